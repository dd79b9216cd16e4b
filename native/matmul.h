/* matmul.h: matrix-vector products (GEMV) y = W x for every tensor encoding.
 *
 * fp32 weights go through matmul(), a deliberately naive loop nest that the IR rewrite stage
 * (plugins/pass_gemv_blas) recognises and replaces with cblas_sgemv. Codebook tensors
 * (docs/FORMAT.md, encoding CODEBOOK) go through gemv(), which dispatches on the encoding to a
 * scalar reference kernel. SIMD kernels live elsewhere and are checked against these.
 */
#ifndef DITTO_MATMUL_H
#define DITTO_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* y[d] = W[d, n] x[n]; W row-major float32. The canonical GEMV nest, OpenMP over rows. */
void matmul(float *y, const float *x, const float *W, int n, int d);

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

/* Dispatcher: y[W->rows] = W x[W->cols] for any encoding, through the kernel table chosen at
 * model load (kernels.h): fp32 -> matmul(); int8 codebooks -> x quantized once (act_quantize),
 * then the table's integer kernel (gemv_i8); f16/f32 codebooks -> the table's float kernel.
 * Not reentrant for int8 tensors (one static quantized-input buffer): concurrent callers
 * quantize into their own QuantActs (act_quantize) and call gemv_i8() (kernels.h). */
void gemv(float *y, const float *x, const Tensor *W);

/* Most activation rows one matmul_batch() call takes (the prefill tile, --batch-size). */
#define MATMUL_BATCH_MAX 512

/* Y[T][rows] = X[T][cols] · Wᵀ for any encoding (W is [rows, cols]): T activation rows at once
 * (GEMM; batched prefill), 1 <= T <= MATMUL_BATCH_MAX, X and Y row-major float32 without
 * padding. Each Y[t] equals gemv(Y[t], X[t], W) up to the order of the float32 summation
 * (int8 codebooks: exactly, through gemm_i8 in kernels.h).
 * Threads split the rows of W (OpenMP, static), so the result is the same for any thread
 * count. Implemented in gemm.c. */
void matmul_batch(float *Y /*[T][rows]*/, const float *X /*[T][cols]*/, int T, const Tensor *W);

/* Y[i] = X · W[i]ᵀ (matmul_batch) for n tensors sharing the input X (q/k/v, gate/up), the same
 * bits; int8 codebook tensors (up to 4, same cols) quantize X once and share one parallel
 * region (kernels.h gemm_i8_float_input_multi). */
void matmul_batch_multi(float *const *Y, const float *X, int T, const Tensor *const *W, int n);

/* Y[t*d + i] = Σ_k W[i*n + k] · X[t*n + k] (t < T, i < d): the canonical GEMM nest that the
 * IR pass replaces with cblas_sgemm (docs/PASS.md "GEMM"). */
void matmul_f32_batch(float *Y, const float *X, const float *W, int T, int n, int d);

/* Y[T][rows] = X[T][cols] · Wᵀ for an f16/f32 codebook payload (parameters as
 * codebook_gemv_ref):
 * decodes tiles of 16 rows to float32 once and multiplies them with all T rows of X.
 * 1 <= T <= MATMUL_BATCH_MAX. Y[t][r] sums over columns in increasing order. */
void codebook_gemm_ref(float *Y, const float *X, int T, const uint8_t *payload,
                       uint32_t codebook_type, int bits, int group_size, int rows, int cols);

/* Row r of W decoded to float32 into out[W->cols] (embedding lookup). */
void tensor_row(float *out, const Tensor *W, uint64_t r);

/* IEEE half -> float (handles subnormals, inf, NaN). */
float f16_to_f32(uint16_t h);

#endif
