/* forward.h: the Llama forward pass for one token at a time, with a KV cache.
 *
 * Per layer (transformers' LlamaDecoderLayer): x += Wo·attn(RoPE(Wq·n), RoPE(Wk·n), Wv·n) with
 * n = RMSNorm(x); x += Wdown·(silu(Wgate·m) ⊙ Wup·m) with m = RMSNorm(x). Then logits =
 * Wcls·RMSNorm(x). Qwen2 (Qwen2DecoderLayer) adds the biases: RoPE(Wq·n + bq), RoPE(Wk·n +
 * bk), Wv·n + bv. RoPE is the rotate-half form (docs/FORMAT.md "Rotary layout"); attention is
 * grouped-query (query head h reads KV head h / (n_heads / n_kv_heads)).
 */
#ifndef DITTO_FORWARD_H
#define DITTO_FORWARD_H

#include "../model/model.h"

/* The element type of a KV cache (llama.cpp's --cache-type-k / --cache-type-v names "f32",
 * "f16"). f16 keys and values are the float32 ones rounded to nearest (even); attention
 * widens them back to float32, so it runs the float32 arithmetic on the rounded values. */
enum { KV_F32 = 0, KV_F16 = 1 };

/* The type named (exactly "f32" or "f16"), or -1. */
int kv_type_parse(const char *name);

/* The name of a type, and the bytes of one element of it. */
static inline const char *kv_type_name(int type) { return type == KV_F16 ? "f16" : "f32"; }
static inline size_t kv_elem_bytes(int type) { return type == KV_F16 ? 2u : 4u; }

/* Activations and KV cache, allocated once; forward() allocates nothing. */
typedef struct {
    int ctx;            /* positions the KV cache holds (<= config.max_seq_len) */
    float *x;           /* [dim] residual stream */
    float *xb;          /* [dim] normalised input of a sub-layer */
    float *xb2;         /* [dim] sub-layer output */
    float *q;           /* [n_heads*head_dim] queries */
    float *att_out;     /* [n_heads*head_dim] attention output before Wo */
    float *hb;          /* [hidden_dim] gate, then silu(gate)*up */
    float *hb2;         /* [hidden_dim] up */
    float *att;         /* [n_heads][ctx] attention scores */
    float *logits;      /* [vocab_size] */
    float *k;           /* [n_kv_heads*head_dim] this position's key, then stored in key_cache */
    float *v;           /* [n_kv_heads*head_dim] this position's value */
    /* [n_layers][n_kv_heads][ctx][head_dim]: each KV head's keys (values) one contiguous run,
     * so attention reads them as one sequential stream (kv_at); float32, or IEEE f16 (half
     * the bytes: KV_F16) per cache */
    void *key_cache;
    void *value_cache;
    int type_k, type_v; /* KV_F32 or KV_F16 */
    float *rope_cos;    /* [ctx][head_dim/2] cos(pos * theta^(-2j/head_dim)) */
    float *rope_sin;    /* [ctx][head_dim/2] */
} RunState;

/* The keys (or values) of KV head kvh in layer `layer`: [ctx][head_dim] at cache + the
 * returned offset, in elements (floats, or f16 halves: kv_head()). */
static inline size_t kv_at(const DittoConfig *c, int ctx, int layer, int kvh) {
    return (((size_t)layer * c->n_kv_heads + (size_t)kvh) * (size_t)ctx) * c->head_dim;
}

/* The keys (values) of KV head kvh in layer `layer` in a cache of element type `type`. */
static inline const void *kv_head(const void *cache, int type, const DittoConfig *c, int ctx,
                                  int layer, int kvh) {
    return (const char *)cache + kv_at(c, ctx, layer, kvh) * kv_elem_bytes(type);
}

/* Store the key and value of position pos ([n_kv_heads*head_dim] each) in layer `layer`'s
 * caches (kv_at). */
void kv_store(const DittoConfig *c, RunState *s, int layer, int pos, const float *k,
              const float *v);

/* Allocate the state for a context of ctx positions (1 <= ctx <= max_seq_len), its key and
 * value caches of element types type_k and type_v (KV_F32, KV_F16).
 * Returns 0, or -1 when out of memory (s then holds nothing to free). */
int runstate_init(RunState *s, const DittoConfig *c, int ctx, int type_k, int type_v);
void runstate_free(RunState *s);

/* Bytes runstate_init() allocates for ctx positions (KV cache included). */
size_t runstate_bytes(const DittoConfig *c, int ctx, int type_k, int type_v);

/* Run token (0 <= token < vocab_size) at position pos (0 <= pos < s->ctx), positions
 * 0..pos-1 having been run before. Returns s->logits, [vocab_size] float32. */
float *forward(const Model *m, RunState *s, int token, int pos);

/* y[i] += b[i] for i < b->cols (b an f32 vector: a Qwen2 q/k/v bias); nothing when b is
 * NULL (Llama). */
void add_bias(float *y, const Tensor *b);

/* y[n] = w[n] * x[n] / sqrt(mean(x^2) + eps) (RMSNorm, Zhang & Sennrich 2019); the mean of the
 * squares in double, summed in a fixed order (forward.c). */
void rmsnorm(float *y, const float *x, const float *w, int n, float eps);

/* g[i] = silu(g[i]) * up[i] = g[i] / (1 + e^-g[i]) * up[i] for i < n (SwiGLU, Shazeer 2020). */
typedef void (*SwigluFn)(float *g, const float *up, int n);

/* The form for this CPU, chosen once before a parallel loop: on AVX2 + FMA CPUs eight at a
 * time with exp8 (simd_exp.h, within 2 ulp of expf), else expf. Decode and prefill use the same
 * choice, so their results agree bit for bit. */
SwigluFn swiglu_for(void);

/* Rotate-half RoPE (Su et al. 2021, HF q/k order; FORMAT.md "Rotary layout") on n_heads heads
 * of size d stored back to back in v, with the position's tables cos_t/sin_t [d/2]. */
void rope(float *v, int n_heads, int d, const float *cos_t, const float *sin_t);

#endif
