/* prefill.c: forward pass over a tile of tokens (see prefill.h). */
#include "prefill.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attention.h"
#include "../kernels/matmul.h"

static int max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

size_t prefill_bytes(const DittoConfig *c, int tile, int ctx, int n_threads) {
    size_t q_dim = (size_t)c->n_heads * c->head_dim;
    size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    size_t per_token = 3 * (size_t)c->dim + 2 * q_dim + 2 * kv_dim + 2 * (size_t)c->hidden_dim +
                       c->vocab_size;
    size_t group = c->n_heads / c->n_kv_heads;
    return ((size_t)tile * per_token + (size_t)n_threads * PREFILL_ATT_TOKENS * group * ctx) *
           sizeof(float);
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
    p->k = calloc(T * c->n_kv_heads * c->head_dim, sizeof(float));
    p->v = calloc(T * c->n_kv_heads * c->head_dim, sizeof(float));
    p->att_out = calloc(T * q_dim, sizeof(float));
    p->hb = calloc(T * c->hidden_dim, sizeof(float));
    p->hb2 = calloc(T * c->hidden_dim, sizeof(float));
    p->att = calloc((size_t)p->n_threads * PREFILL_ATT_TOKENS * (c->n_heads / c->n_kv_heads) *
                        ctx, sizeof(float));
    p->logits = calloc(T * c->vocab_size, sizeof(float));
    if (!p->x || !p->xb || !p->xb2 || !p->q || !p->k || !p->v || !p->att_out || !p->hb ||
        !p->hb2 || !p->att || !p->logits) {
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
    free(p->k);
    free(p->v);
    free(p->att_out);
    free(p->hb);
    free(p->hb2);
    free(p->att);
    free(p->logits);
    memset(p, 0, sizeof *p);
}

static const float *f32_data(const Tensor *t) { return (const float *)(const void *)t->data; }

/* Causal attention of the tile: for query head h of token t (position pos0 + t), softmax(q·k /
 * sqrt(d)) over positions 0..pos0+t, then the weighted sum of values (attention.h, the same
 * bits as forward() gives for one position). The tokens go in blocks of PREFILL_ATT_TOKENS and
 * the keys in blocks of PREFILL_ATT_KEYS: every token of a block takes its scores, then its
 * weighted sums, from one block of keys (or values) while it is in L2, instead of each token
 * streaming the whole KV cache of the layer again (at 2,000 positions, 1.3 MB per KV head of
 * Qwen2.5-Coder-0.5B per token). OpenMP over (KV head, token block) pairs, each the group of
 * query heads sharing that KV head, each thread with its own rows of scores. */
static void attention_tile(const DittoConfig *c, const RunState *s, Prefill *p, int layer,
                           int n, int pos0) {
    int d = (int)c->head_dim;
    int n_kv = (int)c->n_kv_heads, q_dim = (int)c->n_heads * d;
    int group = (int)(c->n_heads / c->n_kv_heads);
    size_t ld = (size_t)s->ctx;
    float inv_sqrt_d = 1.0f / sqrtf((float)d);
    const AttendSteps *A = attend_steps_for(d);
    int n_blocks = (n + PREFILL_ATT_TOKENS - 1) / PREFILL_ATT_TOKENS, gt;
    /* (KV head, token block) pairs dealt out one at a time: a token's cost grows with its
     * position, so contiguous runs would give the last thread the longest rows */
#pragma omp parallel for schedule(static, 1) private(gt)
    for (gt = 0; gt < n_kv * n_blocks; gt++) {
        int kvh = gt % n_kv, t0 = gt / n_kv * PREFILL_ATT_TOKENS, h0 = kvh * group;
        int t1 = t0 + PREFILL_ATT_TOKENS < n ? t0 + PREFILL_ATT_TOKENS : n;
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        const char *K = kv_head(s->key_cache, s->type_k, c, s->ctx, layer, kvh);
        const char *V = kv_head(s->value_cache, s->type_v, c, s->ctx, layer, kvh);
        const size_t kb = kv_elem_bytes(s->type_k), vb = kv_elem_bytes(s->type_v);
        float *att = p->att + (size_t)tid * PREFILL_ATT_TOKENS * group * ld;
        int last_keys = pos0 + t1; /* the block's last token sees the most keys */
        for (int k0 = 0; k0 < last_keys; k0 += PREFILL_ATT_KEYS)
            for (int t = t0; t < t1; t++) {
                int nk = pos0 + t + 1 - k0;
                if (nk <= 0) continue;
                attend_scores(A, s->type_k == KV_F16, att + (size_t)(t - t0) * group * ld + k0,
                              ld, p->q + (size_t)t * q_dim + h0 * d, (size_t)d, group,
                              K + (size_t)k0 * d * kb, (size_t)d,
                              nk < PREFILL_ATT_KEYS ? nk : PREFILL_ATT_KEYS, d, inv_sqrt_d);
            }
        for (int t = t0; t < t1; t++) {
            for (int j = 0; j < group; j++)
                A->softmax(att + ((size_t)(t - t0) * group + j) * ld, pos0 + t + 1);
            memset(p->att_out + (size_t)t * q_dim + h0 * d, 0,
                   (size_t)group * d * sizeof(float));
        }
        for (int k0 = 0; k0 < last_keys; k0 += PREFILL_ATT_KEYS)
            for (int t = t0; t < t1; t++) {
                int nk = pos0 + t + 1 - k0;
                if (nk <= 0) continue;
                attend_wsum_acc(A, s->type_v == KV_F16, p->att_out + (size_t)t * q_dim + h0 * d,
                                (size_t)d, group, V + (size_t)k0 * d * vb, (size_t)d,
                                nk < PREFILL_ATT_KEYS ? nk : PREFILL_ATT_KEYS,
                                att + (size_t)(t - t0) * group * ld + k0, ld, d);
            }
    }
}

float *prefill(const Model *m, RunState *s, Prefill *p, const int32_t *tokens, int n, int pos0,
               int mode) {
    const DittoConfig *c = &m->config;
    int dim = (int)c->dim, hidden = (int)c->hidden_dim, d = (int)c->head_dim;
    int kv_dim = (int)(c->n_kv_heads * c->head_dim), q_dim = (int)c->n_heads * d;
    int half = d / 2;
    SwigluFn swiglu = swiglu_for(); /* chosen before the parallel loops */

    int t; /* the per-token steps run over OpenMP threads (each token's work is independent) */
#pragma omp parallel for private(t)
    for (t = 0; t < n; t++) /* embedding lookup */
        tensor_row(p->x + (size_t)t * dim, m->token_embd, (uint64_t)tokens[t]);

    for (int l = 0; l < (int)c->n_layers; l++) {
        const LayerWeights *w = &m->layers[l];
        float *k = p->k, *v = p->v; /* [n][kv_dim] */

        /* attention block */
#pragma omp parallel for private(t)
        for (t = 0; t < n; t++)
            rmsnorm(p->xb + (size_t)t * dim, p->x + (size_t)t * dim, f32_data(w->attn_norm),
                    dim, c->norm_eps);
        {
            float *const Y[3] = {p->q, k, v};
            const Tensor *const W[3] = {w->wq, w->wk, w->wv};
            matmul_batch_multi(Y, p->xb, n, W, 3);
        }
#pragma omp parallel for private(t)
        for (t = 0; t < n; t++) {
            add_bias(p->q + (size_t)t * q_dim, w->bq); /* Qwen2: q/k/v biases, before RoPE */
            add_bias(k + (size_t)t * kv_dim, w->bk);
            add_bias(v + (size_t)t * kv_dim, w->bv);
            const float *cos_t = s->rope_cos + (size_t)(pos0 + t) * half;
            const float *sin_t = s->rope_sin + (size_t)(pos0 + t) * half;
            rope(p->q + (size_t)t * q_dim, (int)c->n_heads, d, cos_t, sin_t);
            rope(k + (size_t)t * kv_dim, (int)c->n_kv_heads, d, cos_t, sin_t);
            kv_store(c, s, l, pos0 + t, k + (size_t)t * kv_dim, v + (size_t)t * kv_dim);
        }
        attention_tile(c, s, p, l, n, pos0);
        matmul_batch(p->xb2, p->att_out, n, w->wo);

        /* residual, then the SwiGLU feed-forward block */
#pragma omp parallel for private(t)
        for (t = 0; t < n; t++) {
            float *x = p->x + (size_t)t * dim;
            const float *o = p->xb2 + (size_t)t * dim;
            for (int i = 0; i < dim; i++) x[i] += o[i];
            rmsnorm(p->xb + (size_t)t * dim, x, f32_data(w->ffn_norm), dim, c->norm_eps);
        }
        {
            float *const Y[2] = {p->hb, p->hb2};
            const Tensor *const W[2] = {w->w_gate, w->w_up};
            matmul_batch_multi(Y, p->xb, n, W, 2);
        }
#pragma omp parallel for private(t)
        for (t = 0; t < n; t++) {
            float *hb = p->hb + (size_t)t * hidden;
            const float *hb2 = p->hb2 + (size_t)t * hidden;
            swiglu(hb, hb2, hidden); /* silu(gate) * up */
        }
        matmul_batch(p->xb2, p->hb, n, w->w_down);
#pragma omp parallel for private(t)
        for (t = 0; t < n; t++) {
            float *x = p->x + (size_t)t * dim;
            const float *o = p->xb2 + (size_t)t * dim;
            for (int i = 0; i < dim; i++) x[i] += o[i];
        }
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
