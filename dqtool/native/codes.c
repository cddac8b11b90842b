/* Transposes of packed 2/4/8-bit codes (dqtool.native, loaded with ctypes).
 *
 * The same algorithm as dqtool.families.fused.packing.transpose_codes' NumPy path, on
 * registers instead of arrays: a 64-bit word holds E = 64 / bits codes of a row, so an
 * E x E square of codes is E words of E consecutive rows; the recursive transpose swaps
 * the square's off-diagonal halves, then quarters, ... down to single codes (log2(E)
 * stages of shift, mask and xor), and the square lands at its transposed place as whole
 * words. Squares are visited in tiles copied through local buffers (see run()).
 *
 * Plain C99 with no Python API: ctypes releases the GIL around the call, so slabs of
 * squares run on several threads at once. Every load and store goes through memcpy (no
 * alignment is assumed) and words are taken as little-endian (the loader refuses a
 * big-endian machine).
 */
#include <stdint.h>
#include <string.h>

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
    for (int64_t sb = s0; sb < s1; sb += T) {
        const int ns = (int)(s1 - sb < T ? s1 - sb : T);
        for (int64_t cb = 0; cb < wide; cb += T) {
            const int nc = (int)(wide - cb < T ? wide - cb : T);
            const uint8_t *from = src + sb * e * src_stride + cb * 8;
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

/* The entry point: returns 0, or -1 for a width other than 2, 4 or 8. */
int dq_transpose_codes(const uint8_t *src, int64_t src_stride, uint8_t *dst,
                       int64_t dst_stride, int64_t wide, int64_t s0, int64_t s1, int bits,
                       int flip) {
    switch (bits) {
    case 2: run(src, src_stride, dst, dst_stride, wide, s0, s1, (uint8_t)flip, 2); return 0;
    case 4: run(src, src_stride, dst, dst_stride, wide, s0, s1, (uint8_t)flip, 4); return 0;
    case 8: run(src, src_stride, dst, dst_stride, wide, s0, s1, (uint8_t)flip, 8); return 0;
    default: return -1;
    }
}

/* Lets the loader tell this build from a stale one (bumped with any change of meaning). */
int dq_native_version(void) { return 1; }
