/* Table lookups of 2/4/8-bit codes (dqtool.native._codes; see kernels.h): the values of a
 * fold's DequantizeLinear picked from tables the kernel computed (dqtool.folding.by_table).
 */
#include <errno.h>
#include <stdint.h>

#include "kernels.h"
#if DQ_WIDE
#include <immintrin.h>
#endif

/* A table lookup for every code of a band of rows (dqtool.folding.by_table): out[r, c] is
 * entry code(r, c) of the table of the group (r / rpg, c / cpg), the tables laid out
 * [row group][column group][level], each entry `width` bytes (2 or 4). code(r, c) is
 * codes[r * cols + c] & (levels - 1) with bits == 8 (one code a byte), or the bits-bit
 * field c of row r with bits 4 or 2 (packed low bits first, rows of whole bytes: the
 * packed rows a transpose gives, unpacked nowhere). The tables are dequantizations of
 * every level made by the kernel itself, so the values are the kernel's, bit for bit;
 * this only picks them (measured: 0.85 ms for 256 x 8192 codes, where NumPy's cast,
 * subtract and multiply took ~8 ms). 0, or -EINVAL. */
/* One row, for a compile-time code width B and entry type T (the divisions by constants
 * become shifts; with a runtime width the loop ran 10x slower). */
#define LUT_ROW(T, B)                                                                     \
    do {                                                                                  \
        const T *l = (const T *)lut + g0;                                                 \
        T *o = (T *)out + r * cols;                                                       \
        enum { PER = 8 / (B) };                                                           \
        if (cpg == 1) { /* a table per column */                                          \
            if ((B) == 8) {                                                               \
                for (int64_t c = 0; c < cols; c++) o[c] = l[c * levels + (cr[c] & mask)]; \
            } else {                                                                      \
                for (int64_t c = 0; c < cols; c += PER) {                                 \
                    uint8_t byte = cr[c / PER];                                           \
                    for (int j = 0; j < PER; j++, byte >>= (B) % 8)                       \
                        o[c + j] = l[(c + j) * levels + (byte & mask)];                   \
                }                                                                         \
            }                                                                             \
        } else {                                                                          \
            for (int64_t c = 0; c < cols; c++) {                                          \
                const uint8_t code = (B) == 8 ? (uint8_t)(cr[c] & mask) :                 \
                    (uint8_t)((cr[c / PER] >> ((B) % 8 * (c % PER))) & mask);            \
                o[c] = l[(c / cpg) * levels + code];                                      \
            }                                                                             \
        }                                                                                 \
    } while (0)

int dq_lut_rows(const uint8_t *codes, int64_t rows, int64_t cols, int64_t bits, int64_t rpg,
                int64_t cpg, int64_t ncg, const void *lut, int64_t levels, int64_t width,
                void *out) {
    if (rows < 0 || cols < 0 || rpg <= 0 || cpg <= 0 || ncg < (cols + cpg - 1) / cpg ||
        (levels != 4 && levels != 16) || (width != 2 && width != 4) ||
        (bits != 8 && bits != 4 && bits != 2) || (bits < 8 && (cols * bits) % 8) ||
        (bits < 8 && levels != (1 << bits)))
        return -EINVAL;
    const uint8_t mask = (uint8_t)(levels - 1);
    const int64_t row_bytes = bits == 8 ? cols : cols * bits / 8;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *cr = codes + r * row_bytes;
        const int64_t g0 = (r / rpg) * ncg * levels;
        if (width == 2 && bits == 4)
            LUT_ROW(uint16_t, 4);
        else if (width == 2 && bits == 2)
            LUT_ROW(uint16_t, 2);
        else if (width == 2)
            LUT_ROW(uint16_t, 8);
        else if (bits == 4)
            LUT_ROW(uint32_t, 4);
        else if (bits == 2)
            LUT_ROW(uint32_t, 2);
        else
            LUT_ROW(uint32_t, 8);
    }
    return 0;
}

/* dq_lut_rows for a table per column (column groups of one: a DequantizeLinear blocked
 * or per-axis along the rows, as every MatMulNBits' weight is), with the tables laid out
 * [row group][level][column] (as the kernel computes them: no transpose) and the lookups
 * done as selections on AVX-512: for 32 columns (16 with 4-byte entries), the level
 * tables of a row group are held in registers while every row of the group is read, and
 * each row's codes pick their entries by a tree of blends (one blend per level, a test
 * of one code bit per tree level). Why: the scalar lookup, a dependent load per code, ran
 * at ~1.7 G codes/s, a quarter of a float16 fold's CPU time on the bench model; this at
 * 6.3 G codes/s (float16 entries; 2.9 against 1.5 for float32), measured on chunks of
 * 256 x 8192 4-bit codes in blocks of 128 rows, one core. Rows r of the tables' row group
 * r / rpg, as dq_lut_rows. Returns 0; -ENOSYS where the CPU (or the compiler) has no
 * AVX-512BW or dq_set_wide turned the AVX-512 paths off (the caller uses dq_lut_rows);
 * -EINVAL for arguments it does not take. */
#if DQ_WIDE
static int bw_on = -1;

/* Codes of columns c .. c + n - 1 (n <= 32) of a row, one a 16-bit lane. */
static inline __attribute__((always_inline, target("avx512f,avx512bw"))) __m512i codes32(
    const uint8_t *row, int64_t c, int n, const int bits, __m512i idx, __m512i shifts,
    __m512i mask) {
    const int per = 8 / bits;
    const int nbytes = (n + per - 1) / per;
    /* (a 512-bit masked load: masked-off bytes are not read, past a row's end either) */
    const __m512i b = _mm512_maskz_loadu_epi8((__mmask64)((1ull << nbytes) - 1),
                                              row + c / per);
    __m512i w = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(b));  /* byte i in lane i */
    if (bits < 8) {
        w = _mm512_permutexvar_epi16(idx, w);  /* lane j: the byte holding code j */
        w = _mm512_srlv_epi16(w, shifts);
    }
    return _mm512_and_si512(w, mask);
}

/* v[0] = tab[code] lane by lane, for `levels` (4 or 16) tables: a tree of blends, one
 * bit of the code per level of the tree. EPI: the lanes (epi16, epi32); M: their mask. */
#define SELECT_TREE(EPI, M, code, tab, levels, v)                                         \
    do {                                                                                  \
        const M k0 = _mm512_test_##EPI##_mask(code, _mm512_set1_##EPI(1));                \
        const M k1 = _mm512_test_##EPI##_mask(code, _mm512_set1_##EPI(2));                \
        for (int l = 0; l < (levels) / 2; l++)                                            \
            v[l] = _mm512_mask_blend_##EPI(k0, tab[2 * l], tab[2 * l + 1]);               \
        for (int l = 0; l < (levels) / 4; l++)                                            \
            v[l] = _mm512_mask_blend_##EPI(k1, v[2 * l], v[2 * l + 1]);                   \
        if ((levels) == 16) {                                                             \
            const M k2 = _mm512_test_##EPI##_mask(code, _mm512_set1_##EPI(4));            \
            const M k3 = _mm512_test_##EPI##_mask(code, _mm512_set1_##EPI(8));            \
            v[0] = _mm512_mask_blend_##EPI(k2, v[0], v[1]);                               \
            v[1] = _mm512_mask_blend_##EPI(k2, v[2], v[3]);                               \
            v[0] = _mm512_mask_blend_##EPI(k3, v[0], v[1]);                               \
        }                                                                                 \
    } while (0)

static inline __attribute__((always_inline, target("avx512f,avx512bw"))) void select_rows(
    const uint8_t *codes, int64_t row_bytes, int64_t r0, int64_t r1, int64_t cols,
    const uint8_t *t, int levels, int width, uint8_t *out, const int bits) {
    const int per = 8 / bits;
    int16_t idx_a[32], sh_a[32];
    for (int j = 0; j < 32; j++) {
        idx_a[j] = (int16_t)(j / per);
        sh_a[j] = (int16_t)(bits * (j % per));
    }
    const __m512i idx = _mm512_loadu_si512(idx_a), shifts = _mm512_loadu_si512(sh_a);
    const __m512i mask = _mm512_set1_epi16((int16_t)(levels - 1));
    const int lanes = width == 2 ? 32 : 16;
    const int64_t tstride = cols * width;  /* bytes from one level's table to the next */
    for (int64_t c = 0; c < cols; c += lanes) {
        const int n = (int)(cols - c < lanes ? cols - c : lanes);
        const uint64_t m64 = n >= 64 ? ~0ull : ((1ull << n) - 1);
        __m512i tab[16];
        for (int l = 0; l < levels; l++)
            tab[l] = width == 2
                ? _mm512_maskz_loadu_epi16((__mmask32)m64, t + l * tstride + c * 2)
                : _mm512_maskz_loadu_epi32((__mmask16)m64, t + l * tstride + c * 4);
        for (int64_t r = r0; r < r1; r++) {
            __m512i code = codes32(codes + r * row_bytes, c, n, bits, idx, shifts, mask);
            __m512i v[8];
            if (width == 2) {
                SELECT_TREE(epi16, __mmask32, code, tab, levels, v);
                _mm512_mask_storeu_epi16(out + (r * cols + c) * 2, (__mmask32)m64, v[0]);
            } else {
                /* the 16 codes as 32-bit lanes */
                const __m512i c32 = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(code));
                SELECT_TREE(epi32, __mmask16, c32, tab, levels, v);
                _mm512_mask_storeu_epi32(out + (r * cols + c) * 4, (__mmask16)m64, v[0]);
            }
        }
    }
}

__attribute__((target("avx512f,avx512bw"), noinline)) static void select_group(
    const uint8_t *codes, int64_t row_bytes, int64_t r0, int64_t r1, int64_t cols,
    const uint8_t *t, int levels, int width, uint8_t *out, int bits) {
    /* compile-time widths and level counts: the tree and the loads unroll */
    if (bits == 4 && width == 2 && levels == 16)
        select_rows(codes, row_bytes, r0, r1, cols, t, 16, 2, out, 4);
    else if (bits == 4 && width == 4 && levels == 16)
        select_rows(codes, row_bytes, r0, r1, cols, t, 16, 4, out, 4);
    else if (bits == 2 && width == 2)
        select_rows(codes, row_bytes, r0, r1, cols, t, 4, 2, out, 2);
    else if (bits == 2)
        select_rows(codes, row_bytes, r0, r1, cols, t, 4, 4, out, 2);
    else if (width == 2)
        select_rows(codes, row_bytes, r0, r1, cols, t, levels, 2, out, 8);
    else
        select_rows(codes, row_bytes, r0, r1, cols, t, levels, 4, out, 8);
}

static int bw_now(void) {
    if (bw_on < 0) bw_on = __builtin_cpu_supports("avx512bw") ? 1 : 0;
    return bw_on && dq_wide_now();
}
#else
static int bw_now(void) { return 0; }
#endif

/* Whether dq_lut_select runs here (0: it returns -ENOSYS): asked before the tables are
 * built, so that they are built in the layout that will be used. */
int dq_select_supported(void) { return bw_now(); }

int dq_lut_select(const uint8_t *codes, int64_t rows, int64_t cols, int64_t bits, int64_t rpg,
                  const void *tables, int64_t levels, int64_t width, void *out) {
    if (rows < 0 || cols < 0 || rpg <= 0 || (levels != 4 && levels != 16) ||
        (width != 2 && width != 4) || (bits != 8 && bits != 4 && bits != 2) ||
        (bits < 8 && (cols * bits) % 8) || (bits < 8 && levels != (1 << bits)))
        return -EINVAL;
    if (!bw_now()) return -ENOSYS;
#if DQ_WIDE
    const int64_t row_bytes = bits == 8 ? cols : cols * bits / 8;
    const int64_t table_bytes = levels * cols * width;  /* one row group's tables */
    for (int64_t r0 = 0; r0 < rows; r0 += rpg) {
        const int64_t r1 = rows - r0 < rpg ? rows : r0 + rpg;
        select_group(codes, row_bytes, r0, r1, cols,
                     (const uint8_t *)tables + (r0 / rpg) * table_bytes, (int)levels,
                     (int)width, (uint8_t *)out, (int)bits);
    }
    return 0;
#else
    (void)codes; (void)tables; (void)out;
    return -ENOSYS;
#endif
}
