/* gemm.c: matrix-matrix products Y = X Wᵀ for a tile of T activation rows (batched prefill).
 *
 * fp32 weights: matmul_f32_batch(), a naive triple loop nest (rows of W outermost, so each W
 * row is read from memory once and reused from L1 for all T tokens, while the T x cols
 * activation tile stays in L2) that the IR pass (plugins/pass_gemv_blas, docs/PASS.md "GEMM")
 * replaces with cblas_sgemm.
 * int8 codebook weights: the integer kernels through gemm_i8 (kernels.c), bit-identical to gemv().
 * f16/f32 codebook weights: the AVX2 GEMM (gemm_avx2.c) where it applies, else the scalar
 * reference codebook_gemm_ref() (codebook_ref.c).
 */
#include "matmul.h"

#include <string.h>

#include "kernels.h"
#include "arch/x86/gemm_avx2.h"

/* Y[t][i] = Σ_k W[i*n + k] · X[t*n + k] for t < T, i < d. Kept naive on purpose: the rewrite
 * stage turns this nest into cblas_sgemm (RowMajor, NoTrans, Trans); OpenMP over rows of W. */
void matmul_f32_batch(float *Y, const float *X, const float *W, int T, int n, int d) {
    int i;
#pragma omp parallel for private(i)
    for (i = 0; i < d; i++) {
        for (int t = 0; t < T; t++) {
            float acc = 0.0f;
            for (int k = 0; k < n; k++) {
                acc += W[i * n + k] * X[t * n + k];
            }
            Y[t * d + i] = acc;
        }
    }
}

void matmul_batch(float *Y, const float *X, int T, const Tensor *W) {
    int rows = (int)W->rows, cols = (int)W->cols;
    switch (W->encoding) {
    case DITTO_ENC_F32:
        matmul_f32_batch(Y, X, (const float *)(const void *)W->data, T, cols, rows);
        break;
    case DITTO_ENC_CODEBOOK:
        if (W->codebook_type == DITTO_CB_I8) { /* the integer kernels, as gemv() (kernels.h) */
            gemm_i8_float_input(Y, X, T, W);
            break;
        }
        /* G longer than the row is the whole row (S = 1), as gemv() sees it */
        /* AVX2 path for b = 4 (falls back to codebook_gemm_ref where it must) */
        codebook_gemm_avx2(Y, X, T, W->data, W->codebook_type, (int)W->bits,
                           (int)(W->group_size < W->cols ? W->group_size : W->cols), rows, cols);
        break;
    default: /* model_open() rejects other encodings */
        memset(Y, 0, (size_t)T * (size_t)rows * sizeof(float));
        break;
    }
}

void matmul_batch_multi(float *const *Y, const float *X, int T, const Tensor *const *W, int n) {
    int shared = n <= GEMM_MULTI_MAX;
    for (int i = 0; i < n && shared; i++)
        shared = W[i]->encoding == DITTO_ENC_CODEBOOK && W[i]->codebook_type == DITTO_CB_I8 &&
                 W[i]->cols == W[0]->cols;
    if (shared) {
        gemm_i8_float_input_multi(Y, X, T, W, n);
        return;
    }
    for (int i = 0; i < n; i++) matmul_batch(Y[i], X, T, W[i]);
}
