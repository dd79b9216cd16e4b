/* tokenizer.h: text <-> token ids for the two tokenizer kinds of docs/FORMAT.md.
 *
 * Byte-level BPE (GPT-2 style, with the model's pre-tokenizer and merges in rank order) and
 * SentencePiece BPE (merge the adjacent pair whose merged piece has the highest score; bytes
 * without a piece fall back to <0xXX> tokens).
 */
#ifndef DITTO_TOKENIZER_H
#define DITTO_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../model/ditto_format.h"

typedef struct Tokenizer Tokenizer; /* opaque; defined in tokenizer.c */

/* Build a tokenizer from the tokenizer block of a model file (block points at the
 * DittoTokenizerHeader, block_len bytes are readable). n_vocab is config.vocab_size.
 * Returns NULL and writes a message to err (errlen bytes) on a malformed block. */
Tokenizer *tokenizer_new(const uint8_t *block, size_t block_len, uint32_t n_vocab, char *err,
                         size_t errlen);
void tokenizer_free(Tokenizer *t);

/* Encode len bytes of UTF-8 text. parse_special: control/user-defined token texts
 * (e.g. "<|im_start|>") become single tokens; otherwise they are plain text. add_bos:
 * prepend the BOS id. Writes at most max_ids ids; returns the number of ids the text needs
 * (which may exceed max_ids: call again with a larger buffer), or -1 on invalid UTF-8 with a
 * message in err. */
long tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int parse_special,
                      int add_bos, int32_t *ids, size_t max_ids, char *err, size_t errlen);

/* As tokenizer_encode, with special tokens parsed everywhere except in text[lo, hi) (the user's
 * message inside a chat template; lo = hi = 0 parses them everywhere). No special-token match
 * crosses lo or hi, so the template's own tokens stay whole whatever the user typed. */
long tokenizer_encode_range(const Tokenizer *t, const char *text, size_t len, size_t lo,
                            size_t hi, int add_bos, int32_t *ids, size_t max_ids, char *err,
                            size_t errlen);

/* The model's chat template reduced to the fixed text before and after the user's message
 * (rendered at export); returns 0 when the model file has none. */
int tokenizer_chat_text(const Tokenizer *t, const char **prefix, size_t *prefix_len,
                        const char **suffix, size_t *suffix_len);

/* Streaming decoder: bytes of a token sequence, emitted so that a UTF-8 character split over
 * several tokens comes out whole. */
typedef struct {
    uint8_t pending[8];
    int n_pending;
    int at_start; /* SentencePiece: drop the leading space of the first piece */
} TokenDecoder;

void token_decoder_init(TokenDecoder *d);
/* Append the bytes of token id to out (capacity cap; cap >= tokenizer_max_decode_bytes(t) is
 * always enough, a smaller cap truncates); returns bytes written. Control tokens (BOS/EOS...)
 * produce no bytes unless show_special. Bytes that are not valid UTF-8 come out as U+FFFD. */
size_t token_decode(const Tokenizer *t, TokenDecoder *d, int32_t id, int show_special, char *out,
                    size_t cap);
/* Flush bytes still pending at the end (an incomplete character is written as U+FFFD). */
size_t token_decoder_flush(TokenDecoder *d, char *out, size_t cap);

/* Largest number of bytes one token_decode call can write (SmolLM2 has 162-byte tokens). */
size_t tokenizer_max_decode_bytes(const Tokenizer *t);
uint32_t tokenizer_n_tokens(const Tokenizer *t);

int32_t tokenizer_bos(const Tokenizer *t);
int32_t tokenizer_eos(const Tokenizer *t);
/* 1 if token id ends generation: one of the model file's end-of-generation tokens (EOG records:
 * EOS, <|im_end|>, <|endoftext|>, <|fim_pad|>... as llama.cpp), or the EOS id for a file
 * without them; 0 otherwise (ids out of range included). */
int tokenizer_is_eog(const Tokenizer *t, int32_t id);
/* The fill-in-the-middle token of role (DITTO_FIM_PREFIX .. DITTO_FIM_SEP), or -1. */
int32_t tokenizer_fim(const Tokenizer *t, uint32_t role);
/* The FIM prompt [BOS] <fim_prefix> prefix <fim_suffix> suffix <fim_middle> (prefix-suffix-
 * middle order, llama.cpp's infill), prefix and suffix encoded with control-token texts as
 * plain text. Writes at most max_ids ids; returns the number the prompt needs, or -1 with a
 * message in err (no FIM prefix/suffix/middle token: check tokenizer_fim first; invalid
 * UTF-8). */
long tokenizer_encode_fim(const Tokenizer *t, const char *prefix, size_t prefix_len,
                          const char *suffix, size_t suffix_len, int add_bos, int32_t *ids,
                          size_t max_ids, char *err, size_t errlen);
uint32_t tokenizer_chat_format(const Tokenizer *t);
/* id of a token with exactly this text (used for chat markers), or -1 */
int32_t tokenizer_find(const Tokenizer *t, const char *text);

#endif
