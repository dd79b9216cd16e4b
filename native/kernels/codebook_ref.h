/* codebook_ref.h: the codebook payload layout and the scalar reference kernels (docs/FORMAT.md
 * "encoding = 1"): f16 conversion, centroid lookup, GEMV, row decode and GEMM of f16/f32/int8
 * codebook tensors. The bottom of the kernel files: every SIMD kernel falls back to and is
 * checked against these, and this file calls no other runtime file.
 */
#ifndef DITTO_CODEBOOK_REF_H
#define DITTO_CODEBOOK_REF_H

#include <stddef.h>
#include <stdint.h>

#include "../model/ditto_format.h"

/* Most activation rows one matmul_batch() / codebook_gemm_ref() call takes (the prefill
 * tile, --batch-size). */
#define MATMUL_BATCH_MAX 512

/* Where things are in one codebook tensor payload (FORMAT.md "encoding = 1"). */
typedef struct {
    const uint8_t *codebooks; /* [rows][n_sub][k] of f16, f32 or int8 */
    const uint8_t *scales;    /* int8 codebooks: [rows][n_sub] f16 scales; else NULL */
    const uint8_t *indices;   /* [rows][row_bytes] bit-packed indices */
    int is_f16;               /* codebook_type == DITTO_CB_F16 */
    int is_i8;                /* codebook_type == DITTO_CB_I8 */
    int bits, group_size;     /* b, G */
    int n_sub, k;             /* S = ceil(cols / G) sub-blocks per row, K = 2^b centroids */
    size_t row_bytes;         /* ceil(cols / 8) * b */
} CodebookLayout;

/* The layout of a codebook payload (parameters as for codebook_gemv_ref below). */
CodebookLayout codebook_layout(const uint8_t *payload, uint32_t codebook_type, int bits,
                               int group_size, int rows, int cols);

/* Centroid k of sub-block s of row r of a codebook tensor as float32 (f16, f32, or int8 times
 * its sub-block's f16 scale, exact in float32). */
float codebook_centroid(const CodebookLayout *L, int r, int s, int k);

/* y[rows] = W x[cols] for a codebook tensor (FORMAT.md "encoding = 1") given as its raw payload:
 * codebooks [rows][S][2^b] of codebook_type (DITTO_CB_F16 / DITTO_CB_F32; DITTO_CB_I8: int8
 * centroids then [rows][S] f16 scales), padded to 64 bytes, then rows x ceil(cols/8)*b bytes of
 * bit-packed indices. b in 1..8, G >= 2, S = ceil(cols/G).
 * Scalar float reference kernel: decode each sub-block's indices, look up its codebook (int8:
 * scale times centroid, exact in float32), dot with x in float32. gemv() runs int8 codebooks
 * through the integer kernels instead (qgemv.h), whose result this approximates. */
void codebook_gemv_ref(float *y, const float *x, const uint8_t *payload, uint32_t codebook_type,
                       int bits, int group_size, int rows, int cols);

/* Decode row r of a codebook tensor payload (parameters as above) into out[cols]. */
void codebook_row_ref(float *out, const uint8_t *payload, uint32_t codebook_type, int bits,
                      int group_size, int rows, int cols, int r);

/* Y[T][rows] = X[T][cols] · Wᵀ for an f16/f32 codebook payload (parameters as
 * codebook_gemv_ref):
 * decodes tiles of 16 rows to float32 once and multiplies them with all T rows of X.
 * 1 <= T <= MATMUL_BATCH_MAX. Y[t][r] sums over columns in increasing order. */
void codebook_gemm_ref(float *Y, const float *X, int T, const uint8_t *payload,
                       uint32_t codebook_type, int bits, int group_size, int rows, int cols);

/* IEEE half -> float (handles subnormals, inf, NaN). */
float f16_to_f32(uint16_t h);

#endif
