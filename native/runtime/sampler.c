/* sampler.c: greedy, temperature and top-p sampling (see sampler.h). */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>

int sampler_init(Sampler *s, int vocab_size, float temperature, float topp, uint64_t seed) {
    s->vocab_size = vocab_size;
    s->temperature = temperature;
    s->topp = topp;
    s->rng = seed;
    s->candidates = malloc((size_t)vocab_size * sizeof(ProbIndex));
    return s->candidates ? 0 : -1;
}

void sampler_free(Sampler *s) {
    free(s->candidates);
    s->candidates = NULL;
}

/* SplitMix64 (Steele, Lea, Flood 2014): a counter passed through a 64-bit mixer. */
static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float sampler_random(Sampler *s) {
    return (float)(splitmix64(&s->rng) >> 40) / 16777216.0f; /* 24 random bits */
}

void softmax(float *x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] / sum);
}

void softmax_temperature(float *x, int n, float temperature) {
    float max = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > max) max = x[i]; /* NaN never compares greater: ignored */
    if (isinf(max) || isnan(max)) { /* a +inf logit, or nothing above -inf: the limit is */
        int hot = sample_argmax(x, n); /* one-hot on the (first) largest */
        for (int i = 0; i < n; i++) x[i] = i == hot ? 1.0f : 0.0f;
        return;
    }
    const double t = (double)temperature;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        /* (x - max) <= 0 is exact in double, so exp((x - max) / T) is in [0, 1] for every T > 0:
         * no overflow however small T is (the largest logit always gets exp(0) = 1) */
        double d = (double)x[i] - (double)max;
        double e = isnan(d) || d == -INFINITY ? 0.0 : exp(d / t);
        x[i] = (float)e;
        sum += e;
    }
    for (int i = 0; i < n; i++) x[i] = (float)((double)x[i] / sum);
}

/* The first index of the largest logit, comparing with ">" from logits[0] on: NaNs never win
 * (logits[0] = NaN gives 0). Two passes so that the compiler vectorises the first: the largest
 * non-NaN value in ARGMAX_LANES independent running maxima (one serial compare chain over the
 * 151,936 logits of Qwen2.5 costs ~0.5 ms a token), then the first index holding it. */
#define ARGMAX_LANES 16
int sample_argmax(const float *logits, int n) {
    if (n <= 0 || isnan(logits[0])) return 0;
    float lane[ARGMAX_LANES];
    for (int k = 0; k < ARGMAX_LANES; k++) lane[k] = logits[0];
    int i = 0;
    for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int k = 0; k < ARGMAX_LANES; k++)
            lane[k] = logits[i + k] > lane[k] ? logits[i + k] : lane[k];
    float max = logits[0];
    for (int k = 0; k < ARGMAX_LANES; k++) max = lane[k] > max ? lane[k] : max;
    for (; i < n; i++) max = logits[i] > max ? logits[i] : max;
    /* max is logits[0] or a larger non-NaN logit: it is found, and nothing before it is larger */
    int best = 0;
    while (!(logits[best] == max)) best++;
    return best;
}

/* Draw from the distribution probs[n] with the uniform number u. */
static int sample_multinomial(const float *probs, int n, float u) {
    double cdf = 0.0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        if (probs[i] <= 0.0f) continue;
        cdf += probs[i];
        last = i;
        if ((double)u < cdf) return i;
    }
    return last; /* u above the rounded total: the last token that can be drawn */
}

static int by_prob_desc(const void *a, const void *b) {
    const ProbIndex *x = a, *y = b;
    if (x->prob != y->prob) return x->prob > y->prob ? -1 : 1;
    return x->index - y->index;
}

/* Nucleus sampling: keep the smallest set of most likely tokens whose probability mass
 * exceeds topp, renormalise, draw with u. */
static int sample_topp(const float *probs, int n, float topp, ProbIndex *cand, float u) {
    /* tokens below (1 - topp) / (n - 1) can never be in the nucleus: skip them before sorting */
    const float cutoff = (1.0f - topp) / (float)(n > 1 ? n - 1 : 1);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (probs[i] >= cutoff) {
            cand[m].index = i;
            cand[m].prob = probs[i];
            m++;
        }
    }
    if (m == 0) return sample_argmax(probs, n); /* only with tiny vocabularies */
    qsort(cand, (size_t)m, sizeof(ProbIndex), by_prob_desc);
    float mass = 0.0f;
    int last = m - 1;
    for (int i = 0; i < m; i++) {
        mass += cand[i].prob;
        if (mass > topp) {
            last = i;
            break;
        }
    }
    double r = (double)u * mass, cdf = 0.0;
    for (int i = 0; i <= last; i++) {
        cdf += cand[i].prob;
        if (r < cdf) return cand[i].index;
    }
    return cand[last].index;
}

int sampler_sample(Sampler *s, float *logits) {
    if (s->temperature == 0.0f) return sample_argmax(logits, s->vocab_size);
    softmax_temperature(logits, s->vocab_size, s->temperature);
    float u = sampler_random(s);
    if (s->topp <= 0.0f || s->topp >= 1.0f) return sample_multinomial(logits, s->vocab_size, u);
    return sample_topp(logits, s->vocab_size, s->topp, s->candidates, u);
}
