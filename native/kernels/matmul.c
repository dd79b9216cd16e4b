/* matmul.c: GEMV kernels and the dispatcher by tensor encoding (docs/FORMAT.md "Encodings"). */
#include "matmul.h"

#include "kernels.h"
#include "qgemv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* y[d] = W[d, n] x[n]. Kept naive on purpose: the rewrite stage turns this nest into
 * cblas_sgemv, so it must stay the canonical form (one accumulator per row, i*n + k indexing). */
void matmul(float *y, const float *x, const float *W, int n, int d) {
    int i;
#pragma omp parallel for private(i)
    for (i = 0; i < d; i++) {
        float acc = 0.0f;
        for (int k = 0; k < n; k++) {
            acc += W[i * n + k] * x[k];
        }
        y[i] = acc;
    }
}

/* G as the kernels see it: a sub-block longer than the row is the whole row (same layout,
 * S = 1), so every kernel works with G <= cols and its int column arithmetic cannot overflow. */
static int kernel_group_size(const Tensor *W) {
    return (int)(W->group_size < W->cols ? W->group_size : W->cols);
}

/* x quantized for the integer kernels (act_quantize), shared by every row and thread of the
 * GEMV. The last input is kept: the next GEMV on the same values (q/k/v, gate/up read one
 * input) reuses it instead of quantizing again. */
static const QuantActs *quantized_input(const float *x, int n) {
    static QuantActs qa;
    static float *last = NULL;
    static int last_n = -1, last_vnni = -1;
    static size_t last_cap = 0;
    int vnni = kernels_active()->vnni_acts;
    if (n == last_n && vnni == last_vnni && memcmp(x, last, (size_t)n * sizeof *x) == 0)
        return &qa;
    if ((size_t)n > last_cap) {
        free(last);
        last = malloc((size_t)n * sizeof *last);
        last_cap = last ? (size_t)n : 0;
    }
    if (!last || act_quantize(&qa, x, n, vnni)) {
        fprintf(stderr, "ditto: out of memory quantizing a GEMV input of %d floats\n", n);
        abort();
    }
    memcpy(last, x, (size_t)n * sizeof *x);
    last_n = n;
    last_vnni = vnni;
    return &qa;
}

void gemv(float *y, const float *x, const Tensor *W) {
    switch (W->encoding) {
    case DITTO_ENC_F32:
        matmul(y, x, (const float *)(const void *)W->data, (int)W->cols, (int)W->rows);
        break;
    case DITTO_ENC_CODEBOOK:
        if (W->codebook_type == DITTO_CB_I8) {
            gemv_i8(y, quantized_input(x, (int)W->cols), W);
        } else {
            kernels_active()->float_cb(y, x, W->data, W->codebook_type, (int)W->bits,
                                       kernel_group_size(W), (int)W->rows, (int)W->cols);
        }
        break;
    default: /* model_open() rejects other encodings */
        memset(y, 0, W->rows * sizeof(float));
        break;
    }
}

void gemv_multi(float *const *y, const float *x, const Tensor *const *W, int n) {
    int shared = n <= GEMM_MULTI_MAX;
    for (int i = 0; i < n && shared; i++)
        shared = W[i]->encoding == DITTO_ENC_CODEBOOK && W[i]->codebook_type == DITTO_CB_I8 &&
                 W[i]->cols == W[0]->cols;
    if (shared) {
        gemv_i8_multi(y, quantized_input(x, (int)W[0]->cols), W, n);
        return;
    }
    for (int i = 0; i < n; i++) gemv(y[i], x, W[i]);
}

int tile_weights(Model *m) {
    if (m->mapped) return 0; /* the file's pages: read-only */
    int n = 0;
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        Tensor *W = &m->tensors[i];
        if (W == m->token_embd) continue; /* read by row (tensor_row) */
        int rc = kernels_tile_tensor(W);
        if (rc < 0) return -1;
        n += rc;
    }
    return n;
}

void tensor_row(float *out, const Tensor *W, uint64_t r) {
    if (W->tiled) { /* tile_weights() leaves the embedding alone */
        fprintf(stderr, "ditto: internal error: row %" PRIu64 " of %s read from row tiles\n", r,
                W->name);
        abort();
    }
    if (W->encoding == DITTO_ENC_F32) {
        memcpy(out, W->data + r * W->cols * sizeof(float), W->cols * sizeof(float));
    } else {
        codebook_row_ref(out, W->data, W->codebook_type, (int)W->bits, kernel_group_size(W),
                         (int)W->rows, (int)W->cols, (int)r);
    }
}
