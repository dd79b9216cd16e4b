/* codebook_simd_driver.c: codebook_gemv_avx2 (native/kernels/arch/x86/codebook_avx2.c) and codebook_gemv_avx512
 * (native/kernels/arch/x86/codebook_avx512.c) against the scalar reference codebook_gemv_ref
 * (native/kernels/codebook_ref.c)
 * on random payloads, for tests/test_kernels_simd.py
 * (built plainly, under ASan+UBSan, and through Ditto's own IR pipeline).
 *
 * Every payload and x is malloc'ed at its exact size, so a sanitizer build catches any read
 * past the indices or x. Index bytes are fully random (the padding indices of a row's last
 * group too: kernels must ignore them). f16 codebooks are random normal and subnormal halves.
 *
 * For every b in 1..8, G in {8,16,32,64,256,7,100,2,24}, cols in a list with tails, and both
 * codebook types: per row and kernel |simd - ref| <= 1e-5 * sum_c |W[r][c] x[c]| (the bound of a
 * reordered float32 sum), W decoded with codebook_row_ref. Prints "cases N max_rel E" and
 * exits 0, or prints the first failure and exits 1.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/arch/x86/codebook_avx2.h"
#include "kernels/arch/x86/codebook_avx512.h"
#include "kernels/matmul.h"
#include "model/ditto_format.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15u;

static uint32_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Du) >> 32);
}

static float rnd_float(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; }

/* A random finite half: mostly normal with exponent in [-10, 4], one in 16 subnormal. */
static uint16_t rnd_half(void) {
    uint32_t sign = rnd() & 1u, man = rnd() & 0x3ffu;
    uint32_t exp = (rnd() & 15u) == 0 ? 0u : 5u + rnd() % 15u;
    return (uint16_t)(sign << 15 | exp << 10 | man);
}

static int check(int bits, int G, int rows, int cols, uint32_t type, double *max_rel) {
    int n_sub = (cols + G - 1) / G, k = 1 << bits;
    size_t cb_bytes = (size_t)rows * (size_t)n_sub * (size_t)k * (type == DITTO_CB_F16 ? 2u : 4u);
    cb_bytes = (cb_bytes + 63u) & ~(size_t)63u;
    size_t row_bytes = (size_t)((cols + 7) / 8) * (size_t)bits;
    size_t nbytes = cb_bytes + (size_t)rows * row_bytes;
    uint8_t *payload = malloc(nbytes);
    float *x = malloc((size_t)cols * sizeof *x), *w = malloc((size_t)cols * sizeof *w);
    float *y_ref = malloc((size_t)rows * sizeof *y_ref), *y = malloc((size_t)rows * sizeof *y);
    float *y5 = malloc((size_t)rows * sizeof *y5);
    if (!payload || !x || !w || !y_ref || !y || !y5) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    memset(payload, 0, cb_bytes);
    size_t n_cb = (size_t)rows * (size_t)n_sub * (size_t)k;
    for (size_t i = 0; i < n_cb; i++) {
        if (type == DITTO_CB_F16) {
            uint16_t h = rnd_half();
            memcpy(payload + 2 * i, &h, 2);
        } else {
            float f = rnd_float();
            memcpy(payload + 4 * i, &f, 4);
        }
    }
    for (size_t i = cb_bytes; i < nbytes; i++) payload[i] = (uint8_t)rnd();
    for (int c = 0; c < cols; c++) x[c] = rnd_float();

    codebook_gemv_ref(y_ref, x, payload, type, bits, G, rows, cols);
    codebook_gemv_avx2(y, x, payload, type, bits, G, rows, cols);
    codebook_gemv_avx512(y5, x, payload, type, bits, G, rows, cols);
    int ok = 1;
    for (int r = 0; r < rows && ok; r++) {
        codebook_row_ref(w, payload, type, bits, G, rows, cols, r);
        double bound = 0.0;
        for (int c = 0; c < cols; c++) bound += fabs((double)w[c] * (double)x[c]);
        for (int kernel = 0; kernel < 2 && ok; kernel++) {
            float got = kernel == 0 ? y[r] : y5[r];
            double err = fabs((double)got - (double)y_ref[r]);
            if (bound > 0 && err / bound > *max_rel) *max_rel = err / bound;
            if (!(err <= 1e-5 * bound)) {
                printf("FAIL %s b=%d G=%d rows=%d cols=%d type=%u row %d: %.9g ref %.9g "
                       "(bound %g)\n", kernel == 0 ? "avx2" : "avx512", bits, G, rows, cols,
                       type, r, (double)got, (double)y_ref[r], bound);
                ok = 0;
            }
        }
    }
    free(payload);
    free(x);
    free(w);
    free(y_ref);
    free(y);
    free(y5);
    return ok;
}

int main(void) {
    static const int group_sizes[] = {8, 16, 32, 64, 256, 7, 100, 2, 24, 48};
    static const int col_list[] = {1, 5, 8, 9, 16, 23, 64, 100, 255, 257, 576, 1000};
    int cases = 0;
    double max_rel = 0.0;
    if (!codebook_avx2_supported()) printf("note: no AVX2/FMA/F16C, reference fallback only\n");
    if (!codebook_avx512_supported()) printf("note: no AVX-512 VBMI, AVX2 fallback only\n");
    for (int bits = 1; bits <= 8; bits++)
        for (size_t g = 0; g < sizeof group_sizes / sizeof *group_sizes; g++)
            for (size_t c = 0; c < sizeof col_list / sizeof *col_list; c++)
                for (uint32_t type = 0; type <= 1; type++) {
                    int rows = 1 + (int)(rnd() % 9);
                    if (!check(bits, group_sizes[g], rows, col_list[c], type, &max_rel)) return 1;
                    cases++;
                }
    printf("cases %d max_rel %.3g\n", cases, max_rel);
    return 0;
}
