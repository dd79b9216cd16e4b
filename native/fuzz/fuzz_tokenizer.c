/* fuzz_tokenizer.c: libFuzzer target for the tokenizer: building it from a tokenizer block,
 * encoding text with and without --special (and BOS), and decoding the ids back.
 *
 * Input: byte 0 = flags (bit 0 parse_special, bit 1 add_bos, bit 2 decode with show_special,
 * bit 3 the block comes from the input), then
 *   - bit 3 clear: the text, encoded with one of the real tokenizers loaded at start-up from
 *     the model files listed in $DITTO_FUZZ_MODELS (colon-separated; byte 1 picks one);
 *   - bit 3 set: u32 block length L, L bytes of tokenizer block (n_vocab = its n_tokens), the
 *     text.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/model.h"
#include "../tokenizer/tokenizer.h"

#define MAX_FIXED 4
static Tokenizer *fixed[MAX_FIXED];
static int n_fixed = 0;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *list = getenv("DITTO_FUZZ_MODELS");
    if (!list) return 0;
    char *copy = strdup(list);
    for (char *p = strtok(copy, ":"); p && n_fixed < MAX_FIXED; p = strtok(NULL, ":")) {
        static Model models[MAX_FIXED]; /* kept mapped for the whole run */
        char err[1024];
        Model *m = &models[n_fixed];
        if (model_open(m, p, MODEL_LOAD_AUTO, err, sizeof err) != 0) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", err);
            abort();
        }
        fixed[n_fixed] = tokenizer_new(m->tokenizer_block, m->tokenizer_block_len,
                                       m->config.vocab_size, err, sizeof err);
        if (!fixed[n_fixed]) {
            fprintf(stderr, "fuzz_tokenizer: %s: %s\n", p, err);
            abort();
        }
        n_fixed++;
    }
    free(copy);
    return 0;
}

static void encode_decode(const Tokenizer *t, const char *text, size_t len, uint8_t flags) {
    char err[512];
    size_t cap = len + 8;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    if (!ids) return;
    long n = tokenizer_encode(t, text, len, flags & 1, (flags >> 1) & 1, ids, cap, err,
                              sizeof err);
    if (n > (long)cap) abort(); /* at most one id per byte, plus BOS */
    size_t out_cap = tokenizer_max_decode_bytes(t) + 16;
    char *out = malloc(out_cap);
    if (out && n > 0) {
        TokenDecoder d;
        token_decoder_init(&d);
        for (long i = 0; i < n; i++) {
            size_t k = token_decode(t, &d, ids[i], (flags >> 2) & 1, out, out_cap);
            if (k > out_cap) abort();
        }
        if (token_decoder_flush(&d, out, out_cap) > out_cap) abort();
        /* every id of the vocabulary decodes within the bound too */
        token_decoder_init(&d);
        for (uint32_t id = 0; id < tokenizer_n_tokens(t) && id < 64; id++)
            if (token_decode(t, &d, (int32_t)id, 1, out, out_cap) > out_cap) abort();
    }
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    if (!(flags & 8)) {
        if (n_fixed == 0 || size < 2) return 0;
        const Tokenizer *t = fixed[data[1] % n_fixed];
        encode_decode(t, (const char *)data + 2, size - 2, flags);
        return 0;
    }
    if (size < 5) return 0;
    uint32_t blen;
    memcpy(&blen, data + 1, 4);
    if (blen > size - 5) return 0;
    const uint8_t *block = data + 5;
    uint32_t n_vocab = blen >= 12 ? (uint32_t)block[8] | (uint32_t)block[9] << 8 |
                                        (uint32_t)block[10] << 16 | (uint32_t)block[11] << 24
                                  : 1;
    if (n_vocab > (1u << 20)) return 0;
    /* the block is read at a 4-byte aligned address, as in a model file */
    uint8_t *copy = malloc(blen ? blen : 1);
    if (!copy) return 0;
    memcpy(copy, block, blen);
    char err[512];
    Tokenizer *t = tokenizer_new(copy, blen, n_vocab, err, sizeof err);
    if (t) {
        encode_decode(t, (const char *)data + 5 + blen, size - 5 - blen, flags);
        tokenizer_free(t);
    }
    free(copy);
    return 0;
}
