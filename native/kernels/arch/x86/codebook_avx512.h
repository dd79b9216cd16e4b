/* codebook_avx512.h: AVX-512 (F + VBMI) GEMV for codebook tensors with b = 4, the default bit
 * width (docs/FORMAT.md "encoding = 1"); a drop-in for codebook_gemv_ref() in matmul.h and
 * codebook_gemv_avx2() in codebook_avx2.h. See docs/KERNELS.md.
 *
 * Only functions marked with the target attribute inside codebook_avx512.c use AVX-512.
 */
#ifndef DITTO_CODEBOOK_AVX512_H
#define DITTO_CODEBOOK_AVX512_H

#include <stdint.h>

/* 1 if the CPU (and OS) supports AVX-512 F, BW, VL and VBMI, plus F16C and FMA, else 0. */
int codebook_avx512_supported(void);

/* y[rows] = W x[cols], parameters exactly those of codebook_gemv_ref(). OpenMP over rows
 * inside (static schedule). Fast path: b = 4 with G % 16 == 0 (16 centroids in one zmm,
 * looked up with vpermps; indices unpacked with vpmultishiftqb). Anything else, or a CPU
 * without those features, goes to codebook_gemv_avx2() (which itself falls back to the
 * scalar reference where it must). */
void codebook_gemv_avx512(float *y, const float *x, const uint8_t *payload,
                          uint32_t codebook_type, int bits, int group_size, int rows, int cols);

#endif
