/* qgemm_driver.c: a kernel table's int8 GEMM (KernelTable.i8_gemm, batched prefill) against
 * the scalar reference GEMV, bit for bit.
 *
 * Usage: qgemm_driver KERNEL. For b = 1..8, group sizes G from 32 to 4160 (G <= 512 and G >
 * 512: the AVX2 GEMM's int32 runs and decode blocks are 512 columns), row lengths that are and
 * are not multiples of 32, and T = 1..9 inputs (odd and even, a partial group of four): random
 * int8 codebook payloads allocated at their exact size (so ASan sees any read past the end),
 * with fully random index bytes (the padding of a row's last group included); each input random
 * with an all-zero block and an outlier, quantized by the table's act_quantize. The GEMM runs
 * on several row ranges [r0, r1) of each tensor (all rows, one row, the last row, a middle run)
 * into Y prefilled with a sentinel: inside the range Y[t][r] must equal i8cb_rows_generic's
 * y[r] for input t, outside it must keep the sentinel. Prints "ok N cases, M GEMM calls" and
 * exits 0, or prints the first mismatch and exits 1; exits 2 when the kernel is unknown, this
 * CPU cannot run it, or it has no GEMM. Built for x86-64 (run natively under ASan/UBSan and
 * through Ditto's IR pipeline, for every table: avx2, avxvnni, avx512vnni, avx512vbmi) and for
 * aarch64 (run under qemu-aarch64).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "qdriver_rand.h"

#define T_MAX 9

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s KERNEL\n", argv[0]);
        return 2;
    }
    const char *kernel = argv[1];
    const KernelTable *K = kernel_table_by_name(kernel);
    if (!K || !K->supported()) {
        fprintf(stderr, "kernel %s: unknown or not supported by this CPU\n", kernel);
        return 2;
    }
    if (!K->i8_gemm) {
        fprintf(stderr, "kernel %s: no GEMM kernel\n", kernel);
        return 2;
    }
    rng_state = 0x2545F4914F6CDD1Dull; /* other cases than qgemv_driver's */
    ActQuantFn quant = K->act_quant ? K->act_quant : act_quantize_generic;
    static const int groups[] = {32, 64, 256, 512, 576, 4160};
    static const int lengths[] = {32, 33, 100, 257, 576, 1000, 4200};
    QuantActs qa[T_MAX];
    memset(qa, 0, sizeof qa);
    const uint32_t sentinel = 0x7fc0dead; /* a NaN no kernel produces */
    int cases = 0, calls = 0, T = 0;
    for (int b = 1; b <= 8; b++) {
        for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
            for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
                int G = groups[gi], cols = lengths[li];
                if (G > cols) G = cols; /* as gemm_i8() sees it */
                if (G % 32) continue;   /* the GEMM slot's contract: G % 32 == 0 */
                T = T % T_MAX + 1;
                int rows = 1 + (int)(rnd() % 37);
                if (cols >= 1000) rows = 1 + (int)(rnd() % 5);
                uint8_t *p = random_i8cb_payload(b, G, rows, cols);
                float *x = malloc((size_t)cols * sizeof *x);
                float *yref = malloc((size_t)T * (size_t)rows * sizeof *yref);
                float *Y = malloc((size_t)T * (size_t)rows * sizeof *Y);
                if (!p || !x || !yref || !Y) return 3;
                I8Layout L = i8_layout(p, b, G, rows, cols);
                for (int t = 0; t < T; t++) {
                    for (int c = 0; c < cols; c++) x[c] = rnd_float();
                    if (cols > 64)
                        for (int c = 32; c < 64; c++) x[c] = 0.0f; /* an all-zero block */
                    x[(int)(rnd() % (unsigned)cols)] = 300.0f * rnd_float(); /* an outlier */
                    if (quant(&qa[t], x, cols, K->vnni_acts)) return 3;
                    i8cb_rows_generic(yref + (size_t)t * (size_t)rows, &qa[t], &L, 0, rows,
                                      cols);
                }
                int mid0 = rows / 3, mid1 = rows - rows / 3;
                const int ranges[4][2] = {{0, rows}, {0, 1}, {rows - 1, rows}, {mid0, mid1}};
                for (int ri = 0; ri < 4; ri++) {
                    int r0 = ranges[ri][0], r1 = ranges[ri][1];
                    for (size_t i = 0; i < (size_t)T * (size_t)rows; i++)
                        memcpy(&Y[i], &sentinel, sizeof sentinel);
                    K->i8_gemm(Y, qa, T, &L, r0, r1, rows, cols, NULL);
                    calls++;
                    for (int t = 0; t < T; t++) {
                        for (int r = 0; r < rows; r++) {
                            size_t i = (size_t)t * (size_t)rows + (size_t)r;
                            const float *got = &Y[i];
                            const void *want = r >= r0 && r < r1 ? (const void *)&yref[i]
                                                                 : (const void *)&sentinel;
                            if (memcmp(got, want, sizeof(float)) != 0) {
                                printf("MISMATCH kernel=%s b=%d G=%d cols=%d rows=%d T=%d rows "
                                       "[%d, %d) input %d row %d: %.9g vs %.9g (%s)\n",
                                       kernel, b, G, cols, rows, T, r0, r1, t, r, (double)*got,
                                       (double)*(const float *)want,
                                       r >= r0 && r < r1 ? "reference" : "untouched");
                                return 1;
                            }
                        }
                    }
                }
                free(p);
                free(x);
                free(yref);
                free(Y);
                cases++;
            }
        }
    }
    for (int t = 0; t < T_MAX; t++) act_free(&qa[t]);
    printf("ok %d cases, %d GEMM calls\n", cases, calls);
    return 0;
}
