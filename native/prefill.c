/* prefill.c: forward pass over a tile of tokens (see prefill.h). */
#include "prefill.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "gemm_avx2.h"
#include "matmul.h"

static int max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

size_t prefill_bytes(const DittoConfig *c, int tile, int ctx, int n_threads) {
    size_t q_dim = (size_t)c->n_heads * c->head_dim;
    size_t per_token = 3 * (size_t)c->dim + 2 * q_dim + 2 * (size_t)c->hidden_dim + c->vocab_size;
    return ((size_t)tile * per_token + (size_t)n_threads * ctx) * sizeof(float);
}

int prefill_init(Prefill *p, const DittoConfig *c, int tile, int ctx) {
    memset(p, 0, sizeof *p);
    size_t T = (size_t)tile, q_dim = (size_t)c->n_heads * c->head_dim;
    p->tile = tile;
    p->n_threads = max_threads();
    p->x = calloc(T * c->dim, sizeof(float));
    p->xb = calloc(T * c->dim, sizeof(float));
    p->xb2 = calloc(T * c->dim, sizeof(float));
    p->q = calloc(T * q_dim, sizeof(float));
    p->att_out = calloc(T * q_dim, sizeof(float));
    p->hb = calloc(T * c->hidden_dim, sizeof(float));
    p->hb2 = calloc(T * c->hidden_dim, sizeof(float));
    p->att = calloc((size_t)p->n_threads * ctx, sizeof(float));
    p->logits = calloc(T * c->vocab_size, sizeof(float));
    if (!p->x || !p->xb || !p->xb2 || !p->q || !p->att_out || !p->hb || !p->hb2 || !p->att ||
        !p->logits) {
        prefill_free(p);
        return -1;
    }
    return 0;
}

void prefill_free(Prefill *p) {
    free(p->x);
    free(p->xb);
    free(p->xb2);
    free(p->q);
    free(p->att_out);
    free(p->hb);
    free(p->hb2);
    free(p->att);
    free(p->logits);
    memset(p, 0, sizeof *p);
}

static const float *f32_data(const Tensor *t) { return (const float *)(const void *)t->data; }

/* Σ a[i]·b[i], i < n, in order (float32). */
static float dot_scalar(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_DOT_AVX2 1

/* Σ a[i]·b[i], i < n, in 4 x 8 FMA lanes summed at the end (AVX2 + FMA CPUs). */
__attribute__((target("avx2,fma"))) static float dot_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    __m256 v = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float s = _mm_cvtss_f32(h);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
#endif

/* Causal attention of the tile: for query head h of token t (position pos0 + t), softmax(q·k /
 * sqrt(d)) over positions 0..pos0+t, then the weighted sum of values; the same arithmetic, in
 * the same order, as forward()'s attention of one position, except that the q·k dot products
 * run in SIMD lanes on AVX2 CPUs (the prompt's attention is quadratic in its length). OpenMP
 * over (head, token) pairs, each thread with its own row of scores. */
static void attention_tile(const DittoConfig *c, const RunState *s, Prefill *p, int layer,
                           int n, int pos0) {
    int d = (int)c->head_dim, kv_dim = (int)(c->n_kv_heads * c->head_dim);
    int n_heads = (int)c->n_heads, q_dim = n_heads * d;
    int group = (int)(c->n_heads / c->n_kv_heads);
    size_t layer_off = (size_t)layer * s->ctx * kv_dim;
    float inv_sqrt_d = 1.0f / sqrtf((float)d);
    float (*dot)(const float *, const float *, int) = dot_scalar;
#ifdef HAVE_DOT_AVX2
    if (gemm_avx2_supported()) dot = dot_avx2;
#endif
    int ht;
#pragma omp parallel for schedule(static) private(ht)
    for (ht = 0; ht < n_heads * n; ht++) {
        int h = ht % n_heads, t = ht / n_heads, pos = pos0 + t;
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        const float *q = p->q + (size_t)t * q_dim + h * d;
        float *att = p->att + (size_t)tid * s->ctx;
        int kvh = h / group;
        float max = -INFINITY;
        for (int u = 0; u <= pos; u++) {
            const float *k = s->key_cache + layer_off + (size_t)u * kv_dim + kvh * d;
            att[u] = dot(q, k, d) * inv_sqrt_d;
            if (att[u] > max) max = att[u];
        }
        float sum = 0.0f;
        for (int u = 0; u <= pos; u++) {
            att[u] = expf(att[u] - max);
            sum += att[u];
        }
        float *out = p->att_out + (size_t)t * q_dim + h * d;
        for (int i = 0; i < d; i++) out[i] = 0.0f;
        for (int u = 0; u <= pos; u++) {
            const float *v = s->value_cache + layer_off + (size_t)u * kv_dim + kvh * d;
            float a = att[u] / sum;
            for (int i = 0; i < d; i++) out[i] += a * v[i];
        }
    }
}

float *prefill(const Model *m, RunState *s, Prefill *p, const int32_t *tokens, int n, int pos0,
               int mode) {
    const DittoConfig *c = &m->config;
    int dim = (int)c->dim, hidden = (int)c->hidden_dim, d = (int)c->head_dim;
    int kv_dim = (int)(c->n_kv_heads * c->head_dim), q_dim = (int)c->n_heads * d;
    int half = d / 2;
    size_t ndim = (size_t)n * dim;

    for (int t = 0; t < n; t++) /* embedding lookup */
        tensor_row(p->x + (size_t)t * dim, m->token_embd, (uint64_t)tokens[t]);

    for (int l = 0; l < (int)c->n_layers; l++) {
        const LayerWeights *w = &m->layers[l];
        size_t kv_off = ((size_t)l * s->ctx + pos0) * kv_dim;
        float *k = s->key_cache + kv_off, *v = s->value_cache + kv_off; /* [n][kv_dim] */

        /* attention block */
        for (int t = 0; t < n; t++)
            rmsnorm(p->xb + (size_t)t * dim, p->x + (size_t)t * dim, f32_data(w->attn_norm),
                    dim, c->norm_eps);
        matmul_batch(p->q, p->xb, n, w->wq);
        matmul_batch(k, p->xb, n, w->wk);
        matmul_batch(v, p->xb, n, w->wv);
        for (int t = 0; t < n; t++) {
            const float *cos_t = s->rope_cos + (size_t)(pos0 + t) * half;
            const float *sin_t = s->rope_sin + (size_t)(pos0 + t) * half;
            rope(p->q + (size_t)t * q_dim, (int)c->n_heads, d, cos_t, sin_t);
            rope(k + (size_t)t * kv_dim, (int)c->n_kv_heads, d, cos_t, sin_t);
        }
        attention_tile(c, s, p, l, n, pos0);
        matmul_batch(p->xb2, p->att_out, n, w->wo);
        for (size_t i = 0; i < ndim; i++) p->x[i] += p->xb2[i];

        /* SwiGLU feed-forward block */
        for (int t = 0; t < n; t++)
            rmsnorm(p->xb + (size_t)t * dim, p->x + (size_t)t * dim, f32_data(w->ffn_norm), dim,
                    c->norm_eps);
        matmul_batch(p->hb, p->xb, n, w->w_gate);
        matmul_batch(p->hb2, p->xb, n, w->w_up);
        size_t nh = (size_t)n * hidden;
        for (size_t i = 0; i < nh; i++) {
            float g = p->hb[i];
            p->hb[i] = g / (1.0f + expf(-g)) * p->hb2[i]; /* silu(gate) * up */
        }
        matmul_batch(p->xb2, p->hb, n, w->w_down);
        for (size_t i = 0; i < ndim; i++) p->x[i] += p->xb2[i];
    }

    size_t vocab = c->vocab_size;
    float *last = p->logits + (size_t)(n - 1) * vocab;
    if (mode == PREFILL_ALL_LOGITS) {
        for (int t = 0; t < n; t++)
            rmsnorm(p->x + (size_t)t * dim, p->x + (size_t)t * dim, f32_data(m->output_norm),
                    dim, c->norm_eps);
        matmul_batch(p->logits, p->x, n, m->output); /* tied: token_embd */
    } else if (mode == PREFILL_LAST_LOGITS) {
        float *x = p->x + (size_t)(n - 1) * dim;
        rmsnorm(x, x, f32_data(m->output_norm), dim, c->norm_eps);
        gemv(last, x, m->output);
    }
    return last;
}
