/* codebook_ref.c: the scalar reference kernels of codebook tensors (codebook_ref.h): f16
 * conversion, the payload layout, centroid lookup, GEMV and row decode, and the f16/f32
 * codebook GEMM of batched prefill.
 *
 * GEMM (codebook_gemm_ref): tiles of CB_TILE_ROWS rows are decoded to float32 once per column
 * chunk, transposed (Wt[c][r]), and multiplied with the T activation rows by an outer-product
 * micro-kernel (4 tokens x 16 rows of accumulators, one broadcast of x per token and two vectors
 * of Wt per column) that compilers vectorise without reassociating any sum: every Y[t][r] is the
 * sum over c in increasing order, so the result does not depend on the thread count or the tile
 * boundaries.
 */
#include "codebook_ref.h"

#include <string.h>

#define CB_TILE_ROWS 16 /* rows of W per decoded tile: two AVX2 vectors, one cache line of Y */
#define CB_CHUNK 256    /* columns decoded at a time: Wt chunk = 16 KiB, stays in L1 */
#define CB_TOKENS 4     /* tokens per micro-kernel call (4 x 16 accumulators) */

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
