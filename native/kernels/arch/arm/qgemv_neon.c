/* qgemv_neon.c: integer GEMV for int8 codebook tensors with b = 4, Arm NEON with the dot
 * product extension (Armv8.2-A DotProd: every Apple M-series core, Neoverse N1 and later)
 * (definitions in qgemv.h; docs/KERNELS.md "Integer kernels").
 *
 * Per 32 columns (one activation block, G % 32 == 0): the 16 index bytes give the even
 * columns' indices (low nibbles, vand) and the odd columns' (high nibbles, vshr), the perm32
 * order of the quantized activations; tbl looks each half up in the sub-block's 16 int8
 * centroids, and two sdot (signed x signed, no sign trick needed) sum the block into 4 int32
 * lanes, which are multiplied by the block multiplier m and accumulated (vmla). A lane gains at
 * most 8*127*127*255 per block, so the lanes move to int64 every 64 blocks.
 * i8cb_b6_rows_neon unpacks b = 6 with tbl and per-lane shifts; i8cb_rows_neon_any covers every
 * other b (G % 32 == 0) with multi-register tbl lookups.
 */
#include "../../qgemv.h"

#if defined(__aarch64__)

#include "simd_neon.h"

/* acc + m * (the 32 columns at c), index bytes at ip */
NEON_FN static inline int32x4_t block32_neon(int32x4_t acc, const uint8_t *ip, int8x16_t tbl,
                                             const QuantActs *qa, int c) {
    uint8x16_t v = vld1q_u8(ip);
    int8x16_t w_even = vqtbl1q_s8(tbl, vandq_u8(v, vdupq_n_u8(0x0f)));
    int8x16_t w_odd = vqtbl1q_s8(tbl, vshrq_n_u8(v, 4));
    int32x4_t d = vdotq_s32(vdupq_n_s32(0), w_even, vld1q_s8(qa->qp + c));
    d = vdotq_s32(d, w_odd, vld1q_s8(qa->qp + c + 16));
    return vmlaq_n_s32(acc, d, (int32_t)qa->m[c / 32]);
}

/* The row loop of a fixed-b kernel: per sub-block its table (type TBL_T, LOAD_TBL(centroids)
 * of its K int8 centroids), the whole 32-column chunks through BLOCK(acc, index bytes, table,
 * qa, column) with no calls in the loop (everything stays in registers), the row's partial
 * last chunk through a zero-padded copy of its index bytes (lanes to int64 every 64 chunks,
 * as above). */
#define NEON_ROWS_FIXED_B(BITS, K, TBL_T, LOAD_TBL, BLOCK)                                    \
    int64_t T[L->n_sub];                                                                    \
    const int full = cols & ~31; /* columns in whole chunks */                              \
    for (int r = r0; r < r1; r++) {                                                         \
        const uint8_t *row = L->indices + (size_t)r * L->row_bytes;                         \
        for (int s = 0; s < L->n_sub; s++) {                                                \
            const TBL_T tbl =                                                               \
                LOAD_TBL(L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * (K));       \
            int c0 = s * L->group_size;                                                     \
            int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;                 \
            int64_t t = 0;                                                                  \
            for (int c = c0; c < c1;) {                                                     \
                int stop = c + 64 * 32 < c1 ? c + 64 * 32 : c1;                             \
                int stop_full = stop < full ? stop : full;                                  \
                int32x4_t acc = vdupq_n_s32(0);                                             \
                for (; c < stop_full; c += 32)                                              \
                    acc = BLOCK(acc, row + (size_t)c / 8 * (BITS), tbl, qa, c);             \
                if (c < stop) {                                                             \
                    uint8_t tail[32] = {0};                                                 \
                    memcpy(tail, row + (size_t)c / 8 * (BITS),                              \
                           (size_t)ditto_cb_row_bytes((uint64_t)(cols - c), (BITS)));       \
                    acc = BLOCK(acc, tail, tbl, qa, c);                                     \
                    c = stop;                                                               \
                }                                                                           \
                t += vaddlvq_s32(acc);                                                      \
            }                                                                               \
            T[s] = t;                                                                       \
        }                                                                                   \
        y[r] = i8_combine(L, r, T, qa->D);                                                  \
    }

NEON_FN void i8cb_b4_rows_neon(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                               int cols) {
    NEON_ROWS_FIXED_B(4u, 16u, int8x16_t, vld1q_s8, block32_neon)
}

/* b = 6 (G % 32 == 0): 32 indices are 24 bytes (4 per 3 bytes), unpacked by tbl and per-lane
 * shifts (simd_neon.h b6_indices_neon); the 64 centroids are one 4-register tbl.
 * acc + m * (the 32 columns at c), index bytes at p */
NEON_FN static inline int32x4_t b6_block32_neon(int32x4_t acc, const uint8_t *p,
                                                int8x16x4_t tbl, const QuantActs *qa, int c) {
    uint8x16_t lo, hi;
    b6_indices_neon(p, &lo, &hi);
    int32x4_t d = vdotq_s32(vdupq_n_s32(0), vqtbl4q_s8(tbl, lo), vld1q_s8(qa->q + c));
    d = vdotq_s32(d, vqtbl4q_s8(tbl, hi), vld1q_s8(qa->q + c + 16));
    return vmlaq_n_s32(acc, d, (int32_t)qa->m[c / 32]);
}

NEON_FN void i8cb_b6_rows_neon(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                               int cols) {
    NEON_ROWS_FIXED_B(6u, 64u, int8x16x4_t, vld1q_s8_x4, b6_block32_neon)
}

/* Any b in 1..8 with G % 32 == 0: each group of 8 b-bit indices becomes 8 index bytes by
 * shifts, and the 32 bytes are looked up in the sub-block's K int8 centroids with tbl over up
 * to 4 registers (simd_neon.h); then two sdot with the activations in natural order. */
NEON_FN void i8cb_rows_neon_any(float *y, const QuantActs *qa, const I8Layout *L, int r0,
                                int r1, int cols) {
    int64_t T[L->n_sub];
    const int b = L->bits, k = L->k;
    int8x16x4_t tbl[4];
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
        for (int s = 0; s < L->n_sub; s++) {
            const int n4 = load_any_tables(
                tbl, L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * (size_t)k, k);
            int c0 = s * L->group_size;
            int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
            int64_t t = 0;
            for (int c = c0; c < c1;) {
                int stop = c + 64 * 32 < c1 ? c + 64 * 32 : c1;
                int32x4_t acc = vdupq_n_s32(0);
                for (; c < stop; c += 32) {
                    uint8x16_t i0, i1;
                    chunk_index_bytes(row, c, cols, b, L->end, &i0, &i1);
                    int32x4_t d = vdotq_s32(vdupq_n_s32(0), lookup_any(tbl, n4, i0),
                                            vld1q_s8(qa->q + c));
                    d = vdotq_s32(d, lookup_any(tbl, n4, i1), vld1q_s8(qa->q + c + 16));
                    acc = vmlaq_n_s32(acc, d, (int32_t)qa->m[c / 32]);
                }
                t += vaddlvq_s32(acc);
            }
            T[s] = t;
        }
        y[r] = i8_combine(L, r, T, qa->D);
    }
}

#endif
