/* forward.c: Llama / Qwen2 forward pass (see forward.h). */
#include "forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "attention.h"
#include "../kernels/kernels.h"
#include "../kernels/matmul.h"

static size_t kv_floats(const DittoConfig *c, int ctx) {
    return (size_t)c->n_layers * (size_t)ctx * c->n_kv_heads * c->head_dim;
}

int kv_type_parse(const char *name) {
    if (name && !strcmp(name, "f32")) return KV_F32;
    if (name && !strcmp(name, "f16")) return KV_F16;
    return -1;
}

size_t runstate_bytes(const DittoConfig *c, int ctx, int type_k, int type_v) {
    size_t q_dim = (size_t)c->n_heads * c->head_dim;
    size_t n = 3 * (size_t)c->dim + 2 * q_dim + 2 * (size_t)c->hidden_dim +
               (size_t)c->n_heads * ctx + c->vocab_size +
               2 * (size_t)c->n_kv_heads * c->head_dim +
               (size_t)ctx * c->head_dim; /* cos + sin tables */
    return n * sizeof(float) +
           kv_floats(c, ctx) * (kv_elem_bytes(type_k) + kv_elem_bytes(type_v));
}

int runstate_init(RunState *s, const DittoConfig *c, int ctx, int type_k, int type_v) {
    memset(s, 0, sizeof *s);
    size_t q_dim = (size_t)c->n_heads * c->head_dim, half = c->head_dim / 2;
    s->ctx = ctx;
    s->type_k = type_k;
    s->type_v = type_v;
    s->x = calloc(c->dim, sizeof(float));
    s->xb = calloc(c->dim, sizeof(float));
    s->xb2 = calloc(c->dim, sizeof(float));
    s->q = calloc(q_dim, sizeof(float));
    s->att_out = calloc(q_dim, sizeof(float));
    s->hb = calloc(c->hidden_dim, sizeof(float));
    s->hb2 = calloc(c->hidden_dim, sizeof(float));
    s->att = calloc((size_t)c->n_heads * ctx, sizeof(float));
    s->logits = calloc(c->vocab_size, sizeof(float));
    s->k = calloc((size_t)c->n_kv_heads * c->head_dim, sizeof(float));
    s->v = calloc((size_t)c->n_kv_heads * c->head_dim, sizeof(float));
    s->key_cache = calloc(kv_floats(c, ctx), kv_elem_bytes(type_k));
    s->value_cache = calloc(kv_floats(c, ctx), kv_elem_bytes(type_v));
    s->rope_cos = calloc((size_t)ctx * half, sizeof(float));
    s->rope_sin = calloc((size_t)ctx * half, sizeof(float));
    if (!s->x || !s->xb || !s->xb2 || !s->q || !s->att_out || !s->hb || !s->hb2 || !s->att ||
        !s->logits || !s->k || !s->v || !s->key_cache || !s->value_cache || !s->rope_cos ||
        !s->rope_sin) {
        runstate_free(s);
        return -1;
    }
    /* RoPE angles pos * theta^(-2j/d), computed in double (transformers' inv_freq formula) */
    for (int pos = 0; pos < ctx; pos++) {
        for (size_t j = 0; j < half; j++) {
            double inv_freq = 1.0 / pow((double)c->rope_theta, (double)(2 * j) / c->head_dim);
            double angle = pos * inv_freq;
            s->rope_cos[pos * half + j] = (float)cos(angle);
            s->rope_sin[pos * half + j] = (float)sin(angle);
        }
    }
    return 0;
}

void runstate_free(RunState *s) {
    free(s->x);
    free(s->xb);
    free(s->xb2);
    free(s->q);
    free(s->att_out);
    free(s->hb);
    free(s->hb2);
    free(s->att);
    free(s->logits);
    free(s->k);
    free(s->v);
    free(s->key_cache);
    free(s->value_cache);
    free(s->rope_cos);
    free(s->rope_sin);
    memset(s, 0, sizeof *s);
}

/* Σ x² in double over eight partial sums (element i into sum i % 8, then summed pairwise in
 * a fixed order): each (double)x·x is exact, and the fixed order lets the compiler keep the
 * sums in vector registers without changing a bit, where one running sum would be a chain of
 * dependent adds (~4 cycles per element). */
void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += (double)x[i + l] * x[i + l];
    for (; i < n; i++) s[i % 8] += (double)x[i] * x[i];
    double ss = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) y[i] = w[i] * (x[i] * scale);
}

static void swiglu_scalar(float *g, const float *up, int n) {
    for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * up[i];
}

#if defined(__x86_64__) || defined(__i386__)
#include "simd_exp.h"

/* The same formula, one rounding per step as the scalar form, e^x from exp8; a last partial
 * group of eight through a padded copy. */
AVX2_FMA_FN static void swiglu_avx2(float *g, const float *up, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 d = _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, x)));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, d), _mm256_loadu_ps(up + i)));
    }
    if (i < n) {
        float gt[8] = {0}, ut[8] = {0};
        for (int j = i; j < n; j++) gt[j - i] = g[j], ut[j - i] = up[j];
        swiglu_avx2(gt, ut, 8);
        for (int j = i; j < n; j++) g[j] = gt[j - i];
    }
}

/* swiglu_avx2 in sixteen lanes (exp16: the same bits), the last partial group through it. */
AVX512_FN static void swiglu_avx512(float *g, const float *up, int n) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 d = _mm512_add_ps(one, exp16(_mm512_sub_ps(zero, x)));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(x, d), _mm512_loadu_ps(up + i)));
    }
    if (i < n) swiglu_avx2(g + i, up + i, n - i);
}
#endif

/* The vector width follows the kernel table: sixteen lanes only under an AVX-512 table, so
 * DITTO_KERNEL=avx2 runs the whole decode step as an AVX2-only CPU would. */
SwigluFn swiglu_for(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (strncmp(kernels_active()->name, "avx512", 6) == 0 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("fma"))
        return swiglu_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return swiglu_avx2;
#endif
    return swiglu_scalar;
}

void rope(float *v, int n_heads, int d, const float *cos_t, const float *sin_t) {
    int half = d / 2;
    for (int h = 0; h < n_heads; h++) {
        float *hv = v + h * d;
        for (int j = 0; j < half; j++) {
            float x0 = hv[j], x1 = hv[j + half];
            hv[j] = x0 * cos_t[j] - x1 * sin_t[j];
            hv[j + half] = x1 * cos_t[j] + x0 * sin_t[j];
        }
    }
}

static const float *f32_data(const Tensor *t) { return (const float *)(const void *)t->data; }

void add_bias(float *y, const Tensor *b) {
    if (!b) return;
    const float *v = f32_data(b);
    for (int i = 0; i < (int)b->cols; i++) y[i] += v[i];
}

/* Causal attention of one position: for every query head, softmax(q·k / sqrt(d)) over
 * positions 0..pos, then the weighted sum of values (attention.h). The query heads are split
 * evenly over the threads in runs of consecutive heads, and each thread takes its run one KV
 * head at a time with the heads of the run that share it (attend_group: each key and value row
 * read once per group and thread; one query head at a time would read the layer's keys and
 * values n_heads / n_kv_heads times, which at 3,000 positions costs Qwen2.5-Coder-0.5B over a
 * quarter of its decode time). Splitting heads rather than KV heads keeps the threads evenly
 * loaded when the KV heads do not divide among them (SmolLM2's 3 on 2). A head's scores and
 * sums do not depend on which heads share its group, so every split gives the same bits. */
static void attention(const DittoConfig *c, RunState *s, int layer, int pos) {
    int d = (int)c->head_dim;
    int group = (int)(c->n_heads / c->n_kv_heads), n_heads = (int)c->n_heads;
    float inv_sqrt_d = 1.0f / sqrtf((float)d);
    const AttendSteps *steps = attend_steps_for(d);
#pragma omp parallel
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        const int h0 = (int)((long)n_heads * t / nt), h1 = (int)((long)n_heads * (t + 1) / nt);
        for (int h = h0; h < h1;) {
            const int kvh = h / group, end = (kvh + 1) * group < h1 ? (kvh + 1) * group : h1;
            attend_group_steps(steps, s->att_out + (size_t)h * d, s->q + (size_t)h * d,
                               (size_t)d, end - h,
                               kv_head(s->key_cache, s->type_k, c, s->ctx, layer, kvh),
                               s->type_k,
                               kv_head(s->value_cache, s->type_v, c, s->ctx, layer, kvh),
                               s->type_v, (size_t)d, pos + 1, d, inv_sqrt_d,
                               s->att + (size_t)h * s->ctx, (size_t)s->ctx);
            h = end;
        }
    }
}

/* dst[0..n) = src[0..n) in the cache's element type: float32 as it is, f16 rounded to nearest
 * even (the C conversion to _Float16: IEEE 754's rounding, F16C's vcvtps2ph with mode 0). */
static void kv_put(void *dst, int type, const float *src, size_t n) {
    if (type != KV_F16) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    _Float16 *h = dst;
    for (size_t i = 0; i < n; i++) h[i] = (_Float16)src[i];
}

void kv_store(const DittoConfig *c, RunState *s, int layer, int pos, const float *k,
              const float *v) {
    const size_t d = c->head_dim;
    for (int h = 0; h < (int)c->n_kv_heads; h++) {
        size_t at = kv_at(c, s->ctx, layer, h) + (size_t)pos * d;
        kv_put((char *)s->key_cache + at * kv_elem_bytes(s->type_k), s->type_k, k + h * d, d);
        kv_put((char *)s->value_cache + at * kv_elem_bytes(s->type_v), s->type_v, v + h * d, d);
    }
}

float *forward(const Model *m, RunState *s, int token, int pos) {
    const DittoConfig *c = &m->config;
    int dim = (int)c->dim, hidden = (int)c->hidden_dim, d = (int)c->head_dim;
    const float *cos_t = s->rope_cos + (size_t)pos * (d / 2);
    const float *sin_t = s->rope_sin + (size_t)pos * (d / 2);
    SwigluFn swiglu = swiglu_for();

    tensor_row(s->x, m->token_embd, (uint64_t)token); /* embedding lookup */

    for (int l = 0; l < (int)c->n_layers; l++) {
        const LayerWeights *w = &m->layers[l];
        float *k = s->k, *v = s->v;

        /* attention block */
        rmsnorm(s->xb, s->x, f32_data(w->attn_norm), dim, c->norm_eps);
        {
            float *const y[3] = {s->q, k, v};
            const Tensor *const W[3] = {w->wq, w->wk, w->wv};
            gemv_multi(y, s->xb, W, 3);
        }
        add_bias(s->q, w->bq); /* Qwen2: q/k/v biases, before RoPE */
        add_bias(k, w->bk);
        add_bias(v, w->bv);
        rope(s->q, (int)c->n_heads, d, cos_t, sin_t);
        rope(k, (int)c->n_kv_heads, d, cos_t, sin_t);
        kv_store(c, s, l, pos, k, v);
        attention(c, s, l, pos);
        gemv(s->xb2, s->att_out, w->wo);
        for (int i = 0; i < dim; i++) s->x[i] += s->xb2[i];

        /* SwiGLU feed-forward block */
        rmsnorm(s->xb, s->x, f32_data(w->ffn_norm), dim, c->norm_eps);
        {
            float *const y[2] = {s->hb, s->hb2};
            const Tensor *const W[2] = {w->w_gate, w->w_up};
            gemv_multi(y, s->xb, W, 2);
        }
        swiglu(s->hb, s->hb2, hidden); /* silu(gate) * up */
        gemv(s->xb2, s->hb, w->w_down);
        for (int i = 0; i < dim; i++) s->x[i] += s->xb2[i];
    }

    rmsnorm(s->x, s->x, f32_data(m->output_norm), dim, c->norm_eps);
    gemv(s->logits, s->x, m->output); /* tied: token_embd, through the same kernels */
    return s->logits;
}
