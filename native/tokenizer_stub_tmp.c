/* tokenizer_stub_tmp.c: TEMPORARY stand-in for tokenizer.c (engineer H4) so the runtime links.
 * Encodes byte by byte (no merges), decodes token text. Deleted when tokenizer.c lands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

struct Tokenizer {
    DittoTokenizerHeader h;
    const uint32_t *types, *offsets;
    const uint8_t *blob;
    int32_t byte_id[256];
};

static size_t pad4(size_t n) { return (n + 3u) & ~(size_t)3u; }

Tokenizer *tokenizer_new(const uint8_t *block, size_t block_len, uint32_t n_vocab, char *err,
                         size_t errlen) {
    if (block_len < sizeof(DittoTokenizerHeader)) {
        snprintf(err, errlen, "tokenizer block too short");
        return NULL;
    }
    Tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    memcpy(&t->h, block, sizeof t->h);
    size_t n = t->h.n_tokens, off = sizeof t->h;
    if (n != n_vocab || off + 8 * n + 4 > block_len) {
        snprintf(err, errlen, "tokenizer: n_tokens=%zu, vocab_size=%u", n, n_vocab);
        free(t);
        return NULL;
    }
    off += 4 * n; /* scores */
    t->types = (const uint32_t *)(const void *)(block + off);
    off += 4 * n;
    t->offsets = (const uint32_t *)(const void *)(block + off);
    off += 4 * (n + 1);
    t->blob = block + off;
    if (off + pad4(t->h.blob_bytes) > block_len || t->offsets[n] > t->h.blob_bytes) {
        snprintf(err, errlen, "tokenizer: blob out of range");
        free(t);
        return NULL;
    }
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = t->offsets[i], e = t->offsets[i + 1];
        if (a > e || e > t->h.blob_bytes) continue;
        if (t->h.kind == DITTO_TOK_BPE_BYTES && e - a == 1 && t->types[i] == DITTO_TT_NORMAL)
            t->byte_id[t->blob[a]] = (int32_t)i;
        if (t->h.kind == DITTO_TOK_SPM_BPE && e - a == 6 && t->types[i] == DITTO_TT_BYTE) {
            unsigned v;
            if (sscanf((const char *)t->blob + a, "<0x%2X>", &v) == 1) t->byte_id[v & 255] = (int32_t)i;
        }
    }
    return t;
}

void tokenizer_free(Tokenizer *t) { free(t); }

static int utf8_valid(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!n || i + n > len) return 0;
        for (size_t k = 1; k < n; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += n;
    }
    return 1;
}

long tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int parse_special,
                      int add_bos, int32_t *ids, size_t max_ids, char *err, size_t errlen) {
    if (!utf8_valid((const unsigned char *)text, len)) {
        snprintf(err, errlen, "prompt is not valid UTF-8");
        return -1;
    }
    size_t n = 0;
    if (add_bos && t->h.bos_id >= 0) {
        if (n < max_ids) ids[n] = t->h.bos_id;
        n++;
    }
    size_t i = 0;
    while (i < len) {
        int32_t id = -1;
        size_t step = 1;
        if (parse_special) {
            for (uint32_t k = 0; k < t->h.n_tokens && id < 0; k++) {
                if (t->types[k] != DITTO_TT_CONTROL && t->types[k] != DITTO_TT_USER_DEFINED) continue;
                size_t l = t->offsets[k + 1] - t->offsets[k];
                if (l && l <= len - i && !memcmp(text + i, t->blob + t->offsets[k], l)) {
                    id = (int32_t)k;
                    step = l;
                }
            }
        }
        if (id < 0) id = t->byte_id[(unsigned char)text[i]];
        if (id < 0) id = t->h.unk_id >= 0 ? t->h.unk_id : 0;
        if (n < max_ids) ids[n] = id;
        n++;
        i += step;
    }
    return (long)n;
}

void token_decoder_init(TokenDecoder *d) { memset(d, 0, sizeof *d); }

size_t token_decode(const Tokenizer *t, TokenDecoder *d, int32_t id, int show_special, char *out,
                    size_t cap) {
    (void)d;
    if (id < 0 || (uint32_t)id >= t->h.n_tokens) return 0;
    if (t->types[id] == DITTO_TT_CONTROL && !show_special) return 0;
    size_t a = t->offsets[id], l = t->offsets[id + 1] - a;
    if (l > cap) l = cap;
    memcpy(out, t->blob + a, l);
    return l;
}

size_t token_decoder_flush(TokenDecoder *d, char *out, size_t cap) {
    (void)d;
    (void)out;
    (void)cap;
    return 0;
}

int32_t tokenizer_bos(const Tokenizer *t) { return t->h.bos_id; }
int32_t tokenizer_eos(const Tokenizer *t) { return t->h.eos_id; }
uint32_t tokenizer_chat_format(const Tokenizer *t) { return t->h.chat_format; }
int32_t tokenizer_find(const Tokenizer *t, const char *text) {
    size_t l = strlen(text);
    for (uint32_t k = 0; k < t->h.n_tokens; k++)
        if (t->offsets[k + 1] - t->offsets[k] == l && !memcmp(t->blob + t->offsets[k], text, l))
            return (int32_t)k;
    return -1;
}
