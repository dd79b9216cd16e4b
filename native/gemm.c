/* gemm.c: matrix-matrix products Y = X Wᵀ for a tile of T activation rows (batched prefill).
 *
 * fp32 weights: matmul_f32_batch(), a naive triple loop nest (rows of W outermost, so each W
 * row is read from memory once and reused from L1 for all T tokens, while the T x cols
 * activation tile stays in L2) that the IR pass (plugins/pass_gemv_blas, docs/PASS.md "GEMM")
 * replaces with cblas_sgemm.
 * int8 codebook weights: the integer kernels through gemm_i8 (kernels.c), bit-identical to gemv().
 * f16/f32 codebook weights: tiles of CB_TILE_ROWS rows are decoded to float32 once per column chunk,
 * transposed (Wt[c][r]), and multiplied with the T activation rows by an outer-product
 * micro-kernel (4 tokens x 16 rows of accumulators, one broadcast of x per token and two
 * vectors of Wt per column) that compilers vectorise without reassociating any sum: every
 * Y[t][r] is the sum over c in increasing order, so the result does not depend on the thread
 * count or the tile boundaries.
 */
#include "matmul.h"

#include <string.h>

#include "gemm_avx2.h"
#include "kernels.h"

#define CB_TILE_ROWS 16 /* rows of W per decoded tile: two AVX2 vectors, one cache line of Y */
#define CB_CHUNK 256    /* columns decoded at a time: Wt chunk = 16 KiB, stays in L1 */
#define CB_TOKENS 4     /* tokens per micro-kernel call (4 x 16 accumulators) */

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

/* The b bytes of the group of 8 indices that holds column c, as one little-endian integer
 * (index j of the group at bits [j*b, (j+1)*b); FORMAT.md "encoding = 1"). */
static uint64_t index_group(const uint8_t *row, int c, int bits) {
    const uint8_t *p = row + (size_t)(c / 8) * (size_t)bits;
    uint64_t v = 0;
    for (int i = 0; i < bits; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Decode columns [c0, c1) of row r into Wt[(c - c0) * CB_TILE_ROWS + slot], sub-block by
 * sub-block: its centroids are converted to float32 once, each whole group of 8 indices inside
 * it is unpacked once and looked up with constant shifts; a sub-block's head and tail (G not a
 * multiple of 8) column by column. */
static void decode_row_chunk(const CodebookLayout *L, int r, int c0, int c1, float *Wt,
                             int slot) {
    const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
    const int bits = L->bits, G = L->group_size;
    const uint64_t mask = (1u << bits) - 1u;
    float cb[256];
    for (int c = c0; c < c1;) {
        int s = c / G;
        int ce = c1 - s * G > G ? s * G + G : c1; /* end of this sub-block within the chunk */
        for (int k = 0; k < L->k; k++) cb[k] = codebook_centroid(L, r, s, k);
        for (; c < ce && (c & 7); c++)
            Wt[(size_t)(c - c0) * CB_TILE_ROWS + slot] =
                cb[(index_group(row, c, bits) >> ((c & 7) * bits)) & mask];
        for (; c + 8 <= ce; c += 8) {
            uint64_t v = index_group(row, c, bits);
            float *dst = Wt + (size_t)(c - c0) * CB_TILE_ROWS + slot;
            for (int j = 0; j < 8; j++) dst[j * CB_TILE_ROWS] = cb[(v >> (j * bits)) & mask];
        }
        for (; c < ce; c++)
            Wt[(size_t)(c - c0) * CB_TILE_ROWS + slot] =
                cb[(index_group(row, c, bits) >> ((c & 7) * bits)) & mask];
    }
}

/* acc[t][r] (+)= Σ_{c < nc} X[t][c] · Wt[c][r] for NT tokens, in increasing c. */
static void micro_kernel(float *Yt, const float *X, size_t ldx, const float *Wt, int nc, int nt,
                         int first) {
    float acc[CB_TOKENS][CB_TILE_ROWS];
    for (int t = 0; t < CB_TOKENS; t++)
        for (int r = 0; r < CB_TILE_ROWS; r++)
            acc[t][r] = first || t >= nt ? 0.0f : Yt[t * CB_TILE_ROWS + r];
    if (nt == CB_TOKENS) {
        for (int c = 0; c < nc; c++) {
            const float *w = Wt + (size_t)c * CB_TILE_ROWS;
            for (int t = 0; t < CB_TOKENS; t++) {
                float xv = X[(size_t)t * ldx + c];
                for (int r = 0; r < CB_TILE_ROWS; r++) acc[t][r] += xv * w[r];
            }
        }
    } else {
        for (int c = 0; c < nc; c++) {
            const float *w = Wt + (size_t)c * CB_TILE_ROWS;
            for (int t = 0; t < nt; t++) {
                float xv = X[(size_t)t * ldx + c];
                for (int r = 0; r < CB_TILE_ROWS; r++) acc[t][r] += xv * w[r];
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < CB_TILE_ROWS; r++) Yt[t * CB_TILE_ROWS + r] = acc[t][r];
}

void codebook_gemm_ref(float *Y, const float *X, int T, const uint8_t *payload,
                       uint32_t codebook_type, int bits, int group_size, int rows, int cols) {
    CodebookLayout L = codebook_layout(payload, codebook_type, bits, group_size, rows, cols);
    int n_tiles = (rows + CB_TILE_ROWS - 1) / CB_TILE_ROWS;
    int tile;
#pragma omp parallel
    {
        /* per thread: a decoded chunk (16 KiB) and the tile's partial sums (T x 16 floats,
         * at most 32 KiB): on the stack, so nothing is allocated */
        float Wt[CB_CHUNK * CB_TILE_ROWS];
        float Yt[MATMUL_BATCH_MAX * CB_TILE_ROWS];
#pragma omp for schedule(static) private(tile)
        for (tile = 0; tile < n_tiles; tile++) {
            int r0 = tile * CB_TILE_ROWS;
            int nr = rows - r0 < CB_TILE_ROWS ? rows - r0 : CB_TILE_ROWS;
            for (int c0 = 0; c0 < cols; c0 += CB_CHUNK) {
                int c1 = c0 + CB_CHUNK < cols ? c0 + CB_CHUNK : cols;
                if (nr < CB_TILE_ROWS) memset(Wt, 0, sizeof Wt);
                for (int r = 0; r < nr; r++) decode_row_chunk(&L, r0 + r, c0, c1, Wt, r);
                for (int t = 0; t < T; t += CB_TOKENS) {
                    int nt = T - t < CB_TOKENS ? T - t : CB_TOKENS;
                    micro_kernel(Yt + (size_t)t * CB_TILE_ROWS, X + (size_t)t * cols + c0,
                                 (size_t)cols, Wt, c1 - c0, nt, c0 == 0);
                }
            }
            for (int t = 0; t < T; t++)
                memcpy(Y + (size_t)t * rows + r0, Yt + (size_t)t * CB_TILE_ROWS,
                       (size_t)nr * sizeof(float));
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
