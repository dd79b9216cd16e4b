/* qgemv_avx512.c: integer GEMV for int8 codebook tensors with b = 4, AVX-512 VNNI (+ VBMI):
 * 128 columns per step in zmm registers (definitions in qgemv.h; docs/KERNELS.md "Integer
 * kernels").
 */
#include "../../qgemv.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <string.h>

#include "simd_avx2.h"

/* ---- b = 4 over 128 columns per step (perm128 activations), zmm ----
 * The 64 index bytes of 128 columns are one load; their low nibbles (the even columns) and,
 * after a 16-bit shift right by 4, their high nibbles (the odd columns) are looked up in the
 * sub-block's 16 centroids, stored as the unsigned bytes w + 128 (the table xor 0x80). With
 * VBMI the lookup is vpermb on the table repeated in all four lanes: it reads index bits 0..5,
 * and bits 4..5 (the neighbouring nibble) only pick which copy, so no mask is needed; without
 * VBMI it is vpand 0x0f + vpshufb. vpdpbusd multiplies those unsigned weights by the signed
 * bytes ml and mh of m * q (qgemv.h), so per sub-block
 *   sum (w + 128) (256 mh + ml) = T + 128 * sum m q,  T = (lo lanes) + 256 (hi lanes) - corr.
 * Four rows at a time (one activation load per four rows, 8 accumulators); G <= 512 keeps
 * |T| < 2^31, so every sum is formed modulo 2^32 (wrapping int32 lanes) and comes out exact.
 * Other G, and the last r1 - r0 mod 4 rows, go to REST (the same bits). */

#define VNNI512_F16C_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")))
#define VBMI512_F16C_FN                                                                        \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,f16c")))

void i8cb_b4_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                       int cols);
void i8cb_rows_avx512vbmi_any(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                              int cols);

#define LOOKUP128_PERMB(tbl, v) _mm512_permutexvar_epi8((v), (tbl))
#define LOOKUP128_PSHUFB(tbl, v) _mm512_shuffle_epi8((tbl), _mm512_and_si512((v), low4))

/* 128 columns of one row (index bytes at ip): lo and hi gain the dot products. */
#define STEP128(LOOKUP, ip, tbl, lo, hi)                                                       \
    STEP128_V(LOOKUP, _mm512_loadu_si512((const void *)(ip)), tbl, lo, hi)

/* The same on 64 index bytes already loaded (v). */
#define STEP128_V(LOOKUP, v, tbl, lo, hi)                                                      \
    do {                                                                                       \
        __m512i v_ = (v);                                                                      \
        __m512i we_ = LOOKUP(tbl, v_), wo_ = LOOKUP(tbl, _mm512_srli_epi16(v_, 4));            \
        lo = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(lo, we_, ale), wo_, alo);                 \
        hi = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(hi, we_, ahe), wo_, aho);                 \
    } while (0)

/* The same for a last step of at most 64 columns, in ymm: the 32 index bytes v of the chunk's
 * first 64 columns meet the activations at c (their even columns) and c + 64 (their odd
 * columns) of the perm128 order, loaded by ACTS64; lo and hi gain the sums in their low 8
 * lanes. A ymm step costs half a zmm one, and the last sub-block of a 576-column row with
 * G = 256 (SmolLM2) is 64 columns wide. */
#define LOOKUP64_PERMB(tbl, v) _mm256_permutexvar_epi8((v), _mm512_castsi512_si256(tbl))
#define LOOKUP64_PSHUFB(tbl, v)                                                                \
    _mm256_shuffle_epi8(_mm512_castsi512_si256(tbl),                                           \
                        _mm256_and_si256((v), _mm512_castsi512_si256(low4)))
#define STEP64(LOOKUP, v, tbl, lo, hi)                                                         \
    do {                                                                                       \
        __m256i v_ = (v), z_ = _mm256_setzero_si256();                                         \
        __m256i we_ = LOOKUP(tbl, v_), wo_ = LOOKUP(tbl, _mm256_srli_epi16(v_, 4));            \
        lo = _mm512_add_epi32(lo, _mm512_zextsi256_si512(_mm256_dpbusd_epi32(                  \
                                      _mm256_dpbusd_epi32(z_, we_, ale), wo_, alo)));          \
        hi = _mm512_add_epi32(hi, _mm512_zextsi256_si512(_mm256_dpbusd_epi32(                  \
                                      _mm256_dpbusd_epi32(z_, we_, ahe), wo_, aho)));          \
    } while (0)

/* The index line at byte off of each of the four rows into L2: one line per row per step,
 * i8_prefetch_ahead() past the row, so the loads of the rows the kernel reaches next are in
 * flight while these compute (the hardware prefetcher alone, or one burst per four-row group,
 * keeps fewer of them in flight: docs/KERNELS.md "In-loop prefetch"). */
#define PREFETCH4(row, off)                                                                    \
    do {                                                                                       \
        for (int i_ = 0; i_ < 4; i_++)                                                         \
            _mm_prefetch((const char *)(row)[i_] + (off), _MM_HINT_T1);                        \
    } while (0)

#define ACTS128(c)                                                                             \
    const __m512i ale = _mm512_loadu_si512((const void *)(qa->ml + (c)));                      \
    const __m512i alo = _mm512_loadu_si512((const void *)(qa->ml + (c) + 64));                 \
    const __m512i ahe = _mm512_loadu_si512((const void *)(qa->mh + (c)));                      \
    const __m512i aho = _mm512_loadu_si512((const void *)(qa->mh + (c) + 64))

#define ACTS64(c)                                                                              \
    const __m256i ale = _mm256_loadu_si256((const __m256i *)(const void *)(qa->ml + (c)));     \
    const __m256i alo = _mm256_loadu_si256((const __m256i *)(const void *)(qa->ml + (c) + 64)); \
    const __m256i ahe = _mm256_loadu_si256((const __m256i *)(const void *)(qa->mh + (c)));     \
    const __m256i aho = _mm256_loadu_si256((const __m256i *)(const void *)(qa->mh + (c) + 64))

/* The mask of the index bytes of the last n < 128 columns of a b = 4 row (ceil(n / 2) bytes):
 * a masked load reads none of the bytes past it, so it never touches memory past the tensor,
 * and gives the zero-padded step that index 0 times zero activations makes exact. */
static inline __mmask64 tail_mask64(int n) {
    return (__mmask64)(~0ull >> (64u - (unsigned)(n + 1) / 2u));
}

/* The sums of four rows' 16 lanes of lo + 256 hi (wrapping int32), row i in lane i: the lo/hi
 * folds and a transpose tree of in-lane unpacks in zmm, then the four 128-bit lanes added
 * (fewer cross-lane steps than folding each row to 8 lanes and a vphaddd tree). */
__attribute__((target("avx512f,avx2"))) static inline __m128i
sum4_lohi(__m512i l0, __m512i h0, __m512i l1, __m512i h1, __m512i l2, __m512i h2, __m512i l3,
          __m512i h3) {
    const __m512i t0 = _mm512_add_epi32(l0, _mm512_slli_epi32(h0, 8));
    const __m512i t1 = _mm512_add_epi32(l1, _mm512_slli_epi32(h1, 8));
    const __m512i t2 = _mm512_add_epi32(l2, _mm512_slli_epi32(h2, 8));
    const __m512i t3 = _mm512_add_epi32(l3, _mm512_slli_epi32(h3, 8));
    /* per 128-bit lane: rows 0, 1 (2, 3) with their lanes 0+2 and 1+3 */
    const __m512i a =
        _mm512_add_epi32(_mm512_unpacklo_epi32(t0, t1), _mm512_unpackhi_epi32(t0, t1));
    const __m512i b =
        _mm512_add_epi32(_mm512_unpacklo_epi32(t2, t3), _mm512_unpackhi_epi32(t2, t3));
    /* per 128-bit lane: rows 0, 1, 2, 3 */
    const __m512i c = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    const __m256i d = _mm256_add_epi32(_mm512_castsi512_si256(c), _mm512_extracti64x4_epi64(c, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(d), _mm256_extracti128_si256(d, 1));
}

/* The four rows' partial last step from column c: each row's index bytes loaded under mask m
 * by LOAD (zero past the row), then STEP (STEP128_V or STEP64) with LOOKUP. */
#define TAIL4(STEP, LOOKUP, LOAD, m)                                                           \
    do {                                                                                       \
        STEP(LOOKUP, LOAD((m), row[0] + c / 2), t0, l0, h0);                                   \
        STEP(LOOKUP, LOAD((m), row[1] + c / 2), t1, l1, h1);                                   \
        STEP(LOOKUP, LOAD((m), row[2] + c / 2), t2, l2, h2);                                   \
        STEP(LOOKUP, LOAD((m), row[3] + c / 2), t3, l3, h3);                                   \
    } while (0)

/* acc += the four rows' f16 scales of sub-block s times their exact sums T (sum4_lohi of the
 * lo and hi lanes, less corr[s]): i8_combine's step for four rows */
#define COMBINE4(acc, l0, h0, l1, h1, l2, h2, l3, h3, s)                                       \
    do {                                                                                       \
        const __m128i T_ = _mm_sub_epi32(sum4_lohi(l0, h0, l1, h1, l2, h2, l3, h3),            \
                                         _mm_set1_epi32((int)corr[s]));                        \
        acc = _mm256_add_pd(acc, _mm256_mul_pd(scales4_pd(L, r, s), _mm256_cvtepi32_pd(T_)));  \
    } while (0)

/* Each sub-block's sums are combined after the next sub-block's steps are issued: the combine
 * is a long dependent chain (the reduction tree, the conversion to double, the multiply-add)
 * that, issued right after its last vpdpbusd, held up the steps behind it (about 10 % of the
 * kernel on the 576- to 4864-column rows of SmolLM2 and Qwen2.5-Coder, docs/KERNELS.md). */
/* The 64 index bytes of step c (128 columns) of row i: at the row's own bytes, or, with row
 * tiles (TILED; row[0] is the tile), in its chunks c / 64 and c / 64 + 1 (qgemv.h i8_b4_at),
 * 128 bytes apart. */
#define ROW128(TILED, i, c)                                                                    \
    ((TILED) ? _mm512_inserti64x4(                                                             \
                   _mm512_castsi256_si512(_mm256_loadu_si256(                                  \
                       (const __m256i *)(const void *)(row[0] + (size_t)(c) * 2u + 32u * (i)))), \
                   _mm256_loadu_si256((const __m256i *)(const void *)(row[0] + (size_t)(c) * 2u + \
                                                                      128u + 32u * (i))),      \
                   1)                                                                          \
             : _mm512_loadu_si512((const void *)(row[i] + (c) / 2)))
/* The lines `ahead` on of step c: the four rows' own, or the tile's 256 bytes of the step. */
#define PREFETCH_STEP(TILED, c)                                                                \
    do {                                                                                       \
        if (TILED)                                                                             \
            for (int i_ = 0; i_ < 4; i_++)                                                     \
                _mm_prefetch((const char *)row[0] + ahead + (size_t)(c) * 2u + 64u * i_,       \
                             _MM_HINT_T1);                                                     \
        else                                                                                   \
            PREFETCH4(row, ahead + (size_t)(c) / 2);                                           \
    } while (0)

#define I8CB_B4_ROWS4_128(NAME, FN, LOOKUP, LOOKUP64, REST, TILED)                             \
    FN static void NAME##_rows4(float *y, const QuantActs *qa, const I8Layout *L, int r,       \
                                int cols, const uint32_t *corr) {                              \
        const uint8_t *row[4];                                                                 \
        i8_b4_rows4_begin(L, r, row, 0);                                                       \
        const size_t ahead = (TILED) ? stream_prefetch_ahead() : i8_prefetch_ahead(L, row[3]); \
        const int full = cols & ~127;                                                          \
        const __m512i low4 = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8(-128);            \
        (void)low4;                                                                            \
        __m256d acc = _mm256_setzero_pd();                                                     \
        __m512i p0 = _mm512_setzero_si512(), p1 = p0, p2 = p0, p3 = p0; /* sub-block s - 1 */  \
        __m512i q0 = p0, q1 = p0, q2 = p0, q3 = p0;                                            \
        for (int s = 0; s < L->n_sub; s++) {                                                   \
            __m512i t0, t1, t2, t3;                                                            \
            const int8_t *cb = L->cent + ((size_t)r * (size_t)L->n_sub + (size_t)s) * 16u;     \
            const size_t cs = (size_t)L->n_sub * 16u;                                          \
            t0 = _mm512_xor_si512(flip, _mm512_broadcast_i32x4(_mm_loadu_si128(                \
                                            (const __m128i *)(const void *)cb)));              \
            t1 = _mm512_xor_si512(flip, _mm512_broadcast_i32x4(_mm_loadu_si128(                \
                                            (const __m128i *)(const void *)(cb + cs))));       \
            t2 = _mm512_xor_si512(flip, _mm512_broadcast_i32x4(_mm_loadu_si128(                \
                                            (const __m128i *)(const void *)(cb + 2 * cs))));   \
            t3 = _mm512_xor_si512(flip, _mm512_broadcast_i32x4(_mm_loadu_si128(                \
                                            (const __m128i *)(const void *)(cb + 3 * cs))));   \
            int c0 = s * L->group_size;                                                        \
            int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;                    \
            int stop = c1 < full ? c1 : full;                                                  \
            __m512i l0 = _mm512_setzero_si512(), l1 = l0, l2 = l0, l3 = l0;                    \
            __m512i h0 = l0, h1 = l0, h2 = l0, h3 = l0;                                        \
            int c = c0;                                                                        \
            for (; c < stop; c += 128) { /* no calls: everything stays in registers */        \
                PREFETCH_STEP(TILED, c);                                                       \
                ACTS128(c);                                                                    \
                STEP128_V(LOOKUP, ROW128(TILED, 0, c), t0, l0, h0);                            \
                STEP128_V(LOOKUP, ROW128(TILED, 1, c), t1, l1, h1);                            \
                STEP128_V(LOOKUP, ROW128(TILED, 2, c), t2, l2, h2);                            \
                STEP128_V(LOOKUP, ROW128(TILED, 3, c), t3, l3, h3);                            \
            }                                                                                  \
            if ((TILED) && c < c1) { /* a tiled row's last 64 columns: one whole chunk, its     \
                                        lines prefetched too, or the stream has holes that \
                                        cost SmolLM2's 576-column rows 0.84x decode */     \
                _mm_prefetch((const char *)row[0] + ahead + (size_t)c * 2u, _MM_HINT_T1);      \
                _mm_prefetch((const char *)row[0] + ahead + (size_t)c * 2u + 64u, _MM_HINT_T1); \
                ACTS64(c);                                                                     \
                STEP64(LOOKUP64, _mm256_loadu_si256((const __m256i *)(const void *)(           \
                                     row[0] + (size_t)c * 2u)), t0, l0, h0);                  \
                STEP64(LOOKUP64, _mm256_loadu_si256((const __m256i *)(const void *)(           \
                                     row[0] + (size_t)c * 2u + 32u)), t1, l1, h1);            \
                STEP64(LOOKUP64, _mm256_loadu_si256((const __m256i *)(const void *)(           \
                                     row[0] + (size_t)c * 2u + 64u)), t2, l2, h2);            \
                STEP64(LOOKUP64, _mm256_loadu_si256((const __m256i *)(const void *)(           \
                                     row[0] + (size_t)c * 2u + 96u)), t3, l3, h3);            \
            } else if (c < c1 && cols - c <= 64) { /* the rows' last 64 columns or fewer */    \
                const __mmask32 m_ = (__mmask32)tail_mask64(cols - c); /* n <= 64 */           \
                PREFETCH4(row, ahead + (size_t)c / 2);                                         \
                ACTS64(c);                                                                     \
                TAIL4(STEP64, LOOKUP64, _mm256_maskz_loadu_epi8, m_);                          \
            } else if (c < c1) { /* the rows' partial last step: masked loads, zero past it */ \
                const __mmask64 m_ = tail_mask64(cols - c);                                    \
                PREFETCH4(row, ahead + (size_t)c / 2);                                         \
                ACTS128(c);                                                                    \
                TAIL4(STEP128_V, LOOKUP, _mm512_maskz_loadu_epi8, m_);                         \
            }                                                                                  \
            if (s > 0) COMBINE4(acc, p0, q0, p1, q1, p2, q2, p3, q3, s - 1);                   \
            p0 = l0, p1 = l1, p2 = l2, p3 = l3, q0 = h0, q1 = h1, q2 = h2, q3 = h3;            \
        }                                                                                      \
        COMBINE4(acc, p0, q0, p1, q1, p2, q2, p3, q3, L->n_sub - 1);                           \
        store4_combined(y + r, acc, qa->D);                                                    \
    }                                                                                          \
    FN void NAME(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1, int cols) { \
        i8cb_b4_rows4_run(NAME##_rows4, REST, y, qa, L, r0, r1, cols);                         \
    }

/* VBMI: G % 128 != 0 or G > 512 (e.g. a whole row of 576 or 896 columns) through the 64-column
 * any-b kernel below (G % 64 == 0), which hands the rest to the AVX2 b = 4 kernel */
I8CB_B4_ROWS4_128(i8cb_b4_rows_avx512vbmi, VBMI512_F16C_FN, LOOKUP128_PERMB, LOOKUP64_PERMB,
                  i8cb_rows_avx512vbmi_any, 0)
I8CB_B4_ROWS4_128(i8cb_b4_rows_avx512vnni, VNNI512_F16C_FN, LOOKUP128_PSHUFB, LOOKUP64_PSHUFB,
                  i8cb_b4_rows_avx2, 0)

/* ---- any b in 1..8, AVX-512 VBMI: 64 columns per step (natural column order) ----
 * 64 indices are 8b bytes (eight groups of b bytes, FORMAT.md); one vpermb puts group k into
 * qword k, one vpmultishiftqb takes the 8 bits at offsets 0, b, ..., 7b of each qword (index j
 * of the group in bits 0..b-1 of byte j, the next index's bits above it), and the lookup
 * ignores those upper bits: for b <= 6 one vpermb on the sub-block's 2^b centroids repeated
 * through the 64 table bytes (vpermb reads bits 0..5, and every copy holds the same
 * centroids), for b = 7 one vpermi2b on the 128 centroids in two zmm (bits 0..6), for b = 8
 * two vpermi2b joined on bit 7. Then two vpdpbusd multiply the unsigned bytes w + 128 by the
 * signed bytes nl, nh of m * q (qgemv.h), as in the b = 4 kernel above. A sub-block is summed
 * in runs of at most 512 columns, each run's int32 sum exact (|run| < 2^31) and added in
 * double (exact: integers below 2^53). Four rows at a time; a last group of fewer rows
 * repeats its last row (its sums are computed and dropped), so every row of the call takes
 * this path. Needs G % 64 == 0 and the VNNI arrays (the callers check; else the AVX2 kernel
 * of the bit width). The b = 6 slot of the table is this kernel at b = 6. */

/* 64 b-bit indices (the 8b bytes of v) as bytes, index j of group k in bits 0..b-1 of byte
 * 8k + j: place puts group k into qword k, offsets (0, b, ..., 7b) pick its eight indices. */
VBMI512_F16C_FN static inline __m512i idx64_groups(__m512i v, __m512i place, __m512i offsets) {
    return _mm512_multishift_epi64_epi8(offsets, _mm512_permutexvar_epi8(place, v));
}

/* The load mask of a row's last step: its index bytes for the n < 64 columns left at b bits
 * (zero past the row). */
static inline __mmask64 tail_mask_bits(int n, int b) {
    return (__mmask64)(~0ull >> (64u - (unsigned)ditto_cb_row_bytes((uint64_t)n, (uint32_t)b)));
}

/* The VNNI correction of the columns [c, run) (QA_BLOCK-aligned c): the sum of qa->msum over
 * their activation blocks, wrapping as the int32 lanes it is subtracted from. */
static inline uint32_t run_corr(const QuantActs *qa, int c, int run) {
    uint32_t corr = 0;
    for (int j = c / QA_BLOCK; j < (run + QA_BLOCK - 1) / QA_BLOCK; j++)
        corr += (uint32_t)qa->msum[j];
    return corr;
}

/* The 64 table bytes (as w + 128) of centroids cb[0 .. 2^b) for b <= 6, the 2^b centroids
 * repeated. */
VBMI512_F16C_FN static inline __m512i anyb_table64(const int8_t *cb, const int b) {
    __m512i t;
    switch (b) {
    case 6: t = _mm512_loadu_si512((const void *)cb); break;
    case 5: t = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)cb));
        break;
    case 4: t = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)cb));
        break;
    case 3: {
        int64_t v;
        memcpy(&v, cb, 8);
        t = _mm512_set1_epi64(v);
        break;
    }
    case 2: {
        int32_t v;
        memcpy(&v, cb, 4);
        t = _mm512_set1_epi32(v);
        break;
    }
    default: {
        int16_t v;
        memcpy(&v, cb, 2);
        t = _mm512_set1_epi16(v);
        break;
    }
    }
    /* An opaque table: LLVM would otherwise fold the small broadcasts (b <= 3) into generic
     * 512-bit byte shufflevectors, whose x86 lowering does not terminate under LLVM 22. */
    __asm__("" : "+v"(t));
    return _mm512_xor_si512(t, _mm512_set1_epi8(-128));
}

/* One row's tables for a sub-block (centroids at cb): t[0] for b <= 6, t[0..1] for b = 7,
 * t[0..3] for b = 8. */
#define ANYB_TABLES(t, cb, b)                                                                  \
    do {                                                                                       \
        if ((b) <= 6) {                                                                        \
            t[0] = anyb_table64((cb), (b));                                                    \
        } else {                                                                               \
            for (int i_ = 0; i_ < (1 << (b)) / 64; i_++)                                       \
                t[i_] = _mm512_xor_si512(_mm512_loadu_si512((const void *)((cb) + 64 * i_)),   \
                                         _mm512_set1_epi8(-128));                              \
        }                                                                                      \
    } while (0)

/* The weights (w + 128) of 64 index bytes idx (index in bits 0..b-1) through tables t. */
VBMI512_F16C_FN __attribute__((always_inline)) static inline __m512i
anyb_lookup(__m512i idx, const __m512i *t, const int b) {
    if (b <= 6) return _mm512_permutexvar_epi8(idx, t[0]);
    if (b == 7) return _mm512_permutex2var_epi8(t[0], idx, t[1]);
    __m512i lo = _mm512_permutex2var_epi8(t[0], idx, t[1]);
    __m512i hi = _mm512_permutex2var_epi8(t[2], idx, t[3]);
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi);
}

/* vpermb's control putting index group k (b bytes from byte k b) into qword k, and
 * vpmultishiftqb's bit offsets 0, b, ..., 7b of the eight indices of a group. */
VBMI512_F16C_FN static inline __m512i anyb_place(const int b) {
    uint8_t place_b[64];
    for (int k = 0; k < 8; k++) /* qword k <- bytes kb .. kb + 7 (group k and what follows) */
        for (int j = 0; j < 8; j++) place_b[8 * k + j] = (uint8_t)(k * b + j);
    return _mm512_loadu_si512((const void *)place_b);
}
VBMI512_F16C_FN static inline __m512i anyb_offsets(const int b) {
    uint64_t off = 0;
    for (int j = 0; j < 8; j++) off |= (uint64_t)(j * b) << (8 * j);
    return _mm512_set1_epi64((long long)off);
}

/* The index bytes of step c (64 columns) of row i of the four rows at row[]: the row's own at
 * b bits, or, for b = 4 indices in row tiles (`tiled`; row[0] is the tile, qgemv.h i8_b4_at),
 * its chunk c / 64 of the tile. */
#define ANYB_AT(i, c)                                                                          \
    ((tiled) ? row[0] + (size_t)(c) * 2u + 32u * (i) : row[i] + (size_t)(c) / 8 * (size_t)b)
/* The lines `ahead` on of step c: each row's, or the tile's 128 bytes of the step. */
#define ANYB_PREFETCH(c)                                                                       \
    do {                                                                                       \
        if (tiled) {                                                                           \
            _mm_prefetch((const char *)row[0] + ahead + (size_t)(c) * 2u, _MM_HINT_T1);        \
            _mm_prefetch((const char *)row[0] + ahead + (size_t)(c) * 2u + 64u, _MM_HINT_T1);  \
        } else {                                                                               \
            PREFETCH4(row, ahead + (size_t)(c) / 8 * (size_t)b);                               \
        }                                                                                      \
    } while (0)

/* The four rows r .. r + 3 a kernel reads for rows r .. r + n - 1 (a last group of fewer
 * repeats its last row): their numbers rr and index rows; the centroids of the rows 8 on are
 * prefetched into L2. Returns the in-loop prefetch distance (i8_prefetch_ahead). */
static inline size_t anyb_rows4_start(const I8Layout *L, int r, int n, int b, int rr[4],
                                      const uint8_t *row[4], int tiled) {
    for (int i = 0; i < 4; i++) {
        rr[i] = r + (i < n ? i : n - 1);
        row[i] = L->indices + (size_t)rr[i] * L->row_bytes;
    }
    const size_t cs = (size_t)L->n_sub << b;
    prefetch_bytes(L->cent, (size_t)(r + 8) * cs, 4 * cs,
                   (size_t)((const int8_t *)(const void *)L->scale - L->cent));
    return tiled ? stream_prefetch_ahead() : i8_prefetch_ahead(L, row[3]);
}

/* Rows r .. r + n - 1 (1 <= n <= 4) of a b-bit tensor for ni (1 or 2) inputs: y[i][r ..] from
 * qa[i]. Each 64-column step decodes a row's weights once and multiplies them by every input,
 * so two inputs cost two vpdpbusd pairs per decode instead of one (the few-input GEMM below);
 * each input's sums, corrections and double combination are those of one input alone. The
 * accumulators are named variables, not arrays: the IR pipeline of `ditto build` keeps arrays
 * of vectors on the stack (qgemm_avx2.c), which costs a tenth of the decode speed here. */
VBMI512_F16C_FN __attribute__((always_inline)) static inline void
anyb_rows4_vbmi(float *const *y, const QuantActs *const *qa, const int ni, const I8Layout *L,
                int r, int n, int cols, const int b, const int tiled) {
    const __m512i place = anyb_place(b), offsets = anyb_offsets(b);
    const __mmask64 full_mask = (__mmask64)(b == 8 ? ~0ull : (1ull << (8 * b)) - 1u);
    const size_t K = (size_t)1 << b, cs = (size_t)L->n_sub * K;
    const QuantActs *q0 = qa[0], *q1 = qa[ni - 1];
    int rr[4];
    const uint8_t *row[4];
    const size_t ahead = anyb_rows4_start(L, r, n, b, rr, row, tiled);
    const int full = cols & ~63;
    __m256d acc0 = _mm256_setzero_pd(), acc1 = acc0;
    for (int s = 0; s < L->n_sub; s++) {
        __m512i t0[4], t1[4], t2[4], t3[4];
        ANYB_TABLES(t0, L->cent + (size_t)rr[0] * cs + (size_t)s * K, b);
        ANYB_TABLES(t1, L->cent + (size_t)rr[1] * cs + (size_t)s * K, b);
        ANYB_TABLES(t2, L->cent + (size_t)rr[2] * cs + (size_t)s * K, b);
        ANYB_TABLES(t3, L->cent + (size_t)rr[3] * cs + (size_t)s * K, b);
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols;
        __m256d T0 = _mm256_setzero_pd(), T1 = T0;
        for (int c = c0; c < c1;) {
            int run = c + 512 < c1 ? c + 512 : c1; /* |sum of the run| < 2^31 */
            int stop = run < full ? run : full;
            const uint32_t corr0 = run_corr(q0, c, run);
            const uint32_t corr1 = ni == 2 ? run_corr(q1, c, run) : 0;
            __m512i l00 = _mm512_setzero_si512(), l01 = l00, l02 = l00, l03 = l00;
            __m512i h00 = l00, h01 = l00, h02 = l00, h03 = l00;
            __m512i l10 = l00, l11 = l00, l12 = l00, l13 = l00;
            __m512i h10 = l00, h11 = l00, h12 = l00, h13 = l00;
#define ANYB_STEP(mask, ip, t, k)                                                                  \
    do {                                                                                           \
        __m512i w_ = anyb_lookup(                                                                  \
            idx64_groups(_mm512_maskz_loadu_epi8((mask), (ip)), place, offsets), (t), b);          \
        l0##k = _mm512_dpbusd_epi32(l0##k, w_, an0);                                               \
        h0##k = _mm512_dpbusd_epi32(h0##k, w_, ah0);                                               \
        if (ni == 2) {                                                                             \
            l1##k = _mm512_dpbusd_epi32(l1##k, w_, an1);                                           \
            h1##k = _mm512_dpbusd_epi32(h1##k, w_, ah1);                                           \
        }                                                                                          \
    } while (0)
#define ANYB_ACTS(c)                                                                               \
    const __m512i an0 = _mm512_loadu_si512((const void *)(q0->nl + (c)));                         \
    const __m512i ah0 = _mm512_loadu_si512((const void *)(q0->nh + (c)));                         \
    const __m512i an1 = ni == 2 ? _mm512_loadu_si512((const void *)(q1->nl + (c))) : an0;          \
    const __m512i ah1 = ni == 2 ? _mm512_loadu_si512((const void *)(q1->nh + (c))) : ah0
            for (; c < stop; c += 64) { /* no calls: everything stays in registers */
                ANYB_ACTS(c);
                ANYB_PREFETCH(c);
                ANYB_STEP(full_mask, ANYB_AT(0, c), t0, 0);
                ANYB_STEP(full_mask, ANYB_AT(1, c), t1, 1);
                ANYB_STEP(full_mask, ANYB_AT(2, c), t2, 2);
                ANYB_STEP(full_mask, ANYB_AT(3, c), t3, 3);
            }
            if (c < run) { /* the rows' partial last step: masked loads, zero past the row
                              (never tiled rows: theirs are whole 64-column chunks) */
                const size_t o = (size_t)c / 8 * (size_t)b;
                ANYB_ACTS(c);
                const __mmask64 m = tail_mask_bits(cols - c, b);
                ANYB_STEP(m, row[0] + o, t0, 0);
                ANYB_STEP(m, row[1] + o, t1, 1);
                ANYB_STEP(m, row[2] + o, t2, 2);
                ANYB_STEP(m, row[3] + o, t3, 3);
                c = run;
            }
#undef ANYB_ACTS
#undef ANYB_STEP
            __m128i u0 = _mm_sub_epi32(sum4_lohi(l00, h00, l01, h01, l02, h02, l03, h03),
                                       _mm_set1_epi32((int)(128u * corr0)));
            T0 = _mm256_add_pd(T0, _mm256_cvtepi32_pd(u0));
            if (ni == 2) {
                __m128i u1 = _mm_sub_epi32(sum4_lohi(l10, h10, l11, h11, l12, h12, l13, h13),
                                           _mm_set1_epi32((int)(128u * corr1)));
                T1 = _mm256_add_pd(T1, _mm256_cvtepi32_pd(u1));
            }
        }
        const __m256d sc = scales4_rows_pd(L, rr, s);
        acc0 = _mm256_add_pd(acc0, _mm256_mul_pd(sc, T0));
        if (ni == 2) acc1 = _mm256_add_pd(acc1, _mm256_mul_pd(sc, T1));
    }
    storen_combined(y[0] + r, acc0, q0->D, n);
    if (ni == 2) storen_combined(y[1] + r, acc1, q1->D, n);
}

/* anyb_rows4_vbmi for one input and b <= 6: each run's combine is issued after the next run's
 * steps, as in the b = 4 kernel (I8CB_B4_ROWS4_128), so its dependent chain (reduction,
 * correction, conversion, and at a sub-block's end the multiply-add) does not hold up the steps
 * behind it. The same operations in the same order per row: the same bits. */
VBMI512_F16C_FN __attribute__((always_inline)) static inline void
anyb_rows4_late_vbmi(float *y, const QuantActs *qa, const I8Layout *L, int r, int n, int cols,
                     const int b, const int tiled) {
    const __m512i place = anyb_place(b), offsets = anyb_offsets(b);
    const __mmask64 full_mask = (__mmask64)((1ull << (8 * b)) - 1u);
    const size_t K = (size_t)1 << b, cs = (size_t)L->n_sub * K;
    int rr[4];
    const uint8_t *row[4];
    const size_t ahead = anyb_rows4_start(L, r, n, b, rr, row, tiled);
    const int full = cols & ~63;
    __m256d acc = _mm256_setzero_pd(), T = acc;
    __m512i p0 = _mm512_setzero_si512(), p1 = p0, p2 = p0, p3 = p0; /* the pending run */
    __m512i g0 = p0, g1 = p0, g2 = p0, g3 = p0;
    uint32_t pcorr = 0;
    int ps = -1, plast = 0; /* its sub-block (-1: none yet); whether it ends the sub-block */
#define ANYB_LATE_COMBINE()                                                                    \
    do {                                                                                       \
        const __m128i u_ = _mm_sub_epi32(sum4_lohi(p0, g0, p1, g1, p2, g2, p3, g3),             \
                                         _mm_set1_epi32((int)(128u * pcorr)));                 \
        T = _mm256_add_pd(T, _mm256_cvtepi32_pd(u_));                                          \
        if (plast) {                                                                           \
            acc = _mm256_add_pd(acc, _mm256_mul_pd(scales4_rows_pd(L, rr, ps), T));            \
            T = _mm256_setzero_pd();                                                           \
        }                                                                                      \
    } while (0)
#define ANYB_LATE_STEP(mask, ip, t, lo, hi)                                                    \
    do {                                                                                       \
        __m512i w_ = _mm512_permutexvar_epi8(                                                  \
            idx64_groups(_mm512_maskz_loadu_epi8((mask), (ip)), place, offsets), (t));         \
        lo = _mm512_dpbusd_epi32(lo, w_, an);                                                  \
        hi = _mm512_dpbusd_epi32(hi, w_, ah);                                                  \
    } while (0)
    for (int s = 0; s < L->n_sub; s++) {
        const __m512i t0 = anyb_table64(L->cent + (size_t)rr[0] * cs + (size_t)s * K, b);
        const __m512i t1 = anyb_table64(L->cent + (size_t)rr[1] * cs + (size_t)s * K, b);
        const __m512i t2 = anyb_table64(L->cent + (size_t)rr[2] * cs + (size_t)s * K, b);
        const __m512i t3 = anyb_table64(L->cent + (size_t)rr[3] * cs + (size_t)s * K, b);
        int c = s * L->group_size;
        const int c1 = c + L->group_size < cols ? c + L->group_size : cols;
        while (c < c1) {
            const int run = c + 512 < c1 ? c + 512 : c1; /* |sum of the run| < 2^31 */
            const int stop = run < full ? run : full;
            const uint32_t corr = run_corr(qa, c, run);
            __m512i l0 = _mm512_setzero_si512(), l1 = l0, l2 = l0, l3 = l0;
            __m512i h0 = l0, h1 = l0, h2 = l0, h3 = l0;
            for (; c < stop; c += 64) { /* no calls: everything stays in registers */
                const __m512i an = _mm512_loadu_si512((const void *)(qa->nl + c));
                const __m512i ah = _mm512_loadu_si512((const void *)(qa->nh + c));
                ANYB_PREFETCH(c);
                ANYB_LATE_STEP(full_mask, ANYB_AT(0, c), t0, l0, h0);
                ANYB_LATE_STEP(full_mask, ANYB_AT(1, c), t1, l1, h1);
                ANYB_LATE_STEP(full_mask, ANYB_AT(2, c), t2, l2, h2);
                ANYB_LATE_STEP(full_mask, ANYB_AT(3, c), t3, l3, h3);
            }
            if (c < run) { /* the rows' partial last step: masked loads, zero past the row */
                const size_t o = (size_t)c / 8 * (size_t)b;
                const __m512i an = _mm512_loadu_si512((const void *)(qa->nl + c));
                const __m512i ah = _mm512_loadu_si512((const void *)(qa->nh + c));
                const __mmask64 m = tail_mask_bits(cols - c, b);
                ANYB_LATE_STEP(m, row[0] + o, t0, l0, h0);
                ANYB_LATE_STEP(m, row[1] + o, t1, l1, h1);
                ANYB_LATE_STEP(m, row[2] + o, t2, l2, h2);
                ANYB_LATE_STEP(m, row[3] + o, t3, l3, h3);
                c = run;
            }
            if (ps >= 0) ANYB_LATE_COMBINE();
            p0 = l0, p1 = l1, p2 = l2, p3 = l3, g0 = h0, g1 = h1, g2 = h2, g3 = h3;
            pcorr = corr, ps = s, plast = c >= c1;
        }
    }
    ANYB_LATE_COMBINE();
#undef ANYB_LATE_STEP
#undef ANYB_LATE_COMBINE
    storen_combined(y + r, acc, qa->D, n);
}

/* Rows [r0, r1) of a b-bit tensor, G % 64 == 0, qa with the VNNI arrays. */
VBMI512_F16C_FN __attribute__((always_inline)) static inline void
anyb_rows_vbmi(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1, int cols,
               const int b) {
    if (b <= 6) {
        for (int r = r0; r < r1; r += 4)
            anyb_rows4_late_vbmi(y, qa, L, r, r1 - r < 4 ? r1 - r : 4, cols, b, 0);
        return;
    }
    for (int r = r0; r < r1; r += 4)
        anyb_rows4_vbmi(&y, &qa, 1, L, r, r1 - r < 4 ? r1 - r : 4, cols, b, 0);
}

/* Rows [r0, r1) of Y[t] (row stride `rows`) for the T inputs qa[0..T), two inputs per decode
 * (a last odd input alone), four rows at a time: each group of rows stays in L1 while every
 * input passes over it. */
VBMI512_F16C_FN __attribute__((always_inline)) static inline void
anyb_gemm_few_vbmi(float *Y, const QuantActs *qa, int T, const I8Layout *L, int r0, int r1,
                   int rows, int cols, const int b, const int tiled) {
    for (int r = r0; r < r1; r += 4) {
        const int n = r1 - r < 4 ? r1 - r : 4;
        int t = 0;
        for (; t + 2 <= T; t += 2) {
            float *y[2] = {Y + (size_t)t * (size_t)rows, Y + (size_t)(t + 1) * (size_t)rows};
            const QuantActs *q[2] = {&qa[t], &qa[t + 1]};
            anyb_rows4_vbmi(y, q, 2, L, r, n, cols, b, tiled);
        }
        if (t < T) {
            float *y1 = Y + (size_t)t * (size_t)rows;
            const QuantActs *q1 = &qa[t];
            anyb_rows4_vbmi(&y1, &q1, 1, L, r, n, cols, b, tiled);
        }
    }
}

/* The AVX2 kernel of each bit width: where G % 64 != 0 or the input has no VNNI arrays. */
void i8cb_b6_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                       int cols);
void i8cb_b5_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                       int cols);
void i8cb_rows_avx2_any(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                        int cols);
static void rows_avx2_by_bits(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                              int cols) {
    switch (L->bits) {
    case 4: i8cb_b4_rows_avx2(y, qa, L, r0, r1, cols); break;
    case 5: i8cb_b5_rows_avx2(y, qa, L, r0, r1, cols); break;
    case 6: i8cb_b6_rows_avx2(y, qa, L, r0, r1, cols); break;
    default: i8cb_rows_avx2_any(y, qa, L, r0, r1, cols); break;
    }
}

VBMI512_F16C_FN void i8cb_rows_avx512vbmi_any(float *y, const QuantActs *qa, const I8Layout *L,
                                              int r0, int r1, int cols) {
    if (L->group_size % 64 != 0 || !qa->has_vnni) {
        rows_avx2_by_bits(y, qa, L, r0, r1, cols);
        return;
    }
    switch (L->bits) {
    case 1: anyb_rows_vbmi(y, qa, L, r0, r1, cols, 1); break;
    case 2: anyb_rows_vbmi(y, qa, L, r0, r1, cols, 2); break;
    case 3: anyb_rows_vbmi(y, qa, L, r0, r1, cols, 3); break;
    case 4: anyb_rows_vbmi(y, qa, L, r0, r1, cols, 4); break;
    case 5: anyb_rows_vbmi(y, qa, L, r0, r1, cols, 5); break;
    case 6: anyb_rows_vbmi(y, qa, L, r0, r1, cols, 6); break;
    case 7: anyb_rows_vbmi(y, qa, L, r0, r1, cols, 7); break;
    default: anyb_rows_vbmi(y, qa, L, r0, r1, cols, 8); break;
    }
}

/* b = 4 indices in row tiles (kernels_tile_tensor; qgemv.h i8_tiles_fit: G % 64 == 0,
 * G <= 512, cols % 64 == 0, rows % 4 == 0), G % 128 != 0: the any-b kernel at b = 4 on the
 * tile's 64-column chunks (a partial step never happens: cols % 64 == 0). */
VBMI512_F16C_FN static void b4_tiled_any_avx512vbmi(float *y, const QuantActs *qa,
                                                     const I8Layout *L, int r0, int r1,
                                                     int cols) {
    for (int r = r0; r < r1; r += 4)
        anyb_rows4_late_vbmi(y, qa, L, r, r1 - r < 4 ? r1 - r : 4, cols, 4, 1);
}

/* b = 4 indices in row tiles, G % 128 == 0: the 128-column kernel above, each step's four rows
 * one 256-byte run of the tile, so the tensor is read as one stream (docs/KERNELS.md "Row
 * tiles"). */
I8CB_B4_ROWS4_128(b4_tiled128_avx512vbmi, VBMI512_F16C_FN, LOOKUP128_PERMB, LOOKUP64_PERMB,
                  b4_tiled_any_avx512vbmi, 1)

/* The avx512vbmi table's kernel for b = 4 tensors in row tiles (kernels.h i8_b4_tiled): the
 * inputs of that table's GEMV have the VNNI arrays; without them, the scalar reference, which
 * reads tiles too. */
VBMI512_F16C_FN void i8cb_b4_tiled_rows_avx512vbmi(float *y, const QuantActs *qa,
                                                   const I8Layout *L, int r0, int r1,
                                                   int cols) {
    if (!qa->has_vnni) i8cb_rows_generic(y, qa, L, r0, r1, cols);
    else b4_tiled128_avx512vbmi(y, qa, L, r0, r1, cols);
}

VBMI512_F16C_FN void i8cb_b6_rows_avx512vbmi(float *y, const QuantActs *qa, const I8Layout *L,
                                             int r0, int r1, int cols) {
    if (L->group_size % 64 == 0 && qa->has_vnni) anyb_rows_vbmi(y, qa, L, r0, r1, cols, 6);
    else i8cb_b6_rows_avx2(y, qa, L, r0, r1, cols);
}

void i8cb_gemm_avx512vnni(float *Y, const QuantActs *qa, int T, const I8Layout *L, int r0, int r1,
                          int rows, int cols, const GemmPrep *prep);

/* The AVX-512 VBMI table's GEMM (kernels.h I8GemmFn): a few inputs with the VNNI arrays, b = 4,
 * 5 or 6 and G % 64 == 0 go through the any-b row kernel, two inputs per decoded weight (a
 * speculative verification or a short prefill); the rest through the panel GEMM of
 * qgemm_avx2.c, which decodes a row once for all T inputs at a fixed cost per call that only
 * many inputs repay. Both give the bits of the row kernels. "A few": up to 8 inputs, up to
 * GEMM_FEW_MAX (16) for b = 6, whose panel decoding costs more: the crossovers measured on
 * Qwen2.5-Coder-0.5B's b = 4 layers and b = 6 classifier (docs/KERNELS.md "Few-input GEMM"). */
VBMI512_F16C_FN void i8cb_gemm_avx512vbmi(float *Y, const QuantActs *qa, int T,
                                          const I8Layout *L, int r0, int r1, int rows,
                                          int cols, const GemmPrep *prep) {
    int few = T <= (L->bits == 6 ? GEMM_FEW_MAX : 8) && L->group_size % 64 == 0;
    for (int t = 0; t < T && few; t++) few = qa[t].has_vnni;
    if (!few || L->bits < 4 || L->bits > 6) {
        i8cb_gemm_avx512vnni(Y, qa, T, L, r0, r1, rows, cols, prep);
        return;
    }
    switch (L->bits) {
    case 4:
        if (L->tiled) anyb_gemm_few_vbmi(Y, qa, T, L, r0, r1, rows, cols, 4, 1);
        else anyb_gemm_few_vbmi(Y, qa, T, L, r0, r1, rows, cols, 4, 0);
        break;
    case 5: anyb_gemm_few_vbmi(Y, qa, T, L, r0, r1, rows, cols, 5, 0); break;
    default: anyb_gemm_few_vbmi(Y, qa, T, L, r0, r1, rows, cols, 6, 0); break;
    }
}


#endif
