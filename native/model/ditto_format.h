/* ditto_format.h: on-disk layout of a Ditto model file (.ditto), format versions 1 and 2.
 *
 * The single source of truth for the layout is docs/FORMAT.md; this header mirrors it for the
 * C runtime and ditto_core/model/format.py mirrors it for the Python writer. tests/test_format_agree.py
 * checks that the constants and struct sizes here and in format.py agree.
 *
 * All integers and floats are little-endian. Structs are naturally aligned with no padding
 * (the static asserts below pin their sizes).
 */
#ifndef DITTO_FORMAT_H
#define DITTO_FORMAT_H

#include <stdint.h>

#define DITTO_MAGIC "DITTOMDL" /* 8 bytes, no terminator in the file */
#define DITTO_VERSION 2u     /* newest version written (2: tokenizer flags + extension) */
#define DITTO_VERSION_MIN 1u /* oldest version read (1: tokenizer flags and ext_bytes zero) */
#define DITTO_HEADER_BYTES 64u
#define DITTO_ALIGN 64u /* every tensor payload starts at a multiple of this */
#define DITTO_NAME_BYTES 64u

/* model architectures (docs/FORMAT.md "Config") */
#define DITTO_ARCH_LLAMA 1u /* Llama decoder */
#define DITTO_ARCH_QWEN2 2u /* Llama decoder + f32 biases on the q, k and v projections */

/* tensor encodings */
#define DITTO_ENC_F32 0u      /* row-major float32 [rows][cols] */
#define DITTO_ENC_CODEBOOK 1u /* sub-block codebook: see docs/FORMAT.md "Codebook tensors" */

/* codebook group size G: 2 <= G <= DITTO_MAX_GROUP_SIZE (2^24; any G >= cols has the same
 * layout as G = cols, and no config dimension exceeds 2^22) */
#define DITTO_MIN_GROUP_SIZE 2u
#define DITTO_MAX_GROUP_SIZE 16777216u

/* limits of a valid model file (docs/FORMAT.md "Validity rules"; ditto_core/model/format.py has the
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
#define DITTO_CB_I8 2u /* int8 centroids [rows][S][K], then f16 scales [rows][S] */

/* tokenizer kinds */
#define DITTO_TOK_BPE_BYTES 1u /* byte-level BPE (GPT-2 style) with merges */
#define DITTO_TOK_SPM_BPE 2u   /* SentencePiece BPE: merge by piece score, byte fallback */

/* pre-tokenizers (byte-level BPE only) */
#define DITTO_PRE_NONE 0u
#define DITTO_PRE_GPT2 1u        /* GPT-2 split regex */
#define DITTO_PRE_GPT2_DIGITS 2u /* each digit split off, then the GPT-2 regex (SmolLM2) */
#define DITTO_PRE_QWEN2 3u       /* the Qwen2 / Llama-3 split regex, single digits */

/* token types (same numbering as GGUF tokenizer.ggml.token_type) */
#define DITTO_TT_NORMAL 1u
#define DITTO_TT_UNKNOWN 2u
#define DITTO_TT_CONTROL 3u
#define DITTO_TT_USER_DEFINED 4u
#define DITTO_TT_UNUSED 5u
#define DITTO_TT_BYTE 6u

/* tokenizer flags (DittoTokenizerHeader.flags, version 2; docs/FORMAT.md "Tokenizer flags") */
#define DITTO_TOKF_ADDED_RECORDS 0x1u /* added tokens are the ADDED records (HF semantics) */
#define DITTO_TOKF_PREFIX_SPACE 0x2u  /* byte-level: prepend ' ' to a piece not starting so */
#define DITTO_TOKF_MS_SHIFT 2u        /* bits 2-3: Metaspace step, DITTO_MS_* */
#define DITTO_TOKF_MS_MASK 0xCu
#define DITTO_TOKF_MS_SPLIT 0x10u     /* Metaspace split: every U+2581 starts a new word */
#define DITTO_TOKF_RANK_MERGES 0x20u  /* SentencePiece kind: HF BPE by merge rank, byte fallback */
#define DITTO_TOKF_FUSE_UNK 0x40u     /* consecutive unk ids become one */
#define DITTO_TOKF_DECODE_STRIP 0x80u /* decoding drops one leading space of the text */
#define DITTO_TOKF_DECODE_METASPACE 0x100u /* HF Metaspace decoder: <0xXX> pieces print as
                                             text; with DECODE_STRIP the first piece loses
                                             every U+2581 */
#define DITTO_TOKF_ALL 0x1FFu

/* Metaspace step (flags bits 2-3): ' ' -> U+2581 and the prepend scheme */
#define DITTO_MS_NONE 0u   /* no Metaspace pre-tokenizer */
#define DITTO_MS_ALWAYS 1u /* prepend U+2581 to every piece not starting with it */
#define DITTO_MS_FIRST 2u  /* only to the piece at offset 0 of the text */
#define DITTO_MS_NEVER 3u

/* records of the tokenizer extension section (version 2): u32 tag, u32 a, u32 b, u32 len,
 * then len bytes zero-padded to a multiple of 4 */
#define DITTO_TX_LOWERCASE 1u /* normalizer Lowercase (Unicode, per character) */
#define DITTO_TX_STRIP 2u     /* normalizer Strip: a = left, b = right */
#define DITTO_TX_REPLACE 3u   /* normalizer Replace: a = pattern bytes, payload pattern+content */
#define DITTO_TX_PREPEND 4u   /* normalizer Prepend: payload */
#define DITTO_TX_NFC 5u       /* normalizers NFC, NFD, NFKC, NFKD (HF tokenizers' data) */
#define DITTO_TX_NFD 6u
#define DITTO_TX_NFKC 7u
#define DITTO_TX_NFKD 8u
#define DITTO_TX_ADDED 16u    /* added token: a = id, b = DITTO_ADDED_*, payload = text matched */
#define DITTO_TX_CHAT_PREFIX 32u /* chat template text before the user message */
#define DITTO_TX_CHAT_SUFFIX 33u /* chat template text after it (ends the generation prompt) */
#define DITTO_TX_EOG 48u         /* end-of-generation token: a = id (no payload) */
#define DITTO_TX_FIM 49u         /* fill-in-the-middle token: a = id, b = DITTO_FIM_* */

/* FIM roles (DITTO_TX_FIM record b) */
#define DITTO_FIM_PREFIX 0u /* <|fim_prefix|> */
#define DITTO_FIM_SUFFIX 1u /* <|fim_suffix|> */
#define DITTO_FIM_MIDDLE 2u /* <|fim_middle|> */
#define DITTO_FIM_PAD 3u    /* <|fim_pad|> */
#define DITTO_FIM_REPO 4u   /* <|repo_name|> */
#define DITTO_FIM_SEP 5u    /* <|file_sep|> */
#define DITTO_FIM_ROLES 6u

#define DITTO_ADDED_SPECIAL 0x1u
#define DITTO_ADDED_LSTRIP 0x2u
#define DITTO_ADDED_RSTRIP 0x4u
#define DITTO_ADDED_NORMALIZED 0x8u /* matched in the normalized text (payload normalized) */
#define DITTO_ADDED_SINGLE_WORD 0x10u /* matched only with no word character next to it */

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
    uint32_t arch; /* DITTO_ARCH_LLAMA or DITTO_ARCH_QWEN2 */
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
    uint32_t flags;            /* DITTO_TOKF_* (version 2; 0 in version 1) */
    uint32_t ext_bytes;        /* bytes of the extension section (a multiple of 4) */
    uint32_t reserved;
} DittoTokenizerHeader; /* 64 bytes */

/* The CODEBOOK encoding (docs/FORMAT.md "encoding = 1"): element types, sizes and the b-bit
 * index packing, for every part of the runtime that reads a payload. ditto_core/model/codebook.py is
 * the Python twin; tests/test_format_agree.py compiles these functions with clang-22 and checks
 * they give its numbers. Callers check b in 1..8, G in DITTO_MIN..MAX_GROUP_SIZE and
 * rows * cols <= DITTO_MAX_WEIGHTS first, so no size below overflows 64 bits. */

/* bytes per stored centroid value; 0 for an unknown codebook type */
static inline uint64_t ditto_cb_elem_bytes(uint32_t codebook_type) {
    return codebook_type == DITTO_CB_F32 ? 4u : codebook_type == DITTO_CB_F16 ? 2u
           : codebook_type == DITTO_CB_I8 ? 1u : 0u;
}

/* bytes per sub-block on top of its centroids (int8: the f16 scale) */
static inline uint64_t ditto_cb_scale_bytes(uint32_t codebook_type) {
    return codebook_type == DITTO_CB_I8 ? 2u : 0u;
}

/* S = ceil(cols / G) sub-blocks per row */
static inline uint64_t ditto_cb_n_sub(uint64_t cols, uint64_t group_size) {
    return (cols + group_size - 1) / group_size;
}

/* bytes of one packed row of b-bit indices: ceil(cols / 8) * b */
static inline uint64_t ditto_cb_row_bytes(uint64_t cols, uint32_t bits) {
    return (cols + 7) / 8 * bits;
}

/* bytes of the rows * S * 2^b centroids (where the int8 scales start) */
static inline uint64_t ditto_cb_centroid_bytes(uint64_t rows, uint64_t cols, uint32_t bits,
                                               uint64_t group_size, uint32_t codebook_type) {
    return rows * ditto_cb_n_sub(cols, group_size) * (UINT64_C(1) << bits) *
           ditto_cb_elem_bytes(codebook_type);
}

/* the codebook part of a payload, padded to DITTO_ALIGN: centroids, then (int8) the scales;
 * the packed indices start here */
static inline uint64_t ditto_cb_codebook_bytes(uint64_t rows, uint64_t cols, uint32_t bits,
                                               uint64_t group_size, uint32_t codebook_type) {
    uint64_t n = ditto_cb_centroid_bytes(rows, cols, bits, group_size, codebook_type) +
                 rows * ditto_cb_n_sub(cols, group_size) * ditto_cb_scale_bytes(codebook_type);
    return (n + DITTO_ALIGN - 1) / DITTO_ALIGN * DITTO_ALIGN;
}

/* payload bytes of a CODEBOOK tensor (DittoTensorEntry.nbytes) */
static inline uint64_t ditto_cb_payload_bytes(uint64_t rows, uint64_t cols, uint32_t bits,
                                              uint64_t group_size, uint32_t codebook_type) {
    return ditto_cb_codebook_bytes(rows, cols, bits, group_size, codebook_type) +
           rows * ditto_cb_row_bytes(cols, bits);
}

/* The group of 8 indices holding index c of a packed row: its b bytes as one little-endian
 * integer of 8*b bits; index c is bits [(c % 8) * b, (c % 8 + 1) * b) of it. */
static inline uint64_t ditto_cb_group(const uint8_t *row, uint64_t c, uint32_t bits) {
    const uint8_t *p = row + c / 8 * bits;
    uint64_t v = 0;
    for (uint32_t i = 0; i < bits; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* index c of a packed row of b-bit indices */
static inline uint32_t ditto_cb_index(const uint8_t *row, uint64_t c, uint32_t bits) {
    return (uint32_t)(ditto_cb_group(row, c, bits) >> (c % 8 * bits)) & ((1u << bits) - 1u);
}

_Static_assert(sizeof(DittoHeader) == 64, "DittoHeader is 64 bytes");
_Static_assert(sizeof(DittoConfig) == 64, "DittoConfig is 64 bytes");
_Static_assert(sizeof(DittoTensorEntry) == 128, "DittoTensorEntry is 128 bytes");
_Static_assert(sizeof(DittoTokenizerHeader) == 64, "DittoTokenizerHeader is 64 bytes");

#endif
