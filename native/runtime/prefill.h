/* prefill.h: the Llama forward pass over a tile of consecutive tokens at once (batched
 * prefill of the prompt, and of the --score / --dump-logits input).
 *
 * Computes exactly what forward() computes for each token in turn (forward.h), but every
 * weight matrix is applied to the whole tile with one matmul_batch() (GEMM: each weight tile
 * is read and decoded once for all tokens), and attention runs over the tile with the causal
 * mask (token t of the tile at position pos0 + t sees positions 0..pos0 + t). The KV cache of
 * every tile position is filled, so decoding continues with forward() at pos0 + n.
 */
#ifndef DITTO_PREFILL_H
#define DITTO_PREFILL_H

#include "forward.h"

/* The blocks of the tile's attention (prefill.c attention_tile): tokens whose queries meet
 * each block of keys together, and keys per block (256 KiB of keys and values of one KV head
 * at head size 64: in L2 while the tokens pass). */
#define PREFILL_ATT_TOKENS 8
#define PREFILL_ATT_KEYS 512

/* Activations of one tile, allocated once; prefill() allocates nothing. */
typedef struct {
    int tile;           /* tokens per tile (1..MATMUL_BATCH_MAX) */
    int n_threads;      /* attention scratch rows (OpenMP threads at init) */
    float *x;           /* [tile][dim] residual streams */
    float *xb;          /* [tile][dim] normalised sub-layer inputs */
    float *xb2;         /* [tile][dim] sub-layer outputs */
    float *q;           /* [tile][n_heads*head_dim] queries */
    float *k;           /* [tile][n_kv_heads*head_dim] keys, then stored in the KV cache */
    float *v;           /* [tile][n_kv_heads*head_dim] values */
    float *att_out;     /* [tile][n_heads*head_dim] attention outputs before Wo */
    float *hb;          /* [tile][hidden_dim] gate, then silu(gate)*up */
    float *hb2;         /* [tile][hidden_dim] up */
    float *att;         /* [n_threads][PREFILL_ATT_TOKENS][n_heads / n_kv_heads][ctx] scores */
    float *logits;      /* [tile][vocab_size] */
} Prefill;

/* Allocate the buffers of tiles of `tile` tokens for a context of ctx positions.
 * Returns 0, or -1 when out of memory (p then holds nothing to free). */
int prefill_init(Prefill *p, const DittoConfig *c, int tile, int ctx);
void prefill_free(Prefill *p);

/* Bytes prefill_init() allocates. */
size_t prefill_bytes(const DittoConfig *c, int tile, int ctx, int n_threads);

/* Which logits prefill() computes. */
enum { PREFILL_NO_LOGITS = 0, PREFILL_LAST_LOGITS = 1, PREFILL_ALL_LOGITS = 2 };

/* Run tokens[0..n) (1 <= n <= p->tile, each < vocab_size) at positions pos0..pos0+n-1
 * (pos0 + n <= s->ctx), positions 0..pos0-1 having been run before. Fills the KV cache of
 * those positions. mode PREFILL_ALL_LOGITS computes the logits of every token into p->logits
 * ([n][vocab_size], row t = position pos0 + t); PREFILL_LAST_LOGITS only those of the last
 * token (row n - 1), skipping the classifier for the others; PREFILL_NO_LOGITS none (a tile
 * before the prompt's last). Returns row n - 1 of p->logits. */
float *prefill(const Model *m, RunState *s, Prefill *p, const int32_t *tokens, int n, int pos0,
               int mode);

#endif
