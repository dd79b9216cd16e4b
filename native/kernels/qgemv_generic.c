/* qgemv_generic.c: activation quantization and the scalar reference integer GEMV for int8
 * codebook tensors (definitions in qgemv.h). */
#include "qgemv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
/* The float steps below are defined one IEEE rounding at a time, and every kernel must
 * reproduce them bit for bit: no fused multiply-add, and none of the reassociation or
 * reciprocal rewrites that Ditto's fast-math policy (plugins/emit_clang: -fassociative-math
 * -freciprocal-math -ffp-contract=fast) would otherwise license, e.g. in act_block_m's
 * a / (127 D), whose ceiling picks the block multiplier m. */
#pragma STDC FP_CONTRACT OFF
#pragma float_control(precise, on)
#endif

void act_free(QuantActs *qa) {
    free(qa->m);
    free(qa->m16);
    free(qa->q);
    free(qa->qp);
    free(qa->aqp);
    free(qa->qp64);
    free(qa->aqp64);
    free(qa->m64);
    free(qa->ml);
    free(qa->mh);
    free(qa->nl);
    free(qa->nh);
    free(qa->msum);
    memset(qa, 0, sizeof *qa);
}

int act_reserve(QuantActs *qa, size_t n_pad) {
    if (n_pad <= qa->cap && qa->q) return 0;
    QuantActs t;
    memset(&t, 0, sizeof t);
    size_t nb = n_pad / QA_BLOCK;
    t.m = malloc(nb);
    t.m16 = malloc(nb * sizeof *t.m16);
    t.q = malloc(n_pad);
    t.qp = malloc(n_pad);
    t.aqp = malloc(n_pad);
    t.qp64 = malloc(n_pad);
    t.aqp64 = malloc(n_pad);
    t.m64 = malloc(n_pad / 4 * sizeof *t.m64);
    t.ml = malloc(n_pad + 64);
    t.mh = malloc(n_pad + 64);
    t.nl = malloc(n_pad);
    t.nh = malloc(n_pad);
    t.msum = malloc(nb * sizeof *t.msum);
    if (!t.m || !t.m16 || !t.q || !t.qp || !t.aqp || !t.qp64 || !t.aqp64 || !t.m64 || !t.ml ||
        !t.mh || !t.nl || !t.nh || !t.msum) {
        act_free(&t);
        return -1;
    }
    t.cap = n_pad;
    act_free(qa);
    *qa = t;
    return 0;
}

int act_block_m(float a, float D, int finite, float *inv) {
    if (!finite || !(a > 0.0f)) return 0;
    float t = a / ((float)QA_QMAX * D);
    int m = t >= (float)QA_MMAX ? QA_MMAX : (int)ceilf(t);
    if (m < 1) m = 1;
    *inv = 1.0f / (D * (float)m);
    return m;
}

void act_fill_vnni(QuantActs *qa) {
    size_t n_pad = (size_t)qa->n_pad;
    memset(qa->ml, 0, n_pad + 64);
    memset(qa->mh, 0, n_pad + 64);
    for (size_t j = 0; j < n_pad / QA_BLOCK; j++) {
        int32_t sum = 0;
        for (size_t c = j * QA_BLOCK; c < (j + 1) * QA_BLOCK; c++) {
            int v = qa->m[j] * qa->q[c];       /* |v| <= 32385 */
            int l = ((v + 128) & 0xff) - 128; /* v's low byte as a signed byte */
            size_t pos = c / 128 * 128 + (c % 2) * 64 + c % 128 / 2; /* perm128 */
            qa->ml[pos] = qa->nl[c] = (int8_t)l;
            qa->mh[pos] = qa->nh[c] = (int8_t)((v - l) / 256);
            sum += v;
        }
        qa->msum[j] = sum;
    }
    qa->has_vnni = 1;
}

void act_vnni_corrections(uint32_t *corr, const QuantActs *qa, int n_sub, int G, int cols) {
    for (int s = 0; s < n_sub; s++) {
        int c0 = s * G, c1 = c0 + G < cols ? c0 + G : cols;
        uint32_t sum = 0;
        for (int j = c0 / QA_BLOCK; j < (c1 + QA_BLOCK - 1) / QA_BLOCK; j++)
            sum += (uint32_t)qa->msum[j];
        corr[s] = 128u * sum;
    }
}

void act_fill_perm64(QuantActs *qa) {
    for (size_t base = 0; base < (size_t)qa->n_pad; base += 64) { /* QA_PAD: whole groups */
        static const size_t from[4] = {0, 32, 16, 48}; /* evens A, evens B, odds A, odds B */
        for (int k = 0; k < 4; k++) {
            memcpy(qa->qp64 + base + 16 * k, qa->qp + base + from[k], 16);
            memcpy(qa->aqp64 + base + 16 * k, qa->aqp + base + from[k], 16);
        }
        for (int i = 0; i < 8; i++) {
            qa->m64[base / 4 + i] = qa->m16[base / 32];
            qa->m64[base / 4 + 8 + i] = qa->m16[base / 32 + 1];
        }
    }
}

int act_quantize_generic(QuantActs *qa, const float *x, int n, int flags) {
    size_t n_pad = ((size_t)(n > 0 ? n : 1) + QA_PAD - 1) / QA_PAD * QA_PAD;
    if (act_reserve(qa, n_pad)) return -1;
    qa->n = n;
    qa->n_pad = (int)n_pad;
    int nb = (int)(n_pad / QA_BLOCK);
    float A = 0.0f;
    int finite = 1;
    for (int c = 0; c < n; c++) {
        float a = fabsf(x[c]);
        if (!(a <= 3.402823466e38f)) finite = 0; /* NaN or infinity */
        else if (a > A) A = a;
    }
    float D = A / (float)(QA_QMAX * QA_MMAX);
    qa->D = finite ? D : NAN;
    memset(qa->q, 0, n_pad);
    for (int j = 0; j < nb; j++) {
        int c0 = j * QA_BLOCK, c1 = c0 + QA_BLOCK < n ? c0 + QA_BLOCK : n;
        float a = 0.0f, inv = 0.0f;
        for (int c = c0; c < c1; c++) {
            float v = fabsf(x[c]);
            if (v > a) a = v;
        }
        int m = act_block_m(a, D, finite, &inv);
        if (m) {
            for (int c = c0; c < c1; c++) {
                float r = rintf(x[c] * inv);
                r = r > (float)QA_QMAX ? (float)QA_QMAX : r < -(float)QA_QMAX ? -(float)QA_QMAX : r;
                qa->q[c] = (int8_t)r;
            }
        }
        qa->m[j] = (uint8_t)m;
        qa->m16[j] = (int16_t)m;
    }
    qa->has_vnni = qa->has_perm = 0;
    if (flags & ACT_PLAIN) return 0;
    for (size_t base = 0; base < n_pad; base += 32) { /* perm32: the block's evens, then odds */
        for (size_t i = 0; i < 16; i++) {
            qa->qp[base + i] = qa->q[base + 2 * i];
            qa->qp[base + 16 + i] = qa->q[base + 2 * i + 1];
        }
    }
    for (size_t c = 0; c < n_pad; c++) {
        int v = qa->qp[c];
        qa->aqp[c] = (uint8_t)(v < 0 ? -v : v);
    }
    act_fill_perm64(qa);
    qa->has_perm = 1;
    if (flags & ACT_VNNI) act_fill_vnni(qa);
    return 0;
}

I8Layout i8_layout(const uint8_t *payload, int bits, int group_size, int rows, int cols) {
    I8Layout L;
    L.bits = bits;
    L.group_size = group_size;
    L.n_sub = (int)ditto_cb_n_sub((uint64_t)cols, (uint64_t)group_size);
    L.k = 1 << bits;
    L.row_bytes = (size_t)ditto_cb_row_bytes((uint64_t)cols, (uint32_t)bits);
    L.cent = (const int8_t *)(const void *)payload;
    L.scale = (const uint16_t *)(const void *)(
        payload + ditto_cb_centroid_bytes((uint64_t)rows, (uint64_t)cols, (uint32_t)bits,
                                          (uint64_t)group_size, DITTO_CB_I8));
    L.indices = payload + ditto_cb_codebook_bytes((uint64_t)rows, (uint64_t)cols, (uint32_t)bits,
                                                  (uint64_t)group_size, DITTO_CB_I8);
    L.end = L.indices + (size_t)rows * L.row_bytes;
    L.w8 = NULL;
    L.tiled = 0;
    return L;
}

void i8_retile(uint8_t *indices, int rows, size_t row_bytes, uint8_t *tmp) {
    const size_t chunks = row_bytes / I8_TILE_CHUNK, tile = I8_TILE_ROWS * row_bytes;
    for (int r = 0; r < rows; r += I8_TILE_ROWS) {
        uint8_t *t = indices + (size_t)r * row_bytes;
        memcpy(tmp, t, tile);
        for (size_t i = 0; i < I8_TILE_ROWS; i++)
            for (size_t j = 0; j < chunks; j++)
                memcpy(t + (j * I8_TILE_ROWS + i) * I8_TILE_CHUNK,
                       tmp + i * row_bytes + j * I8_TILE_CHUNK, I8_TILE_CHUNK);
    }
}

float i8_combine(const I8Layout *L, int r, const int64_t *T, float D) {
    const uint16_t *sc = L->scale + (size_t)r * (size_t)L->n_sub;
    double acc = 0.0;
    for (int s = 0; s < L->n_sub; s++) {
        double p = (double)f16_to_f32(sc[s]) * (double)T[s];
        acc = acc + p;
    }
    double y = acc * (double)D;
    return (float)y;
}

void i8_tail_indices(uint8_t out[16], const uint8_t *row, int c, int cols) {
    memset(out, 0, 16);
    size_t nbytes = (size_t)ditto_cb_row_bytes((uint64_t)(cols - c), 4u);
    memcpy(out, row + (size_t)c / 2, nbytes);
}

/* The 8 indices of group g of a packed row (FORMAT.md: b bytes, one little-endian integer). */
static void unpack8(const uint8_t *row, int bits, int g, int idx[8]) {
    const uint8_t *p = row + (size_t)g * (size_t)bits;
    uint64_t v = 0;
    for (int i = 0; i < bits; i++) v |= (uint64_t)p[i] << (8 * i);
    uint64_t mask = (UINT64_C(1) << bits) - 1u;
    for (int j = 0; j < 8; j++) idx[j] = (int)((v >> (j * bits)) & mask);
}

void i8cb_rows_generic(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                       int cols) {
    int64_t T[L->n_sub > 0 ? L->n_sub : 1];
    /* a tiled tensor's row gathered into one run of bytes first */
    uint8_t *gathered = L->tiled ? malloc(L->row_bytes) : NULL;
    if (L->tiled && !gathered) {
        fprintf(stderr, "ditto: out of memory gathering a row of %zu index bytes\n",
                L->row_bytes);
        abort();
    }
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
        if (gathered) {
            for (size_t j = 0; j < L->row_bytes / I8_TILE_CHUNK; j++)
                memcpy(gathered + j * I8_TILE_CHUNK, i8_b4_at(L, r, (int)j * 64), I8_TILE_CHUNK);
            row = gathered;
        }
        for (int s = 0; s < L->n_sub; s++) {
            const int8_t *cb = L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * (size_t)L->k;
            int c0 = s * L->group_size;
            int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
            int64_t t = 0;
            int idx[8], g = -1;
            for (int c = c0; c < c1; c++) {
                if (c / 8 != g) {
                    g = c / 8;
                    unpack8(row, L->bits, g, idx);
                }
                /* |m q cent| <= 255 * 127 * 127: exact in int32 */
                t += (int64_t)((int32_t)qa->m[c / QA_BLOCK] * qa->q[c] * cb[idx[c % 8]]);
            }
            T[s] = t;
        }
        y[r] = i8_combine(L, r, T, qa->D);
    }
    free(gathered);
}

void i8_decode_cols_generic(int8_t *w8, const I8Layout *L, int r, int c0, int cols) {
    const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
    for (int c = c0; c < cols; c += 8) {
        uint64_t v = ditto_cb_group(row, (uint64_t)c, (uint32_t)L->bits);
        for (int j = 0; j < 8 && c + j < cols; j++) {
            int s = (c + j) / L->group_size;
            size_t idx = (size_t)(v >> (j * L->bits)) & (size_t)(L->k - 1);
            w8[dec8_offset(r, c + j, cols)] =
                L->cent[((size_t)r * (size_t)L->n_sub + (size_t)s) * (size_t)L->k + idx];
        }
    }
    for (int c = cols; c < (int)dec8_stride(cols); c++) w8[dec8_offset(r, c, cols)] = 0;
}

void i8_decode_rows_generic(int8_t *w8, const I8Layout *L, int r0, int r1, int cols) {
    for (int r = r0; r < r1; r++) i8_decode_cols_generic(w8, L, r, 0, cols);
}
