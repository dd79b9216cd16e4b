/* ditto.h: the C API of the Ditto runtime, for programs that keep a model loaded and answer
 * many prompts (the `ditto serve` HTTP server through ditto_core/runtime/runtime_api.py; docs/RUNTIME.md
 * "C API").
 *
 * A DittoModel is a mapped and validated model file with its tokenizer. A DittoSession is one
 * KV cache of n_ctx positions plus the prefill scratch: tokens are appended at the session's
 * position with ditto_session_eval() and dropped from the end with ditto_session_truncate(), so
 * a caller reuses the common prefix of consecutive prompts. Sessions of one model may live in
 * different threads; their evaluations are serialised by a lock in the model (the kernels keep
 * per-process scratch buffers), each one running on the model's OpenMP threads.
 *
 * Errors: every function that can fail returns a DittoStatus (or a negative count) and writes a
 * one-line message naming the problem into err (errlen bytes, NUL-terminated; err may be NULL).
 * Nothing here exits the process or prints.
 */
#ifndef DITTO_API_H
#define DITTO_API_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define DITTO_API __attribute__((visibility("default")))
#else
#define DITTO_API
#endif

#define DITTO_API_VERSION 3 /* 2: ditto_sampler_set_min_p; 3: ditto_session_new_kv */
#define DITTO_MAX_THREADS 1024 /* the most OpenMP threads a model or ditto-run takes */

typedef enum {
    DITTO_OK = 0,
    DITTO_ERR_ARG = 1,   /* a bad argument: NULL, out of range, n_ctx above max_seq_len ... */
    DITTO_ERR_MODEL = 2, /* the model file cannot be opened or is malformed */
    DITTO_ERR_INPUT = 3, /* bad input: token id out of range, invalid UTF-8, context full */
    DITTO_ERR_OOM = 5,   /* out of memory */
} DittoStatus;

typedef struct DittoModel DittoModel;
typedef struct DittoSession DittoSession;
typedef struct DittoSampler DittoSampler;
typedef struct DittoDecoder DittoDecoder;

/* What a model is, for callers sizing buffers and rendering prompts. */
typedef struct {
    int32_t vocab_size;
    int32_t max_seq_len;
    int32_t dim, n_layers, n_heads, n_kv_heads, head_dim, hidden_dim;
    int32_t bos_id, eos_id; /* -1: none */
    int32_t add_bos;        /* the tokenizer wants BOS before a text prompt */
    int32_t max_piece_bytes;/* most bytes one ditto_decoder_feed() call writes */
    int32_t threads;        /* OpenMP threads an evaluation uses */
    char kernel[32];        /* the GEMV kernel table in use (docs/KERNELS.md) */
} DittoModelInfo;

/* ---- model ---------------------------------------------------------------------------- */

/* Load and validate the model file at path and build its tokenizer: the file is read into
 * 2 MiB pages where Linux gives them and a copy fits the memory available, mmapped when
 * $DITTO_MMAP is 1 (as ditto-run --mmap); $DITTO_MMAP=0 always reads it, any other value is
 * DITTO_ERR_ARG. kernel: the GEMV kernel table by name, NULL or "" for the best this CPU runs
 * (or $DITTO_KERNEL); threads: OpenMP threads of every evaluation, <= 0 for the OpenMP
 * default, more than DITTO_MAX_THREADS is DITTO_ERR_ARG (OpenMP aborts the process when it
 * cannot start the threads asked for). The classifier is decoded to int8 at open where the
 * kernel table reads that faster (as ditto-run does for generation), and a model read into
 * memory has its b = 4 weight matrices put in row tiles where the table reads them
 * ($DITTO_TILES=0: file order; any value but 0 or 1 is DITTO_ERR_ARG).
 * On success *out is the model (free with ditto_model_free). */
DITTO_API DittoStatus ditto_model_open(const char *path, const char *kernel, int threads,
                                       DittoModel **out, char *err, size_t errlen);
DITTO_API void ditto_model_free(DittoModel *m);
DITTO_API void ditto_model_info(const DittoModel *m, DittoModelInfo *info);
DITTO_API int ditto_api_version(void);

/* ---- tokenizer ------------------------------------------------------------------------- */

/* Encode len bytes of UTF-8 text into at most max_ids ids. parse_special: control-token texts
 * such as "<|im_start|>" become their tokens (else they are plain text); add_bos: prepend BOS
 * (when the model has one). Returns the number of ids the text needs (call again with a larger
 * buffer when it exceeds max_ids), or -1 with a message (invalid UTF-8). */
DITTO_API long ditto_tokenize(const DittoModel *m, const char *text, size_t len, int parse_special,
                              int add_bos, int32_t *ids, size_t max_ids, char *err, size_t errlen);

/* The id of the token whose text is exactly text (NUL-terminated), or -1. */
DITTO_API int32_t ditto_token_find(const DittoModel *m, const char *text);

/* Whether id ends generation: one of the model file's end-of-generation tokens (EOS,
 * <|im_end|>, <|endoftext|>, <|fim_pad|>... found at export as llama.cpp does), or EOS for a
 * file without that set. */
DITTO_API int ditto_token_is_eog(const DittoModel *m, int32_t id);

/* The fill-in-the-middle token of role (0 prefix, 1 suffix, 2 middle, 3 pad, 4 repository
 * name, 5 file separator: DITTO_FIM_* of ditto_format.h) as found at export, or -1. */
DITTO_API int32_t ditto_token_fim(const DittoModel *m, int role);

/* Whether id is a control token (BOS, EOS, chat markers, FIM markers...): its text is not
 * printed by the decoder unless show_special. */
DITTO_API int ditto_token_is_control(const DittoModel *m, int32_t id);

/* The text of ids[0..n) as one string, as ditto-run prints a prompt's continuation from its
 * start (SentencePiece's leading space of the first piece dropped, characters split over tokens
 * joined, control tokens left out unless show_special). Writes at most cap bytes; returns the
 * bytes the text needs, or -1 for an id out of range (message in err). */
DITTO_API long ditto_detokenize(const DittoModel *m, const int32_t *ids, size_t n,
                                int show_special, char *out, size_t cap, char *err,
                                size_t errlen);

/* The bytes of one token on its own (control tokens included, SentencePiece's U+2581 as a
 * space, a byte token as its byte). Returns the byte count (<= max_piece_bytes), or -1 for an
 * id out of range. */
DITTO_API long ditto_token_piece(const DittoModel *m, int32_t id, char *out, size_t cap);

/* Streaming decoder: the text of a token sequence fed one id at a time, a UTF-8 character split
 * over several tokens written once whole. ditto_decoder_feed returns the bytes written (cap >=
 * max_piece_bytes is always enough), -1 for an id out of range; ditto_decoder_flush writes the
 * bytes still pending (an incomplete character as U+FFFD). */
DITTO_API DittoStatus ditto_decoder_new(const DittoModel *m, DittoDecoder **out);
DITTO_API long ditto_decoder_feed(DittoDecoder *d, int32_t id, int show_special, char *out,
                                  size_t cap);
DITTO_API long ditto_decoder_flush(DittoDecoder *d, char *out, size_t cap);
DITTO_API void ditto_decoder_free(DittoDecoder *d);

/* ---- sessions -------------------------------------------------------------------------- */

/* A session of n_ctx positions (1 <= n_ctx <= max_seq_len) evaluating in tiles of up to
 * n_batch tokens (1..512; 1 = one token at a time through forward()). */
DITTO_API DittoStatus ditto_session_new(DittoModel *m, int n_ctx, int n_batch, DittoSession **out,
                                        char *err, size_t errlen);
/* The same with the key and value caches' element types named as llama.cpp's --cache-type-k
 * and --cache-type-v name them: "f32" (what ditto_session_new gives) or "f16" (half the bytes;
 * each key and value rounded to nearest even, attention then widening them to float32).
 * Another name is DITTO_ERR_ARG. */
DITTO_API DittoStatus ditto_session_new_kv(DittoModel *m, int n_ctx, int n_batch,
                                           const char *type_k, const char *type_v,
                                           DittoSession **out, char *err, size_t errlen);
DITTO_API void ditto_session_free(DittoSession *s);
/* Positions filled (the next token goes there) and positions available. */
DITTO_API int ditto_session_pos(const DittoSession *s);
DITTO_API int ditto_session_ctx(const DittoSession *s);

/* Which logits ditto_session_eval() writes. */
enum { DITTO_LOGITS_NONE = 0, DITTO_LOGITS_LAST = 1, DITTO_LOGITS_ALL = 2 };

/* Append tokens[0..n) at positions pos..pos+n-1 (n >= 1, pos + n <= n_ctx, each id <
 * vocab_size), filling the KV cache, and advance the position by n. A single token runs
 * through forward(); several through prefill() in tiles of n_batch. logits_mode
 * DITTO_LOGITS_ALL writes the logits of every position into logits ([n][vocab_size] float32,
 * row t = after token t), DITTO_LOGITS_LAST those of the last token ([vocab_size]),
 * DITTO_LOGITS_NONE none (logits may be NULL). On an error nothing is evaluated and the
 * position is unchanged. */
DITTO_API DittoStatus ditto_session_eval(DittoSession *s, const int32_t *tokens, int n,
                                         int logits_mode, float *logits, char *err,
                                         size_t errlen);

/* Drop positions >= n_keep (0 <= n_keep <= pos): the next eval continues at n_keep. The KV
 * entries of positions < n_keep stay as they are. */
DITTO_API DittoStatus ditto_session_truncate(DittoSession *s, int n_keep, char *err,
                                             size_t errlen);

/* ---- sampling -------------------------------------------------------------------------- */

/* A sampler (sampler.h): temperature 0 is greedy argmax (the first largest logit); otherwise
 * softmax(logits / temperature) restricted to the top_k largest logits (top_k <= 0 or >=
 * vocab_size: all; ties at the k-th value kept) and then to the top_p nucleus (top_p >= 1:
 * all), drawn with SplitMix64 seeded by seed. */
DITTO_API DittoStatus ditto_sampler_new(const DittoModel *m, float temperature, int top_k,
                                        float top_p, uint64_t seed, DittoSampler **out,
                                        char *err, size_t errlen);
DITTO_API void ditto_sampler_free(DittoSampler *s);
/* Min-p filtering (llama.cpp's min_p sampler): after top_k, only the tokens whose logit is at
 * least the largest logit + log(min_p) stay, i.e. probability at temperature 1 at least min_p
 * times the most likely token's; then the temperature and top_p apply to those. 0 (the
 * default) turns it off. Greedy sampling is unaffected. DITTO_ERR_ARG when min_p is not in
 * [0, 1]. */
DITTO_API DittoStatus ditto_sampler_set_min_p(DittoSampler *s, float min_p, char *err,
                                              size_t errlen);
/* The next token from logits [vocab_size] (not modified). */
DITTO_API int32_t ditto_sample(DittoSampler *s, const float *logits);
/* Index of the largest of logits [vocab_size] (the first on ties). */
DITTO_API int32_t ditto_argmax(const DittoModel *m, const float *logits);

#endif
