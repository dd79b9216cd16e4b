/* model.h: open a Ditto model file (docs/FORMAT.md), validate it, and give typed access to its
 * tensors.
 *
 * The file is read into memory in 2 MiB pages where Linux gives them, else mmapped read-only
 * (model_open's ModelLoad); f32 payloads are used in place (every payload is 64-byte aligned),
 * codebook payloads are decoded on the fly by the kernels in matmul.c. Nothing in the file is
 * trusted before model_open() has checked it: magic, version, size, CRC-32, config, and
 * every tensor's offset, length, alignment, encoding and shape.
 */
#ifndef DITTO_MODEL_H
#define DITTO_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "ditto_format.h"

/* One tensor of the file, as the kernels see it. */
typedef struct {
    const char *name;      /* points into the tensor table (NUL-terminated after validation) */
    uint32_t encoding;     /* DITTO_ENC_F32 or DITTO_ENC_CODEBOOK */
    uint32_t codebook_type;/* DITTO_CB_F16 / DITTO_CB_F32 (codebook tensors) */
    uint32_t bits;         /* b, 1..8 (codebook tensors) */
    uint32_t group_size;   /* G, >= 2 (codebook tensors) */
    uint64_t rows, cols;   /* [out_features, in_features]; a vector is rows = 1 */
    const uint8_t *data;   /* payload start (inside Model.map) */
    uint64_t nbytes;
    /* int8 codebooks: the weights decoded to int8 at load, [rows][roundup(cols, 32)] (the
     * centroid of each index, zero past cols; kernels_decode_tensor), or NULL */
    int8_t *w8;
    uint32_t ndim;         /* 1 (a vector) or 2 (a matrix), as in the tensor table */
    /* b = 4 int8 codebooks: the index bytes put in row tiles in place at load
     * (kernels_tile_tensor, qgemv.h i8_b4_at), so the file's row order no longer holds */
    uint32_t tiled;
} Tensor;

/* The tensors of one transformer block (FORMAT.md "Tensor names"). */
typedef struct {
    const Tensor *attn_norm; /* [dim] f32 */
    const Tensor *wq;        /* attn_q      [n_heads*head_dim, dim] */
    const Tensor *wk;        /* attn_k      [n_kv_heads*head_dim, dim] */
    const Tensor *wv;        /* attn_v      [n_kv_heads*head_dim, dim] */
    const Tensor *bq;        /* attn_q.bias [n_heads*head_dim] f32 (Qwen2), else NULL */
    const Tensor *bk;        /* attn_k.bias [n_kv_heads*head_dim] f32 (Qwen2), else NULL */
    const Tensor *bv;        /* attn_v.bias [n_kv_heads*head_dim] f32 (Qwen2), else NULL */
    const Tensor *wo;        /* attn_output [dim, n_heads*head_dim] */
    const Tensor *ffn_norm;  /* [dim] f32 */
    const Tensor *w_gate;    /* ffn_gate [hidden_dim, dim] */
    const Tensor *w_up;      /* ffn_up   [hidden_dim, dim] */
    const Tensor *w_down;    /* ffn_down [dim, hidden_dim] */
} LayerWeights;

typedef struct {
    char path[1024];         /* for messages */
    uint8_t *map;            /* whole file, read-only after model_open */
    int mapped;              /* map is an mmap of the file (munmap), else read into memory */
    size_t size;
    DittoConfig config;      /* copied out of the file */
    Tensor *tensors;         /* n_tensors entries, file order */
    uint32_t n_tensors;
    const Tensor *token_embd;  /* [vocab, dim] */
    const Tensor *output_norm; /* [dim] f32 */
    const Tensor *output;      /* classifier [vocab, dim]: token_embd when tied */
    LayerWeights *layers;      /* n_layers entries */
    const uint8_t *tokenizer_block; /* DittoTokenizerHeader + arrays */
    size_t tokenizer_block_len;
} Model;

/* Expected payload bytes of a tensor with this encoding and shape (FORMAT.md "Encodings"),
 * or 0 if the parameters are invalid. */
uint64_t tensor_expected_nbytes(uint32_t encoding, uint32_t codebook_type, uint32_t bits,
                                uint32_t group_size, uint64_t rows, uint64_t cols);

/* CRC-32 (IEEE 802.3 polynomial, reflected, as zlib.crc32) of len bytes, continuing from crc
 * (start with 0). Slice-by-8 table method. */
uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t len);

/* How model_open() brings the file into memory. */
typedef enum {
    /* MODEL_LOAD_READ when Linux's transparent huge pages are on and a copy fits the memory
     * available (MemAvailable, a cgroup v2 memory.max), else MODEL_LOAD_MMAP */
    MODEL_LOAD_AUTO = 0,
    /* mmap the file read-only: page-cache pages (2 MiB only where the cache holds 2 MiB
     * folios), shared with other processes mapping the same file, no copy at open */
    MODEL_LOAD_MMAP = 1,
    /* read() the file into anonymous memory marked MADV_HUGEPAGE (2 MiB pages where Linux
     * gives them: decode reads the weights faster); mapped instead when that memory cannot be
     * allocated */
    MODEL_LOAD_READ = 2,
} ModelLoad;

/* *load from the environment variable DITTO_MMAP: 1 MODEL_LOAD_MMAP, 0 MODEL_LOAD_READ, unset
 * or empty MODEL_LOAD_AUTO (the default of ditto-run, whose --mmap overrides it, and of
 * ditto_model_open()). Returns 0, or -1 with a message in err for any other value. */
int model_load_from_env(ModelLoad *load, char *err, size_t errlen);

/* Bring the file at path into memory (load) and validate it. On success returns 0 and fills
 * m. On failure returns -1 with a message naming the file and the problem in err (errlen
 * bytes); m holds nothing that needs freeing. */
int model_open(Model *m, const char *path, ModelLoad load, char *err, size_t errlen);
void model_close(Model *m);

#endif
