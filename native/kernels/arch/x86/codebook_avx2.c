/* codebook_avx2.c: AVX2 GEMV for codebook tensors (docs/FORMAT.md "encoding = 1").
 *
 * One row at a time, sub-block by sub-block: the sub-block's K = 2^b centroids are converted to
 * float32 once (F16C for f16 codebooks), then each group of 8 packed indices becomes 8 int32
 * lanes and 8 weights by a table lookup, multiplied with x[8] into a vector accumulator (FMA).
 * The lookup, by bit width b:
 *   b = 1..3  K <= 8 centroids fit in one __m256: vpermps (_mm256_permutevar8x32_ps).
 *   b = 4     G % 8 == 0 (the default): byte planes, 32 weights per step with in-lane shuffles
 *             only (see row_dot_b4_planes). Otherwise 16 centroids in two __m256: vpermps on
 *             both, blend on bit 3 of the index, moved to the sign bit by a left shift
 *             (vblendvps reads only the sign bit).
 *   b = 5..8  vgatherdps from the converted centroids.
 * Index decode: b = 1..4 broadcast the group's 8*b <= 32 bits to all lanes and shift lane j
 * right by j*b (vpsrlvd); b = 8 zero-extends 8 bytes (vpmovzxbd); b = 5..7 pick, for lane j,
 * the 4 bytes starting at byte (j*b)/8 (vpshufb on the group broadcast to both 128-bit halves),
 * then shift right by (j*b) % 8 and mask.
 *
 * Groups of 8 that straddle two sub-blocks (G % 8 != 0) and a row's last partial group go
 * through scalar code. The sum is the reference's up to float32 summation order.
 *
 * Everything using AVX2 is in functions marked AVX2_FN; the rest is baseline C11.
 */
#include "codebook_avx2.h"

/* x86 only: an Arm build uses the NEON and generic kernel tables (kernels.c) */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../../codebook_ref.h"
#include "../../../model/ditto_format.h"

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))

int codebook_avx2_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}

/* Where things are in one codebook payload (FORMAT.md): matmul.h's CodebookLayout plus what
 * the SIMD paths need on top of it. */
typedef struct {
    const uint8_t *codebooks; /* [rows][n_sub][k] of f16 or f32 */
    const uint8_t *indices;   /* [rows][row_bytes] */
    const uint8_t *end;       /* one past the last index byte (no load may go beyond) */
    int is_f16, bits, group_size, n_sub, k;
    size_t row_bytes;
    /* b = 5..7 decode: lane j of a group = 4 bytes from byte (j*b)/8 (vpshufb control, 0x80 =
     * zero past the group's 8 bytes; both 128-bit halves alike), shifted right by (j*b) % 8 */
    uint8_t pick[32];
    int32_t shift[8];
} Layout;

static Layout layout_of(const uint8_t *payload, uint32_t codebook_type, int bits,
                        int group_size, int rows, int cols) {
    CodebookLayout C = codebook_layout(payload, codebook_type, bits, group_size, rows, cols);
    Layout L;
    L.codebooks = C.codebooks;
    L.indices = C.indices;
    L.is_f16 = C.is_f16;
    L.bits = C.bits;
    L.group_size = C.group_size;
    L.n_sub = C.n_sub;
    L.k = C.k;
    L.row_bytes = C.row_bytes;
    L.end = L.indices + (size_t)rows * L.row_bytes;
    for (int j = 0; j < 8; j++) {
        for (int t = 0; t < 4; t++) {
            int byte = j * bits / 8 + t;
            L.pick[4 * j + t] = byte < 8 ? (uint8_t)byte : 0x80;
        }
        L.shift[j] = j * bits % 8;
    }
    return L;
}

/* Index c of a packed row (scalar; for heads and tails). */
static int index_at(const uint8_t *row, int bits, int c) {
    return (int)ditto_cb_index(row, (uint64_t)c, (uint32_t)bits);
}

/* The b bytes of the group at p as a little-endian integer, reading 8 bytes at once when they
 * lie inside the payload. */
static uint64_t load_group(const uint8_t *p, int bits, const uint8_t *end) {
    uint64_t v = 0;
    if (end - p >= 8) {
        memcpy(&v, p, 8);
        return bits == 8 ? v : v & ((UINT64_C(1) << (8 * bits)) - 1u);
    }
    for (int i = 0; i < bits; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Centroids of sub-block s of row r as float32 into cb[0..k) (cb 32-byte aligned, >= 8). */
AVX2_FN static void load_centroids(float *cb, const Layout *L, int r, int s) {
    size_t i0 = ((size_t)r * (size_t)L->n_sub + (size_t)s) * (size_t)L->k;
    if (!L->is_f16) {
        memcpy(cb, L->codebooks + 4 * i0, (size_t)L->k * 4);
        return;
    }
    const uint8_t *src = L->codebooks + 2 * i0;
    if (L->k < 8) { /* b = 1, 2: pad to one vector */
        uint16_t h[8] = {0};
        memcpy(h, src, (size_t)L->k * 2);
        _mm256_store_ps(cb, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)h)));
        return;
    }
    for (int k = 0; k < L->k; k += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * (size_t)k));
        _mm256_store_ps(cb + k, _mm256_cvtph_ps(h));
    }
}

/* ---- groups [g0, g1) of one sub-block: acc += W[8g .. 8g+8) * x[8g .. 8g+8) ---- */

/* b = 1..3: lane j = (v >> j*b) & mask, one vpermps. Two accumulators (FMA latency). */
AVX2_FN static inline __m256 weights_b123(const uint8_t *row, int bits, int g, __m256 table,
                                          __m256i shift, __m256i mask) {
    const uint8_t *p = row + (size_t)g * (size_t)bits;
    uint32_t v = p[0];
    if (bits > 1) v |= (uint32_t)p[1] << 8;
    if (bits > 2) v |= (uint32_t)p[2] << 16;
    __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)v), shift), mask);
    return _mm256_permutevar8x32_ps(table, idx);
}

AVX2_FN static __m256 dot_b123(__m256 acc, const uint8_t *row, int bits, int g0, int g1,
                               const float *x, const float *cb) {
    const __m256 table = _mm256_load_ps(cb);
    const __m256i shift = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                             _mm256_set1_epi32(bits));
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    __m256 acc1 = _mm256_setzero_ps();
    int g = g0;
    for (; g + 2 <= g1; g += 2) {
        acc = _mm256_fmadd_ps(weights_b123(row, bits, g, table, shift, mask),
                              _mm256_loadu_ps(x + 8 * (size_t)g), acc);
        acc1 = _mm256_fmadd_ps(weights_b123(row, bits, g + 1, table, shift, mask),
                               _mm256_loadu_ps(x + 8 * (size_t)g + 8), acc1);
    }
    if (g < g1)
        acc = _mm256_fmadd_ps(weights_b123(row, bits, g, table, shift, mask),
                              _mm256_loadu_ps(x + 8 * (size_t)g), acc);
    return _mm256_add_ps(acc, acc1);
}

/* One group of b = 4: 8 nibbles in one 32-bit word. vpermps only reads bits 0..2 of each lane,
 * vblendvps only bit 31, so no mask is needed: bit 3 is moved to bit 31 by a shift of 28. */
AVX2_FN static inline __m256 lookup_b4(uint32_t v, __m256i shift, __m256 lo, __m256 hi) {
    __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32((int)v), shift);
    __m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx), _mm256_permutevar8x32_ps(hi, idx),
                            sel);
}

AVX2_FN static __m256 dot_b4(__m256 acc, const uint8_t *row, int g0, int g1, const float *x,
                             const float *cb) {
    const __m256 lo = _mm256_load_ps(cb), hi = _mm256_load_ps(cb + 8);
    const __m256i shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    __m256 acc1 = _mm256_setzero_ps();
    int g = g0;
    for (; g + 2 <= g1; g += 2) { /* two groups, two accumulators */
        uint32_t v[2];
        memcpy(v, row + 4 * (size_t)g, 8);
        acc = _mm256_fmadd_ps(lookup_b4(v[0], shift, lo, hi), _mm256_loadu_ps(x + 8 * (size_t)g),
                              acc);
        acc1 = _mm256_fmadd_ps(lookup_b4(v[1], shift, lo, hi),
                               _mm256_loadu_ps(x + 8 * (size_t)g + 8), acc1);
    }
    if (g < g1) {
        uint32_t v;
        memcpy(&v, row + 4 * (size_t)g, 4);
        acc = _mm256_fmadd_ps(lookup_b4(v, shift, lo, hi), _mm256_loadu_ps(x + 8 * (size_t)g),
                              acc);
    }
    return _mm256_add_ps(acc, acc1);
}

/* Scalar part of a sub-block: columns [c0, c1) with centroids cb. */
static float dot_scalar(const uint8_t *row, int bits, int c0, int c1, const float *x,
                        const float *cb) {
    float s = 0.0f;
    for (int c = c0; c < c1; c++) s += cb[index_at(row, bits, c)] * x[c];
    return s;
}

AVX2_FN static float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* b = 4, four groups (32 weights, 16 index bytes) at a time, by byte planes: the 16 float32
 * centroids are split into 4 tables of 16 bytes (plane k holds byte k of every centroid), each
 * looked up with one vpshufb; two rounds of unpacks (bytes, then 16-bit words) reassemble the
 * floats. Indices: the 16 bytes broadcast to both 128-bit halves, the low half keeps the low
 * nibbles (even weights), the high half the high nibbles (odd weights). The unpacks then leave
 * group g's weights in the order 0,2,4,6,1,3,5,7 - the order of xp, x permuted once per GEMV.
 * In-lane shuffles only (no vpermps, no vblendvps): 18 vector ops per 32 weights instead of
 * 32 for lookup_b4. */
static const int XP_ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

/* The 4 byte planes of the 16 centroids lo = cb[0..8), hi = cb[8..16), each broadcast to both
 * 128-bit halves. */
AVX2_FN static inline void planes_b4(__m256 lo, __m256 hi, __m256i plane[4]) {
    const __m256i transpose = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                               0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    /* per 128-bit half of 4 floats: dword k = byte k of the 4 floats */
    __m256i a = _mm256_shuffle_epi8(_mm256_castps_si256(lo), transpose);
    __m256i c = _mm256_shuffle_epi8(_mm256_castps_si256(hi), transpose);
    __m256i x = _mm256_permute2x128_si256(a, c, 0x20); /* floats 0-3 | 8-11 */
    __m256i y = _mm256_permute2x128_si256(a, c, 0x31); /* floats 4-7 | 12-15 */
    __m256i t01 = _mm256_unpacklo_epi32(x, y), t23 = _mm256_unpackhi_epi32(x, y);
    plane[0] = _mm256_permute4x64_epi64(t01, 0x88); /* qwords 0,2,0,2 */
    plane[1] = _mm256_permute4x64_epi64(t01, 0xdd); /* qwords 1,3,1,3 */
    plane[2] = _mm256_permute4x64_epi64(t23, 0x88);
    plane[3] = _mm256_permute4x64_epi64(t23, 0xdd);
}

/* Row r's dot product with x for b = 4 and G % 8 == 0 (no sub-block heads), xp = x in
 * XP_ORDER per group of 8. Four accumulators, kept across sub-blocks. */
AVX2_FN static float row_dot_b4_planes(const Layout *L, int r, const float *x, const float *xp,
                                       int cols) {
    const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
    const size_t cb0 = (size_t)r * (size_t)L->n_sub * 16u;
    const __m256i nibble_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    for (int s = 0; s < L->n_sub; s++) {
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols; /* tail sub-block */
        int g0 = c0 / 8, g1 = c1 / 8;
        __m256 lo, hi;
        size_t i0 = cb0 + 16u * (size_t)s;
        if (L->is_f16) {
            const uint8_t *src = L->codebooks + 2 * i0;
            lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)src));
            hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + 16)));
        } else {
            lo = _mm256_loadu_ps((const float *)(const void *)(L->codebooks + 4 * i0));
            hi = _mm256_loadu_ps((const float *)(const void *)(L->codebooks + 4 * i0 + 32));
        }
        __m256i plane[4];
        planes_b4(lo, hi, plane);
        int g = g0;
        for (; g + 4 <= g1; g += 4) {
            __m128i bytes = _mm_loadu_si128((const __m128i *)(const void *)(row + 4 * (size_t)g));
            __m256i idx = _mm256_and_si256(
                _mm256_srlv_epi32(_mm256_broadcastsi128_si256(bytes), nibble_shift), low4);
            __m256i b0 = _mm256_shuffle_epi8(plane[0], idx);
            __m256i b1 = _mm256_shuffle_epi8(plane[1], idx);
            __m256i b2 = _mm256_shuffle_epi8(plane[2], idx);
            __m256i b3 = _mm256_shuffle_epi8(plane[3], idx);
            __m256i w01lo = _mm256_unpacklo_epi8(b0, b1), w01hi = _mm256_unpackhi_epi8(b0, b1);
            __m256i w23lo = _mm256_unpacklo_epi8(b2, b3), w23hi = _mm256_unpackhi_epi8(b2, b3);
            const float *xg = xp + 8 * (size_t)g;
            acc0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(w01lo, w23lo)),
                                   _mm256_loadu_ps(xg), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(w01lo, w23lo)),
                                   _mm256_loadu_ps(xg + 8), acc1);
            acc2 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(w01hi, w23hi)),
                                   _mm256_loadu_ps(xg + 16), acc2);
            acc3 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(w01hi, w23hi)),
                                   _mm256_loadu_ps(xg + 24), acc3);
        }
        const __m256i shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        for (; g < g1; g++) { /* 1..3 groups left */
            uint32_t v;
            memcpy(&v, row + 4 * (size_t)g, 4);
            acc0 = _mm256_fmadd_ps(lookup_b4(v, shift, lo, hi), _mm256_loadu_ps(x + 8 * (size_t)g),
                                   acc0);
        }
        if (8 * g1 < c1) { /* the row's last, partial group */
            _Alignas(32) float cb[16];
            _mm256_store_ps(cb, lo);
            _mm256_store_ps(cb + 8, hi);
            acc0 = _mm256_add_ps(acc0, _mm256_setr_ps(dot_scalar(row, 4, 8 * g1, c1, x, cb), 0, 0,
                                                      0, 0, 0, 0, 0));
        }
    }
    return hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

/* b = 8: one byte per index, zero-extended, then gathered. */
AVX2_FN static __m256 dot_b8(__m256 acc, const uint8_t *row, int g0, int g1, const float *x,
                             const float *cb) {
    __m256 acc1 = _mm256_setzero_ps();
    int g = g0;
    for (; g + 2 <= g1; g += 2) {
        __m128i bytes = _mm_loadu_si128((const __m128i *)(const void *)(row + 8 * (size_t)g));
        __m256 w0 = _mm256_i32gather_ps(cb, _mm256_cvtepu8_epi32(bytes), 4);
        __m256 w1 = _mm256_i32gather_ps(cb, _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)), 4);
        acc = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + 8 * (size_t)g), acc);
        acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8 * (size_t)g + 8), acc1);
    }
    if (g < g1) {
        __m128i bytes = _mm_loadl_epi64((const __m128i *)(const void *)(row + 8 * (size_t)g));
        __m256 w = _mm256_i32gather_ps(cb, _mm256_cvtepu8_epi32(bytes), 4);
        acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 8 * (size_t)g), acc);
    }
    return _mm256_add_ps(acc, acc1);
}

/* b = 5..7: lane j takes bytes (j*b)/8 .. +3 of the group (vpshufb with L->pick), shifted
 * right by (j*b) % 8 (L->shift) and masked; then gathered. */
AVX2_FN static inline __m256 weights_b567(const uint8_t *row, int g, const Layout *L,
                                          __m256i pick, __m256i shift, __m256i mask,
                                          const float *cb) {
    uint64_t v = load_group(row + (size_t)g * (size_t)L->bits, L->bits, L->end);
    __m256i both = _mm256_broadcastsi128_si256(_mm_cvtsi64_si128((long long)v));
    __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(both, pick), shift),
                                   mask);
    return _mm256_i32gather_ps(cb, idx, 4);
}

AVX2_FN static __m256 dot_b567(__m256 acc, const uint8_t *row, const Layout *L, int g0, int g1,
                               const float *x, const float *cb) {
    const __m256i pick = _mm256_loadu_si256((const __m256i *)(const void *)L->pick);
    const __m256i shift = _mm256_loadu_si256((const __m256i *)(const void *)L->shift);
    const __m256i mask = _mm256_set1_epi32((1 << L->bits) - 1);
    __m256 acc1 = _mm256_setzero_ps();
    int g = g0;
    for (; g + 2 <= g1; g += 2) {
        acc = _mm256_fmadd_ps(weights_b567(row, g, L, pick, shift, mask, cb),
                              _mm256_loadu_ps(x + 8 * (size_t)g), acc);
        acc1 = _mm256_fmadd_ps(weights_b567(row, g + 1, L, pick, shift, mask, cb),
                               _mm256_loadu_ps(x + 8 * (size_t)g + 8), acc1);
    }
    if (g < g1)
        acc = _mm256_fmadd_ps(weights_b567(row, g, L, pick, shift, mask, cb),
                              _mm256_loadu_ps(x + 8 * (size_t)g), acc);
    return _mm256_add_ps(acc, acc1);
}

/* Dot product of row r with x[cols]. */
AVX2_FN static float row_dot_avx2(const Layout *L, int r, const float *x, int cols) {
    const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
    _Alignas(32) float cb[256];
    memset(cb, 0, 8 * sizeof(float)); /* b < 3: the lanes of the table past K */
    __m256 acc = _mm256_setzero_ps();
    float rest = 0.0f;
    for (int s = 0; s < L->n_sub; s++) {
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols; /* tail sub-block */
        load_centroids(cb, L, r, s);
        int g0 = (c0 + 7) / 8, g1 = c1 / 8; /* whole groups inside [c0, c1) */
        if (g0 >= g1) {
            rest += dot_scalar(row, L->bits, c0, c1, x, cb);
            continue;
        }
        rest += dot_scalar(row, L->bits, c0, 8 * g0, x, cb);
        switch (L->bits) {
        case 4: acc = dot_b4(acc, row, g0, g1, x, cb); break;
        case 8: acc = dot_b8(acc, row, g0, g1, x, cb); break;
        case 1: case 2: case 3: acc = dot_b123(acc, row, L->bits, g0, g1, x, cb); break;
        default: acc = dot_b567(acc, row, L, g0, g1, x, cb); break;
        }
        rest += dot_scalar(row, L->bits, 8 * g1, c1, x, cb);
    }
    return hsum(acc) + rest;
}

void codebook_gemv_avx2(float *y, const float *x, const uint8_t *payload, uint32_t codebook_type,
                        int bits, int group_size, int rows, int cols) {
    if (bits < 1 || bits > 8 || group_size < 8 || !codebook_avx2_supported()) {
        codebook_gemv_ref(y, x, payload, codebook_type, bits, group_size, rows, cols);
        return;
    }
    Layout L = layout_of(payload, codebook_type, bits, group_size, rows, cols);
    /* b = 4: x with each group of 8 in XP_ORDER, shared by all rows (NULL: slower path) */
    float *xp = NULL;
    if (bits == 4 && group_size % 8 == 0) {
        size_t n = (size_t)(cols / 8) * 8;
        xp = malloc((n > 0 ? n : 8) * sizeof *xp);
        for (size_t c = 0; xp && c < n; c++) xp[c] = x[c - c % 8 + (size_t)XP_ORDER[c % 8]];
    }
    int r;
#pragma omp parallel for schedule(static) private(r)
    for (r = 0; r < rows; r++)
        y[r] = xp ? row_dot_b4_planes(&L, r, x, xp, cols) : row_dot_avx2(&L, r, x, cols);
    free(xp);
}

#endif
