/* qgemm_neon.c: integer GEMM for int8 codebook tensors, Arm NEON with the dot product
 * extension (Armv8.2-A DotProd, as the GEMV kernels of qgemv_neon.c): Y[t][r] for T quantized
 * inputs (batched prefill; kernels.h gemm_i8). Bit-identical to the GEMV kernels, whose
 * definition it shares (qgemv.h): only the order of the exact integer sums changes, and the
 * float part is i8_combine itself.
 *
 * A GEMV spends half of its work turning index bytes into int8 weights (unpack, tbl lookup);
 * with T inputs that work is done once per row: the row's weights are decoded into an int8
 * buffer (cols bytes, in L1 while the inputs pass over it), in the order of the activations
 * they meet (perm32 for b = 4, straight from the nibble split; column order otherwise). A row
 * then meets four inputs at a time: each 32-weight load serves four inputs, each of which
 * costs two sdot (signed x signed int8, 4 int32 lanes) and one mla by its block multiplier m
 * (broadcast from an int32 copy of the multipliers made once per call).
 */
#include "../../qgemv.h"

#if defined(__aarch64__)

#include <stdio.h>
#include <stdlib.h>

#include "simd_neon.h"

/* The 32 weights of a b = 4 chunk (16 index bytes at ip) in perm32 order, and of a b = 6
 * chunk (24 index bytes at ip) in column order, stored at w. */
NEON_FN static inline void decode_b4(int8_t *w, const uint8_t *ip, int8x16_t tbl) {
    uint8x16_t v = vld1q_u8(ip);
    vst1q_s8(w, vqtbl1q_s8(tbl, vandq_u8(v, vdupq_n_u8(0x0f))));
    vst1q_s8(w + 16, vqtbl1q_s8(tbl, vshrq_n_u8(v, 4)));
}

NEON_FN static inline void decode_b6(int8_t *w, const uint8_t *ip, int8x16x4_t tbl) {
    uint8x16_t lo, hi;
    b6_indices_neon(ip, &lo, &hi);
    vst1q_s8(w, vqtbl4q_s8(tbl, lo));
    vst1q_s8(w + 16, vqtbl4q_s8(tbl, hi));
}

/* Row r's int8 weights for all of its columns rounded up to whole 32-column chunks: b = 4 in
 * perm32 order (the order of qa->qp), every other b in column order (that of qa->q). Padding
 * columns get some centroid; the activations they meet are 0. For b = 4 and 6 the whole
 * chunks go through a call-free loop (the table stays in registers) and the row's partial
 * last chunk through a zero-padded copy of its index bytes, after the loop. */
NEON_FN static void decode_row8(int8_t *w, const I8Layout *L, int r, int cols) {
    const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
    const int b = L->bits, full = cols & ~31; /* columns in whole chunks */
    for (int s = 0; s < L->n_sub; s++) {
        const int8_t *cb = L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * (size_t)L->k;
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
        int c1_full = c1 < full ? c1 : full, c = c0;
        if (b == 4) {
            const int8x16_t tbl = vld1q_s8(cb);
            for (; c < c1_full; c += 32) decode_b4(w + c, row + c / 2, tbl);
            if (c < c1) {
                uint8_t tail[16];
                i8_tail_indices(tail, row, c, cols);
                decode_b4(w + c, tail, tbl);
            }
        } else if (b == 6) {
            const int8x16x4_t tbl = vld1q_s8_x4(cb);
            for (; c < c1_full; c += 32) decode_b6(w + c, row + (size_t)c / 32 * 24u, tbl);
            if (c < c1) {
                uint8_t tail[24] = {0};
                memcpy(tail, row + (size_t)c / 32 * 24u,
                       (size_t)ditto_cb_row_bytes((uint64_t)(cols - c), 6u));
                decode_b6(w + c, tail, tbl);
            }
        } else {
            int8x16x4_t tbl[4];
            const int n4 = load_any_tables(tbl, cb, L->k);
            for (int c = c0; c < c1; c += 32) {
                uint8x16_t i0, i1;
                chunk_index_bytes(row, c, cols, b, L->end, &i0, &i1);
                vst1q_s8(w + c, lookup_any(tbl, n4, i0));
                vst1q_s8(w + c + 16, lookup_any(tbl, n4, i1));
            }
        }
    }
}

/* The exact integer sums T0..T3[s] of one row's decoded weights w against four inputs
 * (activations x0..x3 in w's order, block multipliers m0..m3 as int32, so that each is one
 * ld1r). Per 32 weights and input: one 32-byte load, one ld1r, two sdot (their accumulator
 * zeroed by one movi) and one mla. A lane gains at most 8 * 127 * 127 * 255 per block, so
 * the int32 lanes move to int64 every 64 blocks, as in the GEMV kernels. */
NEON_FN static void row_x4(int64_t *T0, int64_t *T1, int64_t *T2, int64_t *T3,
                           const int8_t *w, const int8_t *x0, const int8_t *x1, const int8_t *x2,
                           const int8_t *x3, const int32_t *m0, const int32_t *m1,
                           const int32_t *m2, const int32_t *m3, const I8Layout *L, int cols) {
    /* the sub-blocks and their runs of blocks follow each other: the pointers just advance */
    const int8_t *wp = w, *p0 = x0, *p1 = x1, *p2 = x2, *p3 = x3;
    const int32_t *q0 = m0, *q1 = m1, *q2 = m2, *q3 = m3;
    for (int s = 0; s < L->n_sub; s++) {
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
        int64_t t0 = 0, t1 = 0, t2 = 0, t3 = 0;
        for (int left = (c1 - c0 + 31) / 32; left > 0;) { /* blocks of the sub-block */
            int n = left < 64 ? left : 64;
            left -= n;
            int32x4_t a0 = vdupq_n_s32(0), a1 = a0, a2 = a0, a3 = a0;
            for (; n > 0; n--) {
                const int8x16x2_t wv = vld1q_s8_x2(wp);
                wp += 32;
#define DOT32(acc, p, q)                                                                       \
    do {                                                                                       \
        const int8x16x2_t xv = vld1q_s8_x2(p);                                                 \
        p += 32;                                                                               \
        int32x4_t d = vdotq_s32(vdupq_n_s32(0), wv.val[0], xv.val[0]);                         \
        acc = vmlaq_s32(acc, vdotq_s32(d, wv.val[1], xv.val[1]), vld1q_dup_s32(q++));          \
    } while (0)
                DOT32(a0, p0, q0);
                DOT32(a1, p1, q1);
                DOT32(a2, p2, q2);
                DOT32(a3, p3, q3);
#undef DOT32
            }
            t0 += vaddlvq_s32(a0);
            t1 += vaddlvq_s32(a1);
            t2 += vaddlvq_s32(a2);
            t3 += vaddlvq_s32(a3);
        }
        T0[s] = t0;
        T1[s] = t1;
        T2[s] = t2;
        T3[s] = t3;
    }
}

NEON_FN void i8cb_gemm_neon(float *Y, const QuantActs *qa, int T, const I8Layout *L, int r0,
                            int r1, int rows, int cols, const GemmPrep *prep) {
    (void)prep; /* none: the NEON GEMM reads the inputs' arrays directly */
    const int nblk = qa[0].n_pad / QA_BLOCK, n_sub = L->n_sub;
    int8_t w[(cols + 31) & ~31];
    int64_t sums[4][n_sub];
    int32_t *m = malloc((size_t)T * (size_t)nblk * sizeof *m);
    if (!m) {
        fprintf(stderr, "ditto: out of memory for %d activation block multipliers of %d\n", T,
                nblk);
        abort();
    }
    for (int t = 0; t < T; t++)
        for (int j = 0; j < nblk; j++) m[(size_t)t * (size_t)nblk + (size_t)j] = qa[t].m[j];
    for (int r = r0; r < r1; r++) {
        decode_row8(w, L, r, cols);
        for (int t = 0; t < T; t += 4) {
            int u[4];
            for (int j = 0; j < 4; j++) u[j] = t + j < T ? t + j : T - 1; /* past T: repeat */
#define ACTS(j) (L->bits == 4 ? qa[u[j]].qp : qa[u[j]].q)
#define MULS(j) (m + (size_t)u[j] * (size_t)nblk)
            row_x4(sums[0], sums[1], sums[2], sums[3], w, ACTS(0), ACTS(1), ACTS(2), ACTS(3),
                   MULS(0), MULS(1), MULS(2), MULS(3), L, cols);
#undef ACTS
#undef MULS
            for (int j = 0; j < 4 && t + j < T; j++)
                Y[(size_t)(t + j) * (size_t)rows + (size_t)r] =
                    i8_combine(L, r, sums[j], qa[t + j].D);
        }
    }
    free(m);
}

#endif
