/* sampler.h: pick the next token from logits: greedy (temperature 0), temperature sampling,
 * and nucleus (top-p) sampling (Holtzman et al. 2020, "The Curious Case of Neural Text
 * Degeneration", section 3.1), with a seeded deterministic PRNG (SplitMix64).
 */
#ifndef DITTO_SAMPLER_H
#define DITTO_SAMPLER_H

#include <stdint.h>

typedef struct {
    float prob;
    int index;
} ProbIndex;

typedef struct {
    int vocab_size;
    float temperature; /* 0: greedy (argmax) */
    float topp;        /* in (0, 1): nucleus sampling; >= 1: sample from the full distribution */
    uint64_t rng;      /* SplitMix64 state */
    ProbIndex *candidates; /* [vocab_size] scratch for top-p, allocated once */
} Sampler;

/* Returns 0, or -1 when out of memory. */
int sampler_init(Sampler *s, int vocab_size, float temperature, float topp, uint64_t seed);
void sampler_free(Sampler *s);

/* Index of the largest logit (the first one on ties, like torch.argmax); NaNs never win, and
 * logits[0] = NaN gives 0. */
int sample_argmax(const float *logits, int n);

/* Next token id from logits [vocab_size] (modified in place: turned into probabilities). */
int sampler_sample(Sampler *s, float *logits);

/* Uniform float in [0, 1) from the sampler's PRNG. */
float sampler_random(Sampler *s);

/* In place: x[n] becomes softmax(x / temperature), temperature > 0 (+inf included), computed
 * as exp((x_i - max) / T) / sum in double, so that no T overflows: a T so small that x / T
 * would overflow gives its limit, one-hot on the largest logit (greedy); equal largest logits
 * share the mass. NaN logits get probability 0; a +inf logit (or none above -inf) gives
 * one-hot on the first largest. Always a valid distribution (finite, >= 0, sums to 1). */
void softmax_temperature(float *x, int n, float temperature);

/* In-place softmax of x[n] (max-subtracted). */
void softmax(float *x, int n);

#endif
