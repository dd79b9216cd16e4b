/* matmul.h: matrix-vector products (GEMV) y = W x for every tensor encoding.
 *
 * fp32 weights go through matmul(), a deliberately naive loop nest that the IR rewrite stage
 * (plugins/pass_gemv_blas) recognises and replaces with cblas_sgemv. Codebook tensors
 * (docs/FORMAT.md, encoding CODEBOOK) go through gemv(), which dispatches on the encoding to the
 * kernel table (kernels.h). The scalar codebook reference kernels are in codebook_ref.h.
 */
#ifndef DITTO_MATMUL_H
#define DITTO_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "codebook_ref.h"
#include "../model/model.h"

/* y[d] = W[d, n] x[n]; W row-major float32. The canonical GEMV nest, OpenMP over rows. */
void matmul(float *y, const float *x, const float *W, int n, int d);

/* Dispatcher: y[W->rows] = W x[W->cols] for any encoding, through the kernel table chosen at
 * model load (kernels.h): fp32 -> matmul(); int8 codebooks -> x quantized once (act_quantize),
 * then the table's integer kernel (gemv_i8); f16/f32 codebooks -> the table's float kernel.
 * Not reentrant for int8 tensors (one static quantized-input buffer): concurrent callers
 * quantize into their own QuantActs (act_quantize) and call gemv_i8() (kernels.h). */
void gemv(float *y, const float *x, const Tensor *W);

/* y[i] = W[i] x (gemv) for n tensors sharing the input x (decode's q/k/v, gate/up), the same
 * bits; int8 codebook tensors (up to GEMM_MULTI_MAX, same cols) quantize x once and share one
 * parallel region (kernels.h gemv_i8_multi), which saves a fork and join per tensor and lets
 * a thread that finishes its rows of a small tensor go on to the next. */
void gemv_multi(float *const *y, const float *x, const Tensor *const *W, int n);

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

/* Row r of W decoded to float32 into out[W->cols] (embedding lookup). */
void tensor_row(float *out, const Tensor *W, uint64_t r);

/* Every int8 codebook matrix but the embedding (which tensor_row reads by row) put in row
 * tiles for the active kernel table (kernels_tile_tensor), when the model was read into
 * memory (a mapped file is read-only). Returns how many were tiled, or -1 when out of memory
 * (the tensors tiled so far stay tiled; every kernel path reads either layout). */
int tile_weights(Model *m);

#endif
