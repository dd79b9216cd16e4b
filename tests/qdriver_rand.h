/* qdriver_rand.h: the random inputs of the integer kernel drivers (qgemv_driver.c,
 * qgemm_driver.c): an xorshift64* generator and random int8 codebook payloads. */
#ifndef DITTO_QDRIVER_RAND_H
#define DITTO_QDRIVER_RAND_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float rnd_float(void) { return (float)((double)rnd() / 4294967296.0 * 2.0 - 1.0); }

/* An int8 codebook payload (FORMAT.md) of rows x cols, b bits, group size G, allocated at its
 * exact size (so ASan sees any read past the end): random centroids in -127..127,
 * random f16 scales (exponent 1..29, sign +), fully random index bytes (the padding of a row's
 * last group included). NULL when out of memory. */
static uint8_t *random_i8cb_payload(int b, int G, int rows, int cols) {
    int S = (cols + G - 1) / G, k = 1 << b;
    size_t n_cb = (size_t)rows * (size_t)S;
    size_t cb_bytes = (n_cb * (size_t)k + 2 * n_cb + 63u) & ~(size_t)63u;
    size_t row_bytes = (size_t)((cols + 7) / 8) * (size_t)b;
    size_t nbytes = cb_bytes + (size_t)rows * row_bytes;
    uint8_t *p = malloc(nbytes);
    if (!p) return NULL;
    memset(p, 0, nbytes);
    for (size_t i = 0; i < n_cb * (size_t)k; i++)
        p[i] = (uint8_t)(int8_t)((int)(rnd() % 255) - 127);
    for (size_t i = 0; i < n_cb; i++) {
        uint16_t h = (uint16_t)(((1 + rnd() % 29) << 10) | (rnd() & 0x3ff));
        memcpy(p + n_cb * (size_t)k + 2 * i, &h, 2);
    }
    for (size_t i = cb_bytes; i < nbytes; i++) p[i] = (uint8_t)rnd();
    return p;
}

#endif
