/* main.c: command-line inference program for Ditto model files.
 *
 *   ditto-run -m MODEL.ditto -p "prompt" [-n 256] [--temp 0.8] [--top-p 0.9] [--seed S]
 *
 * See native/README.md for every flag, the token file format and the exit codes.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../runtime/forward.h"
#include "../io/input.h"
#include "../kernels/kernels.h"
#include "../kernels/matmul.h"
#include "../model/model.h"
#include "../io/output.h"
#include "../runtime/prefill.h"
#include "../runtime/sampler.h"
#include "../io/tokenfile.h"
#include "../tokenizer/tokenizer.h"

/* exit codes (documented in native/README.md) */
enum { EXIT_OK = 0, EXIT_USAGE = 1, EXIT_MODEL = 2, EXIT_PROMPT = 3, EXIT_IO = 4, EXIT_OOM = 5 };

static const char *prog = "ditto-run";

/* ---------------------------------------------------------------- signals and stdout */

/* The signal that asked the run to stop (SIGINT, SIGTERM, SIGHUP), 0 while running. The
 * handler only records it; the loops over positions and tokens check it and the run ends
 * through main()'s normal cleanup. There the OpenMP runtime is shut down (which removes its
 * /dev/shm registration file, left behind by a process killed outright) and the signal is
 * raised again with its default action, so the parent sees a death by that signal. */
static volatile sig_atomic_t stop_signal = 0;

static void on_stop_signal(int sig) {
    if (!stop_signal) stop_signal = sig;
}

static void install_signal_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND; /* a second signal acts at once (default action) */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* a reader that went away is a write error (EPIPE, exit 4), not a death by SIGPIPE */
    signal(SIGPIPE, SIG_IGN);
}

/* fd 0, 1 and 2 are always open: a closed one gets /dev/null opened read-only, so a file the
 * run opens never lands on it and a write to a closed stdout fails (EBADF, exit 4) instead of
 * going into that file. */
static void occupy_standard_fds(void) {
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        int n = open("/dev/null", O_RDONLY);
        if (n >= 0 && n != fd) {
            dup2(n, fd);
            close(n);
        }
    }
}

/* Write n bytes to stdout and push them out. Returns 0, or -1 (the reason in errno) when the
 * text cannot be written: full disk, closed stdout, a pipe whose reader went away. */
static int write_stdout(const void *p, size_t n) {
    if (n && fwrite(p, 1, n, stdout) != n) return -1;
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : -1;
}

static int stdout_error(void) {
    if (!stop_signal)
        fprintf(stderr, "%s: error: cannot write to stdout: %s\n", prog, strerror(errno));
    return EXIT_IO;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: %s -m MODEL (-p PROMPT | -f FILE | --ids FILE) [options]\n"
            "       %s -m MODEL --score TOKENS_FILE\n"
            "  -m FILE            Ditto model file (.ditto)\n"
            "  -p PROMPT          prompt text (UTF-8)\n"
            "  -f FILE            read the prompt from FILE, byte-exact\n"
            "  --ids FILE         prompt given as token ids (token file format below)\n"
            "  -n N               generate at most N tokens (N > 0, default 256)\n"
            "  --temp T           temperature, 0 = greedy (default 0.8)\n"
            "  --top-p P          nucleus sampling mass in (0, 1]; 1 = off (default 0.9)\n"
            "  --seed S           PRNG seed (default: from the clock, printed to stderr)\n"
            "  --threads T        OpenMP threads (default: all cores)\n"
            "  --kernel NAME      GEMV kernel table: generic, avx2, avxvnni, avx512vnni,\n"
            "                     avx512vbmi (x86), neon (Arm); default: the best this CPU\n"
            "                     runs, or $DITTO_KERNEL\n"
            "  --mmap             map the model file (shared page cache, no copy at start)\n"
            "                     instead of reading it into memory in 2 MiB pages, which\n"
            "                     decodes faster; also $DITTO_MMAP=1 (0: always read)\n"
            "  --ctx C            KV cache positions (default: prompt + N - 1, at most max_seq_len)\n"
            "  -ctk, --cache-type-k T\n"
            "                     key cache element type: f32 (default) or f16 (half the\n"
            "                     bytes, each key rounded to f16)\n"
            "  -ctv, --cache-type-v T\n"
            "                     value cache element type: f32 (default) or f16\n"
            "  -b, --batch-size B prompt tokens evaluated together (batched prefill, 1..512;\n"
            "                     default 256; 1 = one token at a time)\n"
            "  --chat             wrap the prompt in the model's own chat template\n"
            "  --suffix TEXT      fill in the middle: the prompt (-p/-f) is the text before the\n"
            "                     gap, TEXT the text after it; the model's FIM tokens make\n"
            "                     <fim_prefix>PROMPT<fim_suffix>TEXT<fim_middle>\n"
            "  --suffix-file FILE as --suffix, the text after the gap read from FILE\n"
            "  --bos / --no-bos   prepend BOS or not (default: the model file's add_bos;\n"
            "                     --tokens and --chat default to no BOS)\n"
            "  --special          parse control-token texts such as <|im_start|> in the prompt\n"
            "  --tokens           print the prompt's token ids as a JSON list and exit\n"
            "  --score FILE       teacher-forced log-probabilities of the tokens in FILE (JSON)\n"
            "  --dump-logits FILE write float32 logits [n_prompt_tokens, vocab] and exit\n"
            "  --print-ids        print generated token ids as a JSON list instead of text\n"
            "  --ignore-eos       keep generating after an end-of-generation token\n"
            "                     (benchmarks: exactly N tokens)\n"
            "token file: ids separated by whitespace, commas or brackets (a JSON list works)\n"
            "exit codes: 0 ok, 1 usage, 2 bad model file, 3 bad prompt or token file,\n"
            "            4 I/O error, 5 out of memory\n",
            prog, prog);
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(run %s --help for usage)\n", prog);
    return EXIT_USAGE;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- number parsing */

/* Every numeric flag is parsed by one of these. The whole value must be the number, in base 10:
 * nothing before it (no blank, no '+': strtol/strtod would skip blanks, and strtoull would wrap
 * "-1" or " -1" to 2^64 - 1), nothing after it, not empty; an unsigned value takes no minus
 * sign; a value outside [lo, hi] (overflow included) is refused. Each returns 0 and sets *out,
 * or -1 leaving *out alone; the caller's usage error names the flag and the value. */

/* Whether s starts with a digit (after a '-' when minus_ok; also '.' then a digit when
 * point_ok). */
static int starts_as_number(const char *s, int minus_ok, int point_ok) {
    if (minus_ok && s[0] == '-') s++;
    if (point_ok && s[0] == '.') s++;
    return s[0] >= '0' && s[0] <= '9';
}

static int parse_long(const char *s, long lo, long hi, long *out) {
    if (!starts_as_number(s, 1, 0)) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_ulong(const char *s, unsigned long long hi, unsigned long long *out) {
    if (!starts_as_number(s, 0, 0)) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > hi) return -1;
    *out = v;
    return 0;
}

/* A finite double (decimal or exponent form; underflow to 0 or a subnormal is refused). */
static int parse_double(const char *s, double *out) {
    if (!starts_as_number(s, 1, 1)) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* A finite float: parse_double, refusing values beyond the float range. */
static int parse_float(const char *s, float *out) {
    double v;
    if (parse_double(s, &v) || !isfinite((float)v)) return -1;
    *out = (float)v;
    return 0;
}

/* ---------------------------------------------------------------- files */

/* Read a whole regular file (opened with open_input(), so a FIFO or device is refused without
 * blocking); returns NULL with errno set on failure (EISDIR for a directory, INPUT_ENOTREG for
 * another file that is not regular). *len gets its size. */
static char *read_file(const char *path, size_t *len) {
    int fd = open_input(path, NULL);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, cap *= 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            errno = ENOMEM;
        }
        buf = nb;
    }
    if (buf && ferror(f)) {
        free(buf);
        buf = NULL;
        errno = EIO;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* Report a read_file() failure on stderr, naming the path. */
static void read_error(const char *path) {
    if (errno == EISDIR)
        fprintf(stderr, "%s: error: %s: is a directory, not a file\n", prog, path);
    else if (errno == INPUT_ENOTREG)
        fprintf(stderr, "%s: error: %s: not a regular file (a FIFO, socket or device)\n", prog,
                path);
    else
        fprintf(stderr, "%s: error: %s: cannot read: %s\n", prog, path, strerror(errno));
}

/* ---------------------------------------------------------------- prompt encoding */

/* Append the tokens of text to *ids (growing it); special tokens are parsed outside
 * text[lo, hi) (tokenizer_encode_range). Returns 0, or -1 with err filled. */
static int encode_append(const Tokenizer *tok, const char *text, size_t len, size_t lo,
                         size_t hi, int bos, int32_t **ids, long *n, long *cap, char *err,
                         size_t errlen) {
    long need = tokenizer_encode_range(tok, text, len, lo, hi, bos, *ids + *n,
                                       (size_t)(*cap - *n), err, errlen);
    if (need < 0) return -1;
    if (need > *cap - *n) {
        long ncap = *n + need;
        int32_t *nv = realloc(*ids, (size_t)ncap * sizeof(int32_t));
        if (!nv) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        *ids = nv;
        *cap = ncap;
        need = tokenizer_encode_range(tok, text, len, lo, hi, bos, *ids + *n,
                                      (size_t)(*cap - *n), err, errlen);
        if (need < 0) return -1;
    }
    *n += need;
    return 0;
}

/* ---------------------------------------------------------------- main */

typedef struct {
    const char *model_path, *prompt, *prompt_file, *ids_file, *score_file, *dump_file, *kernel;
    const char *suffix, *suffix_file; /* fill in the middle: the text after the gap */
    long n_gen, threads, ctx, batch;
    float temp, topp;
    uint64_t seed;
    int seed_given, chat, bos, special, tokens_only, print_ids, ignore_eos; /* bos: -1 default */
    int mmap; /* --mmap */
    int type_k, type_v; /* --cache-type-k, --cache-type-v: KV_F32 or KV_F16 */
} Args;

static int parse_args(int argc, char **argv, Args *a) {
    memset(a, 0, sizeof *a);
    a->n_gen = 256;
    a->batch = 256; /* measured: int8 and f16 codebook prefill both faster than at 64 */
    a->temp = 0.8f;
    a->topp = 0.9f;
    a->bos = -1;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        /* flags without a value */
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            exit(EXIT_OK);
        } else if (!strcmp(o, "--chat")) { a->chat = 1; continue; }
        else if (!strcmp(o, "--bos")) { a->bos = 1; continue; }
        else if (!strcmp(o, "--no-bos")) { a->bos = 0; continue; }
        else if (!strcmp(o, "--special")) { a->special = 1; continue; }
        else if (!strcmp(o, "--tokens")) { a->tokens_only = 1; continue; }
        else if (!strcmp(o, "--print-ids")) { a->print_ids = 1; continue; }
        else if (!strcmp(o, "--ignore-eos")) { a->ignore_eos = 1; continue; }
        else if (!strcmp(o, "--mmap")) { a->mmap = 1; continue; }
        /* flags with a value */
        static const char *const with_value[] = {"-m", "-p", "-f", "--ids", "-n", "--temp",
            "--top-p", "--seed", "--threads", "--ctx", "--score", "--dump-logits", "-b",
            "--batch-size", "--kernel", "--suffix", "--suffix-file", "--cache-type-k", "-ctk",
            "--cache-type-v", "-ctv"};
        int known = 0;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++)
            known |= !strcmp(o, with_value[k]);
        if (!known) return usage_error("unknown flag '%s'", o);
        if (i + 1 >= argc) return usage_error("flag '%s' needs a value", o);
        const char *v = argv[++i];
        if (!strcmp(o, "-m")) a->model_path = v;
        else if (!strcmp(o, "-p")) a->prompt = v;
        else if (!strcmp(o, "-f")) a->prompt_file = v;
        else if (!strcmp(o, "--ids")) a->ids_file = v;
        else if (!strcmp(o, "--score")) a->score_file = v;
        else if (!strcmp(o, "--dump-logits")) a->dump_file = v;
        else if (!strcmp(o, "--kernel")) a->kernel = v;
        else if (!strcmp(o, "--suffix")) a->suffix = v;
        else if (!strcmp(o, "--suffix-file")) a->suffix_file = v;
        else if (!strcmp(o, "--cache-type-k") || !strcmp(o, "-ctk")) {
            if ((a->type_k = kv_type_parse(v)) < 0)
                return usage_error("--cache-type-k must be f32 or f16, got '%s'", v);
        } else if (!strcmp(o, "--cache-type-v") || !strcmp(o, "-ctv")) {
            if ((a->type_v = kv_type_parse(v)) < 0)
                return usage_error("--cache-type-v must be f32 or f16, got '%s'", v);
        } else if (!strcmp(o, "-n")) {
            if (parse_long(v, 1, 1L << 30, &a->n_gen))
                return usage_error("-n must be an integer in 1..1073741824, got '%s'", v);
        } else if (!strcmp(o, "--threads")) {
            if (parse_long(v, 1, 1024, &a->threads))
                return usage_error("--threads must be an integer in 1..1024, got '%s'", v);
        } else if (!strcmp(o, "-b") || !strcmp(o, "--batch-size")) {
            if (parse_long(v, 1, MATMUL_BATCH_MAX, &a->batch))
                return usage_error("--batch-size must be an integer in 1..512, got '%s'", v);
        } else if (!strcmp(o, "--ctx")) {
            if (parse_long(v, 1, 1L << 24, &a->ctx))
                return usage_error("--ctx must be an integer in 1..16777216, got '%s'", v);
        } else if (!strcmp(o, "--temp")) {
            if (parse_float(v, &a->temp) || a->temp < 0.0f)
                return usage_error("--temp must be a number >= 0, got '%s'", v);
        } else if (!strcmp(o, "--top-p")) {
            double p;
            if (parse_double(v, &p) || p <= 0.0 || (a->topp = (float)p) > 1.0f)
                return usage_error("--top-p must be in (0, 1], got '%s'", v);
            if (a->topp <= 0.0f) /* positive, but below the smallest float */
                return usage_error("--top-p must be > 0 as a float; '%s' rounds to 0", v);
        } else if (!strcmp(o, "--seed")) {
            unsigned long long seed;
            if (parse_ulong(v, UINT64_MAX, &seed))
                return usage_error("--seed must be a non-negative integer, got '%s'", v);
            a->seed = (uint64_t)seed;
            a->seed_given = 1;
        }
    }
    if (!a->model_path) return usage_error("%s", "missing -m MODEL");
    int n_src = (a->prompt != NULL) + (a->prompt_file != NULL) + (a->ids_file != NULL);
    if (n_src > 1) return usage_error("%s", "give only one of -p, -f and --ids");
    if (a->score_file && n_src)
        return usage_error("%s", "--score takes its tokens from its file; drop -p/-f/--ids");
    if (!a->score_file && n_src == 0)
        return usage_error("%s", "missing prompt: give -p PROMPT, -f FILE or --ids FILE");
    if (a->tokens_only && a->ids_file)
        return usage_error("%s", "--tokens needs a text prompt (-p or -f)");
    if (a->chat && a->ids_file) return usage_error("%s", "--chat needs a text prompt (-p or -f)");
    if (a->suffix || a->suffix_file) {
        if (a->suffix && a->suffix_file)
            return usage_error("%s", "give only one of --suffix and --suffix-file");
        if (a->chat)
            return usage_error("%s", "--suffix (fill in the middle) and --chat exclude each other");
        if (a->ids_file || a->score_file)
            return usage_error("%s", "--suffix needs a text prompt (-p or -f) for the text before "
                               "the gap");
    }
    return -1;
}

/* Peak resident set size of this process in KiB (Linux /proc/self/status VmHWM, which exec
 * resets, unlike getrusage's ru_maxrss), or -1 where unavailable. */
static long peak_rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

/* How model_open() brought the model into memory: "read" (2 MiB pages) or "mmap". */
static const char *load_kind = "mmap";
/* How many weight matrices tile_weights() put in row tiles (0: file order throughout). */
static int tiled_tensors = 0;
/* The KV caches' element types (--cache-type-k, --cache-type-v). */
static const char *cache_type_k = "f32", *cache_type_v = "f32";

/* The stats line on stderr (machine-readable for bench/bench_runtime.py), after a
 * human-readable line: for generation (eval_what NULL) TTFT and tok/s; for --score and
 * --dump-logits, "<eval_what> N tokens in X ms" (N = n_eval, X = prompt_s). */
static void print_stats(const char *eval_what, long n_eval, double load_s, long n_prompt,
                        double prompt_s, double ttft_s, long n_gen, double gen_s, long ctx) {
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    double tps = (n_gen > 1 && gen_s > 0) ? (double)(n_gen - 1) / gen_s : 0.0;
    if (eval_what)
        fprintf(stderr, "%s: %s %ld tokens in %.1f ms\n", prog, eval_what, n_eval,
                prompt_s * 1e3);
    else
        fprintf(stderr,
                "%s: prompt %ld tokens, time to first token %.1f ms, %ld tokens generated, "
                "%.2f tok/s\n",
                prog, n_prompt, ttft_s * 1e3, n_gen, tps);
    fprintf(stderr,
            "stats {\"load_ms\": %.3f, \"prompt_tokens\": %ld, \"prompt_ms\": %.3f, "
            "\"ttft_ms\": %.3f, \"generated_tokens\": %ld, \"decode_ms\": %.3f, "
            "\"tok_per_s\": %.4f, \"threads\": %d, \"ctx\": %ld, \"peak_rss_kib\": %ld, "
            "\"kernel\": \"%s\", \"load\": \"%s\", \"tiled_tensors\": %d, "
            "\"cache_type_k\": \"%s\", \"cache_type_v\": \"%s\"}\n",
            load_s * 1e3, n_prompt, prompt_s * 1e3, ttft_s * 1e3, n_gen, gen_s * 1e3, tps,
            threads, ctx, peak_rss_kib(), kernels_active()->name, load_kind, tiled_tensors,
            cache_type_k, cache_type_v);
}

/* What a run has opened and computed, shared by the modes below. */
typedef struct {
    Model model;
    Tokenizer *tok;
    RunState state;
    Prefill prefill; /* tile buffers of batched prefill (unused with --batch-size 1) */
    long batch;      /* tokens per prefill tile */
    Sampler sampler;
    int32_t *ids; /* the input tokens */
    long n_ids;
    long ctx;     /* KV cache positions */
    double t_start, t_loaded;
} Run;

/* The FIM prompt of --suffix / --suffix-file: <fim_prefix> prefix <fim_suffix> suffix
 * <fim_middle> with the model's own FIM tokens (tokenizer_encode_fim), BOS as for a plain
 * prompt. Control-token texts in prefix and suffix stay plain text, --special or not. r->ids
 * has room for *cap ids. Returns an exit code. */
static int read_fim_ids(const Args *a, Run *r, const char *prefix, size_t prefix_len, long *cap,
                        char *err, size_t errlen) {
    if (tokenizer_fim(r->tok, DITTO_FIM_PREFIX) < 0 || tokenizer_fim(r->tok, DITTO_FIM_SUFFIX) < 0 ||
        tokenizer_fim(r->tok, DITTO_FIM_MIDDLE) < 0) {
        fprintf(stderr, "%s: error: %s: --suffix: the model file has no fill-in-the-middle "
                "tokens (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|> or the like)\n", prog,
                a->model_path);
        return EXIT_USAGE;
    }
    size_t suffix_len;
    char *suffix;
    if (a->suffix_file) {
        suffix = read_file(a->suffix_file, &suffix_len);
        if (!suffix) {
            read_error(a->suffix_file);
            return EXIT_IO;
        }
    } else {
        suffix_len = strlen(a->suffix);
        suffix = malloc(suffix_len + 1);
        if (!suffix) {
            fprintf(stderr, "%s: error: out of memory\n", prog);
            return EXIT_OOM;
        }
        memcpy(suffix, a->suffix, suffix_len + 1);
    }
    int bos = a->bos >= 0 ? a->bos : (a->tokens_only ? 0 : -1);
    if (bos < 0) { /* the model file's default */
        const DittoTokenizerHeader *th =
            (const DittoTokenizerHeader *)(const void *)r->model.tokenizer_block;
        bos = th->add_bos != 0;
    }
    long need = tokenizer_encode_fim(r->tok, prefix, prefix_len, suffix, suffix_len, bos, r->ids,
                                     (size_t)*cap, err, errlen);
    if (need > *cap) {
        int32_t *nv = realloc(r->ids, (size_t)need * sizeof(int32_t));
        if (!nv) {
            free(suffix);
            fprintf(stderr, "%s: error: out of memory\n", prog);
            return EXIT_OOM;
        }
        r->ids = nv;
        *cap = need;
        need = tokenizer_encode_fim(r->tok, prefix, prefix_len, suffix, suffix_len, bos, r->ids,
                                    (size_t)*cap, err, errlen);
    }
    if (need < 0) { /* invalid UTF-8 in the prefix or the suffix: name the one */
        int in_prefix = tokenizer_encode(r->tok, prefix, prefix_len, 0, 0, NULL, 0, err,
                                         errlen) < 0;
        if (!in_prefix) (void)tokenizer_encode(r->tok, suffix, suffix_len, 0, 0, NULL, 0, err,
                                               errlen);
        const char *what = in_prefix ? (a->prompt_file ? a->prompt_file : "prompt")
                                     : (a->suffix_file ? a->suffix_file : "--suffix");
        free(suffix);
        fprintf(stderr, "%s: error: %s: %s\n", prog, what, err);
        return EXIT_PROMPT;
    }
    free(suffix);
    r->n_ids = need;
    return EXIT_OK;
}

/* The input tokens of a text prompt (-p or -f), inside the model's chat template with --chat,
 * or around the --suffix text as a FIM prompt. Returns an exit code; on success r->ids /
 * r->n_ids hold the tokens. */
static int read_prompt_ids(const Args *a, Run *r, char *err, size_t errlen) {
    size_t len;
    char *text;
    if (a->prompt_file) {
        text = read_file(a->prompt_file, &len);
        if (!text) {
            read_error(a->prompt_file);
            return EXIT_IO;
        }
    } else {
        len = strlen(a->prompt);
        text = malloc(len + 1);
        if (text) memcpy(text, a->prompt, len + 1);
    }
    long cap = (long)len + 16;
    r->ids = malloc((size_t)cap * sizeof(int32_t));
    if (!text || !r->ids) {
        free(text);
        fprintf(stderr, "%s: error: out of memory\n", prog);
        return EXIT_OOM;
    }
    int ok;
    if (a->suffix || a->suffix_file) {
        int rc = read_fim_ids(a, r, text, len, &cap, err, errlen);
        free(text);
        return rc;
    }
    if (a->chat) {
        /* the model's chat template, rendered at export around the user's message; the whole
         * prompt is tokenized as one string, special tokens parsed only in the template's
         * text unless --special (so a typed "<|im_end|>" stays plain text) */
        const char *pre, *post;
        size_t npre, npost;
        if (!tokenizer_chat_text(r->tok, &pre, &npre, &post, &npost)) {
            free(text);
            fprintf(stderr, "%s: error: %s: --chat: the model file has no chat template text "
                    "(none in the source model, or one its export could not reduce)\n", prog,
                    a->model_path);
            return EXIT_USAGE;
        }
        char *full = malloc(npre + len + npost + 1);
        if (!full) {
            free(text);
            fprintf(stderr, "%s: error: out of memory\n", prog);
            return EXIT_OOM;
        }
        memcpy(full, pre, npre);
        memcpy(full + npre, text, len);
        memcpy(full + npre + len, post, npost);
        size_t lo = a->special ? 0 : npre, hi = a->special ? 0 : npre + len;
        ok = !encode_append(r->tok, full, npre + len + npost, lo, hi, a->bos == 1, &r->ids,
                            &r->n_ids, &cap, err, errlen);
        free(full);
    } else {
        int bos = a->bos >= 0 ? a->bos : (a->tokens_only ? 0 : -1);
        if (bos < 0) { /* the model file's default */
            const DittoTokenizerHeader *th =
                (const DittoTokenizerHeader *)(const void *)r->model.tokenizer_block;
            bos = th->add_bos != 0;
        }
        ok = !encode_append(r->tok, text, len, 0, a->special ? 0 : len, bos, &r->ids, &r->n_ids,
                            &cap, err, errlen);
    }
    free(text);
    if (!ok) {
        fprintf(stderr, "%s: error: %s: %s\n", prog, a->prompt_file ? a->prompt_file : "prompt",
                err);
        return EXIT_PROMPT;
    }
    return EXIT_OK;
}

/* The input tokens: from a token file (--score, --ids) or a text prompt. Returns an exit code. */
static int read_input_ids(const Args *a, Run *r) {
    char err[1024] = "";
    const char *token_path = a->score_file ? a->score_file : a->ids_file;
    if (!token_path) return read_prompt_ids(a, r, err, sizeof err);
    size_t len;
    char *text = read_file(token_path, &len);
    if (!text) {
        read_error(token_path);
        return EXIT_IO;
    }
    r->n_ids = parse_token_file(token_path, text, len, r->model.config.vocab_size, &r->ids, err,
                                sizeof err);
    free(text);
    if (r->n_ids < 0) {
        r->n_ids = 0;
        fprintf(stderr, "%s: error: %s\n", prog, err);
        return EXIT_PROMPT;
    }
    return EXIT_OK;
}

/* --tokens: print the input token ids as a JSON list. */
static int print_tokens(const Run *r) {
    printf("[");
    for (long i = 0; i < r->n_ids; i++) printf(i ? ", %d" : "%d", r->ids[i]);
    printf("]\n");
    return write_stdout(NULL, 0) ? stdout_error() : EXIT_OK;
}

/* Sizes the KV cache to what this run uses and allocates the run state. Returns an exit code. */
static int prepare_context(const Args *a, Run *r) {
    const DittoConfig *cfg = &r->model.config;
    const char *token_path = a->score_file ? a->score_file : a->ids_file;
    if (r->n_ids == 0 || (a->score_file && r->n_ids < 2)) {
        fprintf(stderr, "%s: error: %s: %s\n", prog,
                token_path ? token_path : a->prompt_file ? a->prompt_file : "prompt",
                a->score_file ? "needs at least 2 tokens to score" : "prompt is empty (0 tokens)");
        return EXIT_PROMPT;
    }
    long max_seq = (long)cfg->max_seq_len;
    long ctx = a->ctx;
    if (ctx > max_seq) {
        fprintf(stderr, "%s: error: --ctx %ld exceeds the model's max_seq_len %ld\n", prog, ctx,
                max_seq);
        return EXIT_USAGE;
    }
    int eval_only = a->score_file || a->dump_file;
    if (ctx == 0) {
        ctx = eval_only ? r->n_ids : r->n_ids + a->n_gen - 1;
        if (ctx > max_seq) ctx = max_seq;
    }
    if (r->n_ids > ctx) {
        fprintf(stderr,
                "%s: error: the prompt has %ld tokens but the context holds %ld "
                "(max_seq_len %ld)\n",
                prog, r->n_ids, ctx, max_seq);
        return EXIT_PROMPT;
    }
    r->ctx = ctx;
    r->batch = a->batch < r->n_ids ? a->batch : r->n_ids;
    if (runstate_init(&r->state, cfg, (int)ctx, a->type_k, a->type_v) ||
        (r->batch > 1 && prefill_init(&r->prefill, cfg, (int)r->batch, (int)ctx)) ||
        sampler_init(&r->sampler, (int)cfg->vocab_size, a->temp, a->topp, a->seed)) {
        int threads = 1;
#ifdef _OPENMP
        threads = omp_get_max_threads();
#endif
        size_t bytes = runstate_bytes(cfg, (int)ctx, a->type_k, a->type_v) +
                       (r->batch > 1 ? prefill_bytes(cfg, (int)r->batch, (int)ctx, threads) : 0);
        fprintf(stderr, "%s: error: out of memory for a context of %ld positions (%.1f MiB)\n",
                prog, ctx, bytes / 1048576.0);
        return EXIT_OOM;
    }
    return EXIT_OK;
}

/* Called by eval_input() with the logits of each input position in order. */
typedef void (*LogitsFn)(Run *r, long pos, const float *logits, void *ctx);

/* Runs the input tokens from position 0, filling the KV cache: in tiles of r->batch tokens
 * through prefill() (batched prefill), or one token at a time through forward() when the tile
 * is 1. With each given, every position's logits are computed and passed to it; without, only
 * the last position's. Returns the logits of the last input position. */
static float *eval_input(Run *r, LogitsFn each, void *ctx) {
    float *logits = NULL;
    int vocab = (int)r->model.config.vocab_size;
    for (long pos0 = 0; pos0 < r->n_ids && !stop_signal; pos0 += r->batch) {
        long n = r->n_ids - pos0 < r->batch ? r->n_ids - pos0 : r->batch;
        if (r->batch == 1) {
            logits = forward(&r->model, &r->state, r->ids[pos0], (int)pos0);
            if (each) each(r, pos0, logits, ctx);
            continue;
        }
        int mode = each ? PREFILL_ALL_LOGITS
                        : pos0 + n >= r->n_ids ? PREFILL_LAST_LOGITS : PREFILL_NO_LOGITS;
        logits = prefill(&r->model, &r->state, &r->prefill, r->ids + pos0, (int)n, (int)pos0,
                         mode);
        if (each)
            for (long t = 0; t < n; t++)
                each(r, pos0 + t, r->prefill.logits + (size_t)t * vocab, ctx);
    }
    return logits;
}

/* LogitsFn of --score: prints log p(ids[pos + 1] | ids[..pos]) and adds it to *(double *)sum. */
static void score_position(Run *r, long pos, const float *logits, void *sum) {
    if (pos + 1 >= r->n_ids) return; /* the last token predicts nothing that is scored */
    int vocab = (int)r->model.config.vocab_size;
    float max = logits[0];
    for (int i = 1; i < vocab; i++)
        if (logits[i] > max) max = logits[i];
    double z = 0.0;
    for (int i = 0; i < vocab; i++) z += exp((double)(logits[i] - max));
    double lp = (double)(logits[r->ids[pos + 1]] - max) - log(z);
    *(double *)sum += lp;
    printf(pos ? ", %.6f" : "%.6f", lp);
}

/* --score: teacher-forced log-probabilities of tokens 1..n-1, as one JSON object on stdout. */
static int score(Run *r) {
    printf("{\"n_tokens\": %ld, \"logprobs\": [", r->n_ids);
    double sum = 0.0;
    eval_input(r, score_position, &sum);
    long n_scored = r->n_ids - 1;
    printf("], \"n_scored\": %ld, \"sum_logprob\": %.6f, \"mean_nll\": %.6f, "
           "\"perplexity\": %.6f}\n",
           n_scored, sum, -sum / n_scored, exp(-sum / n_scored));
    if (stop_signal) return EXIT_OK; /* main() ends the run by the signal */
    if (write_stdout(NULL, 0)) return stdout_error();
    double t_end = now_s();
    print_stats("scored", n_scored, r->t_loaded - r->t_start, r->n_ids, t_end - r->t_loaded, 0.0,
                0, 0.0, r->ctx);
    return EXIT_OK;
}

/* LogitsFn of --dump-logits: copies the logits of pos into row pos of the float dump[n][vocab]. */
static void dump_position(Run *r, long pos, const float *logits, void *dump) {
    size_t vocab = r->model.config.vocab_size;
    memcpy((float *)dump + (size_t)pos * vocab, logits, vocab * sizeof(float));
}

/* --dump-logits FILE: the logits of every input position, n x vocab float32, row-major,
 * written by the output rule of output.h (never over an input or a special file). */
static int dump_logits(Run *r, const Args *a) {
    const char *path = a->dump_file;
    int vocab = (int)r->model.config.vocab_size;
    size_t n_bytes = (size_t)r->n_ids * (size_t)vocab * sizeof(float);
    float *dump = malloc(n_bytes);
    if (!dump) {
        fprintf(stderr, "%s: error: out of memory for %ld x %d logits\n", prog, r->n_ids, vocab);
        return EXIT_OOM;
    }
    eval_input(r, dump_position, dump);
    if (stop_signal) {
        free(dump);
        return EXIT_OK; /* main() ends the run by the signal; nothing was written */
    }
    int rc = EXIT_OK;
    const char *inputs[] = {a->model_path, a->prompt_file, a->ids_file, a->score_file};
    char err[1024];
    if (output_write_file(path, dump, n_bytes, inputs, sizeof inputs / sizeof *inputs, err,
                          sizeof err)) {
        fprintf(stderr, "%s: error: %s\n", prog, err);
        rc = EXIT_IO;
    } else {
        double t_end = now_s();
        print_stats("computed the logits of", r->n_ids, r->t_loaded - r->t_start, r->n_ids,
                    t_end - r->t_loaded, 0.0, 0, 0.0, r->ctx);
    }
    free(dump);
    return rc;
}

/* Generation: evaluates the prompt, then samples up to -n tokens, printing their text as it
 * streams (or their ids with --print-ids). */
static int generate(Run *r, const Args *a) {
    if (!a->seed_given) {
        uint64_t seed = (uint64_t)time(NULL);
        r->sampler.rng = seed;
        if (a->temp > 0.0f) fprintf(stderr, "%s: seed %llu\n", prog, (unsigned long long)seed);
    }
    int32_t *gen_ids = malloc((size_t)a->n_gen * sizeof(int32_t));
    size_t out_cap = tokenizer_max_decode_bytes(r->tok) + 16;
    char *out = malloc(out_cap);
    if (!gen_ids || !out) {
        free(gen_ids);
        free(out);
        fprintf(stderr, "%s: error: out of memory\n", prog);
        return EXIT_OOM;
    }
    float *logits = eval_input(r, NULL, NULL);
    if (stop_signal) {
        free(out);
        free(gen_ids);
        return EXIT_OK; /* main() ends the run by the signal */
    }
    double t_prompt = now_s(), t_first = 0.0;
    TokenDecoder dec;
    token_decoder_init(&dec);
    /* the generated text is decode(prompt + generated) minus decode(prompt), as HF and
     * llama.cpp print it: the decoder first sees the prompt (e.g. SentencePiece drops the
     * leading space of the text's first piece only, not of the first generated one) */
    for (long i = 0; i < r->n_ids; i++)
        (void)token_decode(r->tok, &dec, r->ids[i], 0, out, out_cap);
    long n_gen = 0, pos = r->n_ids;
    int write_failed = 0;
    while (!stop_signal) {
        int next = sampler_sample(&r->sampler, logits);
        gen_ids[n_gen++] = next;
        if (n_gen == 1) t_first = now_s();
        if (!a->ignore_eos && tokenizer_is_eog(r->tok, next)) break;
        if (!a->print_ids) {
            size_t nb = token_decode(r->tok, &dec, next, 0, out, out_cap);
            if (write_stdout(out, nb)) {
                write_failed = 1; /* nobody can read the rest: stop generating */
                break;
            }
        }
        if (n_gen >= a->n_gen) break;
        if (pos >= r->ctx) {
            fprintf(stderr, "\n%s: context full (%ld positions): stopping\n", prog, r->ctx);
            break;
        }
        logits = forward(&r->model, &r->state, next, (int)pos);
        pos++;
    }
    double t_end = now_s();
    if (!write_failed && a->print_ids) {
        printf("[");
        for (long i = 0; i < n_gen; i++) printf(i ? ", %d" : "%d", gen_ids[i]);
        printf("]\n");
        write_failed = write_stdout(NULL, 0) != 0;
    } else if (!write_failed) {
        size_t nb = token_decoder_flush(&dec, out, out_cap);
        if (nb < out_cap) out[nb++] = '\n';
        write_failed = write_stdout(out, nb) != 0;
    }
    if (write_failed || stop_signal) { /* the text first, then the stats on stderr */
        free(out);
        free(gen_ids);
        return write_failed ? stdout_error() : EXIT_OK;
    }
    print_stats(NULL, 0, r->t_loaded - r->t_start, r->n_ids, t_prompt - r->t_loaded,
                t_first - r->t_loaded, n_gen, t_end - t_first, r->ctx);
    free(out);
    free(gen_ids);
    return EXIT_OK;
}

/* Generation's classifier GEMV (a quarter of SmolLM2's weights, stored at b = 6) through
 * weights decoded to int8 once, when the kernel table reads those faster than it looks up b = 6
 * indices (kernels_decode_tensor; vocab x dim bytes). Without the memory for it, the lookup
 * kernel serves, with the same bits. --score and --dump-logits take the classifier through the
 * batched GEMM, which decodes each row itself. */
static void decode_classifier(Model *m) {
    Tensor *out = &m->tensors[m->output - m->tensors];
    if (kernels_decode_tensor(out) < 0)
        fprintf(stderr, "%s: warning: no memory to decode %s for the GEMV kernel (%" PRIu64
                " bytes); using the lookup kernel\n", prog, out->name, out->rows * out->cols);
}

/* Opens the model and its tokenizer, reads the input tokens and runs the chosen mode. */
static int run(const Args *a, Run *r) {
    char err[1024] = "";
    if (kernels_select(a->kernel, err, sizeof err)) { /* --kernel, else $DITTO_KERNEL */
        fprintf(stderr, "%s: error: %s%s\n", prog, a->kernel ? "--kernel: " : "DITTO_KERNEL: ",
                err);
        return EXIT_USAGE;
    }
    ModelLoad load = MODEL_LOAD_MMAP;
    if ((!a->mmap && model_load_from_env(&load, err, sizeof err)) ||
        kernels_tiles_env_check(err, sizeof err)) {
        fprintf(stderr, "%s: error: %s\n", prog, err);
        return EXIT_USAGE;
    }
    if (model_open(&r->model, a->model_path, load, err, sizeof err)) {
        fprintf(stderr, "%s: error: %s\n", prog, err);
        return EXIT_MODEL;
    }
    load_kind = r->model.mapped ? "mmap" : "read";
    const DittoConfig *cfg = &r->model.config;
    r->tok = tokenizer_new(r->model.tokenizer_block, r->model.tokenizer_block_len,
                           cfg->vocab_size, err, sizeof err);
    if (!r->tok) {
        fprintf(stderr, "%s: error: %s: tokenizer: %s\n", prog, a->model_path, err);
        return EXIT_MODEL;
    }
    int rc = read_input_ids(a, r);
    if (rc != EXIT_OK) return rc;
    if (a->tokens_only) return print_tokens(r);
    rc = prepare_context(a, r);
    if (rc != EXIT_OK) return rc;
    if (!a->score_file && !a->dump_file) decode_classifier(&r->model);
    tiled_tensors = tile_weights(&r->model);
    if (tiled_tensors < 0) {
        fprintf(stderr, "%s: warning: no memory to put the weights in row tiles; reading them "
                "in file order\n", prog);
        tiled_tensors = 0;
    }
    r->t_loaded = now_s();
    if (a->score_file) return score(r);
    if (a->dump_file) return dump_logits(r, a);
    return generate(r, a);
}

int main(int argc, char **argv) {
    Args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    cache_type_k = kv_type_name(a.type_k);
    cache_type_v = kv_type_name(a.type_v);
    occupy_standard_fds();
    install_signal_handlers();
#ifdef _OPENMP
    if (a.threads > 0) omp_set_num_threads((int)a.threads);
#endif
    Run r;
    memset(&r, 0, sizeof r);
    r.t_start = now_s();
    rc = run(&a, &r);
    if (write_stdout(NULL, 0) != 0 && rc == EXIT_OK) rc = stdout_error();
    sampler_free(&r.sampler);
    runstate_free(&r.state);
    prefill_free(&r.prefill);
    free(r.ids);
    tokenizer_free(r.tok);
    model_close(&r.model);
    if (stop_signal) {
        int sig = stop_signal;
        fprintf(stderr, "\n%s: interrupted (%s)\n", prog,
                sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP");
#ifdef _OPENMP
        omp_pause_resource_all(omp_pause_hard); /* unregisters libomp (/dev/shm) */
#endif
        signal(sig, SIG_DFL);
        raise(sig);
        return 128 + sig; /* if the signal is blocked by the caller */
    }
    return rc;
}
