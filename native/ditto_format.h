/* ditto_format.h: on-disk layout of a Ditto model file (.ditto), format version 1.
 *
 * The single source of truth for the layout is docs/FORMAT.md; this header mirrors it for the
 * C runtime and ditto_core/format.py mirrors it for the Python writer. tests/test_format_agree.py
 * checks that the constants and struct sizes here and in format.py agree.
 *
 * All integers and floats are little-endian. Structs are naturally aligned with no padding
 * (the static asserts below pin their sizes).
 */
#ifndef DITTO_FORMAT_H
#define DITTO_FORMAT_H

#include <stdint.h>

#define DITTO_MAGIC "DITTOMDL" /* 8 bytes, no terminator in the file */
#define DITTO_VERSION 1u
#define DITTO_HEADER_BYTES 64u
#define DITTO_ALIGN 64u /* every tensor payload starts at a multiple of this */
#define DITTO_NAME_BYTES 64u

/* model architectures */
#define DITTO_ARCH_LLAMA 1u

/* tensor encodings */
#define DITTO_ENC_F32 0u      /* row-major float32 [rows][cols] */
#define DITTO_ENC_CODEBOOK 1u /* sub-block codebook: see docs/FORMAT.md "Codebook tensors" */

/* codebook group size G: 2 <= G <= DITTO_MAX_GROUP_SIZE (2^24; any G >= cols has the same
 * layout as G = cols, and no config dimension exceeds 2^22) */
#define DITTO_MIN_GROUP_SIZE 2u
#define DITTO_MAX_GROUP_SIZE 16777216u

/* limits of a valid model file (docs/FORMAT.md "Validity rules"; ditto_core/format.py has the
 * same numbers and tests/test_format_agree.py checks they agree) */
#define DITTO_MAX_DIM 1048576u          /* dim and n_heads * head_dim: 2^20 */
#define DITTO_MAX_HIDDEN_DIM 4194304u   /* 2^22 */
#define DITTO_MAX_LAYERS 4096u
#define DITTO_MAX_VOCAB 16777216u       /* 2^24 */
#define DITTO_MAX_SEQ_LEN 2147483647u   /* positions are int in the runtime */
#define DITTO_MAX_F32_ELEMENTS 2147483647u /* the f32 GEMV indexes with int */
#define DITTO_MAX_WEIGHTS 1099511627776u   /* rows * cols of any tensor: 2^40 */

/* codebook element types */
#define DITTO_CB_F32 0u
#define DITTO_CB_F16 1u

/* tokenizer kinds */
#define DITTO_TOK_BPE_BYTES 1u /* byte-level BPE (GPT-2 style) with merges */
#define DITTO_TOK_SPM_BPE 2u   /* SentencePiece BPE: merge by piece score, byte fallback */

/* pre-tokenizers (byte-level BPE only) */
#define DITTO_PRE_NONE 0u
#define DITTO_PRE_GPT2 1u        /* GPT-2 split regex */
#define DITTO_PRE_GPT2_DIGITS 2u /* each digit split off, then the GPT-2 regex (SmolLM2) */

/* token types (same numbering as GGUF tokenizer.ggml.token_type) */
#define DITTO_TT_NORMAL 1u
#define DITTO_TT_UNKNOWN 2u
#define DITTO_TT_CONTROL 3u
#define DITTO_TT_USER_DEFINED 4u
#define DITTO_TT_UNUSED 5u
#define DITTO_TT_BYTE 6u

/* chat formats */
#define DITTO_CHAT_NONE 0u
#define DITTO_CHAT_CHATML 1u /* <|im_start|>role\ncontent<|im_end|>\n */

typedef struct {
    char magic[8];      /* DITTO_MAGIC */
    uint32_t version;   /* DITTO_VERSION */
    uint32_t crc32;     /* CRC-32 (IEEE 802.3, as zlib.crc32) of bytes [64, file_size) */
    uint64_t file_size; /* total bytes in the file */
    uint64_t meta_size; /* bytes of config + tensor table + tokenizer, starting at offset 64 */
    uint8_t reserved[32];
} DittoHeader; /* 64 bytes */

typedef struct {
    uint32_t arch; /* DITTO_ARCH_LLAMA */
    uint32_t dim;
    uint32_t hidden_dim;
    uint32_t n_layers;
    uint32_t n_heads;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t vocab_size;
    uint32_t max_seq_len;
    float rope_theta;
    float norm_eps;
    uint32_t tied_embeddings; /* 1: classifier is token_embd.weight, no output.weight */
    uint32_t n_tensors;
    uint32_t reserved[3];
} DittoConfig; /* 64 bytes */

typedef struct {
    char name[DITTO_NAME_BYTES]; /* NUL-padded, e.g. "blk.0.attn_q.weight" */
    uint32_t encoding;           /* DITTO_ENC_* */
    uint32_t codebook_type;      /* DITTO_CB_* (codebook tensors), 0 otherwise */
    uint32_t bits;               /* b: bits per index (1..8), 0 for f32 */
    uint32_t group_size;         /* G: weights per sub-block, 0 for f32 */
    uint64_t rows;               /* output channels; 1 for a vector */
    uint64_t cols;               /* input channels / vector length */
    uint64_t offset;             /* payload byte offset from file start, multiple of 64 */
    uint64_t nbytes;             /* payload bytes */
    uint32_t ndim;               /* 1 or 2 */
    uint32_t reserved[3];
} DittoTensorEntry; /* 128 bytes */

typedef struct {
    uint32_t kind;       /* DITTO_TOK_* */
    uint32_t pre;        /* DITTO_PRE_* */
    uint32_t n_tokens;   /* == config.vocab_size */
    uint32_t n_merges;   /* byte-level BPE only, else 0 */
    int32_t bos_id;      /* -1: none */
    int32_t eos_id;      /* -1: none */
    int32_t unk_id;      /* -1: none */
    int32_t pad_id;      /* -1: none */
    uint32_t add_bos;    /* 1: prepend BOS when encoding a prompt by default */
    uint32_t add_space_prefix; /* SentencePiece: prepend U+2581 to the text */
    uint32_t chat_format;      /* DITTO_CHAT_* */
    uint32_t blob_bytes;       /* bytes of the token text blob (before 4-byte padding) */
    uint32_t template_bytes;   /* bytes of the chat template text (before padding) */
    uint32_t reserved[3];
} DittoTokenizerHeader; /* 64 bytes */

_Static_assert(sizeof(DittoHeader) == 64, "DittoHeader is 64 bytes");
_Static_assert(sizeof(DittoConfig) == 64, "DittoConfig is 64 bytes");
_Static_assert(sizeof(DittoTensorEntry) == 128, "DittoTensorEntry is 128 bytes");
_Static_assert(sizeof(DittoTokenizerHeader) == 64, "DittoTokenizerHeader is 64 bytes");

#endif
