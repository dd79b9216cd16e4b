/* tokenizer.c: text <-> token ids for the two tokenizer kinds of docs/FORMAT.md.
 *
 * Byte-level BPE (GPT-2, Radford et al. 2019; Sennrich et al. 2016 for BPE): the text is cut
 * into control-token matches and plain fragments; each fragment is split into words by the
 * GPT-2 pattern (a hand-written matcher below, no regex library), optionally after isolating
 * every \p{N} character (SmolLM2); each word starts as one symbol per byte and the adjacent
 * pair of lowest merge rank is merged until no pair has a rank.
 *
 * SentencePiece BPE (Kudo & Richardson 2018; as llama.cpp's SPM tokenizer): spaces become
 * U+2581, U+2581 is prepended if add_space_prefix, the text starts as one symbol per UTF-8
 * character and the adjacent pair whose concatenation is a vocabulary piece of highest score
 * (leftmost on ties) is merged until none is left; symbols without a piece fall back to their
 * <0xXX> byte tokens (or unk).
 *
 * Both merge loops use one binary heap of candidate pairs; a popped candidate is stale (and
 * skipped) when either side has changed since it was pushed, which the symbol lengths reveal
 * because symbols only ever grow. O(n log n) per word.
 */
#include "tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode/unicode_tables.h"

/* ---------------------------------------------------------------------------------------- */
/* small helpers                                                                             */
/* ---------------------------------------------------------------------------------------- */

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static float rd_f32(const uint8_t *p) {
    uint32_t u = rd_u32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static size_t pad4(size_t n) { return (n + 3u) & ~(size_t)3u; }

static uint64_t hash_bytes(const uint8_t *s, size_t n) { /* FNV-1a, 64 bit */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_pair(uint32_t a, uint32_t b) {
    uint64_t h = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* UTF-8: length of the sequence a lead byte starts (0 if b cannot start one), and whether byte
 * b may be continuation number k (1..3) after lead (RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF). */
static int utf8_need(uint8_t b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

static int utf8_cont_ok(uint8_t lead, int k, uint8_t b) {
    if (k == 1) {
        if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
        if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
        if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
        if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
    }
    return b >= 0x80 && b <= 0xBF;
}

/* Byte offset of the first invalid UTF-8 sequence in s[0..n), or n if it is all valid. */
static size_t utf8_invalid_at(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        int need = utf8_need(s[i]);
        if (need == 0 || i + (size_t)need > n) return i;
        for (int k = 1; k < need; k++)
            if (!utf8_cont_ok(s[i], k, s[i + k])) return i;
        i += (size_t)need;
    }
    return n;
}

/* Decode the (valid) UTF-8 character at s; stores its length in *len. */
static uint32_t utf8_decode(const uint8_t *s, int *len) {
    int n = utf8_need(s[0]);
    *len = n;
    if (n == 1) return s[0];
    uint32_t cp = s[0] & (0x7Fu >> n);
    for (int k = 1; k < n; k++) cp = cp << 6 | (s[k] & 0x3Fu);
    return cp;
}

/* UTF-8 bytes of code point cp (< 0x110000) into u; returns their number. */
static int utf8_encode(uint32_t cp, uint8_t u[4]) {
    if (cp < 0x80) {
        u[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        u[0] = (uint8_t)(0xC0 | cp >> 6);
        u[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        u[0] = (uint8_t)(0xE0 | cp >> 12);
        u[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        u[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    u[0] = (uint8_t)(0xF0 | cp >> 18);
    u[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    u[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    u[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

static int char_class(uint32_t cp) {
    if (cp < 0x80) { /* ASCII fast path, same answers as the table */
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return UC_LETTER;
        if (cp >= '0' && cp <= '9') return UC_NUMBER;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return UC_SPACE;
        return UC_OTHER;
    }
    return unicode_class(cp);
}

/* ---------------------------------------------------------------------------------------- */
/* the tokenizer                                                                             */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    uint32_t left, right; /* token ids */
    uint32_t rank;        /* position in the merge list */
    int32_t merged;       /* id of text(left) + text(right); -1 marks an empty slot */
} MergeSlot;

typedef struct {
    uint32_t op;           /* DITTO_TX_LOWERCASE / STRIP / REPLACE / PREPEND */
    uint32_t a, b;         /* Strip: left, right */
    const uint8_t *s1;     /* Replace pattern, Prepend text */
    size_t n1;
    const uint8_t *s2;     /* Replace content */
    size_t n2;
} NormOp;

typedef struct {
    int32_t id;
    uint32_t flags;        /* DITTO_ADDED_* */
    const uint8_t *text;   /* what is matched (normalized text for NORMALIZED tokens) */
    size_t len;
} AddedTok;

struct Tokenizer {
    uint32_t kind, pre, n_tokens, chat_format;
    int32_t bos_id, eos_id, unk_id;
    int add_space_prefix;
    float *scores;     /* [n_tokens] */
    uint32_t *types;   /* [n_tokens] */
    uint32_t *offsets; /* [n_tokens + 1] into blob */
    uint8_t *blob;
    int32_t *vocab;    /* open-addressing hash: token text -> id, -1 empty */
    size_t vocab_mask;
    MergeSlot *merges; /* open-addressing hash: (left, right) -> rank, merged id */
    size_t merge_mask;
    int32_t byte_id[256]; /* bpe: token of one raw byte; spm: the <0xXX> token; -1 none
                             (SmolLM2 has no token for 21 bytes, e.g. 0x04 and 0xC0) */
    uint32_t flags;       /* DITTO_TOKF_* */
    uint8_t *ext;         /* copy of the extension section (records point into it) */
    NormOp *norm;         /* normalizer, in order */
    size_t n_norm;
    AddedTok *added;      /* added tokens matched in text, longest text first */
    size_t n_added;
    uint8_t added_first[2][256]; /* [normalized][b]: some added token's text starts with b */
    const uint8_t *chat_prefix, *chat_suffix;
    size_t chat_prefix_len, chat_suffix_len;
    int has_chat;
    int32_t rank_byte_id[256]; /* RANK_MERGES: the token whose text is "<0xXX>", -1 none */
    int has_norm_added;   /* some added token is matched in the normalized text */
    size_t max_token_bytes;
    uint8_t *eog;         /* [n_tokens]: 1 for an end-of-generation token (EOG records); NULL
                             without records: the EOS id alone ends generation */
    int32_t fim[DITTO_FIM_ROLES]; /* FIM token of each DITTO_FIM_* role, -1 none */
};

static const uint8_t *tok_text(const Tokenizer *t, int32_t id, size_t *len) {
    *len = t->offsets[id + 1] - t->offsets[id];
    return t->blob + t->offsets[id];
}

static int32_t vocab_find(const Tokenizer *t, const uint8_t *s, size_t n) {
    for (size_t i = hash_bytes(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        int32_t id = t->vocab[i];
        if (id < 0) return -1;
        size_t len;
        const uint8_t *txt = tok_text(t, id, &len);
        if (len == n && memcmp(txt, s, n) == 0) return id;
    }
}

static const MergeSlot *merge_find(const Tokenizer *t, int32_t left, int32_t right) {
    if (!t->merges) return NULL;
    for (size_t i = hash_pair((uint32_t)left, (uint32_t)right) & t->merge_mask;;
         i = (i + 1) & t->merge_mask) {
        const MergeSlot *m = &t->merges[i];
        if (m->merged < 0) return NULL;
        if (m->left == (uint32_t)left && m->right == (uint32_t)right) return m;
    }
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    free(t->scores);
    free(t->types);
    free(t->offsets);
    free(t->blob);
    free(t->vocab);
    free(t->merges);
    free(t->ext);
    free(t->norm);
    free(t->added);
    free(t->eog);
    free(t);
}

static int cmp_added(const void *a, const void *b) {
    const AddedTok *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1; /* longest first */
    return (x->id > y->id) - (x->id < y->id);
}

/* Parse the byte hex digits of a "<0xXX>" piece; -1 if text is not of that form. */
static int parse_byte_piece(const uint8_t *s, size_t n) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        int c = s[k], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Read the extension section (FORMAT.md "Tokenizer extension"): normalizer records, added
 * tokens, chat template text, end-of-generation and FIM tokens. Returns 0, or -1 with a message
 * for a malformed record. */
static int load_ext(Tokenizer *t, const uint8_t *p, size_t nbytes, char *err, size_t errlen) {
    if (nbytes == 0) return 0;
    t->ext = malloc(nbytes);
    size_t max_rec = nbytes / 16 + 1;
    t->norm = malloc(sizeof(NormOp) * max_rec);
    t->added = malloc(sizeof(AddedTok) * max_rec);
    if (!t->ext || !t->norm || !t->added) {
        set_err(err, errlen, "tokenizer: out of memory");
        return -1;
    }
    memcpy(t->ext, p, nbytes);
    for (size_t pos = 0; pos < nbytes;) {
        if (nbytes - pos < 16) goto bad;
        const uint8_t *r = t->ext + pos;
        uint32_t tag = rd_u32(r), a = rd_u32(r + 4), b = rd_u32(r + 8), len = rd_u32(r + 12);
        if (len > nbytes - pos - 16 || pad4(len) > nbytes - pos - 16) goto bad;
        const uint8_t *pay = r + 16;
        if (tag >= DITTO_TX_LOWERCASE && tag <= DITTO_TX_NFKD) {
            NormOp op = {tag, a, b, pay, len, NULL, 0};
            if (tag == DITTO_TX_REPLACE) {
                if (a == 0 || a > len) goto bad;
                op.n1 = a;
                op.s2 = pay + a;
                op.n2 = len - a;
            }
            t->norm[t->n_norm++] = op;
        } else if (tag == DITTO_TX_ADDED) {
            if ((int32_t)a < 0 || a >= t->n_tokens || len == 0 || (b & ~0x1Fu) != 0) goto bad;
            t->added[t->n_added++] = (AddedTok){(int32_t)a, b, pay, len};
        } else if (tag == DITTO_TX_CHAT_PREFIX) {
            t->chat_prefix = pay;
            t->chat_prefix_len = len;
            t->has_chat = 1;
        } else if (tag == DITTO_TX_CHAT_SUFFIX) {
            t->chat_suffix = pay;
            t->chat_suffix_len = len;
            t->has_chat = 1;
        } else if (tag == DITTO_TX_EOG || tag == DITTO_TX_FIM) {
            /* no payload; a token id; EOG: b = 0, each id once; FIM: b = a role, each once */
            if (len != 0 || a >= t->n_tokens || (tag == DITTO_TX_EOG && b != 0) ||
                (tag == DITTO_TX_FIM && (b >= DITTO_FIM_ROLES || t->fim[b] >= 0))) {
                set_err(err, errlen, "tokenizer block: %s record at byte %zu: token %u, b = %u, "
                        "%u payload bytes (a token < %u, %s, no payload)",
                        tag == DITTO_TX_EOG ? "end-of-generation" : "FIM", pos, a, b, len,
                        t->n_tokens, tag == DITTO_TX_EOG ? "b = 0" : "each role 0..5 once");
                return -1;
            }
            if (tag == DITTO_TX_FIM) {
                t->fim[b] = (int32_t)a;
            } else {
                if (!t->eog && !(t->eog = calloc(t->n_tokens, 1))) {
                    set_err(err, errlen, "tokenizer: out of memory");
                    return -1;
                }
                if (t->eog[a]) {
                    set_err(err, errlen, "tokenizer block: end-of-generation token %u is listed "
                            "twice (record at byte %zu)", a, pos);
                    return -1;
                }
                t->eog[a] = 1;
            }
        } else {
            set_err(err, errlen, "tokenizer block: unknown extension record %u at byte %zu", tag,
                    pos);
            return -1;
        }
        if (utf8_invalid_at(pay, len) != len) {
            set_err(err, errlen, "tokenizer block: extension record %u at byte %zu is not UTF-8",
                    tag, pos);
            return -1;
        }
        pos += 16 + pad4(len);
    }
    return 0;
bad:
    set_err(err, errlen, "tokenizer block: malformed extension record (section of %zu bytes)",
            nbytes);
    return -1;
}

Tokenizer *tokenizer_new(const uint8_t *block, size_t block_len, uint32_t n_vocab, char *err,
                         size_t errlen) {
    const size_t H = sizeof(DittoTokenizerHeader);
    if (!block || block_len < H) {
        set_err(err, errlen, "tokenizer block: %zu bytes, the header alone needs %zu",
                block_len, H);
        return NULL;
    }
    uint32_t kind = rd_u32(block + 0), pre = rd_u32(block + 4), n = rd_u32(block + 8);
    uint32_t n_merges = rd_u32(block + 12);
    int32_t bos = (int32_t)rd_u32(block + 16), eos = (int32_t)rd_u32(block + 20);
    int32_t unk = (int32_t)rd_u32(block + 24), pad = (int32_t)rd_u32(block + 28);
    uint32_t add_bos = rd_u32(block + 32);
    uint32_t add_space_prefix = rd_u32(block + 36), chat = rd_u32(block + 40);
    uint32_t blob_bytes = rd_u32(block + 44), template_bytes = rd_u32(block + 48);
    uint32_t flags = rd_u32(block + 52), ext_bytes = rd_u32(block + 56);

    if (kind != DITTO_TOK_BPE_BYTES && kind != DITTO_TOK_SPM_BPE) {
        set_err(err, errlen, "tokenizer block: unknown kind %u", kind);
        return NULL;
    }
    if ((flags & ~DITTO_TOKF_ALL) != 0 || (ext_bytes & 3u) != 0) {
        set_err(err, errlen, "tokenizer block: unknown flags 0x%x or extension of %u bytes (not "
                "a multiple of 4)", flags, ext_bytes);
        return NULL;
    }
    if (pre > DITTO_PRE_QWEN2) {
        set_err(err, errlen, "tokenizer block: unknown pre-tokenizer %u", pre);
        return NULL;
    }
    if (n == 0 || n != n_vocab) {
        set_err(err, errlen, "tokenizer block: %u tokens but the config's vocab_size is %u", n,
                n_vocab);
        return NULL;
    }
    if (chat > DITTO_CHAT_CHATML) {
        set_err(err, errlen, "tokenizer block: unknown chat format %u", chat);
        return NULL;
    }
    if (add_bos > 1 || add_space_prefix > 1) {
        set_err(err, errlen, "tokenizer block: add_bos=%u and add_space_prefix=%u must be 0 or 1",
                add_bos, add_space_prefix);
        return NULL;
    }
    for (size_t k = 60; k < H; k++) {
        if (block[k] != 0) {
            set_err(err, errlen, "tokenizer block: reserved header bytes 60..63 must be zero");
            return NULL;
        }
    }
    int32_t ids[4] = {bos, eos, unk, pad};
    for (int k = 0; k < 4; k++) {
        if (ids[k] < -1 || ids[k] >= (int32_t)n) {
            set_err(err, errlen, "tokenizer block: special id %d outside [-1, %u)", ids[k], n);
            return NULL;
        }
    }
    /* section sizes in 64-bit arithmetic: no overflow for any u32 field values */
    uint64_t need = (uint64_t)H + 4ull * n + 4ull * n + 4ull * ((uint64_t)n + 1) +
                    pad4(blob_bytes) + 8ull * n_merges + pad4(template_bytes) + ext_bytes;
    if (need != block_len) {
        set_err(err, errlen, "tokenizer block: its sections take %llu bytes, the block has %zu",
                (unsigned long long)need, block_len);
        return NULL;
    }

    const uint8_t *tpl = block + need - ext_bytes - pad4(template_bytes);
    if (utf8_invalid_at(tpl, template_bytes) < template_bytes) {
        set_err(err, errlen, "tokenizer block: the chat template is not valid UTF-8");
        return NULL;
    }

    Tokenizer *t = calloc(1, sizeof *t);
    if (!t) goto oom;
    t->kind = kind;
    t->pre = pre;
    t->n_tokens = n;
    t->chat_format = chat;
    t->bos_id = bos;
    t->eos_id = eos;
    t->unk_id = unk;
    t->add_space_prefix = add_space_prefix != 0;
    t->flags = flags;
    for (uint32_t r = 0; r < DITTO_FIM_ROLES; r++) t->fim[r] = -1;
    t->scores = malloc(sizeof(float) * n);
    t->types = malloc(sizeof(uint32_t) * n);
    t->offsets = malloc(sizeof(uint32_t) * ((size_t)n + 1));
    t->blob = malloc(blob_bytes ? blob_bytes : 1);
    if (!t->scores || !t->types || !t->offsets || !t->blob) goto oom;

    const uint8_t *p = block + H;
    for (uint32_t i = 0; i < n; i++) t->scores[i] = rd_f32(p + 4 * (size_t)i);
    p += 4 * (size_t)n;
    for (uint32_t i = 0; i < n; i++) {
        t->types[i] = rd_u32(p + 4 * (size_t)i);
        if (t->types[i] < DITTO_TT_NORMAL || t->types[i] > DITTO_TT_BYTE) {
            set_err(err, errlen, "tokenizer block: token %u has unknown type %u", i,
                    t->types[i]);
            goto fail;
        }
    }
    p += 4 * (size_t)n;
    for (uint32_t i = 0; i <= n; i++) {
        t->offsets[i] = rd_u32(p + 4 * (size_t)i);
        if ((i == 0 && t->offsets[0] != 0) || (i > 0 && t->offsets[i] < t->offsets[i - 1]) ||
            t->offsets[i] > blob_bytes || (i == n && t->offsets[n] != blob_bytes)) {
            set_err(err, errlen, "tokenizer block: token offsets are not increasing within the "
                    "%u-byte text blob (at token %u)", blob_bytes, i);
            goto fail;
        }
        if (i > 0 && t->offsets[i] - t->offsets[i - 1] > t->max_token_bytes)
            t->max_token_bytes = t->offsets[i] - t->offsets[i - 1];
    }
    p += 4 * ((size_t)n + 1);
    memcpy(t->blob, p, blob_bytes);
    p += pad4(blob_bytes);

    /* vocabulary hash; on duplicate texts the lowest id wins */
    size_t cap = pow2_at_least(2 * (size_t)n);
    t->vocab = malloc(sizeof(int32_t) * cap);
    if (!t->vocab) goto oom;
    memset(t->vocab, 0xFF, sizeof(int32_t) * cap);
    t->vocab_mask = cap - 1;
    for (uint32_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t *s = tok_text(t, (int32_t)i, &len);
        if (vocab_find(t, s, len) >= 0) continue;
        size_t h = hash_bytes(s, len) & t->vocab_mask;
        while (t->vocab[h] >= 0) h = (h + 1) & t->vocab_mask;
        t->vocab[h] = (int32_t)i;
    }

    /* merges hash (byte-level BPE); a repeated pair keeps its first (lowest) rank */
    if (n_merges > 0) {
        size_t mcap = pow2_at_least(2 * (size_t)n_merges);
        t->merges = malloc(sizeof(MergeSlot) * mcap);
        if (!t->merges) goto oom;
        for (size_t i = 0; i < mcap; i++) t->merges[i].merged = -1;
        t->merge_mask = mcap - 1;
        uint8_t *buf = malloc(2 * t->max_token_bytes + 1);
        if (!buf) goto oom;
        for (uint32_t r = 0; r < n_merges; r++) {
            uint32_t l = rd_u32(p + 8 * (size_t)r), rt = rd_u32(p + 8 * (size_t)r + 4);
            if (l >= n || rt >= n) {
                set_err(err, errlen, "tokenizer block: merge %u refers to token %u >= %u", r,
                        l >= n ? l : rt, n);
                free(buf);
                goto fail;
            }
            size_t la, lb;
            const uint8_t *a = tok_text(t, (int32_t)l, &la), *b = tok_text(t, (int32_t)rt, &lb);
            memcpy(buf, a, la);
            memcpy(buf + la, b, lb);
            int32_t merged = vocab_find(t, buf, la + lb);
            if (merged < 0) {
                set_err(err, errlen, "tokenizer block: merge %u (%u, %u): no token has the "
                        "concatenated text", r, l, rt);
                free(buf);
                goto fail;
            }
            if (merge_find(t, (int32_t)l, (int32_t)rt)) continue;
            size_t h = hash_pair(l, rt) & t->merge_mask;
            while (t->merges[h].merged >= 0) h = (h + 1) & t->merge_mask;
            t->merges[h] = (MergeSlot){l, rt, r, merged};
        }
        free(buf);
    }

    /* initial symbols: one per byte */
    for (int b = 0; b < 256; b++) {
        if (kind == DITTO_TOK_BPE_BYTES) {
            uint8_t c = (uint8_t)b;
            t->byte_id[b] = vocab_find(t, &c, 1);
        } else {
            t->byte_id[b] = -1;
        }
    }
    if (kind == DITTO_TOK_SPM_BPE) {
        for (uint32_t i = 0; i < n; i++) {
            if (t->types[i] != DITTO_TT_BYTE) continue;
            size_t len;
            const uint8_t *s = tok_text(t, (int32_t)i, &len);
            int v = parse_byte_piece(s, len);
            if (v < 0) {
                set_err(err, errlen, "tokenizer block: byte token %u is not of the form <0xXX>",
                        i);
                goto fail;
            }
            if (t->byte_id[v] < 0) t->byte_id[v] = (int32_t)i;
        }
    }

    if (kind == DITTO_TOK_SPM_BPE && (flags & DITTO_TOKF_RANK_MERGES)) {
        for (int b = 0; b < 256; b++) {
            char piece[8];
            snprintf(piece, sizeof piece, "<0x%02X>", b);
            t->rank_byte_id[b] = vocab_find(t, (const uint8_t *)piece, 6);
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len = t->offsets[i + 1] - t->offsets[i];
        int special = t->types[i] == DITTO_TT_CONTROL || t->types[i] == DITTO_TT_USER_DEFINED;
        if (special && utf8_invalid_at(t->blob + t->offsets[i], len) < len) {
            set_err(err, errlen, "tokenizer block: control/user-defined token %u is not valid "
                    "UTF-8 text", i);
            goto fail;
        }
    }

    p += 8 * (size_t)n_merges + pad4(template_bytes);
    if (load_ext(t, p, ext_bytes, err, errlen)) goto fail;
    if (!(flags & DITTO_TOKF_ADDED_RECORDS)) {
        /* GGUF semantics (llama.cpp): control and unknown tokens are matched with
         * parse_special, user-defined tokens always */
        if (t->n_added > 0) {
            set_err(err, errlen, "tokenizer block: added-token records without the "
                    "ADDED_RECORDS flag");
            goto fail;
        }
        free(t->added);
        t->added = malloc(sizeof(AddedTok) * n);
        if (!t->added) goto oom;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t ty = t->types[i];
            size_t len;
            const uint8_t *txt = tok_text(t, (int32_t)i, &len);
            if (len == 0 || (ty != DITTO_TT_CONTROL && ty != DITTO_TT_USER_DEFINED &&
                             ty != DITTO_TT_UNKNOWN))
                continue;
            t->added[t->n_added++] = (AddedTok){(int32_t)i,
                                                ty == DITTO_TT_USER_DEFINED ? 0u
                                                                            : DITTO_ADDED_SPECIAL,
                                                txt, len};
        }
    }
    qsort(t->added, t->n_added, sizeof(AddedTok), cmp_added);
    for (size_t k = 0; k < t->n_added; k++) {
        int nz = (t->added[k].flags & DITTO_ADDED_NORMALIZED) != 0;
        t->has_norm_added |= nz;
        t->added_first[nz][t->added[k].text[0]] = 1;
    }
    return t;

oom:
    set_err(err, errlen, "tokenizer: out of memory");
fail:
    tokenizer_free(t);
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* encoding                                                                                  */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    int32_t id;         /* token id of the symbol (-1: SentencePiece char without a piece) */
    int32_t prev, next; /* neighbours in the word, -1 at the ends */
    uint32_t start;     /* byte offset in the word */
    uint32_t len;       /* byte length; 0 once merged into its left neighbour */
} Symbol;

typedef struct {
    double key;       /* lower pops first: merge rank, or -score */
    int32_t left;     /* symbol index */
    int32_t right;    /* symbol index */
    uint32_t size;    /* len(left) + len(right) when pushed: detects stale candidates */
    int32_t merged;   /* id of the merged token */
} Candidate;

typedef struct {
    uint8_t *p;
    size_t n, cap;
} Buf;

typedef struct {
    size_t a, b;  /* byte range */
    int32_t id;   /* added token, or -1 for plain text */
} Seg;

typedef struct {
    Seg *v;
    size_t n, cap;
} Segs;

typedef struct { /* everything encode needs; arrays grow to the longest piece */
    int32_t *ids;
    size_t n_ids, cap_ids;
    size_t cap;     /* entries of syms, cps, offs (heap: 3x, buf: 3x bytes) */
    Buf norm, tmp;  /* normalizer output and scratch */
    Buf pre;        /* a piece with its prefix space / U+2581 escape */
    Segs segs1, segs2; /* added-token cuts of the text and of a normalized range */
    Symbol *syms;
    Candidate *heap;
    size_t n_heap;
    uint32_t *cps;  /* code points of a fragment */
    uint32_t *offs; /* byte offset of each code point, plus one past the end */
    uint8_t *buf;   /* SentencePiece: escaped fragment */
} Work;

static int push_id(Work *w, int32_t id) {
    if (w->n_ids == w->cap_ids) {
        size_t cap = w->cap_ids ? 2 * w->cap_ids : 64;
        int32_t *p = realloc(w->ids, sizeof(int32_t) * cap);
        if (!p) return -1;
        w->ids = p;
        w->cap_ids = cap;
    }
    w->ids[w->n_ids++] = id;
    return 0;
}

static int cand_less(const Candidate *a, const Candidate *b) {
    if (a->key != b->key) return a->key < b->key;
    return a->left < b->left; /* leftmost on ties */
}

static void heap_push(Work *w, Candidate c) {
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_less(&c, &w->heap[parent])) break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = c;
}

static Candidate heap_pop(Work *w) {
    Candidate top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!cand_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n > 0) w->heap[i] = last;
    return top;
}

/* Push the pair (left, right) of adjacent symbols if it can merge. */
static void try_pair(const Tokenizer *t, Work *w, const uint8_t *word, int32_t left,
                     int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol *a = &w->syms[left], *b = &w->syms[right];
    Candidate c = {0, left, right, a->len + b->len, -1};
    if (t->kind == DITTO_TOK_BPE_BYTES || (t->flags & DITTO_TOKF_RANK_MERGES)) {
        const MergeSlot *m = merge_find(t, a->id, b->id);
        if (!m) return;
        c.key = m->rank;
        c.merged = m->merged;
    } else {
        /* as sentencepiece's bpe_model.cc: only normal, user-defined and unused pieces are
         * merge results, never control, unknown or byte pieces */
        int32_t id = vocab_find(t, word + a->start, a->len + b->len);
        if (id < 0 || t->types[id] == DITTO_TT_CONTROL || t->types[id] == DITTO_TT_UNKNOWN ||
            t->types[id] == DITTO_TT_BYTE)
            return;
        c.key = -(double)t->scores[id];
        c.merged = id;
    }
    heap_push(w, c);
}

/* Merge the symbols of one word (already initialised in w->syms[0..n)) until no candidate is
 * left. */
static void merge_word(const Tokenizer *t, Work *w, const uint8_t *word, int32_t n) {
    w->n_heap = 0;
    for (int32_t i = 0; i + 1 < n; i++) try_pair(t, w, word, i, i + 1);
    while (w->n_heap > 0) {
        Candidate c = heap_pop(w);
        Symbol *a = &w->syms[c.left], *b = &w->syms[c.right];
        if (a->len == 0 || b->len == 0 || a->next != c.right || a->len + b->len != c.size)
            continue; /* stale: one side changed since the candidate was pushed */
        a->id = c.merged;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) w->syms[b->next].prev = c.left;
        try_pair(t, w, word, a->prev, c.left);
        try_pair(t, w, word, c.left, a->next);
    }
}

/* Byte-level BPE of one pre-tokenized word. A byte without a token (SmolLM2 has none for 21
 * bytes) is dropped before merging, so its neighbours may merge, as HF tokenizers' BPE does
 * (llama.cpp keeps it as an unmergeable symbol and drops it afterwards). */
static int bpe_word(const Tokenizer *t, Work *w, const uint8_t *word, size_t n) {
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[word[i]];
        if (id < 0) continue;
        w->syms[m] = (Symbol){id, m - 1, -1, (uint32_t)i, 1};
        if (m > 0) w->syms[m - 1].next = m;
        m++;
    }
    merge_word(t, w, word, m);
    for (int32_t i = 0; i >= 0 && m > 0; i = w->syms[i].next)
        if (push_id(w, w->syms[i].id)) return -1;
    return 0;
}

/* End (exclusive) of the GPT-2 pattern's match at code point i of cp[0..end):
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t gpt2_match(const uint32_t *cp, size_t i, size_t end) {
    if (cp[i] == '\'' && i + 1 < end) { /* contractions, lower case only as in GPT-2 */
        uint32_t a = cp[i + 1], b = i + 2 < end ? cp[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return i + 3;
    }
    size_t k = i;
    int cls = char_class(cp[i]);
    if (cp[i] == ' ' && i + 1 < end && char_class(cp[i + 1]) != UC_SPACE) {
        k = i + 1; /* the optional leading space of the three run alternatives */
        cls = char_class(cp[k]);
    }
    if (cls != UC_SPACE) { /* ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ */
        size_t j = k + 1;
        while (j < end && char_class(cp[j]) == cls) j++;
        return j;
    }
    size_t j = i + 1; /* whitespace run */
    while (j < end && char_class(cp[j]) == UC_SPACE) j++;
    if (j == end) return j;         /* \s+(?!\S) at the end */
    if (j - i >= 2) return j - 1;   /* \s+(?!\S): leave the last space to the next word */
    return j;                       /* \s+ */
}

static int is_cr_lf(uint32_t c) { return c == '\r' || c == '\n'; }

/* Simple case fold of the letters of Qwen2's contractions: ASCII capitals, and U+017F (long
 * s), which Oniguruma's (?i:'s) matches as HF tokenizers runs it. */
static uint32_t fold_contraction(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    return c == 0x17F ? 's' : c;
}

/* End (exclusive) of the Qwen2 pattern's match at code point i of cp[0..end) (Qwen2.5's
 * tokenizer.json Split regex, llama.cpp pre-tokenizer "qwen2"; Llama-3's with \p{N} alone):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+
 * The alternatives are tried in order (leftmost-first, as Oniguruma); every character matches
 * one of them, so the matches cover the fragment. */
static size_t qwen2_match(const uint32_t *cp, size_t i, size_t end) {
    if (cp[i] == '\'' && i + 1 < end) { /* contractions, any case */
        uint32_t a = fold_contraction(cp[i + 1]);
        uint32_t b = i + 2 < end ? fold_contraction(cp[i + 2]) : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return i + 3;
    }
    int c0 = char_class(cp[i]);
    /* [^\r\n\p{L}\p{N}]?\p{L}+ : a letter run, led by at most one character that is not a
     * letter, number, CR or LF (a space, a tab, a punctuation mark...) */
    size_t k = i;
    if (c0 != UC_LETTER && c0 != UC_NUMBER && !is_cr_lf(cp[i]) && i + 1 < end &&
        char_class(cp[i + 1]) == UC_LETTER)
        k = i + 1;
    if (char_class(cp[k]) == UC_LETTER) {
        size_t j = k + 1;
        while (j < end && char_class(cp[j]) == UC_LETTER) j++;
        return j;
    }
    if (c0 == UC_NUMBER) return i + 1; /* \p{N}: one digit at a time */
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* : a symbol run, an optional U+0020 before it, the line breaks
     * after it */
    k = cp[i] == ' ' && i + 1 < end && char_class(cp[i + 1]) == UC_OTHER ? i + 1 : i;
    if (char_class(cp[k]) == UC_OTHER) {
        size_t j = k + 1;
        while (j < end && char_class(cp[j]) == UC_OTHER) j++;
        while (j < end && is_cr_lf(cp[j])) j++;
        return j;
    }
    size_t j = i + 1; /* cp[i] is White_Space: the run [i, j) */
    while (j < end && char_class(cp[j]) == UC_SPACE) j++;
    for (size_t p = j; p > i; p--) /* \s*[\r\n]+ : up to the run's last CR or LF */
        if (is_cr_lf(cp[p - 1])) return p;
    if (j == end) return j;       /* \s+(?!\S) at the end */
    if (j - i >= 2) return j - 1; /* \s+(?!\S): leave the last space to the next word */
    return j;                     /* \s+ */
}

/* Split cp[a..b) by the model's pattern (GPT-2 or Qwen2) and BPE each word. frag: the
 * fragment's bytes. */
static int gpt2_words(const Tokenizer *t, Work *w, const uint8_t *frag, size_t a, size_t b) {
    for (size_t i = a; i < b;) {
        size_t j = t->pre == DITTO_PRE_QWEN2 ? qwen2_match(w->cps, i, b)
                                              : gpt2_match(w->cps, i, b);
        if (bpe_word(t, w, frag + w->offs[i], w->offs[j] - w->offs[i])) return -1;
        i = j;
    }
    return 0;
}

static int encode_bpe_fragment(const Tokenizer *t, Work *w, const uint8_t *frag, size_t len) {
    if (t->pre == DITTO_PRE_NONE) return bpe_word(t, w, frag, len);
    size_t n = 0;
    for (size_t i = 0; i < len; n++) {
        int l;
        w->offs[n] = (uint32_t)i;
        w->cps[n] = utf8_decode(frag + i, &l);
        i += (size_t)(l > 0 ? l : 1); /* fragments are valid UTF-8; never loop in place */
    }
    w->offs[n] = (uint32_t)len;
    if (t->pre == DITTO_PRE_GPT2 || t->pre == DITTO_PRE_QWEN2)
        return gpt2_words(t, w, frag, 0, n);
    /* gpt2_digits: every \p{N} character is a word of its own, the GPT-2 pattern splits the
     * runs between them (HF Digits(individual_digits=True) then ByteLevel) */
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        if (char_class(w->cps[i]) != UC_NUMBER) continue;
        if (gpt2_words(t, w, frag, run, i)) return -1;
        if (bpe_word(t, w, frag + w->offs[i], w->offs[i + 1] - w->offs[i])) return -1;
        run = i + 1;
    }
    return gpt2_words(t, w, frag, run, n);
}

static int encode_spm_fragment(const Tokenizer *t, Work *w, const uint8_t *frag, size_t len,
                               int prefix_space) {
    /* escape: ' ' -> U+2581 (E2 96 81), optionally prefixed */
    uint8_t *s = w->buf;
    size_t n = 0;
    for (size_t i = 0; i < len + (prefix_space ? 1 : 0); i++) {
        uint8_t c = prefix_space ? (i == 0 ? ' ' : frag[i - 1]) : frag[i];
        if (c == ' ') {
            s[n++] = 0xE2;
            s[n++] = 0x96;
            s[n++] = 0x81;
        } else {
            s[n++] = c;
        }
    }
    int32_t n_sym = 0;
    for (size_t i = 0; i < n; n_sym++) {
        int l = utf8_need(s[i]);
        if (l == 0 || i + (size_t)l > n) l = 1; /* fragments are valid UTF-8; stay in bounds */
        w->syms[n_sym] = (Symbol){-1, n_sym - 1, -1, (uint32_t)i, (uint32_t)l};
        if (n_sym > 0) w->syms[n_sym - 1].next = n_sym;
        i += (size_t)l;
    }
    merge_word(t, w, s, n_sym);
    for (int32_t i = 0; i >= 0 && n_sym > 0; i = w->syms[i].next) {
        const Symbol *y = &w->syms[i];
        int32_t id = vocab_find(t, s + y->start, y->len);
        if (id >= 0) {
            if (push_id(w, id)) return -1;
            continue;
        }
        for (uint32_t k = 0; k < y->len; k++) { /* byte fallback */
            int32_t b = t->byte_id[s[y->start + k]];
            if (b < 0) { /* no byte tokens: one unk for the character */
                if (t->unk_id >= 0 && push_id(w, t->unk_id)) return -1;
                break;
            }
            if (push_id(w, b)) return -1;
        }
    }
    return 0;
}

/* ---- growable buffers and per-piece capacity ---- */

static int buf_reserve(Buf *b, size_t need) {
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    uint8_t *q = realloc(b->p, cap);
    if (!q) return -1;
    b->p = q;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const uint8_t *s, size_t n) {
    if (buf_reserve(b, b->n + n + 1)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* Room in the symbol, heap, code-point and escape arrays for a piece of n bytes (plus a
 * prefix character). */
static int work_reserve(Work *w, size_t n) {
    size_t need = n + 4;
    if (need <= w->cap) return 0;
    Symbol *syms = realloc(w->syms, sizeof(Symbol) * need);
    if (syms) w->syms = syms;
    Candidate *heap = realloc(w->heap, sizeof(Candidate) * 3 * need); /* n-1 pairs + 2/merge */
    if (heap) w->heap = heap;
    uint32_t *cps = realloc(w->cps, sizeof(uint32_t) * need);
    if (cps) w->cps = cps;
    uint32_t *offs = realloc(w->offs, sizeof(uint32_t) * need);
    if (offs) w->offs = offs;
    uint8_t *buf = realloc(w->buf, 3 * need);
    if (buf) w->buf = buf;
    if (!syms || !heap || !cps || !offs || !buf) return -1;
    w->cap = need;
    return 0;
}

static int segs_push(Segs *g, size_t a, size_t b, int32_t id) {
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        Seg *p = realloc(g->v, sizeof(Seg) * cap);
        if (!p) return -1;
        g->v = p;
        g->cap = cap;
    }
    g->v[g->n++] = (Seg){a, b, id};
    return 0;
}

/* White_Space (Rust char::is_whitespace, regex \s) at s[0]; its byte length in *len. */
static int ws_at(const uint8_t *s, int *len) {
    return char_class(utf8_decode(s, len)) == UC_SPACE;
}

/* ---- added tokens (HF AddedVocabulary::find_matches; llama.cpp for GGUF files) ---- */

/* The longest added token of set `normalized` whose text starts s[i..) and ends by `end` on a
 * character boundary, or NULL. */
static const AddedTok *added_at(const Tokenizer *t, int normalized, const uint8_t *s, size_t i,
                                size_t end) {
    if (!t->added_first[normalized][s[i]]) return NULL;
    for (size_t k = 0; k < t->n_added; k++) {
        const AddedTok *a = &t->added[k];
        if (((a->flags & DITTO_ADDED_NORMALIZED) != 0) != normalized) continue;
        if (a->len <= end - i && a->text[0] == s[i] && memcmp(a->text, s + i, a->len) == 0 &&
            (i + a->len == end || utf8_need(s[i + a->len]) != 0))
            return a;
    }
    return NULL;
}

/* Cut s[0..n) into added-token matches (id >= 0) and plain ranges (id -1), leftmost first and
 * longest first at a position, as HF's Aho-Corasick LeftmostLongest search does. Special
 * tokens count only outside [lo, hi) (the user's text when special tokens are not parsed); a
 * special token found inside is plain text there, and no match crosses lo or hi. lstrip /
 * rstrip tokens take the White_Space next to them (never past the previous match). */
static int find_added(const Tokenizer *t, int normalized, const uint8_t *s, size_t n, size_t lo,
                      size_t hi, Segs *out) {
    out->n = 0;
    size_t start_offset = 0;
    for (size_t i = 0; i < n;) {
        size_t region_end = i < lo ? lo : i < hi ? hi : n;
        const AddedTok *m = added_at(t, normalized, s, i, region_end);
        if (!m) {
            i += (size_t)utf8_need(s[i]); /* >= 1: the text is valid UTF-8 */
            continue;
        }
        size_t start = i, stop = i + m->len;
        i = stop;
        if ((m->flags & DITTO_ADDED_SPECIAL) && start >= lo && start < hi) continue;
        if (m->flags & DITTO_ADDED_SINGLE_WORD) { /* no \w character right before or after */
            size_t p = start;
            int l;
            if (p > 0) {
                do p--; while (p > 0 && (s[p] & 0xC0) == 0x80);
                if (unicode_is_word(utf8_decode(s + p, &l))) continue;
            }
            if (stop < n && unicode_is_word(utf8_decode(s + stop, &l))) continue;
        }
        if (m->flags & DITTO_ADDED_LSTRIP) {
            while (start > start_offset) {
                size_t p = start - 1;
                while (p > start_offset && (s[p] & 0xC0) == 0x80) p--;
                int l;
                if (!ws_at(s + p, &l)) break;
                start = p;
            }
        }
        if (m->flags & DITTO_ADDED_RSTRIP) {
            int l;
            while (stop < n && ws_at(s + stop, &l)) stop += (size_t)l;
            i = stop;
        }
        if (start > start_offset && segs_push(out, start_offset, start, -1)) return -1;
        if (segs_push(out, start, stop, m->id)) return -1;
        start_offset = stop;
    }
    if (start_offset < n && segs_push(out, start_offset, n, -1)) return -1;
    return 0;
}

/* ---- normalizers (HF normalizers: Strip, Replace with a string pattern, Prepend) ---- */

/* Unicode normalization form `op` (DITTO_TX_NFC..NFKD) of the valid UTF-8 s[0..n), appended to
 * out: full decomposition (canonical, or compatibility for NFK*), canonical ordering of each
 * run of non-starters by combining class (stable), then for NFC/NFKC canonical composition
 * (Unicode UAX #15 / §3.11), with HF tokenizers' data (unicode_norm.c). */
static int unicode_form(uint32_t op, const uint8_t *s, size_t n, Buf *out) {
    int compat = op == DITTO_TX_NFKC || op == DITTO_TX_NFKD;
    int compose = op == DITTO_TX_NFC || op == DITTO_TX_NFKC;
    uint32_t *cp = malloc(sizeof(uint32_t) * (n * UNICODE_MAX_DECOMP + 1));
    if (!cp) return -1;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        int l;
        uint32_t c = utf8_decode(s + i, &l);
        m += (size_t)unicode_decompose(c, compat, cp + m);
        i += (size_t)l;
    }
    for (size_t i = 1; i < m; i++) { /* insertion sort inside runs of non-starters */
        int cc = unicode_ccc(cp[i]);
        if (cc == 0) continue;
        for (size_t j = i; j > 0; j--) {
            int pc = unicode_ccc(cp[j - 1]);
            if (pc == 0 || pc <= cc) break;
            uint32_t tmp = cp[j];
            cp[j] = cp[j - 1];
            cp[j - 1] = tmp;
        }
    }
    if (compose && m > 0) {
        size_t starter = 0, w = 1;
        int last = unicode_ccc(cp[0]) ? 256 : 0;
        for (size_t i = 1; i < m; i++) {
            int cc = unicode_ccc(cp[i]);
            uint32_t c = unicode_compose(cp[starter], cp[i]);
            if (c && (last < cc || last == 0)) {
                cp[starter] = c;
                continue;
            }
            if (cc == 0) starter = w;
            last = cc;
            cp[w++] = cp[i];
        }
        m = w;
    }
    int rc = 0;
    for (size_t i = 0; i < m && rc == 0; i++) {
        uint8_t u[4];
        int ul = utf8_encode(cp[i], u);
        rc = buf_put(out, u, (size_t)ul);
    }
    free(cp);
    return rc;
}

/* Apply the normalizer to s[0..n) into w->norm. *lead0 (in: the piece starts the text) is
 * cleared when the first character of the result no longer comes from offset 0 of the text
 * (HF offsets_original, which Metaspace prepend_scheme "first" reads). */
static int normalize(const Tokenizer *t, Work *w, const uint8_t *s, size_t n, int *lead0) {
    Buf *cur = &w->norm, *nxt = &w->tmp;
    cur->n = 0;
    if (buf_put(cur, s, n)) return -1;
    for (size_t k = 0; k < t->n_norm; k++) {
        const NormOp *op = &t->norm[k];
        nxt->n = 0;
        const uint8_t *c = cur->p;
        size_t cn = cur->n;
        if (op->op == DITTO_TX_STRIP) {
            size_t a = 0, b = cn;
            int l;
            while (op->a && a < b && ws_at(c + a, &l)) a += (size_t)l;
            while (op->b && b > a) {
                size_t p = b - 1;
                while (p > a && (c[p] & 0xC0) == 0x80) p--;
                if (!ws_at(c + p, &l)) break;
                b = p;
            }
            if (a > 0) *lead0 = 0;
            if (buf_put(nxt, c + a, b - a)) return -1;
        } else if (op->op == DITTO_TX_REPLACE) {
            for (size_t i = 0; i < cn;) {
                if (op->n1 <= cn - i && memcmp(c + i, op->s1, op->n1) == 0) {
                    /* HF aligns the replacement to the last replaced character, so
                     * the text no longer starts at offset 0 when the pattern is
                     * longer than one character (or the content is empty) */
                    if (i == 0 && (op->n2 == 0 || (size_t)utf8_need(op->s1[0]) < op->n1))
                        *lead0 = 0;
                    if (buf_put(nxt, op->s2, op->n2)) return -1;
                    i += op->n1;
                } else {
                    if (buf_put(nxt, c + i, 1)) return -1;
                    i++;
                }
            }
        } else if (op->op == DITTO_TX_PREPEND) {
            if (cn > 0 && (buf_put(nxt, op->s1, op->n1) || buf_put(nxt, c, cn))) return -1;
        } else if (op->op >= DITTO_TX_NFC) {
            if (unicode_form(op->op, c, cn, nxt)) return -1;
        } else { /* DITTO_TX_LOWERCASE: per character, Rust char::to_lowercase */
            for (size_t i = 0; i < cn;) {
                int l;
                uint32_t cp = utf8_decode(c + i, &l), low[3];
                int nl = unicode_lower(cp, low);
                for (int j = 0; j < nl; j++) {
                    uint8_t u[4];
                    int ul = utf8_encode(low[j], u);
                    if (buf_put(nxt, u, (size_t)ul)) return -1;
                }
                i += (size_t)l;
            }
        }
        Buf tmp = *cur;
        *cur = *nxt;
        *nxt = tmp;
    }
    if (cur != &w->norm) { /* keep the result in w->norm */
        Buf tmp = w->norm;
        w->norm = *cur;
        *cur = tmp;
    }
    return 0;
}

/* ---- the model on one pre-tokenized piece ---- */

/* HF BPE (models::bpe::BPE::merge_word) of one word of a SentencePiece-style tokenizer.json:
 * one symbol per character that is a token, else its <0xXX> byte tokens (byte_fallback), else
 * unk (consecutive unks fused with fuse_unk; a pending unk goes after byte symbols, as HF);
 * then merges by rank. */
static int rank_word(const Tokenizer *t, Work *w, const uint8_t *s, size_t n) {
    int32_t m = 0;
    size_t unk_start = 0, unk_len = 0;
#define ADD_SYM(ID, START, LEN)                                                               \
    do {                                                                                       \
        w->syms[m] = (Symbol){(ID), m - 1, -1, (uint32_t)(START), (uint32_t)(LEN)};           \
        if (m > 0) w->syms[m - 1].next = m;                                                    \
        m++;                                                                                   \
    } while (0)
    for (size_t i = 0; i < n;) {
        size_t l = (size_t)utf8_need(s[i]);
        int32_t id = vocab_find(t, s + i, l);
        if (id >= 0) {
            if (unk_len) ADD_SYM(t->unk_id, unk_start, unk_len);
            unk_len = 0;
            ADD_SYM(id, i, l);
        } else {
            int fallback = 1;
            for (size_t k = 0; k < l; k++) fallback &= t->rank_byte_id[s[i + k]] >= 0;
            if (fallback) {
                for (size_t k = 0; k < l; k++) ADD_SYM(t->rank_byte_id[s[i + k]], i + k, 1);
            } else if (t->unk_id >= 0) {
                if (unk_len && (t->flags & DITTO_TOKF_FUSE_UNK)) {
                    unk_len += l;
                } else {
                    if (unk_len) ADD_SYM(t->unk_id, unk_start, unk_len);
                    unk_start = i;
                    unk_len = l;
                }
            }
        }
        i += l;
    }
    if (unk_len) ADD_SYM(t->unk_id, unk_start, unk_len);
#undef ADD_SYM
    merge_word(t, w, s, m);
    for (int32_t i = 0; i >= 0 && m > 0; i = w->syms[i].next)
        if (push_id(w, w->syms[i].id)) return -1;
    return 0;
}

static const uint8_t METASPACE[3] = {0xE2, 0x96, 0x81}; /* U+2581 */

/* One piece between added tokens, after the normalizer: pre-tokenizer and model.
 * at_start: the piece starts at offset 0 of the text (Metaspace prepend_scheme "first"). */
static int encode_piece(const Tokenizer *t, Work *w, const uint8_t *s, size_t n, int at_start) {
    if (n == 0) return 0;
    if (t->kind == DITTO_TOK_BPE_BYTES) {
        if ((t->flags & DITTO_TOKF_PREFIX_SPACE) && s[0] != ' ') { /* HF ByteLevel */
            w->pre.n = 0;
            if (buf_put(&w->pre, (const uint8_t *)" ", 1) || buf_put(&w->pre, s, n)) return -1;
            s = w->pre.p;
            n = w->pre.n;
        }
        if (work_reserve(w, n)) return -1;
        return encode_bpe_fragment(t, w, s, n);
    }
    if (!(t->flags & DITTO_TOKF_RANK_MERGES)) {
        if (work_reserve(w, n + 1)) return -1;
        return encode_spm_fragment(t, w, s, n, t->add_space_prefix);
    }
    uint32_t ms = (t->flags & DITTO_TOKF_MS_MASK) >> DITTO_TOKF_MS_SHIFT;
    if (ms != DITTO_MS_NONE) { /* HF Metaspace: ' ' -> U+2581, then the prepend scheme */
        w->pre.n = 0;
        int starts = s[0] == ' ' || (n >= 3 && memcmp(s, METASPACE, 3) == 0);
        if (!starts && (ms == DITTO_MS_ALWAYS || (ms == DITTO_MS_FIRST && at_start)) &&
            buf_put(&w->pre, METASPACE, 3))
            return -1;
        for (size_t i = 0; i < n; i++)
            if (s[i] == ' ' ? buf_put(&w->pre, METASPACE, 3) : buf_put(&w->pre, s + i, 1))
                return -1;
        s = w->pre.p;
        n = w->pre.n;
    }
    if (work_reserve(w, n)) return -1;
    if (!(t->flags & DITTO_TOKF_MS_SPLIT)) return rank_word(t, w, s, n);
    size_t a = 0; /* split before every U+2581 (SplitDelimiterBehavior::MergedWithNext) */
    for (size_t i = 1; i + 3 <= n; i++) {
        if (memcmp(s + i, METASPACE, 3) != 0) continue;
        if (rank_word(t, w, s + a, i - a)) return -1;
        a = i;
    }
    return rank_word(t, w, s + a, n - a);
}

/* A plain range of the text (between added tokens matched in the raw text): normalizer, then
 * added tokens matched in the normalized text, then each piece. off: its offset in the text;
 * [lo, hi): the text where special tokens are not parsed. */
static int encode_plain(const Tokenizer *t, Work *w, const uint8_t *s, size_t n, size_t off,
                        size_t lo, size_t hi) {
    int lead0 = off == 0;
    size_t plo = 0, phi = 0;
    if (t->n_norm) {
        if (normalize(t, w, s, n, &lead0)) return -1;
        s = w->norm.p;
        n = w->norm.n;
        if (hi > lo) phi = n; /* offsets are not tracked through the normalizer */
    } else {
        plo = lo > off ? (lo - off < n ? lo - off : n) : 0;
        phi = hi > off ? (hi - off < n ? hi - off : n) : 0;
    }
    if (!t->has_norm_added) return encode_piece(t, w, s, n, lead0);
    if (find_added(t, 1, s, n, plo, phi, &w->segs2)) return -1;
    for (size_t k = 0; k < w->segs2.n; k++) {
        Seg g = w->segs2.v[k];
        int at0 = lead0 && g.a == 0;
        if (g.id >= 0 ? push_id(w, g.id) : encode_piece(t, w, s + g.a, g.b - g.a, at0))
            return -1;
    }
    return 0;
}

long tokenizer_encode_range(const Tokenizer *t, const char *text, size_t len, size_t lo,
                            size_t hi, int add_bos, int32_t *ids, size_t max_ids, char *err,
                            size_t errlen) {
    const uint8_t *s = (const uint8_t *)text;
    if (len > 0 && !text) {
        set_err(err, errlen, "tokenizer: NULL text");
        return -1;
    }
    if (len >= UINT32_MAX / 4) {
        set_err(err, errlen, "tokenizer: text of %zu bytes is too long", len);
        return -1;
    }
    if (lo > hi || hi > len) {
        set_err(err, errlen, "tokenizer: plain range [%zu, %zu) outside the text of %zu bytes",
                lo, hi, len);
        return -1;
    }
    size_t bad = utf8_invalid_at(s, len);
    if (bad < len) {
        set_err(err, errlen, "invalid UTF-8 in the text at byte offset %zu (byte 0x%02X)", bad,
                s[bad]);
        return -1;
    }
    Work w = {0};
    long result = -1;
    if (add_bos && t->bos_id >= 0 && push_id(&w, t->bos_id)) goto oom;
    if (find_added(t, 0, s, len, lo, hi, &w.segs1)) goto oom;
    for (size_t k = 0; k < w.segs1.n; k++) {
        Seg g = w.segs1.v[k];
        if (g.id >= 0 ? push_id(&w, g.id) : encode_plain(t, &w, s + g.a, g.b - g.a, g.a, lo, hi))
            goto oom;
    }
    for (size_t i = 0; i < w.n_ids && i < max_ids; i++) ids[i] = w.ids[i];
    result = (long)w.n_ids;
    goto done;
oom:
    set_err(err, errlen, "tokenizer: out of memory");
done:
    free(w.ids);
    free(w.syms);
    free(w.heap);
    free(w.cps);
    free(w.offs);
    free(w.buf);
    free(w.norm.p);
    free(w.tmp.p);
    free(w.pre.p);
    free(w.segs1.v);
    free(w.segs2.v);
    return result;
}

long tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int parse_special,
                      int add_bos, int32_t *ids, size_t max_ids, char *err, size_t errlen) {
    return tokenizer_encode_range(t, text, len, 0, parse_special ? 0 : len, add_bos, ids,
                                  max_ids, err, errlen);
}

/* ---------------------------------------------------------------------------------------- */
/* decoding                                                                                  */
/* ---------------------------------------------------------------------------------------- */

void token_decoder_init(TokenDecoder *d) {
    memset(d, 0, sizeof *d);
    d->at_start = 1;
}

typedef struct {
    char *out;
    size_t cap, n;
} Out;

static void put_bytes(Out *o, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n && o->n < o->cap; i++) o->out[o->n++] = (char)b[i];
}

static void put_replacement(Out *o) {
    static const uint8_t fffd[3] = {0xEF, 0xBF, 0xBD};
    if (o->n + 3 <= o->cap) put_bytes(o, fffd, 3);
}

/* Feed one byte through the UTF-8 assembler: complete characters go to o, invalid bytes and
 * cut-off sequences become U+FFFD. */
static void feed_byte(TokenDecoder *d, Out *o, uint8_t b) {
    if (d->n_pending > 0) {
        if (utf8_cont_ok(d->pending[0], d->n_pending, b)) {
            d->pending[d->n_pending++] = b;
            if (d->n_pending == utf8_need(d->pending[0])) {
                if (o->n + (size_t)d->n_pending <= o->cap)
                    put_bytes(o, d->pending, (size_t)d->n_pending);
                d->n_pending = 0;
            }
            return;
        }
        put_replacement(o); /* the pending character was cut off; b starts afresh */
        d->n_pending = 0;
    }
    int need = utf8_need(b);
    if (need == 1) {
        put_bytes(o, &b, 1);
    } else if (need == 0) {
        put_replacement(o);
    } else {
        d->pending[0] = b;
        d->n_pending = 1;
    }
}

static void feed(TokenDecoder *d, Out *o, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) feed_byte(d, o, b[i]);
}

size_t token_decode(const Tokenizer *t, TokenDecoder *d, int32_t id, int show_special, char *out,
                    size_t cap) {
    Out o = {out, cap, 0};
    if (id < 0 || (uint32_t)id >= t->n_tokens) return 0;
    size_t len;
    const uint8_t *s = tok_text(t, id, &len);
    uint32_t type = t->types[id];
    if (type == DITTO_TT_CONTROL || type == DITTO_TT_UNKNOWN || type == DITTO_TT_UNUSED) {
        if (show_special) feed(d, &o, s, len);
        return o.n;
    }
    int drop_space = d->at_start && ((t->kind == DITTO_TOK_SPM_BPE && t->add_space_prefix) ||
                                     (t->flags & DITTO_TOKF_DECODE_STRIP));
    d->at_start = 0;
    if (t->kind == DITTO_TOK_BPE_BYTES) {
        feed(d, &o, s, len);
        return o.n;
    }
    int metaspace = (t->flags & DITTO_TOKF_DECODE_METASPACE) != 0;
    if (type == DITTO_TT_BYTE && !metaspace) {
        uint8_t b = (uint8_t)parse_byte_piece(s, len); /* validated in tokenizer_new */
        if (!(drop_space && b == ' ')) feed(d, &o, &b, 1);
        return o.n;
    }
    if (type == DITTO_TT_USER_DEFINED && !(t->flags & DITTO_TOKF_RANK_MERGES)) {
        /* llama.cpp prints user-defined text as is; HF's decoder also rewrites added tokens */
        feed(d, &o, s, len);
        return o.n;
    }
    for (size_t i = 0; i < len;) { /* SentencePiece piece: U+2581 -> ' ' */
        if (i + 3 <= len && s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) {
            if (!(drop_space && (i == 0 || metaspace))) feed_byte(d, &o, ' ');
            i += 3;
        } else if (drop_space && i == 0 && s[0] == ' ' && !metaspace &&
                   (t->flags & DITTO_TOKF_DECODE_STRIP)) {
            i++; /* HF's Strip(' ', 1, 0) takes a literal leading space too */
        } else {
            feed_byte(d, &o, s[i++]);
        }
    }
    return o.n;
}

size_t token_decoder_flush(TokenDecoder *d, char *out, size_t cap) {
    Out o = {out, cap, 0};
    if (d->n_pending > 0) put_replacement(&o);
    d->n_pending = 0;
    return o.n;
}

size_t tokenizer_max_decode_bytes(const Tokenizer *t) {
    /* worst case: every byte of the longest token plus a pending character becomes U+FFFD */
    return 3 * (t->max_token_bytes + 4);
}

int32_t tokenizer_bos(const Tokenizer *t) { return t->bos_id; }
int32_t tokenizer_eos(const Tokenizer *t) { return t->eos_id; }

int tokenizer_is_eog(const Tokenizer *t, int32_t id) {
    if (id < 0 || (uint32_t)id >= t->n_tokens) return 0;
    return t->eog ? t->eog[id] : id == t->eos_id;
}

int32_t tokenizer_fim(const Tokenizer *t, uint32_t role) {
    return role < DITTO_FIM_ROLES ? t->fim[role] : -1;
}

long tokenizer_encode_fim(const Tokenizer *t, const char *prefix, size_t prefix_len,
                          const char *suffix, size_t suffix_len, int add_bos, int32_t *ids,
                          size_t max_ids, char *err, size_t errlen) {
    int32_t pre = t->fim[DITTO_FIM_PREFIX], suf = t->fim[DITTO_FIM_SUFFIX];
    int32_t mid = t->fim[DITTO_FIM_MIDDLE];
    if (pre < 0 || suf < 0 || mid < 0) {
        set_err(err, errlen, "the model has no fill-in-the-middle tokens (prefix %d, suffix %d, "
                "middle %d; -1 = none)", pre, suf, mid);
        return -1;
    }
    size_t n = 0;
    const char *text[2] = {prefix, suffix};
    size_t len[2] = {prefix_len, suffix_len};
    int32_t before[3] = {pre, suf, mid};
    if (add_bos && t->bos_id >= 0) {
        if (n < max_ids) ids[n] = t->bos_id;
        n++;
    }
    for (int k = 0; k < 3; k++) {
        if (n < max_ids) ids[n] = before[k];
        n++;
        if (k == 2) break;
        /* the user's text: control-token texts in it are plain text */
        long m = tokenizer_encode(t, text[k], len[k], 0, 0, n < max_ids ? ids + n : NULL,
                                  n < max_ids ? max_ids - n : 0, err, errlen);
        if (m < 0) return -1;
        n += (size_t)m;
    }
    return (long)n;
}
uint32_t tokenizer_chat_format(const Tokenizer *t) { return t->chat_format; }
uint32_t tokenizer_n_tokens(const Tokenizer *t) { return t->n_tokens; }

int tokenizer_chat_text(const Tokenizer *t, const char **prefix, size_t *prefix_len,
                        const char **suffix, size_t *suffix_len) {
    *prefix = (const char *)t->chat_prefix;
    *prefix_len = t->chat_prefix_len;
    *suffix = (const char *)t->chat_suffix;
    *suffix_len = t->chat_suffix_len;
    return t->has_chat;
}

int32_t tokenizer_find(const Tokenizer *t, const char *text) {
    return vocab_find(t, (const uint8_t *)text, strlen(text));
}
