/* simd_neon.h: the NEON building blocks shared by the integer GEMV (qgemv_neon.c) and GEMM
 * (qgemm_neon.c) kernels: b = 6 and any-b index unpacking and the int8 centroid lookup over
 * up to 256 entries. Internal to those files (static inline, aarch64 only). */
#ifndef DITTO_SIMD_NEON_H
#define DITTO_SIMD_NEON_H

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#include "../../qgemv.h"

/* Armv8.2-A DotProd (sdot); the rest of the program stays baseline Armv8-A. Spelled as an
 * arch so that gcc accepts it as well as clang (gcc 12 refuses a bare "dotprod"). */
#define NEON_FN __attribute__((target("arch=armv8.2-a+dotprod")))

/* b = 6: the 32 indices of a 24-byte chunk at p as bytes in column order, columns 0..15 in *lo
 * and 16..31 in *hi. tbl places under each index the 16-bit word holding it (from bytes 0..15
 * and 8..23 of the chunk, so nothing past it is read), a per-lane shift right by 0, 6, 4 or 10
 * and a mask bring its 6 bits down, and vmovn narrows the words to bytes. */
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

/* Any b in 1..8: the 8 b-bit indices of the group at p as 8 index bytes (bytes past `end` are
 * not read). */
static inline uint64_t group_index_bytes(const uint8_t *p, int bits, const uint8_t *end) {
    uint64_t v = 0, out = 0, mask = (UINT64_C(1) << bits) - 1u;
    memcpy(&v, p, end - p >= 8 ? 8 : (size_t)bits);
    for (int j = 0; j < 8; j++) out |= ((v >> (j * bits)) & mask) << (8 * j);
    return out;
}

/* The 32 indices of the chunk at column c (a multiple of 32) of a packed b-bit row as bytes in
 * column order: columns c..c+15 in *i0, c+16..c+31 in *i1 (groups past the row's last column
 * give index 0). */
static inline void chunk_index_bytes(const uint8_t *row, int c, int cols, int bits,
                                     const uint8_t *end, uint8x16_t *i0, uint8x16_t *i1) {
    uint64_t g[4] = {0, 0, 0, 0};
    for (int j = 0; j < 4 && c + 8 * j < cols; j++)
        g[j] = group_index_bytes(row + (size_t)(c / 8 + j) * (size_t)bits, bits, end);
    *i0 = vreinterpretq_u8_u64(vcombine_u64(vcreate_u64(g[0]), vcreate_u64(g[1])));
    *i1 = vreinterpretq_u8_u64(vcombine_u64(vcreate_u64(g[2]), vcreate_u64(g[3])));
}

/* A sub-block's K int8 centroids cb as n4 = max(1, K / 64) four-register tables (K < 64 is
 * zero-padded; the entries past K are never looked up). */
static inline int load_any_tables(int8x16x4_t tbl[4], const int8_t *cb, int k) {
    int8_t pad[64];
    if (k < 64) {
        memset(pad, 0, sizeof pad);
        memcpy(pad, cb, (size_t)k);
        cb = pad;
    }
    int n4 = k > 64 ? k / 64 : 1;
    for (int i = 0; i < n4; i++) tbl[i] = vld1q_s8_x4(cb + 64 * i);
    return n4;
}

/* The centroids of 16 index bytes: tbl over 4 registers (64 entries; an index past the table
 * gives 0, so larger tables are the OR of the lookups of idx, idx - 64, ...). */
static inline int8x16_t lookup_any(const int8x16x4_t *tbl, int n4, uint8x16_t idx) {
    int8x16_t w = vqtbl4q_s8(tbl[0], idx);
    for (int i = 1; i < n4; i++) /* entries 64 i .. 64 i + 63 */
        w = vorrq_s8(w, vqtbl4q_s8(tbl[i], vsubq_u8(idx, vdupq_n_u8((uint8_t)(64 * i)))));
    return w;
}

#endif
