/* session.c: the C API of the runtime (ditto.h) over model.c, forward.c, prefill.c,
 * tokenizer.c and sampler.c. */
#include "ditto.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "forward.h"
#include "prefill.h"
#include "sampler.h"
#include "../kernels/kernels.h"
#include "../kernels/matmul.h"
#include "../model/model.h"
#include "../tokenizer/tokenizer.h"

struct DittoModel {
    Model model;
    Tokenizer *tok;
    int threads;          /* OpenMP threads per evaluation, <= 0: the OpenMP default */
    int add_bos;
    pthread_mutex_t lock; /* one evaluation at a time (the kernels' scratch is per process) */
};

struct DittoSession {
    DittoModel *m;
    RunState state;
    Prefill prefill;
    int batch; /* tile of prefill(); 1: forward() only */
    int pos;
};

struct DittoSampler {
    Sampler s;
    int top_k;
    float min_p;   /* 0: off (ditto_sampler_set_min_p) */
    float *work;   /* [vocab] copy of the logits (sampler_sample works in place) */
    float *heap;   /* [top_k] min-heap of the k largest logits */
};

struct DittoDecoder {
    const DittoModel *m;
    TokenDecoder d;
};

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static void use_threads(int threads) {
#ifdef _OPENMP
    if (threads > 0) omp_set_num_threads(threads);
#else
    (void)threads;
#endif
}

int ditto_api_version(void) { return DITTO_API_VERSION; }

/* ---- model ------------------------------------------------------------------------------ */

DittoStatus ditto_model_open(const char *path, const char *kernel, int threads, DittoModel **out,
                             char *err, size_t errlen) {
    if (!path || !out) {
        set_err(err, errlen, "ditto_model_open: path and out must not be NULL");
        return DITTO_ERR_ARG;
    }
    *out = NULL;
    if (threads > DITTO_MAX_THREADS) {
        set_err(err, errlen, "threads: %d is more than %d", threads, DITTO_MAX_THREADS);
        return DITTO_ERR_ARG;
    }
    char msg[1024] = "";
    if (kernels_select(kernel && *kernel ? kernel : NULL, msg, sizeof msg)) {
        /* named by where the table's name came from, as ditto-run names --kernel or the
         * environment variable */
        set_err(err, errlen, "%s%s", kernel && *kernel ? "kernel: " : "DITTO_KERNEL: ", msg);
        return DITTO_ERR_ARG;
    }
    DittoModel *m = calloc(1, sizeof *m);
    if (!m) {
        set_err(err, errlen, "out of memory");
        return DITTO_ERR_OOM;
    }
    ModelLoad load;
    if (model_load_from_env(&load, msg, sizeof msg) || kernels_tiles_env_check(msg, sizeof msg)) {
        free(m);
        set_err(err, errlen, "%s", msg);
        return DITTO_ERR_ARG;
    }
    if (model_open(&m->model, path, load, msg, sizeof msg)) {
        free(m);
        set_err(err, errlen, "%s", msg);
        return DITTO_ERR_MODEL;
    }
    m->tok = tokenizer_new(m->model.tokenizer_block, m->model.tokenizer_block_len,
                           m->model.config.vocab_size, msg, sizeof msg);
    if (!m->tok) {
        model_close(&m->model);
        free(m);
        set_err(err, errlen, "%s: tokenizer: %s", path, msg);
        return DITTO_ERR_MODEL;
    }
    const DittoTokenizerHeader *th =
        (const DittoTokenizerHeader *)(const void *)m->model.tokenizer_block;
    m->add_bos = th->add_bos != 0 && tokenizer_bos(m->tok) >= 0;
    m->threads = threads;
    if (pthread_mutex_init(&m->lock, NULL)) {
        tokenizer_free(m->tok);
        model_close(&m->model);
        free(m);
        set_err(err, errlen, "cannot create a mutex");
        return DITTO_ERR_OOM;
    }
    /* generation's classifier through int8 weights decoded once, as ditto-run does; without
     * the memory for it the lookup kernel gives the same bits */
    Tensor *cls = &m->model.tensors[m->model.output - m->model.tensors];
    use_threads(threads);
    (void)kernels_decode_tensor(cls);
    (void)tile_weights(&m->model); /* without the memory, file order gives the same bits */
    *out = m;
    return DITTO_OK;
}

void ditto_model_free(DittoModel *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->lock);
    tokenizer_free(m->tok);
    model_close(&m->model); /* frees the decoded classifier too */
    free(m);
}

void ditto_model_info(const DittoModel *m, DittoModelInfo *info) {
    memset(info, 0, sizeof *info);
    const DittoConfig *c = &m->model.config;
    info->vocab_size = (int32_t)c->vocab_size;
    info->max_seq_len = (int32_t)c->max_seq_len;
    info->dim = (int32_t)c->dim;
    info->n_layers = (int32_t)c->n_layers;
    info->n_heads = (int32_t)c->n_heads;
    info->n_kv_heads = (int32_t)c->n_kv_heads;
    info->head_dim = (int32_t)c->head_dim;
    info->hidden_dim = (int32_t)c->hidden_dim;
    info->bos_id = tokenizer_bos(m->tok);
    info->eos_id = tokenizer_eos(m->tok);
    info->add_bos = m->add_bos;
    info->max_piece_bytes = (int32_t)tokenizer_max_decode_bytes(m->tok) + 8;
    int threads = m->threads;
#ifdef _OPENMP
    if (threads <= 0) threads = omp_get_max_threads();
#else
    threads = 1;
#endif
    info->threads = threads;
    snprintf(info->kernel, sizeof info->kernel, "%s", kernel_active_name());
}

/* ---- tokenizer ---------------------------------------------------------------------------- */

long ditto_tokenize(const DittoModel *m, const char *text, size_t len, int parse_special,
                    int add_bos, int32_t *ids, size_t max_ids, char *err, size_t errlen) {
    if (!text && len) {
        set_err(err, errlen, "ditto_tokenize: text is NULL");
        return -1;
    }
    return tokenizer_encode(m->tok, text ? text : "", len, parse_special,
                            add_bos && tokenizer_bos(m->tok) >= 0, ids, max_ids, err, errlen);
}

int32_t ditto_token_find(const DittoModel *m, const char *text) {
    return text ? tokenizer_find(m->tok, text) : -1;
}

int ditto_token_is_eog(const DittoModel *m, int32_t id) { return tokenizer_is_eog(m->tok, id); }

int32_t ditto_token_fim(const DittoModel *m, int role) {
    return role >= 0 ? tokenizer_fim(m->tok, (uint32_t)role) : -1;
}

static int id_ok(const DittoModel *m, int32_t id) {
    return id >= 0 && (uint32_t)id < m->model.config.vocab_size &&
           (uint32_t)id < tokenizer_n_tokens(m->tok);
}

long ditto_token_piece(const DittoModel *m, int32_t id, char *out, size_t cap) {
    if (!id_ok(m, id)) return -1;
    TokenDecoder d;
    token_decoder_init(&d);
    d.at_start = 0;
    size_t n = token_decode(m->tok, &d, id, 1, out, cap);
    /* the bytes of an incomplete character wait in the decoder: they are the piece's too */
    for (int i = 0; i < d.n_pending && n < cap; i++) out[n++] = (char)d.pending[i];
    return (long)n;
}

int ditto_token_is_control(const DittoModel *m, int32_t id) {
    if (!id_ok(m, id)) return 0;
    char buf[8];
    TokenDecoder d;
    token_decoder_init(&d);
    d.at_start = 0;
    size_t plain = token_decode(m->tok, &d, id, 0, buf, sizeof buf) + (size_t)d.n_pending;
    token_decoder_init(&d);
    d.at_start = 0;
    size_t shown = token_decode(m->tok, &d, id, 1, buf, sizeof buf) + (size_t)d.n_pending;
    return plain == 0 && shown > 0;
}

long ditto_detokenize(const DittoModel *m, const int32_t *ids, size_t n, int show_special,
                      char *out, size_t cap, char *err, size_t errlen) {
    size_t piece_cap = tokenizer_max_decode_bytes(m->tok) + 8;
    char *piece = malloc(piece_cap);
    if (!piece) {
        set_err(err, errlen, "out of memory");
        return -1;
    }
    TokenDecoder d;
    token_decoder_init(&d);
    size_t total = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t k;
        if (i == n) {
            k = token_decoder_flush(&d, piece, piece_cap);
        } else {
            if (!id_ok(m, ids[i])) {
                free(piece);
                set_err(err, errlen, "token id %ld at index %zu is out of range (vocab %u)",
                        (long)ids[i], i, m->model.config.vocab_size);
                return -1;
            }
            k = token_decode(m->tok, &d, ids[i], show_special, piece, piece_cap);
        }
        if (out && total < cap) memcpy(out + total, piece, k < cap - total ? k : cap - total);
        total += k;
    }
    free(piece);
    return (long)total;
}

DittoStatus ditto_decoder_new(const DittoModel *m, DittoDecoder **out) {
    DittoDecoder *d = calloc(1, sizeof *d);
    *out = d;
    if (!d) return DITTO_ERR_OOM;
    d->m = m;
    token_decoder_init(&d->d);
    return DITTO_OK;
}

long ditto_decoder_feed(DittoDecoder *d, int32_t id, int show_special, char *out, size_t cap) {
    if (!id_ok(d->m, id)) return -1;
    return (long)token_decode(d->m->tok, &d->d, id, show_special, out, cap);
}

long ditto_decoder_flush(DittoDecoder *d, char *out, size_t cap) {
    return (long)token_decoder_flush(&d->d, out, cap);
}

void ditto_decoder_free(DittoDecoder *d) { free(d); }

/* ---- sessions ----------------------------------------------------------------------------- */

DittoStatus ditto_session_new(DittoModel *m, int n_ctx, int n_batch, DittoSession **out,
                              char *err, size_t errlen) {
    if (!m || !out) {
        set_err(err, errlen, "ditto_session_new: model and out must not be NULL");
        return DITTO_ERR_ARG;
    }
    return ditto_session_new_kv(m, n_ctx, n_batch, "f32", "f32", out, err, errlen);
}

DittoStatus ditto_session_new_kv(DittoModel *m, int n_ctx, int n_batch, const char *type_k,
                                 const char *type_v, DittoSession **out, char *err,
                                 size_t errlen) {
    if (!m || !out) {
        set_err(err, errlen, "ditto_session_new_kv: model and out must not be NULL");
        return DITTO_ERR_ARG;
    }
    *out = NULL;
    const int tk = kv_type_parse(type_k), tv = kv_type_parse(type_v);
    if (tk < 0 || tv < 0) {
        set_err(err, errlen, "cache_type_%s '%s' is not a KV cache type (f32, f16)",
                tk < 0 ? "k" : "v", tk < 0 ? (type_k ? type_k : "(null)")
                                           : (type_v ? type_v : "(null)"));
        return DITTO_ERR_ARG;
    }
    const DittoConfig *c = &m->model.config;
    if (n_ctx < 1 || (uint32_t)n_ctx > c->max_seq_len) {
        set_err(err, errlen, "n_ctx %d is outside 1..%u (the model's max_seq_len)", n_ctx,
                c->max_seq_len);
        return DITTO_ERR_ARG;
    }
    if (n_batch < 1 || n_batch > MATMUL_BATCH_MAX) {
        set_err(err, errlen, "n_batch %d is outside 1..%d", n_batch, MATMUL_BATCH_MAX);
        return DITTO_ERR_ARG;
    }
    DittoSession *s = calloc(1, sizeof *s);
    if (!s) {
        set_err(err, errlen, "out of memory");
        return DITTO_ERR_OOM;
    }
    s->m = m;
    s->batch = n_batch;
    use_threads(m->threads); /* prefill's attention scratch has a row per thread */
    if (runstate_init(&s->state, c, n_ctx, tk, tv) ||
        (n_batch > 1 && prefill_init(&s->prefill, c, n_batch, n_ctx))) {
        int threads = 1;
#ifdef _OPENMP
        threads = omp_get_max_threads();
#endif
        size_t bytes = runstate_bytes(c, n_ctx, tk, tv) +
                       (n_batch > 1 ? prefill_bytes(c, n_batch, n_ctx, threads) : 0);
        runstate_free(&s->state);
        free(s);
        set_err(err, errlen, "out of memory for a context of %d positions (%.1f MiB)", n_ctx,
                bytes / 1048576.0);
        return DITTO_ERR_OOM;
    }
    *out = s;
    return DITTO_OK;
}

void ditto_session_free(DittoSession *s) {
    if (!s) return;
    runstate_free(&s->state);
    prefill_free(&s->prefill);
    free(s);
}

int ditto_session_pos(const DittoSession *s) { return s->pos; }
int ditto_session_ctx(const DittoSession *s) { return s->state.ctx; }

DittoStatus ditto_session_eval(DittoSession *s, const int32_t *tokens, int n, int logits_mode,
                               float *logits, char *err, size_t errlen) {
    const DittoModel *m = s->m;
    size_t vocab = m->model.config.vocab_size;
    if (n < 1 || !tokens) {
        set_err(err, errlen, "eval: no tokens (n = %d)", n);
        return DITTO_ERR_ARG;
    }
    if (logits_mode < DITTO_LOGITS_NONE || logits_mode > DITTO_LOGITS_ALL ||
        (logits_mode != DITTO_LOGITS_NONE && !logits)) {
        set_err(err, errlen, "eval: bad logits mode %d or NULL logits buffer", logits_mode);
        return DITTO_ERR_ARG;
    }
    if (n > s->state.ctx - s->pos) {
        set_err(err, errlen, "context full: %d tokens at position %d exceed the %d positions of "
                "the session", n, s->pos, s->state.ctx);
        return DITTO_ERR_INPUT;
    }
    for (int i = 0; i < n; i++)
        if (!id_ok(m, tokens[i])) {
            set_err(err, errlen, "token id %ld at index %d is out of range (vocab %zu)",
                    (long)tokens[i], i, vocab);
            return DITTO_ERR_INPUT;
        }
    pthread_mutex_lock(&s->m->lock);
    use_threads(m->threads);
    if (s->batch == 1 || n == 1) {
        for (int i = 0; i < n; i++) {
            float *l = forward(&m->model, &s->state, tokens[i], s->pos + i);
            if (logits_mode == DITTO_LOGITS_ALL)
                memcpy(logits + (size_t)i * vocab, l, vocab * sizeof(float));
            else if (logits_mode == DITTO_LOGITS_LAST && i == n - 1)
                memcpy(logits, l, vocab * sizeof(float));
        }
    } else {
        for (int t0 = 0; t0 < n; t0 += s->batch) {
            int k = n - t0 < s->batch ? n - t0 : s->batch;
            int last = t0 + k == n;
            int mode = logits_mode == DITTO_LOGITS_ALL ? PREFILL_ALL_LOGITS
                       : logits_mode == DITTO_LOGITS_LAST && last ? PREFILL_LAST_LOGITS
                                                                   : PREFILL_NO_LOGITS;
            /* an f32 classifier goes through BLAS, whose GEMM and GEMV round differently:
             * every row then takes the decode step's GEMV, so all logits have forward()'s
             * bits (the int8 GEMM already equals the GEMV row by row) */
            int per_row = mode == PREFILL_ALL_LOGITS && m->model.output->encoding == DITTO_ENC_F32;
            float *l = prefill(&m->model, &s->state, &s->prefill, tokens + t0, k, s->pos + t0,
                               per_row ? PREFILL_NO_LOGITS : mode);
            if (per_row) {
                const DittoConfig *c = &m->model.config;
                const float *w = (const float *)(const void *)m->model.output_norm->data;
                for (int t = 0; t < k; t++) {
                    float *x = s->prefill.x + (size_t)t * c->dim;
                    rmsnorm(x, x, w, (int)c->dim, c->norm_eps);
                    gemv(logits + (size_t)(t0 + t) * vocab, x, m->model.output);
                }
            } else if (mode == PREFILL_ALL_LOGITS) {
                memcpy(logits + (size_t)t0 * vocab, s->prefill.logits,
                       (size_t)k * vocab * sizeof(float));
            } else if (mode == PREFILL_LAST_LOGITS) {
                memcpy(logits, l, vocab * sizeof(float));
            }
        }
    }
    pthread_mutex_unlock(&s->m->lock);
    s->pos += n;
    return DITTO_OK;
}

DittoStatus ditto_session_truncate(DittoSession *s, int n_keep, char *err, size_t errlen) {
    if (n_keep < 0 || n_keep > s->pos) {
        set_err(err, errlen, "truncate: n_keep %d is outside 0..%d (the session's position)",
                n_keep, s->pos);
        return DITTO_ERR_ARG;
    }
    s->pos = n_keep; /* positions >= n_keep are overwritten by the next eval */
    return DITTO_OK;
}

/* ---- sampling ----------------------------------------------------------------------------- */

DittoStatus ditto_sampler_new(const DittoModel *m, float temperature, int top_k, float top_p,
                              uint64_t seed, DittoSampler **out, char *err, size_t errlen) {
    *out = NULL;
    int vocab = (int)m->model.config.vocab_size;
    if (!(temperature >= 0.0f) || !(top_p > 0.0f)) { /* NaN fails both */
        set_err(err, errlen, "temperature must be >= 0 and top_p > 0 (got %g, %g)",
                (double)temperature, (double)top_p);
        return DITTO_ERR_ARG;
    }
    DittoSampler *s = calloc(1, sizeof *s);
    if (!s) {
        set_err(err, errlen, "out of memory");
        return DITTO_ERR_OOM;
    }
    s->top_k = top_k > 0 && top_k < vocab ? top_k : 0;
    s->work = malloc((size_t)vocab * sizeof(float));
    s->heap = s->top_k ? malloc((size_t)s->top_k * sizeof(float)) : NULL;
    if (!s->work || (s->top_k && !s->heap) ||
        sampler_init(&s->s, vocab, temperature, top_p, seed)) {
        free(s->work);
        free(s->heap);
        free(s);
        set_err(err, errlen, "out of memory");
        return DITTO_ERR_OOM;
    }
    *out = s;
    return DITTO_OK;
}

void ditto_sampler_free(DittoSampler *s) {
    if (!s) return;
    sampler_free(&s->s);
    free(s->work);
    free(s->heap);
    free(s);
}

static void sift_down(float *h, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, mi = i;
        if (l < k && h[l] < h[mi]) mi = l;
        if (r < k && h[r] < h[mi]) mi = r;
        if (mi == i) return;
        float t = h[i];
        h[i] = h[mi];
        h[mi] = t;
        i = mi;
    }
}

/* The k-th largest of x[n] (k <= n), NaN counted as -inf: a min-heap of the k largest. */
static float kth_largest(const float *x, int n, float *h, int k) {
    for (int i = 0; i < k; i++) h[i] = isnan(x[i]) ? -INFINITY : x[i];
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(h, k, i);
    for (int i = k; i < n; i++)
        if (x[i] > h[0]) {
            h[0] = x[i];
            sift_down(h, k, 0);
        }
    return h[0];
}

DittoStatus ditto_sampler_set_min_p(DittoSampler *s, float min_p, char *err, size_t errlen) {
    if (!(min_p >= 0.0f && min_p <= 1.0f)) { /* NaN fails too */
        set_err(err, errlen, "min_p must be in [0, 1] (got %g)", (double)min_p);
        return DITTO_ERR_ARG;
    }
    s->min_p = min_p;
    return DITTO_OK;
}

int32_t ditto_sample(DittoSampler *s, const float *logits) {
    int vocab = s->s.vocab_size;
    if (s->s.temperature == 0.0f) return sample_argmax(logits, vocab);
    memcpy(s->work, logits, (size_t)vocab * sizeof(float));
    if (s->top_k) {
        float kth = kth_largest(logits, vocab, s->heap, s->top_k);
        for (int i = 0; i < vocab; i++)
            if (!(s->work[i] >= kth)) s->work[i] = -INFINITY;
    }
    if (s->min_p > 0.0f) { /* llama.cpp's min-p on the logits: p_i >= min_p * p_max at T = 1 */
        float max = -INFINITY;
        for (int i = 0; i < vocab; i++)
            if (s->work[i] > max) max = s->work[i];
        const float floor_logit = max + logf(s->min_p);
        for (int i = 0; i < vocab; i++)
            if (!(s->work[i] >= floor_logit)) s->work[i] = -INFINITY;
    }
    return sampler_sample(&s->s, s->work);
}

int32_t ditto_argmax(const DittoModel *m, const float *logits) {
    return sample_argmax(logits, (int)m->model.config.vocab_size);
}
