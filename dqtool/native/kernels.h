/* The kernels of dqtool.native._codes (transpose.c, lookup.c), called by module.c. Plain
 * C with no Python API; module.c releases the GIL around every call. Words are taken as
 * little-endian (dqtool.native refuses the extension on a big-endian machine). */
#ifndef DQ_KERNELS_H
#define DQ_KERNELS_H
#include <stdint.h>

/* The AVX-512 paths, where the compiler has their intrinsics behind the target attribute
 * (GCC 5, clang 5); older compilers build the portable loops alone. */
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 5) || \
                            (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 5))
#define DQ_WIDE 1
#else
#define DQ_WIDE 0
#endif

int dq_transpose_codes(const uint8_t *src, int64_t src_stride, uint8_t *dst,
                       int64_t dst_stride, int64_t wide, int64_t s0, int64_t s1, int bits,
                       int flip);
int dq_set_wide(int on);
int dq_wide_now(void);
int dq_lut_rows(const uint8_t *codes, int64_t rows, int64_t cols, int64_t bits, int64_t rpg,
                int64_t cpg, int64_t ncg, const void *lut, int64_t levels, int64_t width,
                void *out);
int dq_lut_select(const uint8_t *codes, int64_t rows, int64_t cols, int64_t bits, int64_t rpg,
                  const void *tables, int64_t levels, int64_t width, void *out);
int dq_select_supported(void);
#endif
