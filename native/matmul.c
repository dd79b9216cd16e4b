/* matmul.c: GEMV kernels and the dispatcher by tensor encoding (docs/FORMAT.md "Encodings"). */
#include "matmul.h"

#include "kernels.h"
#include "qgemv.h"

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

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign; /* +-0 */
        } else { /* subnormal: normalise the mantissa */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | man << 13; /* inf / NaN */
    } else {
        bits = sign | (exp - 15 + 127) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

CodebookLayout codebook_layout(const uint8_t *payload, uint32_t codebook_type, int bits,
                               int group_size, int rows, int cols) {
    CodebookLayout L;
    L.is_f16 = codebook_type == DITTO_CB_F16;
    L.is_i8 = codebook_type == DITTO_CB_I8;
    L.bits = bits;
    L.group_size = group_size;
    L.n_sub = (int)ditto_cb_n_sub((uint64_t)cols, (uint64_t)group_size);
    L.k = 1 << bits;
    L.row_bytes = (size_t)ditto_cb_row_bytes((uint64_t)cols, (uint32_t)bits);
    L.scales = L.is_i8 ? payload + ditto_cb_centroid_bytes((uint64_t)rows, (uint64_t)cols,
                                                           (uint32_t)bits, (uint64_t)group_size,
                                                           codebook_type)
                       : NULL;
    L.codebooks = payload;
    L.indices = payload + ditto_cb_codebook_bytes((uint64_t)rows, (uint64_t)cols, (uint32_t)bits,
                                                  (uint64_t)group_size, codebook_type);
    return L;
}

float codebook_centroid(const CodebookLayout *L, int r, int s, int k) {
    size_t i = ((size_t)r * (size_t)L->n_sub + (size_t)s) * (size_t)L->k + (size_t)k;
    if (L->is_i8) { /* scale * int8, exact in float32 (11 + 7 significant bits) */
        uint16_t h;
        memcpy(&h, L->scales + 2 * ((size_t)r * (size_t)L->n_sub + (size_t)s), 2);
        return f16_to_f32(h) * (float)(int8_t)L->codebooks[i];
    }
    if (L->is_f16) {
        uint16_t h;
        memcpy(&h, L->codebooks + 2 * i, 2);
        return f16_to_f32(h);
    }
    float f;
    memcpy(&f, L->codebooks + 4 * i, 4);
    return f;
}

/* Unpack the 8 indices of the group holding index c of a packed row (ditto_cb_group). */
static void unpack_group(const uint8_t *row, int c, int bits, int idx[8]) {
    uint64_t v = ditto_cb_group(row, (uint64_t)c, (uint32_t)bits);
    uint64_t mask = (1u << bits) - 1u;
    for (int j = 0; j < 8; j++) idx[j] = (int)((v >> (j * bits)) & mask);
}

/* Dot product of row r with x, decoding sub-block by sub-block. Within a sub-block
 * [c0, c1), each group of 8 packed indices is unpacked once and its indices used in turn. */
static float codebook_row_dot(const CodebookLayout *L, int r, const float *x, int cols) {
    const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
    float acc = 0.0f;
    for (int s = 0; s < L->n_sub; s++) {
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols; /* tail sub-block */
        float cb[256];
        for (int k = 0; k < L->k; k++) cb[k] = codebook_centroid(L, r, s, k);
        float sub = 0.0f;
        for (int c = c0; c < c1;) {
            int group = c / 8, j0 = c % 8;
            int j1 = j0 + (c1 - c) < 8 ? j0 + (c1 - c) : 8; /* stop at the sub-block's end */
            int idx[8];
            unpack_group(row, group * 8, L->bits, idx);
            for (int j = j0; j < j1; j++) sub += cb[idx[j]] * x[group * 8 + j];
            c = group * 8 + j1;
        }
        acc += sub;
    }
    return acc;
}

void codebook_gemv_ref(float *y, const float *x, const uint8_t *payload, uint32_t codebook_type,
                       int bits, int group_size, int rows, int cols) {
    CodebookLayout L = codebook_layout(payload, codebook_type, bits, group_size, rows, cols);
    int r;
#pragma omp parallel for private(r)
    for (r = 0; r < rows; r++) y[r] = codebook_row_dot(&L, r, x, cols);
}

void codebook_row_ref(float *out, const uint8_t *payload, uint32_t codebook_type, int bits,
                      int group_size, int rows, int cols, int r) {
    CodebookLayout L = codebook_layout(payload, codebook_type, bits, group_size, rows, cols);
    const uint8_t *row = L.indices + (size_t)r * L.row_bytes;
    for (int c = 0; c < cols; c++) {
        out[c] = codebook_centroid(&L, r, c / group_size,
                                   (int)ditto_cb_index(row, (uint64_t)c, (uint32_t)bits));
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

void tensor_row(float *out, const Tensor *W, uint64_t r) {
    if (W->encoding == DITTO_ENC_F32) {
        memcpy(out, W->data + r * W->cols * sizeof(float), W->cols * sizeof(float));
    } else {
        codebook_row_ref(out, W->data, W->codebook_type, (int)W->bits, kernel_group_size(W),
                         (int)W->rows, (int)W->cols, (int)r);
    }
}
