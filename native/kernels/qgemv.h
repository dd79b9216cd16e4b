/* qgemv.h: integer GEMV for int8 codebook tensors (docs/FORMAT.md "int8 codebooks",
 * docs/KERNELS.md "Integer kernels").
 *
 * The input vector x is quantized once per GEMV input (act_quantize) into int8 values in blocks
 * of 32 with a two-level scale: x[c] ~ D * m[c/32] * q[c], D one float32 for the whole vector,
 * m a block multiplier in 0..255, q in -127..127. Every row and thread shares that buffer. A
 * weight is s[r][sb] * cent[r][sb][idx] with cent an int8 in -127..127 and s an f16 scale. The
 * result is defined exactly by the scalar reference i8cb_rows_generic:
 *
 *   T[r][sb] = sum over the columns c of sub-block sb of m[c/32] * q[c] * cent[r][sb][idx[r][c]]
 *              (exact integer: every kernel computes the same int64)
 *   acc = 0.0 (double); for sb = 0, 1, ...: acc = acc + (double)s[r][sb] * (double)T[r][sb]
 *   y[r] = (float)(acc * (double)D)
 *
 * so every SIMD kernel, which only changes how the integer sums are formed, gives the same bits.
 */
#ifndef DITTO_QGEMV_H
#define DITTO_QGEMV_H

#include <stddef.h>
#include <stdint.h>

#include "codebook_ref.h"

#define QA_BLOCK 32   /* activation quantization block (columns) */
#define QA_PAD 64     /* the activation arrays are zero-padded to a multiple of this */
#define QA_MMAX 255   /* largest block multiplier m */
#define QA_QMAX 127   /* largest |q| */

/* One quantized GEMV input (x of length n). Arrays hold n_pad = roundup(n, QA_PAD) entries, the
 * ones past n zero; blocks past the last are m = 0. */
typedef struct {
    int n, n_pad;
    float D;        /* x[c] ~ D * m[c/32] * q[c]; NaN when x has a NaN or an infinity */
    uint8_t *m;     /* [n_pad / 32] block multipliers, 0..255 (0: an all-zero block) */
    int16_t *m16;   /* the same as int16 (broadcast by the AVX2 kernels) */
    int8_t *q;      /* [n_pad] natural column order, -127..127 */
    /* "perm32" order, shared by the SIMD kernels: within each block of 32 columns, the 16 even
     * columns first, then the 16 odd ones (the order a 16-byte run of b = 4 indices gives when
     * its low nibbles and its high nibbles are taken apart) */
    int8_t *qp;     /* q in perm32 order */
    uint8_t *aqp;   /* |qp| */
    /* "perm64" order, read by the AVX2 tiled four-row b = 4 kernel: per 64 columns (A, B),
     * the 16 evens of A, the 16 evens of B, the 16 odds of A, the 16 odds of B (perm32 with
     * the middle two 16-byte runs swapped), so one 32-byte load holds the activations that
     * the low (high) nibbles of the 64 columns' 32 index bytes meet */
    int8_t *qp64;   /* q in perm64 order */
    uint8_t *aqp64; /* |qp64| */
    int16_t *m64;   /* per 64 columns: m of A eight times, then m of B eight times (n_pad / 4) */
    /* "perm128" order, read by the 128-column VNNI kernels: within each chunk of 128 columns,
     * the 64 even columns, then the 64 odd ones (the order the low and the high nibbles of 64
     * b = 4 index bytes give). m * q = 256 * mh + ml with ml in -128..127, mh in -127..127
     * (signed bytes, the second operand of vpdpbusd). n_pad + 64 entries (a multiple of 128
     * covers the columns), zero past n. */
    int8_t *ml;
    int8_t *mh;
    int8_t *nl;     /* ml and mh in natural column order (n_pad entries), for b = 6 */
    int8_t *nh;
    int32_t *msum;  /* [n_pad / 32] sum of m * q over block j (natural order) */
    int has_vnni;   /* ml, mh, nl, nh and msum are filled */
    int has_perm;   /* qp, aqp, qp64, aqp64 and m64 are filled (not under ACT_PLAIN) */
    size_t cap;     /* allocated n_pad */
} QuantActs;

/* The T inputs of a GEMM prepared once for every chunk of rows and every thread that runs it
 * (kernels.h KernelTable.i8_gemm_prep): for the pair-form GEMMs (avx2, avxvnni), each group of
 * GEMM_PREP_GROUP (6) inputs' int16 m * q column pairs interleaved,
 * pairs[(g * n_pad / 2 + k) * 6 + j] = input 6g + j's columns 2k and 2k + 1 (zero past the T
 * inputs), gemm_pairs_len(T, n_pad) entries. */
#define GEMM_PREP_GROUP 6
typedef struct {
    const QuantActs *qa; /* the inputs it was made from */
    const int32_t *pairs;
    int T, n_pad;
} GemmPrep;

static inline size_t gemm_pairs_len(int T, int n_pad) {
    const size_t groups = ((size_t)T + GEMM_PREP_GROUP - 1) / GEMM_PREP_GROUP;
    return groups * GEMM_PREP_GROUP * (size_t)n_pad / 2;
}

/* Most inputs a GEMM over int8 codebooks takes through its few-input path (kernels.h
 * I8GemmFn): the row kernels, several inputs per decoded weight, which read the VNNI arrays
 * (gemm_i8_float_input makes them for T up to this). Speculative verification (up to 9 tokens)
 * and short prefills fall under it; beyond it the panel GEMMs are faster. */
#define GEMM_FEW_MAX 16

/* act_quantize() flags: ACT_VNNI also fills the VNNI arrays; ACT_PLAIN fills only D, m, m16 and
 * q (what the panel GEMMs read: kernels.h KernelTable.gemm_plain_acts), no perm32, perm64 or
 * VNNI arrays (ACT_VNNI is then ignored). */
#define ACT_VNNI 1
#define ACT_PLAIN 2

/* Quantize x[n] into qa (growing its arrays as needed; a zeroed QuantActs is empty). Per block
 * j of 32: a_j = max |x| of the block, A = max_j a_j, D = A / (127 * 255) (float32),
 * m_j = min(255, ceil(a_j / (127 * D))) (0 when a_j = 0), and q[c] = clamp(rint(x[c] * inv_j),
 * -127, 127) with inv_j = 1 / (D * m_j), all in float32, rint rounding half to even. A = 0
 * gives D = 0 and all q = 0; a NaN or infinity in x gives D = NaN (so every y is NaN). Also
 * fills the perm32 and perm64 arrays unless flags has ACT_PLAIN, and the VNNI ones when it has
 * ACT_VNNI. Returns 0, or -1 when out of memory (qa unchanged). */
int act_quantize(QuantActs *qa, const float *x, int n, int flags);

/* act_quantize() runs the active kernel table's form (kernels.h); this scalar one defines the
 * result, and every SIMD form gives the same bytes. */
int act_quantize_generic(QuantActs *qa, const float *x, int n, int flags);

/* Shared by the act_quantize forms: grow qa's arrays to n_pad entries (0, or -1 when out of
 * memory, qa unchanged); block j's multiplier m from a = max |x| of the block (0 when a = 0
 * or x is not finite), with *inv = 1 / (D * m); the VNNI arrays from qp and m. */
int act_reserve(QuantActs *qa, size_t n_pad);
int act_block_m(float a, float D, int finite, float *inv);
void act_fill_vnni(QuantActs *qa);
/* The perm64 arrays qp64 and aqp64 from qp and aqp, and m64 from m16 (every act_quantize
 * form fills them; the AVX2 form with its own moves, the same bytes). */
void act_fill_perm64(QuantActs *qa);

/* For the perm128 VNNI kernels, which multiply the unsigned bytes w + 128 (w a centroid) by
 * the signed bytes of m * q: corr[s] = 128 * sum of m * q over the columns of sub-block s
 * (G columns, G % 32 == 0, the last one cut at cols), modulo 2^32, so T[s] = (their sum) -
 * corr[s]. */
void act_vnni_corrections(uint32_t *corr, const QuantActs *qa, int n_sub, int G, int cols);

void act_free(QuantActs *qa);

/* Where things are in an int8 codebook payload (FORMAT.md): centroids int8 [rows][S][K], then
 * scales f16 [rows][S], padded to 64 bytes, then the packed indices. */
typedef struct {
    const int8_t *cent;
    const uint16_t *scale; /* f16 bits */
    const uint8_t *indices;
    const uint8_t *end;    /* one past the last index byte */
    int bits, group_size, n_sub, k;
    size_t row_bytes;
    const int8_t *w8;      /* the decoded weights (Tensor.w8), NULL when not decoded */
    int tiled;             /* b = 4 indices in row tiles (Tensor.tiled; i8_b4_at below) */
} I8Layout;

/* b = 4 index bytes in tiles of I8_TILE_ROWS rows (kernels_tile_tensor, at load): within a
 * tile, the I8_TILE_CHUNK-byte chunk j (64 columns) of its row i sits at byte
 * (j * I8_TILE_ROWS + i) * I8_TILE_CHUNK, so a kernel taking four rows at a time reads one
 * sequential stream. Four concurrent row streams held the b = 4 GEMV at ~65 % of a
 * sequential read from DRAM on the Zen 3 measured (docs/KERNELS.md "Row tiles"). Only
 * tensors where every tile and chunk is whole are tiled (i8_tiles_fit). */
#define I8_TILE_ROWS 4
#define I8_TILE_CHUNK 32
/* Whether a b-bit tensor of rows x cols with sub-blocks of G (G <= cols) can be tiled: b = 4,
 * whole tiles (rows % 4), whole chunks (cols % 64), sub-blocks of whole chunks no longer than
 * the four-row kernels take (G % 64, G <= 512: sub-block sums in int32). */
static inline int i8_tiles_fit(int bits, int G, int rows, int cols) {
    return bits == 4 && rows % I8_TILE_ROWS == 0 && cols % 64 == 0 && G % 64 == 0 && G <= 512;
}
/* The index byte of column c (even) of row r, tiled or not; 16 bytes on from it are the same
 * row's when c % 32 == 0, 32 bytes when c % 64 == 0. */
static inline const uint8_t *i8_b4_at(const I8Layout *L, int r, int c) {
    if (!L->tiled) return L->indices + (size_t)r * L->row_bytes + (size_t)c / 2;
    return L->indices + (size_t)(r - r % I8_TILE_ROWS) * L->row_bytes +
           ((size_t)(c / 64) * I8_TILE_ROWS + (size_t)(r % I8_TILE_ROWS)) * I8_TILE_CHUNK +
           (size_t)(c % 64) / 2;
}
/* Put the b = 4 indices of rows x row_bytes (file order) in row tiles in place, one tile at a
 * time through tmp[I8_TILE_ROWS * row_bytes]; rows % I8_TILE_ROWS == 0, row_bytes %
 * I8_TILE_CHUNK == 0. */
void i8_retile(uint8_t *indices, int rows, size_t row_bytes, uint8_t *tmp);

I8Layout i8_layout(const uint8_t *payload, int bits, int group_size, int rows, int cols);

/* y[r] for rows r in [r0, r1): the reference (any b in 1..8, any G >= 2), exact integer
 * arithmetic as defined at the top of this file. qa->n must equal cols. */
void i8cb_rows_generic(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                       int cols);

/* The float part shared by every kernel: y = (float)(D * sum_sb s[sb] * T[sb]) in sub-block
 * order, given the row's exact integer sums T[0..n_sub). */
float i8_combine(const I8Layout *L, int r, const int64_t *T, float D);

/* The b = 4 index bytes of the row's last, partial 32-column chunk starting at column c (a
 * multiple of 32): ceil((cols - c) / 8) * 4 bytes copied into out[16], the rest zero (so
 * the padding columns look up centroid 0 and meet q = 0). */
void i8_tail_indices(uint8_t out[16], const uint8_t *row, int c, int cols);

/* Weights decoded to int8 (Tensor.w8, I8Layout.w8) lie in tiles of DEC8_TILE rows, so that a
 * GEMV taking DEC8_TILE rows at a time reads one sequential stream (four streams, one per
 * row, leave the hardware prefetchers behind on a classifier of 136 MB; docs/KERNELS.md
 * "Decoded classifier"). Rows are padded with zeros to a multiple of 32 columns
 * (dec8_stride) and the tensor to a multiple of DEC8_TILE rows; within a tile, the 32-column
 * chunk j of its row i sits at byte (j * DEC8_TILE + i) * 32. */
#define DEC8_TILE 4
static inline size_t dec8_stride(int cols) { return ((size_t)cols + 31) / 32 * 32; }
/* the bytes of a decoded rows x cols tensor, padding included */
static inline size_t dec8_bytes(int rows, int cols) {
    return ((size_t)rows + DEC8_TILE - 1) / DEC8_TILE * DEC8_TILE * dec8_stride(cols);
}
/* the offset of weight (r, c) in the decoded tensor */
static inline size_t dec8_offset(int r, int c, int cols) {
    return (size_t)(r / DEC8_TILE) * DEC8_TILE * dec8_stride(cols) +
           ((size_t)(c / 32) * DEC8_TILE + (size_t)(r % DEC8_TILE)) * 32u + (size_t)(c % 32);
}

/* Rows [r0, r1) of an int8 codebook tensor decoded into w8 (the tiled layout above, zero past
 * cols): w8[dec8_offset(r, c, cols)] = the centroid of index (r, c). The scalar decoder of the
 * kernel tables that have none of their own (kernels.h I8DecodeFn). */
void i8_decode_rows_generic(int8_t *w8, const I8Layout *L, int r0, int r1, int cols);
/* Row r's columns [c0, cols) (c0 a multiple of 8) into w8 (the whole decoded tensor, tiled
 * layout), zero up to roundup(cols, 32): the scalar decoder of the SIMD ones' row ends. */
void i8_decode_cols_generic(int8_t *w8, const I8Layout *L, int r, int c0, int cols);

#endif
