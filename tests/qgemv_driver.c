/* qgemv_driver.c: every integer GEMV kernel table against the scalar reference, bit for bit.
 *
 * Usage: qgemv_driver KERNEL [CASES [-v]]. For b = 1..8, a list of group sizes G (multiples of
 * 32 and 64, and not) and row lengths (with partial blocks and partial index groups), random int8
 * codebook payloads allocated at their exact size (so ASan sees any read past the end), with
 * fully random index bytes (including the padding of a row's last group), random centroids in
 * -127..127 and random f16 scales; x random with a few zero blocks and one large outlier.
 * Each case also runs the table's GEMM (gemm_i8) on 1..14 inputs, every one of them equal to
 * the reference GEMV of that input. The b = 4 cases whose G and row length fit row tiles
 * (qgemv.h i8_tiles_fit) also run on a fresh payload of a whole number of tiles, put in tiles
 * by kernels_tile_tensor when the table reads them, through gemv (the table's tiled kernel, then
 * the scalar reference's fallback with "generic" selected) and the GEMM. Prints "tiled: N cases
 * equal the reference", then "ok N cases (M through the SIMD path, K through the GEMM kernel)"
 * and exits 0 (with -v, first one line "gemm b=B G=G cols=C T=T: equal" per GEMM case that
 * ran), or prints the first mismatch and exits 1; exits 2 when the kernel is unknown or this
 * CPU cannot run it. Built for x86-64 (run natively, also under ASan/UBSan) and for aarch64
 * (run under qemu-aarch64).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/matmul.h"
#include "qdriver_rand.h"

static int same_bits(const float *a, const float *b, int n, const char *what, int G, int cols) {
    for (int r = 0; r < n; r++)
        if (memcmp(&a[r], &b[r], sizeof(float)) != 0) {
            printf("MISMATCH tiled %s G=%d cols=%d row %d: %.9g vs %.9g (reference)\n", what, G,
                   cols, r, (double)a[r], (double)b[r]);
            return 0;
        }
    return 1;
}

/* One tiled case (see the top): 1 when the table tiled and every result equals the reference,
 * 0 when it did not tile, -1 on a mismatch, -3 out of memory. */
static int tiled_case(const char *kernel, int G, int cols, int rows, const float *X, int T) {
    uint8_t *p = random_i8cb_payload(4, G, rows, cols);
    size_t nbytes = (size_t)ditto_cb_codebook_bytes((uint64_t)rows, (uint64_t)cols, 4u,
                                                    (uint64_t)G, DITTO_CB_I8) +
                    (size_t)rows * (size_t)ditto_cb_row_bytes((uint64_t)cols, 4u);
    uint8_t *ref = malloc(nbytes);
    float *y = malloc((size_t)rows * sizeof *y), *y0 = malloc((size_t)rows * sizeof *y0);
    float *Y = malloc((size_t)T * (size_t)rows * sizeof *Y);
    if (!p || !ref || !y || !y0 || !Y) return -3;
    memcpy(ref, p, nbytes);
    char err[256];
    Tensor W = {.name = "w", .encoding = DITTO_ENC_CODEBOOK, .codebook_type = DITTO_CB_I8,
                .bits = 4, .group_size = (uint32_t)G, .rows = (uint64_t)rows,
                .cols = (uint64_t)cols, .data = p, .nbytes = nbytes, .ndim = 2};
    int rc = 0;
    if (kernels_select(kernel, err, sizeof err) || kernels_tile_tensor(&W) < 0) {
        rc = -3;
    } else if (W.tiled) {
        rc = 1;
        for (int pass = 0; pass < 2 && rc == 1; pass++) {
            if (pass == 1 && kernels_select("generic", err, sizeof err)) rc = -3;
            for (int t = 0; t < T && rc == 1; t++) {
                const float *x = X + (size_t)t * (size_t)cols;
                if (i8cb_gemv_with("generic", y0, x, ref, 4, G, rows, cols) < 0) rc = -3;
                gemv(y, x, &W);
                if (rc == 1 && !same_bits(y, y0, rows, pass ? "generic gemv" : "gemv", G, cols))
                    rc = -1;
            }
        }
        if (rc == 1 && kernels_select(kernel, err, sizeof err)) rc = -3;
        if (rc == 1) gemm_i8_float_input(Y, X, T, &W);
        for (int t = 0; t < T && rc == 1; t++) {
            if (i8cb_gemv_with("generic", y0, X + (size_t)t * (size_t)cols, ref, 4, G, rows,
                               cols) < 0)
                rc = -3;
            else if (!same_bits(Y + (size_t)t * (size_t)rows, y0, rows, "GEMM", G, cols))
                rc = -1;
        }
    }
    free(p);
    free(ref);
    free(y);
    free(y0);
    free(Y);
    return rc;
}

/* One case: b-bit codebooks with sub-blocks of G on a random number of rows of cols columns,
 * the table's GEMV and GEMM against the reference (and row tiles where they fit). 0 when equal
 * (counting into simd, gemm and tiled), 1 on a mismatch (printed), 3 when out of memory. */
static int run_case(const char *kernel, int b, int G, int cols, int case_no, int verbose,
                    int *simd, int *gemm, int *tiled) {
    int rows = 1 + (int)(rnd() % 40);
    if (cols >= 1000 && b != 4) rows = 3;
    uint8_t *p = random_i8cb_payload(b, G, rows, cols);
    float *x = malloc((size_t)cols * sizeof *x);
    float *y0 = malloc((size_t)rows * sizeof *y0), *y1 = malloc((size_t)rows * sizeof *y1);
    if (!p || !x || !y0 || !y1) return 3;
    for (int c = 0; c < cols; c++) x[c] = rnd_float();
    if (cols > 64)
        for (int c = 32; c < 64; c++) x[c] = 0.0f; /* an all-zero block */
    if (cols > 5) x[cols / 2] = 300.0f * rnd_float(); /* an outlier */
    int r0 = i8cb_gemv_with("generic", y0, x, p, b, G, rows, cols);
    int r1 = i8cb_gemv_with(kernel, y1, x, p, b, G, rows, cols);
    if (r0 < 0 || r1 < 0) return 3;
    *simd += r1;
    for (int r = 0; r < rows; r++) {
        if (memcmp(&y0[r], &y1[r], sizeof(float)) != 0) {
            printf("MISMATCH kernel=%s b=%d G=%d cols=%d rows=%d row %d: %.9g vs "
                   "%.9g (reference)\n", kernel, b, G, cols, rows, r, (double)y1[r],
                   (double)y0[r]);
            return 1;
        }
    }
    /* the table's GEMM: T inputs (x first), each row equal to the reference GEMV */
    int T = 1 + (int)(rnd() % 14);
    float *X = malloc((size_t)T * (size_t)cols * sizeof *X);
    float *Y = malloc((size_t)T * (size_t)rows * sizeof *Y);
    if (!X || !Y) return 3;
    memcpy(X, x, (size_t)cols * sizeof *X);
    for (size_t i = (size_t)cols; i < (size_t)T * (size_t)cols; i++)
        X[i] = rnd_float() * (float)(1 + rnd() % 4);
    int rg = i8cb_gemm_with(kernel, Y, X, T, p, b, G, rows, cols);
    if (rg < 0) return 3;
    *gemm += rg;
    for (int t = 0; t < T; t++) {
        if (i8cb_gemv_with("generic", y0, X + (size_t)t * (size_t)cols, p, b, G,
                           rows, cols) < 0)
            return 3;
        for (int r = 0; r < rows; r++) {
            if (memcmp(&y0[r], &Y[(size_t)t * (size_t)rows + (size_t)r],
                       sizeof(float)) != 0) {
                printf("MISMATCH GEMM kernel=%s b=%d G=%d cols=%d rows=%d T=%d "
                       "input %d row %d: %.9g vs %.9g (reference)\n", kernel, b, G,
                       cols, rows, T, t, r,
                       (double)Y[(size_t)t * (size_t)rows + (size_t)r],
                       (double)y0[r]);
                return 1;
            }
        }
    }
    if (verbose && rg > 0)
        printf("gemm b=%d G=%d cols=%d T=%d: equal\n", b, G, cols, T);
    if (b == 4 && i8_tiles_fit(4, G < cols ? G : cols, 4, cols)) {
        int rt = tiled_case(kernel, G, cols, 4 * (1 + case_no % 10), X, T);
        if (rt < 0) return rt == -1 ? 1 : 3;
        *tiled += rt;
    }
    free(X);
    free(Y);
    free(p);
    free(x);
    free(y0);
    free(y1);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s KERNEL [CASES [-v]]\n", argv[0]);
        return 2;
    }
    const char *kernel = argv[1];
    int max_cases = argc > 2 ? atoi(argv[2]) : 1 << 30;
    int verbose = argc > 3 && strcmp(argv[3], "-v") == 0;
    const KernelTable *K = kernel_table_by_name(kernel);
    if (!K || !K->supported()) {
        fprintf(stderr, "kernel %s: unknown or not supported by this CPU\n", kernel);
        return 2;
    }
    /* the table's act_quantize into one QuantActs reused across lengths (as decode reuses
     * its buffers), its arrays dirtied in between, against act_quantize_generic on a fresh one:
     * the same bytes in everything a kernel reads */
    if (K->act_quant) {
        static const int ns[] = {4200, 65, 1000, 33, 576, 100, 7, 4200, 1, 130, 64};
        QuantActs qa, ref;
        memset(&qa, 0, sizeof qa);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            int n = ns[i];
            float *x = malloc((size_t)n * sizeof *x);
            if (!x) return 3;
            for (int c = 0; c < n; c++) x[c] = rnd_float() * (float)(1 + c % 7);
            memset(&ref, 0, sizeof ref);
            if (K->act_quant(&qa, x, n, 1) || act_quantize_generic(&ref, x, n, 1)) return 3;
            size_t np = (size_t)ref.n_pad, n128 = (np + 127) / 128 * 128;
            if (qa.n_pad != ref.n_pad || qa.has_vnni != 1 || memcmp(&qa.D, &ref.D, sizeof qa.D) ||
                memcmp(qa.m, ref.m, np / 32) || memcmp(qa.q, ref.q, np) ||
                memcmp(qa.qp, ref.qp, np) || memcmp(qa.aqp, ref.aqp, np) ||
                memcmp(qa.qp64, ref.qp64, np) || memcmp(qa.aqp64, ref.aqp64, np) ||
                memcmp(qa.m64, ref.m64, np / 4 * sizeof *qa.m64) ||
                memcmp(qa.ml, ref.ml, n128) || memcmp(qa.mh, ref.mh, n128) ||
                memcmp(qa.nl, ref.nl, np) || memcmp(qa.nh, ref.nh, np) ||
                memcmp(qa.msum, ref.msum, np / 32 * sizeof *qa.msum)) {
                printf("MISMATCH act_quantize kernel=%s n=%d (reused buffers)\n", kernel, n);
                return 1;
            }
            memset(qa.ml, 0x5a, qa.cap + 64); /* garbage for the next, shorter input */
            memset(qa.mh, 0xa5, qa.cap + 64);
            memset(qa.qp64, 0x5a, qa.cap);
            memset(qa.aqp64, 0xa5, qa.cap);
            memset(qa.m64, 0x5a, qa.cap / 4 * sizeof *qa.m64);
            act_free(&ref);
            free(x);
        }
        act_free(&qa);
        printf("act_quantize: %zu lengths with reused buffers equal the reference\n",
               sizeof ns / sizeof ns[0]);
    }
    static const int groups[] = {32, 64, 128, 256, 576, 4160, 2, 7, 48, 100};
    static const int lengths[] = {1, 7, 31, 32, 33, 63, 64, 65, 100, 257, 576, 1000, 4200};
    /* run after all of the above, so their random data (and the GEMM case pinned in
     * tests/test_kernels_int.py) stay as they were: 700 columns end in a partial chunk of at
     * most 64 columns after a whole step of the same sub-block (G = 256) or alone (G = 128) */
    static const int later_lengths[] = {700};
    int cases = 0, simd = 0, gemm = 0, tiled = 0;
    for (int pass = 0; pass < 2; pass++) {
        const int *ls = pass ? later_lengths : lengths;
        const size_t nl = pass ? sizeof later_lengths / sizeof later_lengths[0]
                               : sizeof lengths / sizeof lengths[0];
        for (int b = 1; b <= 8; b++) {
            for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
                for (size_t li = 0; li < nl; li++) {
                    if (cases >= max_cases) goto done;
                    int rc = run_case(kernel, b, groups[gi], ls[li], cases, verbose, &simd,
                                      &gemm, &tiled);
                    if (rc) return rc;
                    cases++;
                }
            }
        }
    }
done:
    printf("tiled: %d cases equal the reference\n", tiled);
    printf("ok %d cases (%d through the SIMD path, %d through the GEMM kernel)\n", cases, simd,
           gemm);
    return 0;
}
