/* gemm_avx2.c: AVX2 + FMA GEMM Y[T][rows] = X[T][cols] · Wᵀ for codebook tensors with b = 4
 * (the default bit width) and G % 8 == 0 — the batched-prefill path of matmul_batch().
 *
 * Per tile of 16 rows (OpenMP, static schedule) and chunk of 256 columns: each row's chunk is
 * decoded once to float32 (per group of 8 indices: one 32-bit load, vpsrlvd by 0, 4, ..., 28,
 * two vpermps over the sub-block's 16 centroids and a vblendvps on index bit 3), the 16 x 256
 * block is transposed (8 x 8 in-register transposes) to Wt[c][16], and multiplied with the T
 * activation rows by an outer-product micro-kernel: 6 tokens x 16 rows of accumulators, per
 * column 2 loads of Wt, 6 broadcasts of x and 12 FMAs. Every Y[t][r] is summed over columns in
 * increasing order (as codebook_gemm_ref(); with FMA rounding), independent of the thread
 * count. Anything else (other b, G % 8 != 0, a CPU without AVX2/FMA/F16C) goes to
 * codebook_gemm_ref().
 */
#include "gemm_avx2.h"

#include "../../codebook_ref.h"

/* x86 only: elsewhere (Arm) the entry points below call the reference */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <string.h>

#define TILE_ROWS 16  /* rows of W per tile: two 8-float vectors */
#define TILE_TOKENS 6 /* tokens per micro-kernel step: 12 accumulators */
#define CHUNK 256     /* columns decoded at a time: the transposed chunk is 16 KiB (L1) */

int gemm_avx2_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}

/* Columns [c0, c1) of row r decoded into out[0 .. c1 - c0) (b = 4, G % 8 == 0, c0 % 8 == 0). */
__attribute__((target("avx2,fma,f16c"))) static void decode_b4(const CodebookLayout *L, int r,
                                                               int c0, int c1, float *out) {
    const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i nib = _mm256_set1_epi32(15);
    const int G = L->group_size;
    for (int c = c0; c < c1;) {
        int s = c / G;
        int ce = c1 - s * G > G ? s * G + G : c1; /* end of this sub-block within [c0, c1) */
        size_t ci = ((size_t)r * (size_t)L->n_sub + (size_t)s) * 16u;
        __m256 lo, hi;
        if (L->is_f16) {
            lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(L->codebooks + 2 * ci)));
            hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(L->codebooks + 2 * ci + 16)));
        } else {
            lo = _mm256_loadu_ps((const float *)(const void *)(L->codebooks + 4 * ci));
            hi = _mm256_loadu_ps((const float *)(const void *)(L->codebooks + 4 * ci + 32));
        }
        for (; c + 8 <= ce; c += 8) {
            uint32_t v;
            memcpy(&v, row + (size_t)(c / 8) * 4u, 4);
            __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)v), shifts),
                                           nib);
            __m256 a = _mm256_permutevar8x32_ps(lo, idx), b = _mm256_permutevar8x32_ps(hi, idx);
            __m256 bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)); /* sign = bit 3 */
            _mm256_storeu_ps(out + (c - c0), _mm256_blendv_ps(a, b, bit3));
        }
        if (c < ce) { /* the row's last, partial group (cols % 8 != 0); padding never read */
            float cb[16];
            _mm256_storeu_ps(cb, lo);
            _mm256_storeu_ps(cb + 8, hi);
            const uint8_t *p = row + (size_t)(c / 8) * 4u;
            for (; c < ce; c++) out[c - c0] = cb[(p[(c & 7) / 2] >> (4 * (c & 1))) & 15u];
        }
    }
}

/* Wt[c][0..8) = rows 0..7 of column c of the 8 x 8 block at src (row stride lds), c < 8. */
__attribute__((target("avx2"))) static void transpose8(const float *src, size_t lds, float *Wt) {
    __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lds);
    __m256 r2 = _mm256_loadu_ps(src + 2 * lds), r3 = _mm256_loadu_ps(src + 3 * lds);
    __m256 r4 = _mm256_loadu_ps(src + 4 * lds), r5 = _mm256_loadu_ps(src + 5 * lds);
    __m256 r6 = _mm256_loadu_ps(src + 6 * lds), r7 = _mm256_loadu_ps(src + 7 * lds);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    const size_t ld = TILE_ROWS;
    _mm256_storeu_ps(Wt + 0 * ld, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(Wt + 1 * ld, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(Wt + 2 * ld, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(Wt + 3 * ld, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(Wt + 4 * ld, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(Wt + 5 * ld, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(Wt + 6 * ld, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(Wt + 7 * ld, _mm256_permute2f128_ps(u3, u7, 0x31));
}

/* Yt[t][0..16) (+)= Σ_{c < nc} X[t][c] · Wt[c][0..16) for the tokens t < T of the tile, in
 * increasing c: 6 tokens x 16 rows of accumulators (12 vectors), per column 2 loads of Wt,
 * 6 broadcasts of x and 12 FMAs. first: start from 0 instead of Yt. */
__attribute__((target("avx2,fma"))) static void outer_kernel(float *Yt, const float *X,
                                                             size_t ldx, int T, const float *Wt,
                                                             int nc, int first) {
    for (int t0 = 0; t0 < T; t0 += TILE_TOKENS) {
        const float *x[TILE_TOKENS];
        for (int tt = 0; tt < TILE_TOKENS; tt++) /* past T: repeat the last row, unused */
            x[tt] = X + (size_t)(t0 + tt < T ? t0 + tt : T - 1) * ldx;
        __m256 a[TILE_TOKENS][2];
        for (int tt = 0; tt < TILE_TOKENS; tt++) {
            const float *y = Yt + (size_t)(t0 + tt < T ? t0 + tt : T - 1) * TILE_ROWS;
            a[tt][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y);
            a[tt][1] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + 8);
        }
        for (int c = 0; c < nc; c++) {
            __m256 w0 = _mm256_loadu_ps(Wt + (size_t)c * TILE_ROWS);
            __m256 w1 = _mm256_loadu_ps(Wt + (size_t)c * TILE_ROWS + 8);
            for (int tt = 0; tt < TILE_TOKENS; tt++) {
                __m256 xv = _mm256_broadcast_ss(x[tt] + c);
                a[tt][0] = _mm256_fmadd_ps(xv, w0, a[tt][0]);
                a[tt][1] = _mm256_fmadd_ps(xv, w1, a[tt][1]);
            }
        }
        for (int tt = 0; tt < TILE_TOKENS && t0 + tt < T; tt++) {
            _mm256_storeu_ps(Yt + (size_t)(t0 + tt) * TILE_ROWS, a[tt][0]);
            _mm256_storeu_ps(Yt + (size_t)(t0 + tt) * TILE_ROWS + 8, a[tt][1]);
        }
    }
}

void codebook_gemm_avx2(float *Y, const float *X, int T, const uint8_t *payload,
                        uint32_t codebook_type, int bits, int group_size, int rows, int cols) {
    if (bits != 4 || group_size % 8 != 0 || !gemm_avx2_supported()) {
        codebook_gemm_ref(Y, X, T, payload, codebook_type, bits, group_size, rows, cols);
        return;
    }
    CodebookLayout L = codebook_layout(payload, codebook_type, bits, group_size, rows, cols);
    int n_tiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
    int tile;
#pragma omp parallel
    {
        /* per thread: 16 decoded row chunks, their transpose, and the tile's partial sums */
        float rowbuf[TILE_ROWS * CHUNK], Wt[CHUNK * TILE_ROWS];
        float Yt[MATMUL_BATCH_MAX * TILE_ROWS];
#pragma omp for schedule(static) private(tile)
        for (tile = 0; tile < n_tiles; tile++) {
            int r0 = tile * TILE_ROWS;
            int nr = rows - r0 < TILE_ROWS ? rows - r0 : TILE_ROWS;
            for (int c0 = 0; c0 < cols; c0 += CHUNK) {
                int c1 = c0 + CHUNK < cols ? c0 + CHUNK : cols, nc = c1 - c0;
                int nc8 = (nc + 7) & ~7;
                for (int i = 0; i < TILE_ROWS; i++) {
                    float *dst = rowbuf + (size_t)i * CHUNK;
                    if (i < nr) {
                        decode_b4(&L, r0 + i, c0, c1, dst);
                        for (int c = nc; c < nc8; c++) dst[c] = 0.0f;
                    } else {
                        memset(dst, 0, (size_t)nc8 * sizeof(float));
                    }
                }
                for (int cb = 0; cb < nc8; cb += 8)
                    for (int rb = 0; rb < TILE_ROWS; rb += 8)
                        transpose8(rowbuf + (size_t)rb * CHUNK + cb, CHUNK,
                                   Wt + (size_t)cb * TILE_ROWS + rb);
                outer_kernel(Yt, X + c0, (size_t)cols, T, Wt, nc, c0 == 0);
            }
            for (int t = 0; t < T; t++)
                memcpy(Y + (size_t)t * rows + r0, Yt + (size_t)t * TILE_ROWS,
                       (size_t)nr * sizeof(float));
        }
    }
}

#else /* not x86 */

int gemm_avx2_supported(void) { return 0; }

void codebook_gemm_avx2(float *Y, const float *X, int T, const uint8_t *payload,
                        uint32_t codebook_type, int bits, int group_size, int rows, int cols) {
    codebook_gemm_ref(Y, X, T, payload, codebook_type, bits, group_size, rows, cols);
}

#endif
