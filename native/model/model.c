/* model.c: bring a Ditto model file into memory and validate everything before use
 * (docs/FORMAT.md). */
#define _DEFAULT_SOURCE 1 /* madvise and MADV_HUGEPAGE (Linux), for huge_pages.h */
#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../io/huge_pages.h"
#include "../io/input.h"

/* ------------------------------------------- CRC-32 (PCLMULQDQ folding on x86, slice-by-8) */

static uint32_t crc_table[8][256];
static int crc_table_ready = 0;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
    crc_table_ready = 1;
}

static uint32_t load_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define CLMUL_FN __attribute__((target("pclmul,sse2")))

/* x * (k.lo, k.hi) folded onto d: the 128-bit remainder x moved 128 + 512 or 128 bits on. */
CLMUL_FN static inline __m128i clmul_fold(__m128i x, __m128i k, __m128i d) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00),
                                       _mm_clmulepi64_si128(x, k, 0x11)),
                         d);
}

/* The running (inverted) CRC of len bytes at p (len % 16 == 0, len >= 64) by carry-less
 * multiplication, the method of Gopal et al., "Fast CRC Computation for Generic Polynomials
 * Using PCLMULQDQ Instruction" (Intel, 2009): four 128-bit remainders advance 64 bytes per
 * step (times x^(512+32) and x^(512-32) mod P), are folded into one (x^(128+32), x^(128-32)),
 * which takes the rest 16 bytes at a time; the last 128 bits are folded to 64 and 32 (x^64)
 * and reduced by Barrett's method (mu = x^64 / P). Every constant is the bit-reflected
 * remainder shifted left by one, as the reflected polynomial 0xEDB88320 needs
 * (tests/test_native_kernels.py checks lengths 0..300 from 17 start addresses against zlib). */
CLMUL_FN static uint32_t crc32_clmul(uint32_t crc, const uint8_t *p, size_t len) {
    const __m128i k512 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
    const __m128i k128 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
    const __m128i k64 = _mm_set_epi64x(0, 0x163cd6124);
    const __m128i poly_mu = _mm_set_epi64x(0x1f7011641, 0x1db710641);
    const __m128i low32 = _mm_set_epi32(0, 0, 0, -1);
    const __m128i *v = (const __m128i *)(const void *)p;
    __m128i x0 = _mm_xor_si128(_mm_loadu_si128(v), _mm_cvtsi32_si128((int)crc));
    __m128i x1 = _mm_loadu_si128(v + 1), x2 = _mm_loadu_si128(v + 2), x3 = _mm_loadu_si128(v + 3);
    size_t i = 4, n = len / 16;
    for (; i + 4 <= n; i += 4) {
        x0 = clmul_fold(x0, k512, _mm_loadu_si128(v + i));
        x1 = clmul_fold(x1, k512, _mm_loadu_si128(v + i + 1));
        x2 = clmul_fold(x2, k512, _mm_loadu_si128(v + i + 2));
        x3 = clmul_fold(x3, k512, _mm_loadu_si128(v + i + 3));
    }
    __m128i x = clmul_fold(clmul_fold(clmul_fold(x0, k128, x1), k128, x2), k128, x3);
    for (; i < n; i++) x = clmul_fold(x, k128, _mm_loadu_si128(v + i));
    /* 128 -> 64 bits (with 32 zero bits appended), then 64 -> 32 */
    x = _mm_xor_si128(_mm_srli_si128(x, 8), _mm_clmulepi64_si128(x, k128, 0x10));
    x = _mm_xor_si128(_mm_srli_si128(x, 4),
                      _mm_clmulepi64_si128(_mm_and_si128(x, low32), k64, 0x00));
    /* Barrett: q = (x mod x^32) * mu, then x - (q mod x^32) * P */
    __m128i q = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x, low32), poly_mu, 0x10),
                              low32);
    x = _mm_xor_si128(x, _mm_clmulepi64_si128(q, poly_mu, 0x00));
    return (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(x, 4));
}

static int have_pclmul(void) {
    static int known = -1;
    if (known < 0) known = __builtin_cpu_supports("pclmul") ? 1 : 0;
    return known;
}
#endif

uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t len) {
    if (!crc_table_ready) crc_init();
    crc = ~crc;
#if defined(__x86_64__) || defined(__i386__)
    if (len >= 64 && have_pclmul()) { /* whole 16-byte blocks; the rest below */
        const size_t n = len & ~(size_t)15;
        crc = crc32_clmul(crc, p, n);
        p += n;
        len -= n;
    }
#endif
    while (len >= 8) { /* eight bytes per step: one lookup per byte in eight tables */
        uint32_t a = load_u32le(p) ^ crc, b = load_u32le(p + 4);
        crc = crc_table[7][a & 0xff] ^ crc_table[6][(a >> 8) & 0xff] ^
              crc_table[5][(a >> 16) & 0xff] ^ crc_table[4][a >> 24] ^
              crc_table[3][b & 0xff] ^ crc_table[2][(b >> 8) & 0xff] ^
              crc_table[1][(b >> 16) & 0xff] ^ crc_table[0][b >> 24];
        p += 8;
        len -= 8;
    }
    while (len--) crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* ---------------------------------------------------------------- sizes */

static uint64_t roundup64(uint64_t x) { return (x + 63u) & ~(uint64_t)63u; }

uint64_t tensor_expected_nbytes(uint32_t encoding, uint32_t codebook_type, uint32_t bits,
                                uint32_t group_size, uint64_t rows, uint64_t cols) {
    /* int-sized dimensions (the kernels index with int) and at most 2^40 weights, so no
     * size below can overflow 64 bits */
    if (rows == 0 || cols == 0 || rows > 0x7fffffffull || cols > 0x7fffffffull ||
        rows * cols > DITTO_MAX_WEIGHTS)
        return 0;
    if (encoding == DITTO_ENC_F32) {
        if (bits || group_size || codebook_type || rows * cols > DITTO_MAX_F32_ELEMENTS) return 0;
        return rows * cols * 4u;
    }
    if (encoding != DITTO_ENC_CODEBOOK) return 0;
    if (bits < 1 || bits > 8 || group_size < DITTO_MIN_GROUP_SIZE ||
        group_size > DITTO_MAX_GROUP_SIZE)
        return 0;
    if (ditto_cb_elem_bytes(codebook_type) == 0) return 0;
    return ditto_cb_payload_bytes(rows, cols, bits, group_size, codebook_type);
}

/* ---------------------------------------------------------------- errors */

static int fail(const Model *m, char *err, size_t errlen, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(err, errlen, "%s: %s", m->path, msg);
    return -1;
}

/* ---------------------------------------------------------------- int8 codebooks */

/* The integer kernels rely on every int8 centroid being in -127..127 (|c| fits their sign
 * trick, docs/KERNELS.md) and on finite, non-negative f16 scales (FORMAT.md). */
static int check_int8_codebooks(const Model *m, const Tensor *t, char *err, size_t errlen) {
    uint64_t n_sub = ditto_cb_n_sub(t->cols, t->group_size), k = UINT64_C(1) << t->bits;
    /* the scales follow the int8 centroids (1 byte each) */
    uint64_t n_cent =
        ditto_cb_centroid_bytes(t->rows, t->cols, t->bits, t->group_size, DITTO_CB_I8);
    const int8_t *c = (const int8_t *)(const void *)t->data;
    for (uint64_t i = 0; i < n_cent; i++)
        if (c[i] == -128)
            return fail(m, err, errlen,
                        "tensor %s: int8 centroid -128 at row %llu sub-block %llu (int8 "
                        "codebooks use -127..127)", t->name,
                        (unsigned long long)(i / k / n_sub),
                        (unsigned long long)(i / k % n_sub));
    for (uint64_t i = 0; i < t->rows * n_sub; i++) {
        uint16_t h;
        memcpy(&h, t->data + n_cent + 2 * i, 2);
        if ((h & 0x8000u) || (h & 0x7c00u) == 0x7c00u)
            return fail(m, err, errlen,
                        "tensor %s: int8 codebook scale 0x%04x at row %llu sub-block %llu is "
                        "negative, infinite or NaN", t->name, h,
                        (unsigned long long)(i / n_sub), (unsigned long long)(i % n_sub));
    }
    return 0;
}

/* ---------------------------------------------------------------- tensor lookup */

static const Tensor *find_tensor(const Model *m, const char *name) {
    for (uint32_t i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

/* Look up a required tensor and check its shape; vectors must be f32 (norm weights). */
static const Tensor *need(const Model *m, const char *name, uint64_t rows, uint64_t cols,
                          int is_vector, int *n_found, char *err, size_t errlen) {
    const Tensor *t = find_tensor(m, name);
    if (!t) {
        fail(m, err, errlen,
             "tensor %s is missing (config: arch=%u, n_layers=%u, tied_embeddings=%u)", name,
             m->config.arch, m->config.n_layers, m->config.tied_embeddings);
        return NULL;
    }
    if (t->rows != rows || t->cols != cols || t->ndim != (is_vector ? 1u : 2u)) {
        fail(m, err, errlen,
             "tensor %s has shape [%llu, %llu] (ndim %u) but the config needs [%llu, %llu] "
             "(ndim %d)", name, (unsigned long long)t->rows, (unsigned long long)t->cols,
             t->ndim, (unsigned long long)rows, (unsigned long long)cols, is_vector ? 1 : 2);
        return NULL;
    }
    if (is_vector && t->encoding != DITTO_ENC_F32) {
        fail(m, err, errlen, "tensor %s is a vector and must be f32 (encoding %u)", name,
             t->encoding);
        return NULL;
    }
    (*n_found)++;
    return t;
}

/* ---------------------------------------------------------------- validation steps */

static int check_config(const Model *m, char *err, size_t errlen) {
    const DittoConfig *c = &m->config;
    if (c->arch != DITTO_ARCH_LLAMA && c->arch != DITTO_ARCH_QWEN2)
        return fail(m, err, errlen, "config: unknown architecture %u (1 = Llama, 2 = Qwen2)",
                    c->arch);
    if (!c->dim || !c->hidden_dim || !c->n_layers || !c->n_heads || !c->n_kv_heads ||
        !c->head_dim || !c->vocab_size || !c->max_seq_len)
        return fail(m, err, errlen,
                    "config: a size is zero (dim=%u hidden_dim=%u n_layers=%u n_heads=%u "
                    "n_kv_heads=%u head_dim=%u vocab_size=%u max_seq_len=%u)",
                    c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim,
                    c->vocab_size, c->max_seq_len);
    if (c->n_layers > DITTO_MAX_LAYERS || c->dim > DITTO_MAX_DIM ||
        c->hidden_dim > DITTO_MAX_HIDDEN_DIM || c->vocab_size > DITTO_MAX_VOCAB ||
        c->max_seq_len > DITTO_MAX_SEQ_LEN || (uint64_t)c->n_heads * c->head_dim > DITTO_MAX_DIM)
        return fail(m, err, errlen,
                    "config: a size is above its limit (n_layers=%u <= %u, dim=%u <= %u, "
                    "hidden_dim=%u <= %u, vocab_size=%u <= %u, max_seq_len=%u <= %u, "
                    "n_heads*head_dim=%llu <= %u)",
                    c->n_layers, DITTO_MAX_LAYERS, c->dim, DITTO_MAX_DIM, c->hidden_dim,
                    DITTO_MAX_HIDDEN_DIM, c->vocab_size, DITTO_MAX_VOCAB, c->max_seq_len,
                    DITTO_MAX_SEQ_LEN, (unsigned long long)c->n_heads * c->head_dim,
                    DITTO_MAX_DIM);
    if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0)
        return fail(m, err, errlen, "config: n_heads=%u is not a multiple of n_kv_heads=%u",
                    c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 != 0)
        return fail(m, err, errlen, "config: head_dim=%u must be even for RoPE", c->head_dim);
    if (!isfinite(c->rope_theta) || c->rope_theta <= 0.0f)
        return fail(m, err, errlen, "config: rope_theta=%g must be finite and > 0",
                    (double)c->rope_theta);
    if (!isfinite(c->norm_eps) || c->norm_eps <= 0.0f)
        return fail(m, err, errlen, "config: norm_eps=%g must be finite and > 0",
                    (double)c->norm_eps);
    if (c->tied_embeddings > 1)
        return fail(m, err, errlen, "config: tied_embeddings=%u must be 0 or 1",
                    c->tied_embeddings);
    for (int i = 0; i < 3; i++)
        if (c->reserved[i] != 0)
            return fail(m, err, errlen, "config: reserved bytes 52..63 must be zero");
    return 0;
}

static int cmp_by_offset(const void *a, const void *b) {
    const Tensor *x = *(const Tensor *const *)a, *y = *(const Tensor *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

/* No two payloads share a byte (FORMAT.md "Validity rules"). */
static int check_no_overlap(Model *m, char *err, size_t errlen) {
    const Tensor **by = malloc(sizeof(*by) * m->n_tensors);
    if (!by) return fail(m, err, errlen, "out of memory");
    for (uint32_t i = 0; i < m->n_tensors; i++) by[i] = &m->tensors[i];
    qsort(by, m->n_tensors, sizeof(*by), cmp_by_offset);
    for (uint32_t i = 1; i < m->n_tensors; i++) {
        if (by[i]->data < by[i - 1]->data + by[i - 1]->nbytes) {
            fail(m, err, errlen, "tensor %s: payload at offset %llu overlaps the payload of %s "
                 "[%llu, %llu)", by[i]->name, (unsigned long long)(by[i]->data - m->map),
                 by[i - 1]->name, (unsigned long long)(by[i - 1]->data - m->map),
                 (unsigned long long)(by[i - 1]->data - m->map + by[i - 1]->nbytes));
            free(by);
            return -1;
        }
    }
    free(by);
    return 0;
}

static int check_tensor_table(Model *m, const DittoTensorEntry *table, uint64_t data_start,
                              char *err, size_t errlen) {
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const DittoTensorEntry *e = &table[i];
        Tensor *t = &m->tensors[i];
        const char *nul = memchr(e->name, 0, DITTO_NAME_BYTES);
        if (nul == NULL || e->name[0] == 0)
            return fail(m, err, errlen, "tensor table entry %u has no NUL-terminated name", i);
        for (const char *q = nul; q < e->name + DITTO_NAME_BYTES; q++)
            if (*q != 0)
                return fail(m, err, errlen, "tensor %s: name is not NUL-padded (byte %d after "
                            "the name is not zero)", e->name, (int)(q - e->name));
        t->name = e->name;
        for (int k = 0; k < 3; k++)
            if (e->reserved[k] != 0)
                return fail(m, err, errlen, "tensor %s: reserved bytes 116..127 must be zero",
                            e->name);
        if (e->ndim != 1 && e->ndim != 2)
            return fail(m, err, errlen, "tensor %s: ndim=%u must be 1 or 2", e->name, e->ndim);
        if (e->ndim == 1 && e->rows != 1)
            return fail(m, err, errlen, "tensor %s: a vector must have rows=1 (has %llu)",
                        e->name, (unsigned long long)e->rows);
        uint64_t want = tensor_expected_nbytes(e->encoding, e->codebook_type, e->bits,
                                               e->group_size, e->rows, e->cols);
        if (want == 0)
            return fail(m, err, errlen,
                        "tensor %s: invalid encoding parameters (encoding=%u codebook_type=%u "
                        "bits=%u group_size=%u rows=%llu cols=%llu)",
                        e->name, e->encoding, e->codebook_type, e->bits, e->group_size,
                        (unsigned long long)e->rows, (unsigned long long)e->cols);
        if (e->nbytes != want)
            return fail(m, err, errlen,
                        "tensor %s: nbytes=%llu but encoding %u with shape [%llu, %llu] needs %llu",
                        e->name, (unsigned long long)e->nbytes, e->encoding,
                        (unsigned long long)e->rows, (unsigned long long)e->cols,
                        (unsigned long long)want);
        if (e->offset % DITTO_ALIGN != 0)
            return fail(m, err, errlen, "tensor %s: offset %llu is not a multiple of %u",
                        e->name, (unsigned long long)e->offset, DITTO_ALIGN);
        if (e->offset < data_start)
            return fail(m, err, errlen,
                        "tensor %s: offset %llu overlaps the metadata (data starts at %llu)",
                        e->name, (unsigned long long)e->offset, (unsigned long long)data_start);
        if (e->offset > m->size || e->nbytes > m->size - e->offset)
            return fail(m, err, errlen,
                        "tensor %s: payload [%llu, %llu) extends past the end of the file "
                        "(%zu bytes)",
                        e->name, (unsigned long long)e->offset,
                        (unsigned long long)(e->offset + e->nbytes), m->size);
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(m->tensors[j].name, e->name) == 0)
                return fail(m, err, errlen, "tensor %s appears twice in the table", e->name);
        t->encoding = e->encoding;
        t->codebook_type = e->codebook_type;
        t->bits = e->bits;
        t->group_size = e->group_size;
        t->rows = e->rows;
        t->cols = e->cols;
        t->data = m->map + e->offset;
        t->nbytes = e->nbytes;
        t->ndim = e->ndim;
        if (t->encoding == DITTO_ENC_CODEBOOK && t->codebook_type == DITTO_CB_I8 &&
            check_int8_codebooks(m, t, err, errlen))
            return -1;
    }
    return check_no_overlap(m, err, errlen);
}

static int bind_weights(Model *m, char *err, size_t errlen) {
    const DittoConfig *c = &m->config;
    uint64_t q_dim = (uint64_t)c->n_heads * c->head_dim;
    uint64_t kv_dim = (uint64_t)c->n_kv_heads * c->head_dim;
    int found = 0;
    char name[DITTO_NAME_BYTES + 32];
    m->token_embd = need(m, "token_embd.weight", c->vocab_size, c->dim, 0, &found, err, errlen);
    if (!m->token_embd) return -1;
    if (!(m->output_norm = need(m, "output_norm.weight", 1, c->dim, 1, &found, err, errlen)))
        return -1;
    if (c->tied_embeddings) {
        if (find_tensor(m, "output.weight"))
            return fail(m, err, errlen,
                        "config says tied_embeddings=1 but the file has output.weight");
        m->output = m->token_embd;
    } else {
        m->output = need(m, "output.weight", c->vocab_size, c->dim, 0, &found, err, errlen);
        if (!m->output) return -1;
    }
    m->layers = calloc(c->n_layers, sizeof(LayerWeights));
    if (!m->layers) return fail(m, err, errlen, "out of memory");
    for (uint32_t l = 0; l < c->n_layers; l++) {
        LayerWeights *w = &m->layers[l];
#define NEED(field, suffix, r, cc, vec)                                                     \
    snprintf(name, sizeof name, "blk.%u." suffix, l);                                       \
    if (!(w->field = need(m, name, (r), (cc), (vec), &found, err, errlen))) return -1;
        NEED(attn_norm, "attn_norm.weight", 1, c->dim, 1)
        NEED(wq, "attn_q.weight", q_dim, c->dim, 0)
        NEED(wk, "attn_k.weight", kv_dim, c->dim, 0)
        NEED(wv, "attn_v.weight", kv_dim, c->dim, 0)
        if (c->arch == DITTO_ARCH_QWEN2) { /* f32 vectors, added after the projections */
            NEED(bq, "attn_q.bias", 1, q_dim, 1)
            NEED(bk, "attn_k.bias", 1, kv_dim, 1)
            NEED(bv, "attn_v.bias", 1, kv_dim, 1)
        }
        NEED(wo, "attn_output.weight", c->dim, q_dim, 0)
        NEED(ffn_norm, "ffn_norm.weight", 1, c->dim, 1)
        NEED(w_gate, "ffn_gate.weight", c->hidden_dim, c->dim, 0)
        NEED(w_up, "ffn_up.weight", c->hidden_dim, c->dim, 0)
        NEED(w_down, "ffn_down.weight", c->dim, c->hidden_dim, 0)
#undef NEED
    }
    if ((uint32_t)found != m->n_tensors) {
        /* name the first tensor the config does not account for */
        for (uint32_t i = 0; i < m->n_tensors; i++) {
            const char *n = m->tensors[i].name;
            unsigned l;
            int used = 0, at = 0;
            if (sscanf(n, "blk.%u.%n", &l, &at) == 1 && at > 0) {
                const char *rest = n + at;
                int is_bias = !strcmp(rest, "attn_q.bias") || !strcmp(rest, "attn_k.bias") ||
                              !strcmp(rest, "attn_v.bias");
                used = l < c->n_layers && (!is_bias || c->arch == DITTO_ARCH_QWEN2);
            } else {
                used = !strcmp(n, "token_embd.weight") || !strcmp(n, "output_norm.weight") ||
                       !strcmp(n, "output.weight");
            }
            if (!used)
                return fail(m, err, errlen,
                            "tensor %s does not belong to the model the config describes "
                            "(arch=%u, n_layers=%u; only arch 2 = Qwen2 has q/k/v biases)", n,
                            c->arch, c->n_layers);
        }
        return fail(m, err, errlen, "%u tensors in the file, the config accounts for %d",
                    m->n_tensors, found);
    }
    return 0;
}

/* ---------------------------------------------------------------- open / close */

/* A file mapping gets 2 MiB mappings only where ext4's page cache happens to hold 2 MiB
 * folios (about half of Qwen2.5-Coder-1.5B's file, measured) and 4 KiB pages elsewhere, so by
 * default the file is read into 2 MiB pages (huge_pages.h) when Linux's transparent huge pages
 * are on ("always" or "madvise"): that model decodes 10 % faster (docs/RUNTIME.md "Loading"). */
#define READ_ENDED_EARLY (-1) /* read_into_memory's *read_errno when the file ends early */

/* Whether Linux gives 2 MiB pages to memory marked MADV_HUGEPAGE. */
static int huge_pages_on(void) {
#ifdef MADV_HUGEPAGE
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return 0;
    char line[128] = "";
    int on = fgets(line, sizeof line, f) != NULL && strstr(line, "[never]") == NULL;
    fclose(f);
    return on;
#else
    return 0;
#endif
}

/* The first unsigned number in file path after the text key (the whole file when key is
 * ""), or -1 when there is none ("max", no such file). */
static long long number_in_file(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    while (v < 0 && fgets(line, sizeof line, f)) {
        const char *at = *key ? strstr(line, key) : line;
        if (at && sscanf(at + strlen(key), " %lld", &v) != 1) v = -1;
    }
    fclose(f);
    return v;
}

/* Whether a private copy of size bytes fits the memory the process can have without evicting
 * what others use: Linux's MemAvailable (/proc/meminfo), and under a cgroup v2 limit (a
 * container) memory.max - memory.current, each with 64 MiB to spare. Unknown limits count as
 * no limit. The file's own page-cache pages are in MemAvailable (reclaimable), so a copy may
 * evict them. */
static int copy_fits_in_memory(size_t size) {
    const long long spare = 64ll << 20;
    long long avail_kib = number_in_file("/proc/meminfo", "MemAvailable:");
    if (avail_kib >= 0 && (long long)(size / 1024) + spare / 1024 > avail_kib) return 0;
    long long max = number_in_file("/sys/fs/cgroup/memory.max", "");
    long long used = number_in_file("/sys/fs/cgroup/memory.current", "");
    if (max >= 0 && used >= 0 && (long long)size + spare > max - used) return 0;
    return 1;
}

/* The size bytes of fd read into a 2 MiB-aligned buffer marked MADV_HUGEPAGE (free()d by
 * model_close). Returns NULL with *read_errno = 0 when the buffer cannot be allocated (the
 * caller maps the file instead), or NULL with *read_errno the read error (errno, or
 * READ_ENDED_EARLY when the file ends before size bytes). */
static uint8_t *read_into_memory(int fd, size_t size, int *read_errno) {
    uint8_t *p = huge_pages_alloc(size);
    *read_errno = 0;
    if (!p) return NULL;
    for (size_t got = 0; got < size;) {
        size_t want = size - got < ((size_t)64 << 20) ? size - got : ((size_t)64 << 20);
        ssize_t n = read(fd, p + got, want);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            *read_errno = n < 0 ? errno : READ_ENDED_EARLY;
            free(p);
            return NULL;
        }
        got += (size_t)n;
    }
    return p;
}

int model_load_from_env(ModelLoad *load, char *err, size_t errlen) {
    const char *v = getenv("DITTO_MMAP");
    *load = MODEL_LOAD_AUTO;
    if (!v || !*v) return 0;
    if (!strcmp(v, "1")) {
        *load = MODEL_LOAD_MMAP;
    } else if (!strcmp(v, "0")) {
        *load = MODEL_LOAD_READ;
    } else {
        snprintf(err, errlen, "DITTO_MMAP must be 1 (map the model file) or 0 (read it into "
                 "memory), got '%s'", v);
        return -1;
    }
    return 0;
}

int model_open(Model *m, const char *path, ModelLoad load, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    snprintf(m->path, sizeof m->path, "%s", path);
    struct stat st;
    int fd = open_input(path, &st); /* a FIFO or device is refused without blocking */
    if (fd < 0) {
        if (errno == EISDIR || errno == INPUT_ENOTREG)
            return fail(m, err, errlen, "not a regular file");
        return fail(m, err, errlen, "cannot open: %s", strerror(errno));
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return fail(m, err, errlen, "%lld bytes do not fit this program's address space",
                    (long long)st.st_size);
    }
    m->size = (size_t)st.st_size;
    if (m->size < DITTO_HEADER_BYTES) {
        close(fd);
        return fail(m, err, errlen, "too small to be a Ditto model file (%zu bytes)", m->size);
    }
    if (load == MODEL_LOAD_READ ||
        (load == MODEL_LOAD_AUTO && huge_pages_on() && copy_fits_in_memory(m->size))) {
        int read_errno;
        m->map = read_into_memory(fd, m->size, &read_errno);
        if (!m->map && read_errno) {
            close(fd);
            return fail(m, err, errlen, "cannot read: %s", read_errno == READ_ENDED_EARLY
                        ? "the file ended early (changed while being read?)"
                        : strerror(read_errno));
        }
    }
    if (!m->map) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return fail(m, err, errlen, "cannot mmap: %s", strerror(e));
        }
        m->map = p;
        m->mapped = 1;
    }
    close(fd);

    DittoHeader h;
    memcpy(&h, m->map, sizeof h);
    if (memcmp(h.magic, DITTO_MAGIC, 8) != 0) {
        fail(m, err, errlen, "not a Ditto model file (bad magic, expected \"%s\")", DITTO_MAGIC);
        goto bad;
    }
    if (h.version < DITTO_VERSION_MIN || h.version > DITTO_VERSION) {
        fail(m, err, errlen, "unsupported format version %u (this program reads versions "
             "%u..%u)", h.version, DITTO_VERSION_MIN, DITTO_VERSION);
        goto bad;
    }
    for (size_t i = 0; i < sizeof h.reserved; i++) {
        if (h.reserved[i] != 0) {
            fail(m, err, errlen, "header reserved bytes 32..63 must be zero, byte %zu is 0x%02x "
                 "(a newer or damaged file; the CRC does not cover the header)",
                 (size_t)32 + i, (unsigned)h.reserved[i]);
            goto bad;
        }
    }
    if (h.file_size > m->size) {
        fail(m, err, errlen, "file is truncated: header says %llu bytes, file has %zu",
             (unsigned long long)h.file_size, m->size);
        goto bad;
    }
    if (h.file_size < m->size) {
        fail(m, err, errlen, "file has %zu bytes but the header says %llu (trailing data)",
             m->size, (unsigned long long)h.file_size);
        goto bad;
    }
    uint32_t crc = crc32_update(0, m->map + DITTO_HEADER_BYTES, m->size - DITTO_HEADER_BYTES);
    if (crc != h.crc32) {
        fail(m, err, errlen, "checksum mismatch: CRC-32 of the file is %08x, header says %08x "
             "(file corrupted)", crc, h.crc32);
        goto bad;
    }
    if (h.meta_size < sizeof(DittoConfig) || h.meta_size > m->size - DITTO_HEADER_BYTES) {
        fail(m, err, errlen, "meta_size=%llu does not fit in the file",
             (unsigned long long)h.meta_size);
        goto bad;
    }
    memcpy(&m->config, m->map + DITTO_HEADER_BYTES, sizeof m->config);
    if (check_config(m, err, errlen)) goto bad;
    uint64_t table_start = DITTO_HEADER_BYTES + sizeof(DittoConfig);
    uint64_t meta_end = DITTO_HEADER_BYTES + h.meta_size;
    m->n_tensors = m->config.n_tensors;
    uint64_t tok_start = table_start + (uint64_t)m->n_tensors * sizeof(DittoTensorEntry);
    if (m->n_tensors == 0 || tok_start + sizeof(DittoTokenizerHeader) > meta_end) {
        fail(m, err, errlen, "config: n_tensors=%u does not fit in meta_size=%llu",
             m->n_tensors, (unsigned long long)h.meta_size);
        goto bad;
    }
    m->tensors = calloc(m->n_tensors, sizeof(Tensor));
    if (!m->tensors) {
        fail(m, err, errlen, "out of memory");
        goto bad;
    }
    /* the table starts at byte 128 of a page-aligned mapping: 8-byte aligned */
    const DittoTensorEntry *table = (const DittoTensorEntry *)(const void *)(m->map + table_start);
    if (check_tensor_table(m, table, roundup64(meta_end), err, errlen)) goto bad;
    if (bind_weights(m, err, errlen)) goto bad;
    m->tokenizer_block = m->map + tok_start;
    m->tokenizer_block_len = (size_t)(meta_end - tok_start);
    return 0;
bad:
    model_close(m);
    return -1;
}

void model_close(Model *m) {
    for (uint32_t i = 0; m->tensors && i < m->n_tensors; i++)
        free(m->tensors[i].w8); /* decoded weights (kernels_decode_tensor), malloc'd */
    if (m->map && m->mapped)
        munmap(m->map, m->size);
    else
        free(m->map);
    free(m->tensors);
    free(m->layers);
    m->map = NULL;
    m->tensors = NULL;
    m->layers = NULL;
}
