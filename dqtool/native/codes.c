/* Transposes of packed 2/4/8-bit codes (dqtool.native, loaded with ctypes).
 *
 * The same algorithm as dqtool.transposes.transpose_codes' NumPy path, on
 * registers instead of arrays: a 64-bit word holds E = 64 / bits codes of a row, so an
 * E x E square of codes is E words of E consecutive rows; the recursive transpose swaps
 * the square's off-diagonal halves, then quarters, ... down to single codes (log2(E)
 * stages of shift, mask and xor), and the square lands at its transposed place as whole
 * words. Squares are visited in tiles copied through local buffers (see run()), or, on a
 * CPU with AVX-512, eight at a time in registers (tile_wide()).
 *
 * Plain C99 (and POSIX pwrite and mutexes) with no Python API: ctypes releases the GIL
 * around the call, so slabs of squares run on several threads at once, and a streamed
 * weight (dq_write_transposed) is transposed and written band by band without it. Every
 * load and store goes through memcpy (no alignment is assumed) and words are taken as
 * little-endian (the loader refuses a big-endian machine).
 */
#ifdef __linux__
#define _GNU_SOURCE /* fallocate */
#include <fcntl.h>
#else
#define _XOPEN_SOURCE 700 /* pwrite, recursive mutexes */
#endif
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
/* (GCC 5 and clang 5 have AVX-512 intrinsics behind the target attribute; older
 * compilers build the portable loop alone) */
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 5) || \
                            (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 5))
#include <immintrin.h>
#define DQ_WIDE 1
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
 * asked (the loader sets it once, when it loads the library). */
static int wide_on = -1;
static int wide_supported(void) { return __builtin_cpu_supports("avx512f") ? 1 : 0; }
#else
#define DQ_WIDE 0
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

/* A turn for writes into one file: writers (threads) take it around each write, because
 * the kernel lets one write into a file at a time anyway and a writer waiting in the
 * kernel spins, where one waiting here sleeps (measured: 10% of a `pack`'s CPU).
 * Recursive, as the Python lock it stands in for (a copy through user space writes
 * within its own turn). NULL when memory runs out. */
void *dq_turn_new(void) {
    pthread_mutex_t *m = malloc(sizeof *m);
    pthread_mutexattr_t attr;
    if (m == NULL) return NULL;
    if (pthread_mutexattr_init(&attr) != 0) { free(m); return NULL; }
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    int rc = pthread_mutex_init(m, &attr);
    pthread_mutexattr_destroy(&attr);
    if (rc != 0) { free(m); return NULL; }
    return m;
}

void dq_turn_take(void *turn) { pthread_mutex_lock((pthread_mutex_t *)turn); }
void dq_turn_give(void *turn) { pthread_mutex_unlock((pthread_mutex_t *)turn); }

void dq_turn_free(void *turn) {
    if (turn == NULL) return;
    pthread_mutex_destroy((pthread_mutex_t *)turn);
    free(turn);
}

/* Bytes per pwrite: the page cache's folios are as large as a write, and on a VM that
 * hands large free blocks back to its host those wait for the host on first write (see
 * dqtool/pieces.py: 1 MiB pieces made an `upgrade` 1.6-2.7 s instead of 0.85 s in such
 * minutes). 64 KiB, as a copy of the file writes. */
#define WRITE_PIECE ((int64_t)64 << 10)

/* WRITE_PIECE, for the loader to compare with dqtool.pieces.WRITE_PIECE. */
int64_t dq_write_piece(void) { return WRITE_PIECE; }

/* All of buf[0..n) at `offset` of fd, in `turn` (if any): 0, or -errno. */
static int64_t write_all(int fd, const uint8_t *buf, int64_t n, int64_t offset, void *turn) {
    int64_t at = 0, rc = 0;
    if (turn != NULL) dq_turn_take(turn);
    while (at < n) {
        const int64_t piece = n - at < WRITE_PIECE ? n - at : WRITE_PIECE;
        ssize_t k = pwrite(fd, buf + at, (size_t)piece, (off_t)(offset + at));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { rc = k < 0 ? -errno : -EIO; break; }
        at += k;
    }
    if (turn != NULL) dq_turn_give(turn);
    return rc;
}

/* All of buf[0..n) at `offset` of fd, in pieces of WRITE_PIECE, in `turn` (NULL: none):
 * 0, or -errno. Python's writes of large buffers into a data file come here: one call
 * without the GIL instead of a call per piece (measured: a float16 fold's 7.4 GB in
 * 64 KiB pieces from Python cost 0.7 s more CPU than in 1 MiB ones). */
int64_t dq_write_all(int fd, const uint8_t *buf, int64_t n, int64_t offset, void *turn) {
    if (n < 0 || offset < 0) return -EINVAL;
    return write_all(fd, buf, n, offset, turn);
}

/* The transpose of `words` source words a row (squares x E rows of BITS-bit codes, rows
 * src_stride bytes apart), written to fd at `offset` a band of `band_words` source words
 * at a time: each band becomes band_words x E output rows, built in `buf` (out_row bytes
 * apart: the first squares * 8 bytes are codes, the rest zeros) and written with one
 * pwrite in `turn` (NULL: none). Only the first `out_rows` output rows are written (a
 * ragged tail of padding codes is dropped). `buf` holds band_words * E * out_row bytes.
 * Every source byte is xor-ed with `flip` first. BITS 2, 4, 8 (packed codes) or 16, 32
 * (float16 / float32 scales, one element a code). Returns the bytes written, or -errno
 * (-EINVAL for another width, rows narrower than squares * 8 bytes, or no words a band).
 *
 * Why in C: the loop over bands, in Python, cost ~40 us a band in the interpreter and
 * the GIL (measured: 0.12 s of CPU over the 1,800 bands of a 1.8 GB model). */
int64_t dq_write_transposed(const uint8_t *src, int64_t src_stride, int64_t squares,
                            int64_t words, int64_t band_words, int bits, int flip,
                            uint8_t *buf, int64_t out_row, int64_t out_rows, int fd,
                            int64_t offset, void *turn) {
    if (bits != 2 && bits != 4 && bits != 8 && bits != 16 && bits != 32) return -EINVAL;
    /* rows narrower than a band's codes would overrun buf; no words a band, no end */
    if (out_row < squares * 8 || band_words <= 0 || squares < 0 || words < 0) return -EINVAL;
    const int e = 64 / bits;
    if (out_row > squares * 8)  /* the padding bytes of every row of a band: zeros */
        for (int64_t r = 0; r < band_words * e; r++)
            memset(buf + r * out_row + squares * 8, 0, (size_t)(out_row - squares * 8));
    /* Bands of whole 64-byte lines of the source where a band is a few lines wide: a line
     * split between two bands is read from memory twice, as the first band's cached lines
     * are gone by the next (measured on the bench model, one core: its transposes 5%
     * quicker with the 42-word bands of its 3072-row weights cut to 40; bands of 15 words
     * for its 8192-row weights instead of 16 made them 30% slower). The first band is cut
     * short so that the others start on a line, where rows do (stride a multiple of 64). */
    int64_t first = band_words;
    if (band_words >= 16) {
        band_words -= band_words % 8;
        first = band_words;
        const uintptr_t at = (uintptr_t)src % 64;
        if (src_stride % 64 == 0 && at % 8 == 0 && at != 0)
            first = band_words - (int64_t)at / 8;
    }
    int64_t written = 0, rows_done = 0;
    for (int64_t w0 = 0; w0 < words && rows_done < out_rows;
         w0 += w0 == 0 ? first : band_words) {
        const int64_t want = w0 == 0 ? first : band_words;
        const int64_t nw = words - w0 < want ? words - w0 : want;
        dq_transpose_codes(src + w0 * 8, src_stride, buf, out_row, nw, 0, squares, bits, flip);
        int64_t rows = nw * e;
        if (rows > out_rows - rows_done) rows = out_rows - rows_done;
        const int64_t rc = write_all(fd, buf, rows * out_row, offset + written, turn);
        if (rc < 0) return rc;
        written += rows * out_row;
        rows_done += rows;
    }
    return written;
}

/* Reserves bytes offset .. offset + length of fd's file on disk (Linux fallocate, which
 * keeps the file's bytes as they are and reads unwritten ones as zeros): 0, or -errno
 * (-EOPNOTSUPP where the file system or the system has no such call; nothing changed).
 * Why: a data file's writes then only fill blocks already allocated (measured: ~15%
 * less of write()'s CPU for 1.8 GB on ext4), and a full disk is known before any byte
 * is written. Not posix_fallocate: where the file system cannot, glibc writes a byte
 * into every block instead, which is slower than not reserving. */
int dq_reserve(int fd, int64_t offset, int64_t length) {
#ifdef __linux__
    if (fallocate(fd, 0, (off_t)offset, (off_t)length) == 0) return 0;
    return -errno;
#else
    (void)fd;
    (void)offset;
    (void)length;
    return -EOPNOTSUPP;
#endif
}

/* Lets the loader tell this build from a stale one (bumped with any change of meaning). */
int dq_native_version(void) { return 4; }

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
    const int64_t per = 8 / bits, row_bytes = bits == 8 ? cols : cols * bits / 8;
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
    return bw_on && wide_on != 0;
}
#else
static int bw_now(void) { return 0; }
#endif

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
