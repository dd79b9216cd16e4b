/* codebook_avx512.c: AVX-512 GEMV for b = 4 codebook tensors (docs/FORMAT.md "encoding = 1").
 *
 * A sub-block's 16 centroids fill exactly one zmm register, so a 16-entry lookup is a single
 * vpermps (_mm512_permutexvar_ps, which reads bits 0..3 of each index lane). 16 weights take
 * 8 index bytes: broadcast as one qword to all 8 qword lanes, vpmultishiftqb (AVX512-VBMI)
 * copies to byte 0 of dword lane j the 8 bits starting at bit 4j, whose low nibble is index
 * j; the other bits are ignored by vpermps, so no mask is needed. Per 16 weights: one
 * broadcast load, vpmultishiftqb, vpermps, one FMA (against 18 vector ops per 32 weights for
 * the AVX2 byte-plane path in codebook_avx2.c).
 *
 * The row's last chunk of fewer than 16 columns uses masked loads and a masked FMA, so the
 * zero padding indices are never looked up. Everything using AVX-512 is in functions marked
 * AVX512_FN; the rest is baseline C11.
 */
#include "codebook_avx512.h"

/* x86 only: an Arm build uses the NEON and generic kernel tables (kernels.c) */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "codebook_avx2.h"
#include "../../../model/ditto_format.h"

#define AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,fma,f16c")))

int codebook_avx512_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
           __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

/* One b = 4 payload (FORMAT.md): codebooks [rows][n_sub][16], then rows x row_bytes indices. */
typedef struct {
    const uint8_t *codebooks, *indices;
    int is_f16, group_size, n_sub;
    size_t row_bytes;
} Layout4;

/* 16 indices starting at an even column c of a row: the 8 bytes from c/2 (fewer at the end of
 * the row: `avail` bytes, the rest zero), as one little-endian qword broadcast to all lanes. */
AVX512_FN static inline __m512i nibbles16(const uint8_t *p, size_t avail) {
    uint64_t v = 0;
    memcpy(&v, p, avail < 8 ? avail : 8);
    return _mm512_set1_epi64((long long)v);
}

AVX512_FN static float row_dot_b4_avx512(const Layout4 *L, int r, const float *x, int cols) {
    /* byte 0 of dword lane j <- bits [4j, 4j+8) of the qword (both dwords of a qword lane) */
    const __m512i ctrl = _mm512_set_epi64(
        (long long)0x0000003c00000038, (long long)0x0000003400000030,
        (long long)0x0000002c00000028, (long long)0x0000002400000020,
        (long long)0x0000001c00000018, (long long)0x0000001400000010,
        (long long)0x0000000c00000008, (long long)0x0000000400000000);
    const uint8_t *row = L->indices + (size_t)r * L->row_bytes;
    const size_t cb0 = (size_t)r * (size_t)L->n_sub * 16u;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int s = 0; s < L->n_sub; s++) {
        int c0 = s * L->group_size;
        int c1 = c0 + L->group_size < cols ? c0 + L->group_size : cols; /* tail sub-block */
        size_t i0 = cb0 + 16u * (size_t)s;
        __m512 cb = L->is_f16
            ? _mm512_cvtph_ps(_mm256_loadu_si256(
                  (const __m256i *)(const void *)(L->codebooks + 2 * i0)))
            : _mm512_loadu_ps((const float *)(const void *)(L->codebooks + 4 * i0));
        int c = c0;
        for (; c + 32 <= c1; c += 32) {
            __m512i i0v = _mm512_multishift_epi64_epi8(ctrl, nibbles16(row + c / 2, 8));
            __m512i i1v = _mm512_multishift_epi64_epi8(ctrl, nibbles16(row + c / 2 + 8, 8));
            acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(i0v, cb), _mm512_loadu_ps(x + c), acc0);
            acc1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(i1v, cb), _mm512_loadu_ps(x + c + 16),
                                   acc1);
        }
        if (c + 16 <= c1) {
            __m512i iv = _mm512_multishift_epi64_epi8(ctrl, nibbles16(row + c / 2, 8));
            acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(iv, cb), _mm512_loadu_ps(x + c), acc0);
            c += 16;
        }
        if (c < c1) { /* the row's last 1..15 columns (G % 16 == 0: only in the last sub-block) */
            __mmask16 k = (__mmask16)((1u << (c1 - c)) - 1u);
            __m512i iv = _mm512_multishift_epi64_epi8(
                ctrl, nibbles16(row + c / 2, L->row_bytes - (size_t)c / 2));
            __m512 w = _mm512_permutexvar_ps(iv, cb);
            acc1 = _mm512_mask3_fmadd_ps(w, _mm512_maskz_loadu_ps(k, x + c), acc1, k);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

void codebook_gemv_avx512(float *y, const float *x, const uint8_t *payload,
                          uint32_t codebook_type, int bits, int group_size, int rows, int cols) {
    if (bits != 4 || group_size < 16 || group_size % 16 != 0 || !codebook_avx512_supported()) {
        codebook_gemv_avx2(y, x, payload, codebook_type, bits, group_size, rows, cols);
        return;
    }
    Layout4 L;
    L.is_f16 = codebook_type == DITTO_CB_F16;
    L.group_size = group_size;
    L.n_sub = (int)ditto_cb_n_sub((uint64_t)cols, (uint64_t)group_size);
    L.row_bytes = (size_t)ditto_cb_row_bytes((uint64_t)cols, 4u);
    L.codebooks = payload;
    L.indices = payload + ditto_cb_codebook_bytes((uint64_t)rows, (uint64_t)cols, 4u,
                                                  (uint64_t)group_size, codebook_type);
    int r;
#pragma omp parallel for schedule(static) private(r)
    for (r = 0; r < rows; r++) y[r] = row_dot_b4_avx512(&L, r, x, cols);
}

#endif
