/* gemm_avx2.h: AVX2 + FMA codebook GEMM for batched prefill (b = 4, G % 8 == 0), a drop-in for
 * codebook_gemm_ref() in matmul.h. Only the functions marked with a target attribute inside
 * gemm_avx2.c use AVX2; callers stay baseline x86-64.
 */
#ifndef DITTO_GEMM_AVX2_H
#define DITTO_GEMM_AVX2_H

#include <stdint.h>

/* 1 if the CPU (and OS) supports AVX2, FMA and F16C, else 0 (__builtin_cpu_supports). */
int gemm_avx2_supported(void);

/* Y[T][rows] = X[T][cols] · Wᵀ, parameters exactly those of codebook_gemm_ref(); OpenMP over
 * tiles of 16 rows inside (static schedule). b = 4, G % 8 == 0 on an AVX2/FMA/F16C CPU;
 * anything else calls codebook_gemm_ref(). 1 <= T <= MATMUL_BATCH_MAX. */
void codebook_gemm_avx2(float *Y, const float *X, int T, const uint8_t *payload,
                        uint32_t codebook_type, int bits, int group_size, int rows, int cols);

#endif
