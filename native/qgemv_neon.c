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
#include "qgemv.h"
#include "kernels.h"

#if defined(__aarch64__)

#include <arm_neon.h>
#include <string.h>

#define NEON_FN __attribute__((target("dotprod")))

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


/* b = 6 (G % 32 == 0): 32 indices are 24 bytes (4 per 3 bytes). tbl places under each index
 * the 16-bit word holding it (from bytes 0..15 and 8..23 of the chunk, so nothing past it is
 * read), a per-lane shift right by 0, 6, 4 or 10 and a mask bring its 6 bits down, and vmovn
 * narrows the words to bytes in column order. The 64 centroids are one 4-register tbl. */
NEON_FN static inline void b6_indices_neon(const uint8_t *p, uint8x16_t *lo, uint8x16_t *hi) {
    static const uint8_t pick[4][16] = {
        {0, 1, 0, 1, 1, 2, 1, 2, 3, 4, 3, 4, 4, 5, 4, 5},
        {6, 7, 6, 7, 7, 8, 7, 8, 9, 10, 9, 10, 10, 11, 10, 11},
        {4, 5, 4, 5, 5, 6, 5, 6, 7, 8, 7, 8, 8, 9, 8, 9},
        {10, 11, 10, 11, 11, 12, 11, 12, 13, 14, 13, 14, 14, 15, 14, 15}};
    static const int16_t shifts[8] = {0, -6, -4, -10, 0, -6, -4, -10};
    const int16x8_t sh = vld1q_s16(shifts);
    const uint16x8_t six = vdupq_n_u16(0x3f);
    uint8x16_t v0 = vld1q_u8(p), v1 = vld1q_u8(p + 8);
    uint16x8_t w[4];
    for (int i = 0; i < 4; i++) {
        uint8x16_t words = vqtbl1q_u8(i < 2 ? v0 : v1, vld1q_u8(pick[i]));
        w[i] = vandq_u16(vshlq_u16(vreinterpretq_u16_u8(words), sh), six);
    }
    *lo = vcombine_u8(vmovn_u16(w[0]), vmovn_u16(w[1]));
    *hi = vcombine_u8(vmovn_u16(w[2]), vmovn_u16(w[3]));
}

/* acc + m * (the 32 columns at c), index bytes at p */
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
 * to 4 registers (64 entries; an index past the table gives 0, so larger tables are the OR of
 * lookups of idx, idx - 64, ...); then two sdot with the activations in natural order. */
static inline uint64_t group_index_bytes(const uint8_t *p, int bits, const uint8_t *end) {
    uint64_t v = 0, out = 0, mask = (UINT64_C(1) << bits) - 1u;
    memcpy(&v, p, end - p >= 8 ? 8 : (size_t)bits);
    for (int j = 0; j < 8; j++) out |= ((v >> (j * bits)) & mask) << (8 * j);
    return out;
}

NEON_FN static inline int8x16_t lookup_any(const int8x16x4_t *tbl, int n4, uint8x16_t idx) {
    int8x16_t w = vqtbl4q_s8(tbl[0], idx);
    for (int i = 1; i < n4; i++) /* entries 64 i .. 64 i + 63 */
        w = vorrq_s8(w, vqtbl4q_s8(tbl[i], vsubq_u8(idx, vdupq_n_u8((uint8_t)(64 * i)))));
    return w;
}

NEON_FN void i8cb_rows_neon_any(float *y, const QuantActs *qa, const I8Layout *L, int r0,
                                int r1, int cols) {
    int64_t T[L->n_sub];
    const int b = L->bits, k = L->k, n4 = k > 64 ? k / 64 : 1;
    int8x16x4_t tbl[4];
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
        for (int s = 0; s < L->n_sub; s++) {
            const int8_t *cb = L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * (size_t)k;
            int8_t pad[256];
            memset(pad, 0, 64);
            memcpy(pad, cb, (size_t)k);
            if (k < 64) cb = pad; /* the entries past K are never looked up */
            for (int i = 0; i < n4; i++) tbl[i] = vld1q_s8_x4(cb + 64 * i);
            int c0 = s * L->group_size;
            int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
            int64_t t = 0;
            for (int c = c0; c < c1;) {
                int stop = c + 64 * 32 < c1 ? c + 64 * 32 : c1;
                int32x4_t acc = vdupq_n_s32(0);
                for (; c < stop; c += 32) {
                    uint64_t g[4] = {0, 0, 0, 0};
                    for (int j = 0; j < 4 && c + 8 * j < cols; j++)
                        g[j] = group_index_bytes(row + (size_t)(c / 8 + j) * (size_t)b, b,
                                                 L->end);
                    uint8x16_t i0 = vreinterpretq_u8_u64(vcombine_u64(vcreate_u64(g[0]),
                                                                      vcreate_u64(g[1])));
                    uint8x16_t i1 = vreinterpretq_u8_u64(vcombine_u64(vcreate_u64(g[2]),
                                                                      vcreate_u64(g[3])));
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
