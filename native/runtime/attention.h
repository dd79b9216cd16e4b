/* attention.h: causal attention of one query head over the KV cache (decode: forward.c;
 * batched prefill: prefill.c). */
#ifndef DITTO_ATTENTION_H
#define DITTO_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

/* One query head's attention: out[0..d) = sum over u < n_keys of softmax_u(scale * q·k_u) * v_u,
 * with k_u = K + u * stride and v_u = V + u * stride (float32 rows of the KV cache) and
 * att[0..n_keys) scratch. The softmax subtracts the largest score and divides each exp by the
 * sum (Vaswani et al. 2017, eq. 1). */
typedef void (*AttendFn)(float *out, const float *q, const float *K, const float *V,
                         size_t stride, int n_keys, int d, float scale, float *att);

/* The scalar form, loops in index order (any d; the reference of the tests). */
void attend_scalar(float *out, const float *q, const float *K, const float *V, size_t stride,
                   int n_keys, int d, float scale, float *att);

/* The form for head size d on this CPU, chosen once before a parallel loop: on AVX2 + FMA CPUs
 * with d % 8 == 0 and d <= 256, q·k four keys at a time and the weighted sum in SIMD lanes
 * (the same arithmetic up to float rounding); else attend_scalar. */
AttendFn attend_for(int d);

/* nq query heads that share one KV head (grouped-query attention) against the same n_keys keys:
 * out_j = out + j * qs, q_j = q + j * qs, scratch att + j * ld (ld >= n_keys). Each key and
 * value row is read once for the group. Query j's result has the same bits as attend() of
 * q_j alone (the same form for d): the grouping changes no sum. */
typedef void (*AttendGroupFn)(float *out, const float *q, size_t qs, int nq, const float *K,
                              const float *V, size_t stride, int n_keys, int d, float scale,
                              float *att, size_t ld);

void attend_group_scalar(float *out, const float *q, size_t qs, int nq, const float *K,
                         const float *V, size_t stride, int n_keys, int d, float scale,
                         float *att, size_t ld);

/* The group form for head size d on this CPU (the same choice as attend_for). */
AttendGroupFn attend_group_for(int d);

/* The three steps of that form, for a caller that goes through the keys block by block
 * (prefill.c: several tokens' queries against each block of keys while it is in cache):
 * scores: att[j * ld + u] = scale * q_j · k_u (q_j = q + j * qs) for j < nq, u < n_keys (each
 *   score on its own: a block of keys gives the scores of the whole pass);
 * softmax: att[0..n_keys) in place, of one query over all its keys;
 * wsum_acc: out_j += sum over u < n_keys of w[j * ld + u] * v_u, each output's sum in key
 *   order continued from out_j (blocks in key order from out_j = 0 give one pass's bits).
 * Run in that order they give attend_group's bits, and attend's for one query. */
typedef struct {
    void (*scores)(float *att, size_t ld, const float *q, size_t qs, int nq, const float *K,
                   size_t stride, int n_keys, int d, float scale);
    void (*softmax)(float *att, int n_keys);
    void (*wsum_acc)(float *out, size_t qs, int nq, const float *V, size_t stride, int n_keys,
                     const float *w, size_t ld, int d);
    /* scores and wsum_acc over IEEE f16 key (value) rows (an f16 KV cache): each element
     * widened to float32, then the float32 arithmetic, so the result has the bits of scores
     * (wsum_acc) on the widened rows */
    void (*scores_f16)(float *att, size_t ld, const float *q, size_t qs, int nq,
                       const uint16_t *K, size_t stride, int n_keys, int d, float scale);
    void (*wsum_acc_f16)(float *out, size_t qs, int nq, const uint16_t *V, size_t stride,
                         int n_keys, const float *w, size_t ld, int d);
} AttendSteps;

const AttendSteps *attend_steps_for(int d);

/* A's scores (A->scores_f16 when k_f16 is set: K holds f16 rows) and weighted sum
 * (A->wsum_acc_f16 when v_f16 is set), for callers whose KV cache type is known at run time. */
void attend_scores(const AttendSteps *A, int k_f16, float *att, size_t ld, const float *q,
                   size_t qs, int nq, const void *K, size_t stride, int n_keys, int d,
                   float scale);
void attend_wsum_acc(const AttendSteps *A, int v_f16, float *out, size_t qs, int nq,
                     const void *V, size_t stride, int n_keys, const float *w, size_t ld,
                     int d);

/* attend_group's result through the steps A: the keys K are float32 rows, or f16 rows when
 * k_f16 is set (the values V likewise with v_f16). With float32 keys and values it has the
 * bits of attend_group_for(d), whose steps A are. */
void attend_group_steps(const AttendSteps *A, float *out, const float *q, size_t qs, int nq,
                        const void *K, int k_f16, const void *V, int v_f16, size_t stride,
                        int n_keys, int d, float scale, float *att, size_t ld);

#endif
