/* kernels.c: the GEMV kernel tables, their selection by CPU features, and the threaded int8
 * codebook GEMV (kernels.h). */
#define _DEFAULT_SOURCE 1 /* madvise and MADV_HUGEPAGE (Linux), for huge_pages.h */
#include "kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/huge_pages.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "arch/x86/codebook_avx2.h"
#include "arch/x86/codebook_avx512.h"

#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

static int always(void) { return 1; }

#if defined(__x86_64__) || defined(__i386__)
void i8cb_b4_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                       int cols);
void i8cb_b4_rows_avxvnni(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                          int cols);
void i8cb_b4_rows_avx512vnni(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                             int cols);
void i8cb_b4_rows_avx512vbmi(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                             int cols);
void i8cb_b6_rows_avx512vbmi(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                             int cols);
void i8cb_b6_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                       int cols);
void i8cb_rows_avx2_any(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                        int cols);
void i8cb_rows_avx512vbmi_any(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                              int cols);
void i8cb_b5_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                       int cols);
void i8cb_b4_tiled_rows_avx512vbmi(float *y, const QuantActs *qa, const I8Layout *L, int r0,
                                   int r1, int cols);
void i8cb_b4_tiled_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                             int cols);
void i8_dec8_rows_avx2(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                       int cols);
void i8_decode_rows_avx2(int8_t *w8, const I8Layout *L, int r0, int r1, int cols);
int act_quantize_avx2(QuantActs *qa, const float *x, int n, int flags);
int act_quantize_avx512(QuantActs *qa, const float *x, int n, int flags);
void i8cb_gemm_avx2(float *Y, const QuantActs *qa, int T, const I8Layout *L, int r0, int r1,
                    int rows, int cols, const GemmPrep *prep);
void i8cb_gemm_avxvnni(float *Y, const QuantActs *qa, int T, const I8Layout *L, int r0, int r1,
                       int rows, int cols, const GemmPrep *prep);
void i8cb_gemm_avx512vbmi(float *Y, const QuantActs *qa, int T, const I8Layout *L, int r0,
                          int r1, int rows, int cols, const GemmPrep *prep);
void i8cb_gemm_avx512vnni(float *Y, const QuantActs *qa, int T, const I8Layout *L, int r0,
                          int r1, int rows, int cols, const GemmPrep *prep);
void i8cb_gemm_prep_pairs(int32_t *pairs, const QuantActs *qa, int T, int g);

static int has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
}
static int has_avxvnni(void) { return has_avx2() && __builtin_cpu_supports("avxvnni"); }
static int has_avx512vnni(void) {
    return has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
}
static int has_avx512vbmi(void) {
    return has_avx512vnni() && __builtin_cpu_supports("avx512vbmi");
}

static const KernelTable TABLES[] = {
    {"avx512vbmi", "avx512f avx512bw avx512vl avx512_vnni avx512vbmi avx2 fma f16c bmi2",
     has_avx512vbmi, i8cb_b4_rows_avx512vbmi, 32, i8cb_b6_rows_avx512vbmi,
     i8cb_rows_avx512vbmi_any, i8cb_gemm_avx512vbmi, 1, codebook_gemv_avx512, act_quantize_avx512,
     NULL, NULL, NULL, i8cb_b4_tiled_rows_avx512vbmi, 1, NULL},
    {"avx512vnni", "avx512f avx512bw avx512vl avx512_vnni avx2 fma f16c bmi2", has_avx512vnni,
     i8cb_b4_rows_avx512vnni, 32, i8cb_b6_rows_avx2, i8cb_rows_avx2_any, i8cb_gemm_avx512vnni, 1,
     codebook_gemv_avx512, act_quantize_avx512, i8_dec8_rows_avx2, i8_decode_rows_avx2,
     i8cb_b5_rows_avx2, NULL, 1, NULL},
    {"avxvnni", "avx_vnni avx2 fma f16c bmi2", has_avxvnni, i8cb_b4_rows_avxvnni, 32,
     i8cb_b6_rows_avx2, i8cb_rows_avx2_any, i8cb_gemm_avxvnni, 1, codebook_gemv_avx2,
     act_quantize_avx2, i8_dec8_rows_avx2, i8_decode_rows_avx2, i8cb_b5_rows_avx2, NULL, 1,
     i8cb_gemm_prep_pairs},
    {"avx2", "avx2 fma f16c bmi2", has_avx2, i8cb_b4_rows_avx2, 32, i8cb_b6_rows_avx2,
     i8cb_rows_avx2_any, i8cb_gemm_avx2, 0, codebook_gemv_avx2, act_quantize_avx2,
     i8_dec8_rows_avx2, i8_decode_rows_avx2, i8cb_b5_rows_avx2, i8cb_b4_tiled_rows_avx2, 1,
     i8cb_gemm_prep_pairs},
    {"generic", "", always, NULL, 1, NULL, NULL, NULL, 0, codebook_gemv_ref, NULL, NULL, NULL,
     NULL, NULL, 0, NULL},
};

#elif defined(__aarch64__)
void i8cb_b4_rows_neon(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                       int cols);
void i8cb_b6_rows_neon(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                       int cols);
void i8cb_rows_neon_any(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                        int cols);
void i8cb_gemm_neon(float *Y, const QuantActs *qa, int T, const I8Layout *L, int r0, int r1,
                    int rows, int cols, const GemmPrep *prep);

static int has_neon_dotprod(void) {
#if defined(__APPLE__)
    return 1; /* every Apple M-series core has the dot product instructions */
#else
    return (getauxval(AT_HWCAP) & (1ul << 20)) != 0; /* HWCAP_ASIMDDP */
#endif
}

static const KernelTable TABLES[] = {
    {"neon", "asimddp", has_neon_dotprod, i8cb_b4_rows_neon, 32, i8cb_b6_rows_neon,
     i8cb_rows_neon_any, i8cb_gemm_neon, 0, codebook_gemv_ref, NULL, NULL, NULL, NULL, NULL,
     0, NULL},
    {"generic", "", always, NULL, 1, NULL, NULL, NULL, 0, codebook_gemv_ref, NULL, NULL, NULL,
     NULL, NULL, 0, NULL},
};

#else
static const KernelTable TABLES[] = {
    {"generic", "", always, NULL, 1, NULL, NULL, NULL, 0, codebook_gemv_ref, NULL, NULL, NULL,
     NULL, NULL, 0, NULL},
};
#endif

#define N_TABLES ((int)(sizeof TABLES / sizeof TABLES[0]))

static const KernelTable *active = NULL;

const KernelTable *kernel_tables(int *n) {
    *n = N_TABLES;
    return TABLES;
}

/* Whether this CPU has feature f, spelled as in /proc/cpuinfo (a table's `features`). */
static int cpu_has(const char *f) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!strcmp(f, "avx2")) return __builtin_cpu_supports("avx2");
    if (!strcmp(f, "fma")) return __builtin_cpu_supports("fma");
    if (!strcmp(f, "f16c")) return __builtin_cpu_supports("f16c");
    if (!strcmp(f, "bmi2")) return __builtin_cpu_supports("bmi2");
    if (!strcmp(f, "avx_vnni")) return __builtin_cpu_supports("avxvnni");
    if (!strcmp(f, "avx512f")) return __builtin_cpu_supports("avx512f");
    if (!strcmp(f, "avx512bw")) return __builtin_cpu_supports("avx512bw");
    if (!strcmp(f, "avx512vl")) return __builtin_cpu_supports("avx512vl");
    if (!strcmp(f, "avx512_vnni")) return __builtin_cpu_supports("avx512vnni");
    if (!strcmp(f, "avx512vbmi")) return __builtin_cpu_supports("avx512vbmi");
#elif defined(__aarch64__)
    if (!strcmp(f, "asimddp")) return has_neon_dotprod();
#else
    (void)f;
#endif
    return 0;
}

/* The space-separated features of `features` this CPU lacks, comma-separated, into out. */
static void missing_features(const char *features, char *out, size_t n) {
    char f[32];
    out[0] = '\0';
    for (const char *p = features; *p;) {
        size_t len = strcspn(p, " ");
        if (len > 0 && len < sizeof f) {
            memcpy(f, p, len);
            f[len] = '\0';
            if (!cpu_has(f)) {
                strncat(out, out[0] ? ", " : "", n - strlen(out) - 1);
                strncat(out, f, n - strlen(out) - 1);
            }
        }
        p += len;
        p += strspn(p, " ");
    }
}

const char *kernel_name_at(int i) { return i >= 0 && i < N_TABLES ? TABLES[i].name : NULL; }

const char *kernel_features_at(int i) {
    return i >= 0 && i < N_TABLES ? TABLES[i].features : NULL;
}

int kernel_supported_at(int i) { return i >= 0 && i < N_TABLES ? TABLES[i].supported() : 0; }

const char *kernel_active_name(void) { return kernels_active()->name; }

const KernelTable *kernel_table_by_name(const char *name) {
    for (int i = 0; i < N_TABLES; i++)
        if (strcmp(TABLES[i].name, name) == 0) return &TABLES[i];
    return NULL;
}

int kernels_select(const char *force, char *err, size_t errlen) {
    if (!force || !*force) force = getenv("DITTO_KERNEL");
    if (force && *force) {
        const KernelTable *t = kernel_table_by_name(force);
        if (!t) {
            char names[256] = "";
            for (int i = 0; i < N_TABLES; i++) {
                strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
                strncat(names, TABLES[i].name, sizeof names - strlen(names) - 1);
            }
            snprintf(err, errlen, "unknown kernel '%s' (this program has: %s)", force, names);
            return -1;
        }
        if (!t->supported()) {
            char missing[256];
            missing_features(t->features, missing, sizeof missing);
            snprintf(err, errlen, "kernel '%s' needs CPU features this CPU lacks: %s", force,
                     missing);
            return -1;
        }
        active = t;
        return 0;
    }
    for (int i = 0; i < N_TABLES; i++) {
        if (TABLES[i].supported()) {
            active = &TABLES[i];
            return 0;
        }
    }
    active = &TABLES[N_TABLES - 1];
    return 0;
}

const KernelTable *kernels_active(void) {
    if (!active) {
        char err[256];
        if (kernels_select(NULL, err, sizeof err)) { /* a bad DITTO_KERNEL: say so, go on */
            fprintf(stderr, "ditto: DITTO_KERNEL: %s; using the default\n", err);
            kernels_select("", err, sizeof err);
            for (int i = 0; i < N_TABLES && !active; i++)
                if (TABLES[i].supported()) active = &TABLES[i];
        }
    }
    return active;
}

static int act_quantize_by(const KernelTable *K, QuantActs *qa, const float *x, int n,
                           int flags) {
    return (K->act_quant ? K->act_quant : act_quantize_generic)(qa, x, n, flags);
}

int act_quantize(QuantActs *qa, const float *x, int n, int flags) {
    return act_quantize_by(kernels_active(), qa, x, n, flags);
}

I8RowsFn kernel_pick_i8(const KernelTable *K, int bits, int G, int has_vnni) {
    if (K->i8_b4 && bits == 4 && G % K->i8_b4_chunk == 0 && (!K->vnni_acts || has_vnni))
        return K->i8_b4;
    if (K->i8_b6 && bits == 6 && G % 32 == 0) return K->i8_b6;
    if (K->i8_b5 && bits == 5 && G % 32 == 0) return K->i8_b5;
    if (K->i8_any && G % 32 == 0) return K->i8_any;
    return i8cb_rows_generic;
}

void split_rows(int rows, int t, int nt, int *r0, int *r1) {
    int nblk = (rows + 15) / 16;
    int b0 = (int)((long long)nblk * t / nt), b1 = (int)((long long)nblk * (t + 1) / nt);
    *r0 = b0 * 16 < rows ? b0 * 16 : rows;
    *r1 = b1 * 16 < rows ? b1 * 16 : rows;
}

/* A GEMV's rows in chunks that threads claim in turn (gemv_i8, gemv_i8_multi, and the
 * prefill GEMMs through gemm_rows_claimed). A GEMV of decode streams its weights from memory,
 * and the two threads of a 2-vCPU machine do not stream at the same rate (perf on a Zen 3 VM:
 * one spent a third of a token waiting at the barrier behind the other with an even split),
 * so rows go in chunks of decreasing size, as OpenMP's guided schedule makes them: each chunk
 * is the unclaimed runs of 16 rows over twice the thread count, but at least ROW_CHUNK_BYTES
 * of weights (one claim, an atomic add on a line both cores write, costs about what streaming
 * a few KiB does), and a thread that finishes early takes the next. Past ROW_CHUNKS_MAX - 1
 * chunks (only with hundreds of threads) each tensor's rest is one chunk. Chunks never cross
 * a tensor and start on a multiple of 16 rows, so no two threads write one
 * cache line of y, and the row tiles (I8_TILE_ROWS) stay whole. Every row is computed by the
 * same kernel whichever thread takes it: the bits do not depend on the claiming order. */
#define ROW_RUN 16
#define ROW_CHUNKS_MAX 512
#define ROW_CHUNK_BYTES 32768
typedef struct { /* past ROW_CHUNKS_MAX - 1, one chunk per tensor left: GEMM_MULTI_MAX more */
    short tensor[ROW_CHUNKS_MAX + GEMM_MULTI_MAX];
    int r0[ROW_CHUNKS_MAX + GEMM_MULTI_MAX], r1[ROW_CHUNKS_MAX + GEMM_MULTI_MAX];
    int n;
} RowChunks;

static void row_chunks(RowChunks *C, const int *rows, const I8Layout *L, int n_tensors,
                       int nt, long long least_bytes) {
    long long runs = 0;
    for (int i = 0; i < n_tensors; i++) runs += (rows[i] + ROW_RUN - 1) / ROW_RUN;
    int t = 0, r = 0; /* the next unclaimed row: tensor t, row r */
    C->n = 0;
    while (t < n_tensors) {
        if (r >= rows[t]) {
            t++, r = 0;
            continue;
        }
        long long run_bytes = (long long)ROW_RUN * (long long)L[t].row_bytes;
        long long least = (least_bytes + run_bytes - 1) / (run_bytes > 0 ? run_bytes : 1);
        if (least < 1) least = 1;
        long long size = runs / (2LL * nt);
        if (size < least) size = least;
        if (C->n >= ROW_CHUNKS_MAX - 1) size = runs; /* the rest of tensor t in one chunk */
        long long left = (rows[t] - r + ROW_RUN - 1) / ROW_RUN; /* runs left in tensor t */
        if (size > left) size = left;
        C->tensor[C->n] = (short)t;
        C->r0[C->n] = r;
        r = r + (int)size * ROW_RUN < rows[t] ? r + (int)size * ROW_RUN : rows[t];
        C->r1[C->n] = r;
        C->n++;
        runs -= size;
    }
}

static int team_size(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* fn[i] over rows [0, rows[i]) of each of n tensors (y[i], L[i], cols), the rows claimed by
 * the OpenMP threads in RowChunks; no barrier between tensors (their outputs differ). */
static void rows_claimed(I8RowsFn const *fn, float *const *y, const QuantActs *qa,
                         const I8Layout *L, const int *rows, int cols, int n) {
    if (team_size() == 1) {
        for (int i = 0; i < n; i++)
            if (rows[i] > 0) fn[i](y[i], qa, &L[i], 0, rows[i], cols);
        return;
    }
    RowChunks C;
    row_chunks(&C, rows, L, n, team_size(), ROW_CHUNK_BYTES);
    int next = 0;
#ifdef _OPENMP
#pragma omp parallel shared(next)
#endif
    for (;;) {
        int k = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
        if (k >= C.n) break;
        int i = C.tensor[k];
        fn[i](y[i], qa, &L[i], C.r0[k], C.r1[k], cols);
    }
}

int row_chunks_for_test(int n_tensors, const int *rows, const int *row_bytes, int nt,
                        int *tensor, int *r0, int *r1, int cap) {
    if (n_tensors < 1 || n_tensors > GEMM_MULTI_MAX || nt < 1) return -1;
    I8Layout L[GEMM_MULTI_MAX];
    memset(L, 0, sizeof L);
    for (int i = 0; i < n_tensors; i++) L[i].row_bytes = (size_t)row_bytes[i];
    static RowChunks C; /* 5 KiB: off the test caller's stack */
    row_chunks(&C, rows, L, n_tensors, nt, ROW_CHUNK_BYTES);
    for (int k = 0; k < C.n && k < cap; k++) {
        tensor[k] = C.tensor[k];
        r0[k] = C.r0[k];
        r1[k] = C.r1[k];
    }
    return C.n;
}

/* The layout of int8 codebook tensor W and the row kernel gemv_i8() runs on it: the decoded
 * weights' kernel when W->w8 is set, else K's kernel for its b and G. */
static I8RowsFn gemv_i8_plan(const KernelTable *K, const QuantActs *qa, const Tensor *W,
                             I8Layout *L) {
    /* a sub-block longer than the row is the whole row (G <= cols keeps int arithmetic) */
    int bits = (int)W->bits, rows = (int)W->rows, cols = (int)W->cols;
    int G = (int)(W->group_size < W->cols ? W->group_size : W->cols);
    *L = i8_layout(W->data, bits, G, rows, cols);
    if (W->tiled) { /* the reference reads tiles too, should the table have changed since */
        L->tiled = 1;
        return K->i8_b4_tiled ? K->i8_b4_tiled : i8cb_rows_generic;
    }
    if (W->w8 && K->i8_dec8 && G % 32 == 0) {
        L->w8 = W->w8;
        return K->i8_dec8;
    }
    return kernel_pick_i8(K, bits, G, qa->has_vnni);
}

void gemv_i8(float *y, const QuantActs *qa, const Tensor *W) {
    I8Layout L;
    I8RowsFn fn = gemv_i8_plan(kernels_active(), qa, W, &L);
    int rows = (int)W->rows;
    rows_claimed(&fn, &y, qa, &L, &rows, (int)W->cols, 1);
}

void gemv_i8_multi(float *const *y, const QuantActs *qa, const Tensor *const *W, int n) {
    const KernelTable *K = kernels_active();
    I8Layout L[GEMM_MULTI_MAX];
    I8RowsFn fn[GEMM_MULTI_MAX];
    int rows[GEMM_MULTI_MAX];
    for (int i = 0; i < n; i++) {
        fn[i] = gemv_i8_plan(K, qa, W[i], &L[i]);
        rows[i] = (int)W[i]->rows;
    }
    rows_claimed(fn, y, qa, L, rows, (int)W[0]->cols, n);
}

/* Whether table K decodes a tensor of bit width b and group size G (G <= cols). */
static int decodes(const KernelTable *K, int bits, int G) {
    return K->i8_dec8 && bits >= DEC8_MIN_BITS && G % 32 == 0;
}

const char *kernel_path(const KernelTable *K, int bits, int G, int has_vnni, int classifier) {
    if (classifier && decodes(K, bits, G)) return "decoded-int8";
    I8RowsFn fn = kernel_pick_i8(K, bits, G, has_vnni);
    if (fn == i8cb_rows_generic) return "generic";
    if (fn == K->i8_b4) return "i8_b4";
    if (fn == K->i8_b6) return "i8_b6";
    if (fn == K->i8_b5) return "i8_b5";
    return "i8_any";
}

const char *kernel_path_with(const char *kernel, int bits, int G, int cols, int classifier) {
    const KernelTable *K = kernel_table_by_name(kernel);
    if (!K) return NULL;
    return kernel_path(K, bits, G < cols ? G : cols, K->vnni_acts, classifier);
}

/* All rows decoded through K's decoder, the rows split across the OpenMP threads. */
static void decode_i8(const KernelTable *K, int8_t *w8, const I8Layout *L, int rows, int cols) {
    I8DecodeFn fn = K->i8_decode ? K->i8_decode : i8_decode_rows_generic;
#ifdef _OPENMP
#pragma omp parallel
    {
        int r0, r1;
        split_rows(rows, omp_get_thread_num(), omp_get_num_threads(), &r0, &r1);
        if (r0 < r1) fn(w8, L, r0, r1, cols);
    }
#else
    fn(w8, L, 0, rows, cols);
#endif
}

/* The decoded weights are read once per token, start to end: a classifier of 136 MB
 * (Qwen2.5-Coder's 151936 x 896) streams from DRAM, so a copy of 2 MiB or more goes in 2 MiB
 * pages (huge_pages.h). */
static int8_t *decoded_copy(const KernelTable *K, const I8Layout *L, int rows, int cols) {
    size_t bytes = dec8_bytes(rows, cols);
    int8_t *w8 = bytes >= HUGE_PAGE ? huge_pages_alloc(bytes) : malloc(bytes);
    if (!w8) return NULL;
    if (rows % DEC8_TILE) { /* the padding rows of the last tile are zeros */
        size_t last = (size_t)(rows / DEC8_TILE) * DEC8_TILE * dec8_stride(cols);
        memset(w8 + last, 0, bytes - last);
    }
    decode_i8(K, w8, L, rows, cols);
    return w8;
}

int kernels_decode_tensor(Tensor *W) {
    if (W->encoding != DITTO_ENC_CODEBOOK || W->codebook_type != DITTO_CB_I8 || W->w8) return 0;
    int rows = (int)W->rows, cols = (int)W->cols;
    int G = (int)(W->group_size < W->cols ? W->group_size : W->cols);
    if (!decodes(kernels_active(), (int)W->bits, G)) return 0;
    I8Layout L = i8_layout(W->data, (int)W->bits, G, rows, cols);
    W->w8 = decoded_copy(kernels_active(), &L, rows, cols);
    return W->w8 ? 1 : -1;
}

int kernels_tiles_env_check(char *err, size_t errlen) {
    const char *v = getenv("DITTO_TILES");
    if (!v || !*v || !strcmp(v, "0") || !strcmp(v, "1")) return 0;
    snprintf(err, errlen, "DITTO_TILES must be 1 (b = 4 weight matrices in row tiles where the "
             "kernel table reads them) or 0 (file order), got '%s'", v);
    return -1;
}

int kernels_tile_tensor(Tensor *W) {
    if (W->encoding != DITTO_ENC_CODEBOOK || W->codebook_type != DITTO_CB_I8 || W->tiled ||
        !kernels_active()->i8_b4_tiled)
        return 0;
    const char *env = getenv("DITTO_TILES");
    if (env && !strcmp(env, "0")) return 0;
    int rows = (int)W->rows, cols = (int)W->cols;
    int G = (int)(W->group_size < W->cols ? W->group_size : W->cols);
    if (!i8_tiles_fit((int)W->bits, G, rows, cols)) return 0;
    I8Layout L = i8_layout(W->data, (int)W->bits, G, rows, cols);
    uint8_t *indices = (uint8_t *)(uintptr_t)L.indices; /* the caller's writable copy */
    const size_t tile = I8_TILE_ROWS * L.row_bytes;
#ifdef _OPENMP
    const int nt = omp_get_max_threads();
#else
    const int nt = 1;
#endif
    uint8_t *tmp = malloc((size_t)nt * tile); /* every thread's buffer before any row moves */
    if (!tmp) return -1;
#ifdef _OPENMP
#pragma omp parallel
    {
        int r0, r1, t = omp_get_thread_num();
        split_rows(rows, t, omp_get_num_threads(), &r0, &r1);
        if (r0 < r1)
            i8_retile(indices + (size_t)r0 * L.row_bytes, r1 - r0, L.row_bytes,
                      tmp + (size_t)t * tile);
    }
#else
    i8_retile(indices, rows, L.row_bytes, tmp);
#endif
    free(tmp);
    W->tiled = 1;
    return 1;
}

void kernels_free_tensor(Tensor *W) {
    free(W->w8);
    W->w8 = NULL;
}

int i8cb_gemv_decoded_with(const char *kernel, float *y, const float *x, const uint8_t *payload,
                           int bits, int group_size, int rows, int cols) {
    const KernelTable *K = kernel_table_by_name(kernel);
    if (!K || !K->supported()) return -1;
    if (group_size > cols) group_size = cols;
    if (!decodes(K, bits, group_size)) {
        int ran = i8cb_gemv_with(kernel, y, x, payload, bits, group_size, rows, cols);
        return ran < 0 ? -1 : 0;
    }
    QuantActs qa;
    memset(&qa, 0, sizeof qa);
    I8Layout L = i8_layout(payload, bits, group_size, rows, cols);
    int8_t *w8 = decoded_copy(K, &L, rows, cols);
    if (!w8 || act_quantize_by(K, &qa, x, cols, 1)) {
        free(w8);
        return -1;
    }
    L.w8 = w8;
    I8RowsFn fn = K->i8_dec8;
    rows_claimed(&fn, &y, &qa, &L, &rows, cols, 1);
    free(w8);
    act_free(&qa);
    return 1;
}

int i8cb_gemv_with(const char *kernel, float *y, const float *x, const uint8_t *payload,
                   int bits, int group_size, int rows, int cols) {
    const KernelTable *K = kernel_table_by_name(kernel);
    if (!K || !K->supported()) return -1;
    QuantActs qa;
    memset(&qa, 0, sizeof qa);
    if (act_quantize_by(K, &qa, x, cols, 1)) return -1;
    if (group_size > cols) group_size = cols; /* as gemv() sees it */
    I8Layout L = i8_layout(payload, bits, group_size, rows, cols);
    I8RowsFn fn = kernel_pick_i8(K, bits, group_size, 1);
    int fast = fn != i8cb_rows_generic;
    rows_claimed(&fn, &y, &qa, &L, &rows, cols, 1);
    act_free(&qa);
    return fast;
}

int act_quantize_copy_with(const char *kernel, const float *x, int n, float *D, uint8_t *m,
                           int8_t *q, int8_t *qp, uint8_t *aqp, int8_t *qp64, uint8_t *aqp64,
                           int16_t *m64) {
    const KernelTable *K = kernel_table_by_name(kernel);
    if (!K || !K->supported()) return -1;
    QuantActs qa;
    memset(&qa, 0, sizeof qa);
    const int plain = !qp && !aqp && !qp64 && !aqp64 && !m64;
    if (act_quantize_by(K, &qa, x, n, plain ? ACT_PLAIN : 0)) return -1;
    if (qa.has_perm == plain) { /* the flag disagrees with the arrays made */
        act_free(&qa);
        return -1;
    }
    size_t n_pad = (size_t)qa.n_pad;
    *D = qa.D;
    memcpy(m, qa.m, n_pad / QA_BLOCK);
    memcpy(q, qa.q, n_pad);
    if (qp) memcpy(qp, qa.qp, n_pad);
    if (aqp) memcpy(aqp, qa.aqp, n_pad);
    if (qp64) memcpy(qp64, qa.qp64, n_pad);
    if (aqp64) memcpy(aqp64, qa.aqp64, n_pad);
    if (m64) memcpy(m64, qa.m64, n_pad / 4 * sizeof *m64);
    act_free(&qa);
    return (int)n_pad;
}

int act_quantize_copy(const float *x, int n, float *D, uint8_t *m, int8_t *q) {
    return act_quantize_copy_with(kernels_active()->name, x, n, D, m, q, NULL, NULL, NULL, NULL,
                                  NULL);
}

/* One thread's rows [r0, r1) of gemm_i8() through table K on layout L. */
static void gemm_i8_part(const KernelTable *K, float *Y, const QuantActs *qa, int T,
                         const I8Layout *L, int r0, int r1, int rows, int cols,
                         const GemmPrep *prep) {
    if (r0 >= r1) return;
    int vnni = 1;
    for (int t = 0; t < T; t++) vnni &= qa[t].has_vnni;
    if (L->tiled && !K->i8_b4_tiled) { /* tiled for another table: the reference reads tiles */
        for (int t = 0; t < T; t++)
            i8cb_rows_generic(Y + (size_t)t * (size_t)rows, &qa[t], L, r0, r1, cols);
        return;
    }
    if (K->i8_gemm && L->group_size % 32 == 0) {
        K->i8_gemm(Y, qa, T, L, r0, r1, rows, cols, prep);
        return;
    }
    for (int t = 0; t < T; t++)
        if (!qa[t].has_perm) { /* quantize_rows' gemm_reads_plain disagrees with this rule */
            fprintf(stderr, "ditto: internal error: activation row without perm arrays for the "
                            "row kernels (b = %d, G = %d)\n", L->bits, L->group_size);
            abort();
        }
    I8RowsFn fn = kernel_pick_i8(K, L->bits, L->group_size, vnni);
    /* 16 rows at a time for every token: their index bytes stay in L1/L2 for all T */
    for (int rb = r0; rb < r1; rb += 16) {
        int re = rb + 16 < r1 ? rb + 16 : r1;
        for (int t = 0; t < T; t++) fn(Y + (size_t)t * (size_t)rows, &qa[t], L, rb, re, cols);
    }
}

/* gemm_i8_part over rows [0, rows[i]) of each of n tensors (Y[i], L[i], cols), the rows
 * claimed by the threads in the GEMV's chunks (rows_claimed). A chunk runs all T inputs, so
 * a claim is cheap next to it, yet chunks of one run made SmolLM2's prefill (matrices of 36
 * to 96 runs) 3-5 % slower than an even split on the Zen 3 VM; 32 KiB chunks did not. */
static void gemm_rows_claimed(const KernelTable *K, float *const *Y, const QuantActs *qa, int T,
                              const I8Layout *L, const int *rows, int cols, int n,
                              const GemmPrep *prep) {
    if (team_size() == 1) {
        for (int i = 0; i < n; i++)
            gemm_i8_part(K, Y[i], qa, T, &L[i], 0, rows[i], rows[i], cols, prep);
        return;
    }
    RowChunks C;
    row_chunks(&C, rows, L, n, team_size(), ROW_CHUNK_BYTES);
    int next = 0;
#ifdef _OPENMP
#pragma omp parallel shared(next)
#endif
    for (;;) {
        int k = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
        if (k >= C.n) break;
        int i = C.tensor[k];
        gemm_i8_part(K, Y[i], qa, T, &L[i], C.r0[k], C.r1[k], rows[i], cols, prep);
    }
}

/* Whether gemm_i8_part() takes a tensor of group size G (G <= cols) through table K's GEMM
 * kernel for T inputs reading only their plain arrays (KernelTable.gemm_plain_acts): G % 32 ==
 * 0 and, when the tensor is tiled, a table that reads the tiles. */
static int gemm_reads_plain(const KernelTable *K, int G, int tiled, int T) {
    return K->i8_gemm && K->gemm_plain_acts && T > GEMM_FEW_MAX && G % 32 == 0 &&
           (!tiled || K->i8_b4_tiled);
}

static int tensor_reads_plain(const KernelTable *K, const Tensor *W, int T) {
    int G = (int)(W->group_size < W->cols ? W->group_size : W->cols);
    return gemm_reads_plain(K, G, (int)W->tiled, T);
}

/* gemm_i8() through table K on the payload's layout; returns 1 when K's GEMM kernel ran. */
static int gemm_i8_by(const KernelTable *K, float *Y, const QuantActs *qa, int T,
                      const uint8_t *payload, int bits, int G, int rows, int cols, int tiled,
                      const GemmPrep *prep) {
    I8Layout L = i8_layout(payload, bits, G, rows, cols);
    L.tiled = tiled;
    gemm_rows_claimed(K, &Y, qa, T, &L, &rows, cols, 1, prep);
    return K->i8_gemm && G % 32 == 0;
}

void gemm_i8(float *Y, const QuantActs *qa, int T, const Tensor *W) {
    int cols = (int)W->cols;
    int G = (int)(W->group_size < W->cols ? W->group_size : W->cols);
    gemm_i8_by(kernels_active(), Y, qa, T, W->data, (int)W->bits, G, (int)W->rows, cols,
               (int)W->tiled, NULL);
}

/* K's GemmPrep of the T inputs qa into *prep, its pairs in *buf (grown to *cap entries as
 * needed), the groups over the threads. Returns prep, or NULL when K has no i8_gemm_prep or
 * there is no memory (the GEMM then makes its own). */
static const GemmPrep *prepare_gemm(const KernelTable *K, GemmPrep *prep, int32_t **buf,
                                    size_t *cap, const QuantActs *qa, int T) {
    if (!K->i8_gemm_prep) return NULL;
    size_t len = gemm_pairs_len(T, qa[0].n_pad);
    if (len > *cap) {
        int32_t *p = realloc(*buf, len * sizeof *p);
        if (!p) return NULL;
        *buf = p;
        *cap = len;
    }
    int g, n_groups = (T + GEMM_PREP_GROUP - 1) / GEMM_PREP_GROUP;
#pragma omp parallel for private(g)
    for (g = 0; g < n_groups; g++) K->i8_gemm_prep(*buf, qa, T, g);
    prep->qa = qa;
    prep->pairs = *buf;
    prep->T = T;
    prep->n_pad = qa[0].n_pad;
    return prep;
}

int i8cb_gemm_with(const char *kernel, float *Y, const float *X, int T, const uint8_t *payload,
                   int bits, int group_size, int rows, int cols) {
    const KernelTable *K = kernel_table_by_name(kernel);
    if (!K || !K->supported() || T < 1) return -1;
    QuantActs *qa = calloc((size_t)T, sizeof *qa);
    int ok = qa != NULL, ran = -1;
    /* the arrays prefill would make for this tensor (quantize_rows) */
    int flags = gemm_reads_plain(K, group_size < cols ? group_size : cols, 0, T) ? ACT_PLAIN
                : K->vnni_acts                                             ? ACT_VNNI
                                                                           : 0;
    for (int t = 0; ok && t < T; t++)
        ok = act_quantize_by(K, &qa[t], X + (size_t)t * (size_t)cols, cols, flags) == 0;
    GemmPrep prep;
    int32_t *pairs = NULL;
    size_t cap = 0;
    if (ok) { /* the inputs prepared once, as prefill does (the GEMM drivers pass none) */
        if (group_size > cols) group_size = cols; /* as gemm_i8() sees it */
        ran = gemm_i8_by(K, Y, qa, T, payload, bits, group_size, rows, cols, 0,
                         prepare_gemm(K, &prep, &pairs, &cap, qa, T));
    }
    free(pairs);
    for (int t = 0; qa && t < T; t++) act_free(&qa[t]);
    free(qa);
    return ran;
}

/* One QuantActs per activation row, kept between calls (MATMUL_BATCH_MAX at most): X[T][cols]
 * quantized into them, the rows over the threads. The VNNI arrays are left out when the table
 * has a GEMM kernel and T > GEMM_FEW_MAX: gemm_i8_part() then runs it for every G % 32 == 0,
 * and no b = 4 row kernel (G % 32 == 0 or 64) reads them for the other G. With `plain` (every
 * tensor of the call gemm_reads_plain) the perm32 and perm64 arrays are left out too, and *prep
 * gets the table's GemmPrep of the rows, which every chunk of the GEMMs shares (NULL without
 * `plain`, when the table takes none, or without memory for it: each GEMM call then makes its
 * own). */
static QuantActs *quantize_rows(const float *X, int T, int cols, int plain,
                                const GemmPrep **prep) {
    static QuantActs qa[MATMUL_BATCH_MAX];
    static GemmPrep kept;
    static int32_t *pairs;
    static size_t cap;
    const KernelTable *K = kernels_active();
    int vnni = K->vnni_acts && (!K->i8_gemm || T <= GEMM_FEW_MAX), failed = 0, t;
    int flags = plain ? ACT_PLAIN : vnni ? ACT_VNNI : 0;
#pragma omp parallel for reduction(| : failed) private(t)
    for (t = 0; t < T; t++) /* each row on its own: threads do not change the bytes */
        failed |= act_quantize(&qa[t], X + (size_t)t * (size_t)cols, cols, flags) != 0;
    if (failed) {
        fprintf(stderr, "ditto: out of memory quantizing %d activation rows of %d floats\n", T,
                cols);
        abort();
    }
    *prep = plain ? prepare_gemm(K, &kept, &pairs, &cap, qa, T) : NULL;
    return qa;
}

void gemm_i8_float_input(float *Y, const float *X, int T, const Tensor *W) {
    const KernelTable *K = kernels_active();
    const GemmPrep *prep;
    const QuantActs *qa = quantize_rows(X, T, (int)W->cols, tensor_reads_plain(K, W, T), &prep);
    int G = (int)(W->group_size < W->cols ? W->group_size : W->cols);
    gemm_i8_by(K, Y, qa, T, W->data, (int)W->bits, G, (int)W->rows, (int)W->cols, (int)W->tiled,
               prep);
}

void gemm_i8_float_input_multi(float *const *Y, const float *X, int T, const Tensor *const *W,
                               int n) {
    const KernelTable *K = kernels_active();
    int plain = 1;
    for (int i = 0; i < n; i++) plain &= tensor_reads_plain(K, W[i], T);
    const GemmPrep *prep;
    const QuantActs *qa = quantize_rows(X, T, (int)W[0]->cols, plain, &prep);
    I8Layout L[GEMM_MULTI_MAX];
    int rows[GEMM_MULTI_MAX];
    for (int i = 0; i < n; i++) {
        int G = (int)(W[i]->group_size < W[i]->cols ? W[i]->group_size : W[i]->cols);
        L[i] = i8_layout(W[i]->data, (int)W[i]->bits, G, (int)W[i]->rows, (int)W[i]->cols);
        L[i].tiled = (int)W[i]->tiled;
        rows[i] = (int)W[i]->rows;
    }
    gemm_rows_claimed(K, Y, qa, T, L, rows, (int)W[0]->cols, n, prep);
}
