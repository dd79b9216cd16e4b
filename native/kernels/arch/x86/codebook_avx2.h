/* codebook_avx2.h: AVX2 + FMA + F16C GEMV for codebook tensors (docs/FORMAT.md "encoding = 1"),
 * a drop-in for codebook_gemv_ref() in matmul.h (same parameters, same result up to the order of
 * the float32 summation). See docs/KERNELS.md for the layout tricks and measured figures.
 *
 * Only functions marked with the target attribute inside codebook_avx2.c use AVX2; everything
 * else (and every caller) can stay baseline x86-64.
 */
#ifndef DITTO_CODEBOOK_AVX2_H
#define DITTO_CODEBOOK_AVX2_H

#include <stdint.h>

/* 1 if the CPU (and OS) supports AVX2, FMA and F16C, else 0 (__builtin_cpu_supports). */
int codebook_avx2_supported(void);

/* y[rows] = W x[cols] for a codebook tensor given as its raw payload, exactly the parameters
 * of codebook_gemv_ref(): codebook_type DITTO_CB_F16 / DITTO_CB_F32, bits b in 1..8,
 * group_size G >= 2, S = ceil(cols / G) sub-blocks per row. OpenMP over rows inside (static
 * schedule), like the reference. Fast paths: b = 4 with G % 8 == 0 (byte-plane lookup with
 * vpshufb), b = 1..4 (centroids in registers, vpermps), b = 5..8 (vgatherdps from the
 * sub-block's centroids). Any G: groups of 8 indices that lie
 * inside one sub-block go through SIMD, the rest (sub-block heads/tails when G % 8 != 0, a
 * row's last partial group) through scalar code. G < 8, or a CPU without AVX2/FMA/F16C, calls
 * codebook_gemv_ref(). */
void codebook_gemv_avx2(float *y, const float *x, const uint8_t *payload, uint32_t codebook_type,
                        int bits, int group_size, int rows, int cols);

#endif
