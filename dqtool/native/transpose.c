/* Transposes of packed 2/4/8-bit codes (dqtool.native._codes; see kernels.h).
 *
 * The same algorithm as dqtool.transposes.transpose_codes' NumPy path, on
 * registers instead of arrays: a 64-bit word holds E = 64 / bits codes of a row, so an
 * E x E square of codes is E words of E consecutive rows; the recursive transpose swaps
 * the square's off-diagonal halves, then quarters, ... down to single codes (log2(E)
 * stages of shift, mask and xor), and the square lands at its transposed place as whole
 * words. Squares are visited in tiles copied through local buffers (see run()), or, on a
 * CPU with AVX-512, eight at a time in registers (tile_wide()).
 *
 * The GIL is released around each call (module.c), so slabs of squares run on several
 * threads at once. Every load and store goes through memcpy (no alignment is assumed).
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* Mask of the low d bits of every 2d-bit group of a word. */
static inline uint64_t group_mask(int d) {
    uint64_t group = d == 32 ? 0xFFFFFFFFull : ((1ull << d) - 1);
    uint64_t mask = 0;
    for (int at = 0; at < 64; at += 2 * d) mask |= group << at;
    return mask;
}

/* Two words side by side: GCC/Clang vector extensions, one SSE2 / NEON register. */
typedef uint64_t pair_t __attribute__((vector_size(16)));

/* square() on two squares at once, one in each lane of w[0..E-1]. */
static inline __attribute__((always_inline)) void square2(pair_t *w, const int bits) {
    const int e = 64 / bits;
#pragma GCC unroll 8
    for (int d = 32; d >= bits; d >>= 1) {
        const uint64_t m = group_mask(d);
        const pair_t mask = {m, m};
        const int dist = d / bits;
#pragma GCC unroll 32
        for (int i = 0; i < e; i += 2 * dist) {
#pragma GCC unroll 32
            for (int j = i; j < i + dist; j++) {
                pair_t t = ((w[j] >> d) ^ w[j + dist]) & mask;
                w[j + dist] ^= t;
                w[j] ^= t << d;
            }
        }
    }
}

/* Transposes the E x E square of BITS-bit codes held in w[0..E-1] (E = 64 / BITS): the
 * last square of an odd row of a tile. (square2 with one square in both lanes does the
 * same, but its loads and stores then take an index each: 15% slower overall, measured.) */
static inline __attribute__((always_inline)) void square(uint64_t *w, const int bits) {
    const int e = 64 / bits;
#pragma GCC unroll 8
    for (int d = 32; d >= bits; d >>= 1) {
        const uint64_t mask = group_mask(d);
        const int dist = d / bits;
#pragma GCC unroll 32
        for (int i = 0; i < e; i += 2 * dist) {
#pragma GCC unroll 32
            for (int j = i; j < i + dist; j++) {
                uint64_t t = ((w[j] >> d) ^ w[j + dist]) & mask;
                w[j + dist] ^= t;
                w[j] ^= t << d;
            }
        }
    }
}

/* The tile loop with AVX-512 (x86-64, where the CPU has it: see wide_on), for whole tiles
 * of 8 x 8 squares, straight from the source rows to the destination rows. A row of 8
 * squares side by side is 8 words, one 64-byte line: E loads give E registers whose lane
 * c holds square c's word, so the stages of square() run on 8 squares at once; then, for
 * each of the E output rows of a square, an 8 x 8 transpose of words turns the 8 rows of
 * squares below each other into whole 64-byte lines of output. Why: the portable loop
 * spends as long in its shifts and masks as in waiting for memory (measured on one core:
 * a tile in L1 at 10.7 GB/s against 29 GB/s here; the bench model's weights from the page
 * cache at 3.5 GB/s against 4.6 GB/s, `upgrade` 11% quicker end to end). */
#if DQ_WIDE  /* (kernels.h) */
#include <immintrin.h>
typedef uint64_t wide_t __attribute__((vector_size(64)));

/* Rows r[0..7] of an 8 x 8 matrix of words, transposed in place: three stages, each
 * swapping one bit of the row index with the same bit of the column index. */
static inline __attribute__((always_inline, target("avx512f"))) void words8x8(__m512i *r) {
#pragma GCC unroll 3
    for (int k = 4; k >= 1; k >>= 1) {
        int64_t lo[8], hi[8];
        for (int l = 0; l < 8; l++) {
            lo[l] = (l & k) ? 8 + l - k : l;
            hi[l] = (l & k) ? 8 + l : l + k;
        }
        const __m512i ilo = _mm512_loadu_si512(lo), ihi = _mm512_loadu_si512(hi);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            if (j & k) continue;
            const __m512i a = r[j], b = r[j + k];
            r[j] = _mm512_permutex2var_epi64(a, ilo, b);
            r[j + k] = _mm512_permutex2var_epi64(a, ihi, b);
        }
    }
}

/* square() on eight squares at once, one in each lane of w[0..E-1]. (square, square2 and
 * this are one loop on three types: C has no generics, and a macro would hide the unroll
 * pragmas the speed depends on.) */
static inline __attribute__((always_inline, target("avx512f"))) void square8(wide_t *w,
                                                                            const int bits) {
    const int e = 64 / bits;
#pragma GCC unroll 8
    for (int d = 32; d >= bits; d >>= 1) {
        const uint64_t m = group_mask(d);
        const wide_t mask = {m, m, m, m, m, m, m, m};
        const int dist = d / bits;
#pragma GCC unroll 32
        for (int i = 0; i < e; i += 2 * dist) {
#pragma GCC unroll 32
            for (int j = i; j < i + dist; j++) {
                wide_t x = ((w[j] >> d) ^ w[j + dist]) & mask;
                w[j + dist] ^= x;
                w[j] ^= x << d;
            }
        }
    }
}

static inline __attribute__((always_inline, target("avx512f"))) void tile_wide_e(
    const uint8_t *src, int64_t src_stride, uint8_t *dst, int64_t dst_stride,
    uint64_t xor_word, const int bits, const int flips) {
    const int e = 64 / bits;
    const wide_t flip = {xor_word, xor_word, xor_word, xor_word,
                         xor_word, xor_word, xor_word, xor_word};
    wide_t t[8][32];  /* [row of squares][word]: lane c is square c's */
    for (int sj = 0; sj < 8; sj++) {
        wide_t v[32];
#pragma GCC unroll 32
        for (int i = 0; i < e; i++) {
            memcpy(&v[i], src + (sj * e + i) * src_stride, 64);
            if (flips) v[i] ^= flip;
        }
        square8(v, bits);
#pragma GCC unroll 32
        for (int i = 0; i < e; i++) t[sj][i] = v[i];
    }
#pragma GCC unroll 4
    for (int i = 0; i < e; i++) {
        __m512i r[8];
#pragma GCC unroll 8
        for (int sj = 0; sj < 8; sj++) memcpy(&r[sj], &t[sj][i], 64);
        words8x8(r);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) memcpy(dst + (c * e + i) * dst_stride, &r[c], 64);
    }
}

__attribute__((target("avx512f"), noinline)) static void tile_wide(
    const uint8_t *src, int64_t src_stride, uint8_t *dst, int64_t dst_stride,
    uint64_t xor_word, int bits) {
    /* Without a flip, a copy of the loop without the xor: the source loads then stand
     * alone (measured: the bench model's transposes 20-25% quicker, 5.9 against 4.6 GB/s
     * for its 8192-row weights on one core, where a xor with zero was done before). */
    if (xor_word == 0) {
        switch (bits) {
        case 2: tile_wide_e(src, src_stride, dst, dst_stride, 0, 2, 0); break;
        case 4: tile_wide_e(src, src_stride, dst, dst_stride, 0, 4, 0); break;
        case 8: tile_wide_e(src, src_stride, dst, dst_stride, 0, 8, 0); break;
        case 16: tile_wide_e(src, src_stride, dst, dst_stride, 0, 16, 0); break;
        default: tile_wide_e(src, src_stride, dst, dst_stride, 0, 32, 0); break;
        }
        return;
    }
    switch (bits) {
    case 2: tile_wide_e(src, src_stride, dst, dst_stride, xor_word, 2, 1); break;
    case 4: tile_wide_e(src, src_stride, dst, dst_stride, xor_word, 4, 1); break;
    case 8: tile_wide_e(src, src_stride, dst, dst_stride, xor_word, 8, 1); break;
    case 16: tile_wide_e(src, src_stride, dst, dst_stride, xor_word, 16, 1); break;
    default: tile_wide_e(src, src_stride, dst, dst_stride, xor_word, 32, 1); break;
    }
}

/* 1 where the CPU has AVX-512F (and dq_set_wide did not turn it off), else 0; -1 until
 * first asked. */
static int wide_on = -1;
static int wide_supported(void) { return __builtin_cpu_supports("avx512f") ? 1 : 0; }
#else
static int wide_on = 0;
static int wide_supported(void) { return 0; }
#endif

/* Tests run both tile loops on one machine: 0 turns the wide one off, 1 back on where
 * the CPU has it; returns whether it is on. */
int dq_set_wide(int on) {
    wide_on = on && wide_supported();
    return wide_on;
}

static inline int wide_now(void) {
    if (wide_on < 0) wide_on = wide_supported();  /* the same answer from any thread */
    return wide_on;
}

/* wide_now() for lookup.c: its AVX-512 selections follow the same switch. */
int dq_wide_now(void) { return wide_now(); }

/* Squares (s, c) for s in [s0, s1), c in [0, wide): square (s, c) is the words at byte
 * c * 8 of source rows s * E .. s * E + E - 1 (rows src_stride bytes apart); it is written
 * transposed to destination rows c * E .. c * E + E - 1 at byte s * 8 (rows dst_stride
 * bytes apart). Every source byte is xor-ed with `flip` first (0: none).
 *
 * A tile of 8 x 8 squares is copied in as whole 64-byte lines of its source rows,
 * transposed between two local buffers, and copied out as whole 64-byte lines of its
 * destination rows. Why: rows are often a power of two bytes apart (4096 for K = 8192
 * 4-bit codes), so the E lines a square touches all fall into one L1 set and evict each
 * other; word by word in place, every load and store missed L1 (measured 1.5 GB/s on one
 * core, against 0.9 ms for a memcpy of the same 12.6 MB). */
static inline __attribute__((always_inline)) void run(
    const uint8_t *src, int64_t src_stride, uint8_t *dst, int64_t dst_stride,
    int64_t wide, int64_t s0, int64_t s1, uint8_t flip, const int bits) {
    enum { T = 8 };  /* squares per tile side: 8 words = one 64-byte line */
    const int e = 64 / bits;
    const uint64_t xor_word = 0x0101010101010101ull * flip;
    uint64_t in[T * 32 * T], out[T * 32 * T];  /* (T*E rows) x (T words), E <= 32 */
    uint64_t w[32];
    pair_t v[32];
    const int use_wide = wide_now();
    for (int64_t sb = s0; sb < s1; sb += T) {
        const int ns = (int)(s1 - sb < T ? s1 - sb : T);
        /* The next block of T squares' rows, asked for now: each of its rows is a short
         * run of lines far from the last (a band's columns of a row of the weight), which
         * the hardware prefetchers do not foresee; loaded while this block is transposed,
         * its lines are in L2 when their turn comes (measured: the bands of a 1.8 GB model
         * transposed 13% faster, 0.58 s against 0.67 s on one core). Into L2, not L1: rows
         * 1536 or 4096 bytes apart fall into few L1 sets, and lines fetched into L1 ahead
         * evicted the block's own (measured on the bench model's weights, one core, AVX-512
         * tiles: 8.5 against 5.8 GB/s for 8192 rows in bands of 16 words, 9.5 against 7
         * for 3072 rows in bands of 40; its 224 weights transposed and written by two
         * threads, with the loop without a flip below: 0.34-0.38 s against 0.38-0.47). */
        if (sb + T < s1) {
            const uint8_t *next = src + (sb + T) * e * src_stride;
            const int rows = (int)(s1 - sb - T < T ? s1 - sb - T : T) * e;
            for (int r = 0; r < rows; r++)
                for (int64_t b = 0; b < wide * 8; b += 64)
                    __builtin_prefetch(next + r * src_stride + b, 0, 2);
        }
        for (int64_t cb = 0; cb < wide; cb += T) {
            const int nc = (int)(wide - cb < T ? wide - cb : T);
            const uint8_t *from = src + sb * e * src_stride + cb * 8;
#if DQ_WIDE
            if (use_wide && ns == T && nc == T) {
                tile_wide(from, src_stride, dst + cb * e * dst_stride + sb * 8, dst_stride,
                          xor_word, bits);
                continue;
            }
#endif
            /* constant-size copies of whole tiles compile to a few vector moves; a call
             * to memcpy per 64-byte line cost as much as the transpose itself */
            if (nc == T)
                for (int r = 0; r < ns * e; r++) memcpy(&in[r * T], from + r * src_stride, T * 8);
            else
                for (int r = 0; r < ns * e; r++) memcpy(&in[r * T], from + r * src_stride, nc * 8);
            for (int s = 0; s < ns; s++) {
                int c = 0;
                for (; c + 1 < nc; c += 2) {  /* squares (s, c) and (s, c + 1) together */
                    const pair_t flip2 = {xor_word, xor_word};
#pragma GCC unroll 32
                    for (int i = 0; i < e; i++) {
                        memcpy(&v[i], &in[(s * e + i) * T + c], 16);
                        v[i] ^= flip2;
                    }
                    square2(v, bits);
#pragma GCC unroll 32
                    for (int i = 0; i < e; i++) {
                        out[(c * e + i) * T + s] = v[i][0];
                        out[((c + 1) * e + i) * T + s] = v[i][1];
                    }
                }
                for (; c < nc; c++) {
#pragma GCC unroll 32
                    for (int i = 0; i < e; i++) w[i] = in[(s * e + i) * T + c] ^ xor_word;
                    square(w, bits);
#pragma GCC unroll 32
                    for (int i = 0; i < e; i++) out[(c * e + i) * T + s] = w[i];
                }
            }
            uint8_t *to = dst + cb * e * dst_stride + sb * 8;
            if (ns == T)
                for (int r = 0; r < nc * e; r++) memcpy(to + r * dst_stride, &out[r * T], T * 8);
            else
                for (int r = 0; r < nc * e; r++) memcpy(to + r * dst_stride, &out[r * T], ns * 8);
        }
    }
}

/* The entry point: returns 0, or -1 for a width other than 2, 4, 8 (packed codes), 16 or
 * 32 (float16 / float32 elements, one a code). */
int dq_transpose_codes(const uint8_t *src, int64_t src_stride, uint8_t *dst,
                       int64_t dst_stride, int64_t wide, int64_t s0, int64_t s1, int bits,
                       int flip) {
    switch (bits) {
    case 2: run(src, src_stride, dst, dst_stride, wide, s0, s1, (uint8_t)flip, 2); return 0;
    case 4: run(src, src_stride, dst, dst_stride, wide, s0, s1, (uint8_t)flip, 4); return 0;
    case 8: run(src, src_stride, dst, dst_stride, wide, s0, s1, (uint8_t)flip, 8); return 0;
    case 16: run(src, src_stride, dst, dst_stride, wide, s0, s1, (uint8_t)flip, 16); return 0;
    case 32: run(src, src_stride, dst, dst_stride, wide, s0, s1, (uint8_t)flip, 32); return 0;
    default: return -1;
    }
}
