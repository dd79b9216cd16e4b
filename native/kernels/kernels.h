/* kernels.h: the GEMV kernel table, one per instruction set, chosen once at model load from the
 * CPU's features (docs/KERNELS.md "Kernel table").
 *
 * A table says, for each tensor format, which function computes it: int8 codebooks with b = 4
 * (the default build) through an integer kernel of that ISA when G is a multiple of its chunk,
 * b = 6 (the default embedding/classifier rule) and b = 5 (the bit allocation's other common
 * width) through their kernels when G % 32 == 0,
 * other int8 codebooks with G % 32 == 0 through its any-b kernel (if it has one), the rest
 * through the scalar reference; f16/f32 codebooks through the float lookup kernels. The environment variable DITTO_KERNEL (or ditto-run --kernel) forces a table
 * by name, for tests and benchmarks.
 */
#ifndef DITTO_KERNELS_H
#define DITTO_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "qgemv.h"
#include "../model/model.h"

/* rows [r0, r1) of y = W x for an int8 codebook tensor (qgemv.h) */
typedef void (*I8RowsFn)(float *y, const QuantActs *qa, const I8Layout *L, int r0, int r1,
                         int cols);
/* Y[t][r] (row stride `rows`) for t < T and rows [r0, r1) of an int8 codebook tensor: a GEMM over
 * T quantized inputs that decodes each row's weights once (bit-identical to the row kernels).
 * prep: the inputs as the table's i8_gemm_prep made them, or NULL (the call makes its own). */
typedef void (*I8GemmFn)(float *Y, const QuantActs *qa, int T, const I8Layout *L, int r0, int r1,
                         int rows, int cols, const GemmPrep *prep);
/* Group g (inputs 6g..6g+5) of GemmPrep.pairs for the T inputs qa (qgemv.h) */
typedef void (*I8GemmPrepFn)(int32_t *pairs, const QuantActs *qa, int T, int g);
/* the whole y = W x for an f16/f32 codebook tensor (parameters of codebook_gemv_ref) */
typedef void (*FloatCbFn)(float *y, const float *x, const uint8_t *payload,
                          uint32_t codebook_type, int bits, int group_size, int rows, int cols);

/* rows [r0, r1) of an int8 codebook tensor decoded into w8 (qgemv.h's tiled layout, zero past
 * cols): w8[dec8_offset(r, c, cols)] = the centroid of index (r, c); generic:
 * i8_decode_rows_generic (qgemv.h) */
typedef void (*I8DecodeFn)(int8_t *w8, const I8Layout *L, int r0, int r1, int cols);

/* act_quantize() of one ISA (qgemv.h; the same bytes as act_quantize_generic) */
typedef int (*ActQuantFn)(QuantActs *qa, const float *x, int n, int flags);

typedef struct {
    const char *name;     /* "generic", "avx2", "avxvnni", "avx512vnni", "avx512vbmi", "neon" */
    const char *features; /* what the CPU needs, as named in /proc/cpuinfo (x86) or HWCAP */
    int (*supported)(void);
    I8RowsFn i8_b4;       /* int8 codebooks, b = 4, G % i8_b4_chunk == 0; NULL: generic */
    int i8_b4_chunk;
    I8RowsFn i8_b6;       /* int8 codebooks, b = 6 (the default classifier), G % 32 == 0; NULL:
                             i8_any */
    I8RowsFn i8_any;      /* int8 codebooks, any b, G % 32 == 0 (when i8_b4 does not apply) */
    I8GemmFn i8_gemm;     /* int8 codebooks, any b, G % 32 == 0, T inputs (prefill); NULL: the
                             row kernels once per input */
    int vnni_acts;        /* i8_b4 reads QuantActs' VNNI arrays */
    FloatCbFn float_cb;   /* f16/f32 codebooks */
    ActQuantFn act_quant; /* activation quantization; NULL: act_quantize_generic */
    I8RowsFn i8_dec8;     /* int8 codebooks with b >= DEC8_MIN_BITS decoded at load to int8
                             weights (L->w8), G % 32 == 0; NULL: the table decodes nothing */
    I8DecodeFn i8_decode; /* that decoding for rows [r0, r1); NULL: i8_decode_rows_generic */
    I8RowsFn i8_b5;       /* int8 codebooks, b = 5, G % 32 == 0; NULL: i8_any */
    I8RowsFn i8_b4_tiled; /* b = 4 tensors whose indices this table has tiled at load
                             (kernels_tile_tensor, qgemv.h i8_tiles_fit); NULL: none tiled.
                             The table's i8_gemm must read tiles too (qgemm_avx2.c decode_row
                             does, through i8_b4_at) */
    int gemm_plain_acts;  /* for more than GEMM_FEW_MAX inputs i8_gemm reads only D, m, m16 and
                             q of each input (qgemv.h ACT_PLAIN): prefill's activation rows
                             then skip the perm32 and perm64 arrays */
    I8GemmPrepFn i8_gemm_prep; /* i8_gemm's GemmPrep, made once per batch of inputs; NULL:
                                  i8_gemm takes none */
} KernelTable;

/* The bit widths whose lookup kernels cost more than reading decoded int8 weights: b = 6 (the
 * default classifier) needs ~20 AVX2 instructions per 32 weights to unpack and look up, a
 * plain int8 weight 4 (docs/KERNELS.md "Decoded classifier"). */
#define DEC8_MIN_BITS 5

/* Every table compiled into this program, best first; *n gets their number. */
const KernelTable *kernel_tables(int *n);

/* The int8 row kernel a table uses for bit width b and group size G (G <= cols), given whether
 * the quantized input has the VNNI arrays; i8cb_rows_generic when no SIMD kernel applies. */
I8RowsFn kernel_pick_i8(const KernelTable *K, int bits, int G, int has_vnni);

/* The kernel path gemv_i8() takes on table K for an int8 codebook tensor of bit width b and
 * group size G (G <= cols): "decoded-int8" (the classifier, when classifier is set and K
 * decodes it at load: kernels_decode_tensor), "i8_b4", "i8_b5", "i8_b6", "i8_any" (the slot
 * kernel_pick_i8 picks) or "generic" (the scalar reference). ditto_core/kernel_paths.py
 * mirrors this rule for `ditto inspect`; tests/test_kernel_paths.py checks they agree. */
const char *kernel_path(const KernelTable *K, int bits, int G, int has_vnni, int classifier);
/* The same for the table named kernel (NULL if no such table is compiled in), G clamped to
 * cols as gemv_i8() does, the VNNI arrays filled when the table reads them (as decode's GEMV
 * inputs are: matmul.c). */
const char *kernel_path_with(const char *kernel, int bits, int G, int cols, int classifier);

/* Table i's name (NULL past the last), the CPU features it needs (space-separated, as
 * /proc/cpuinfo spells them; NULL past the last), whether this CPU can run it, and the active
 * table's name (plain C types, for tests and benchmarks through ctypes). */
const char *kernel_name_at(int i);
const char *kernel_features_at(int i);
int kernel_supported_at(int i);
const char *kernel_active_name(void);

/* The table named name (NULL if no such table is compiled in). */
const KernelTable *kernel_table_by_name(const char *name);

/* Choose the table the GEMVs use: the one named `force` (NULL or "" = the best this CPU
 * supports, or the DITTO_KERNEL environment variable when set). Returns 0, or -1 with a message
 * in err for an unknown name or a table this CPU cannot run (naming the missing features). */
int kernels_select(const char *force, char *err, size_t errlen);

/* The table in use (selects the default on first use). */
const KernelTable *kernels_active(void);

/* y[W->rows] = W x for an int8 codebook tensor whose input is already quantized (qa->n must be
 * W->cols): the activation quantization can be shared by several tensors with the same input
 * (q/k/v, gate/up). The OpenMP threads claim the rows in chunks of whole runs of 16 rows (a
 * 64-byte line of y), so no two threads write the same cache line, and a thread that streams
 * faster takes more of them (kernels.c row_chunks). */
void gemv_i8(float *y, const QuantActs *qa, const Tensor *W);

/* y[i] = W[i] x for n <= GEMM_MULTI_MAX int8 codebook tensors with the same cols sharing one
 * quantized input (decode's q/k/v, gate/up): one parallel region, the threads claiming chunks
 * of rows of every tensor in turn with no barrier in between. y[i] has the bits of
 * gemv_i8(y[i], qa, W[i]): the same kernel on the same rows. */
void gemv_i8_multi(float *const *y, const QuantActs *qa, const Tensor *const *W, int n);

/* Y[T][W->rows] = X[T][W->cols] · Wᵀ for an int8 codebook tensor, T activation rows already
 * quantized (qa[0..T)): a GEMM for batched prefill. Threads claim the rows as gemv_i8() does;
 * each thread takes 16 rows at a time through all T rows of X, so the weights are read from
 * memory once per call. Y[t] is bit-identical to gemv_i8(Y[t], &qa[t], W). */
void gemm_i8(float *Y, const QuantActs *qa, int T, const Tensor *W);

/* The same from float32 rows X[T][W->cols] (1 <= T <= MATMUL_BATCH_MAX), each quantized once
 * (act_quantize) into buffers kept between calls; not reentrant. matmul_batch() uses it. */
void gemm_i8_float_input(float *Y, const float *X, int T, const Tensor *W);

/* Y[i] = X · W[i]ᵀ for n <= GEMM_MULTI_MAX int8 codebook tensors with the same cols (q/k/v,
 * gate/up): X quantized once, all of them in one parallel region (each thread takes its rows
 * of every tensor, no barrier in between). Y[i] has the bits of gemm_i8_float_input(Y[i], X,
 * T, W[i]); not reentrant. */
#define GEMM_MULTI_MAX 4
void gemm_i8_float_input_multi(float *const *Y, const float *X, int T, const Tensor *const *W,
                               int n);

/* Decode W's weights to int8 once (W->w8, dec8_bytes(rows, cols): qgemv.h's tiles of
 * DEC8_TILE rows; OpenMP over rows)
 * when the active table reads decoded weights faster than its lookup kernel: W an int8
 * codebook tensor with b >= DEC8_MIN_BITS and G % 32 == 0, and the table has i8_dec8. gemv_i8
 * then runs i8_dec8 on W->w8: the same integer sums, so the same bits. Returns 1 when decoded,
 * 0 when not needed, -1 when out of memory (W unchanged). kernels_free_tensor() frees W->w8. */
int kernels_decode_tensor(Tensor *W);
void kernels_free_tensor(Tensor *W);

/* Put W's b = 4 indices in row tiles in place (qgemv.h i8_b4_at; W->tiled = 1) when the active
 * table reads tiles (i8_b4_tiled) and W fits them (i8_tiles_fit); W->data must be writable
 * (the model read into memory, not mapped). DITTO_TILES=0 in the environment turns it off.
 * Every int8 kernel path then reads the tiles (gemv_i8, gemm_i8, the scalar reference), with
 * the same integer sums, so the same bits. Returns 1 when tiled, 0 when not, -1 when out of
 * memory (W unchanged). Not for a tensor read by row (the embedding: tensor_row). */
int kernels_tile_tensor(Tensor *W);

/* DITTO_TILES from the environment: unset, empty or "1" (tile where the table reads tiles) or
 * "0" (file order). Returns 0, or -1 with a message in err for any other value. */
int kernels_tiles_env_check(char *err, size_t errlen);

/* For tests: the chunks (tensor[k], rows [r0[k], r1[k])) that nt threads claim of n_tensors
 * (1..GEMM_MULTI_MAX) GEMV tensors of rows[i] rows of row_bytes[i] index bytes each
 * (kernels.c row_chunks), at most cap of them copied out. Returns the number of chunks, or
 * -1 for bad arguments. */
int row_chunks_for_test(int n_tensors, const int *rows, const int *row_bytes, int nt,
                        int *tensor, int *r0, int *r1, int cap);

/* Thread t of nt gets rows [*r0, *r1): contiguous runs whose boundaries are multiples of 16. */
void split_rows(int rows, int t, int nt, int *r0, int *r1);

/* For tests and benchmarks: y = W x for an int8 codebook payload (parameters of
 * codebook_gemv_ref) through the table named `kernel`, x quantized on the spot. Returns 1 when
 * one of the table's SIMD kernels ran (kernel_pick_i8), 0 when the scalar
 * reference did, -1 for an unknown kernel, one this CPU cannot run, or no memory. */
int i8cb_gemv_with(const char *kernel, float *y, const float *x, const uint8_t *payload,
                   int bits, int group_size, int rows, int cols);

/* For tests: i8cb_gemv_with() with the weights decoded first as kernels_decode_tensor() does
 * for that table. Returns 1 when the table's decoded-weight kernel ran, 0 when the table
 * decodes nothing for these b and G (then the row kernels ran), -1 as i8cb_gemv_with(). */
int i8cb_gemv_decoded_with(const char *kernel, float *y, const float *x, const uint8_t *payload,
                           int bits, int group_size, int rows, int cols);

/* For tests: Y[T][rows] = X[T][cols] · Wᵀ for an int8 codebook payload through the table named
 * `kernel` (gemm_i8() with that table; each X row quantized by its act_quantize with the arrays
 * prefill makes, ACT_PLAIN when the GEMM reads no others, and the inputs prepared once as
 * prefill prepares them). Returns 1 when
 * the table's GEMM kernel ran, 0 when its row kernels did (once per input), -1 for an unknown
 * kernel, one this CPU cannot run, T < 1, or no memory. */
int i8cb_gemm_with(const char *kernel, float *Y, const float *X, int T, const uint8_t *payload,
                   int bits, int group_size, int rows, int cols);

/* For tests: act_quantize(x, n) copied out: *D, m[n_pad / 32], q[n_pad] (n_pad =
 * roundup(n, 64), the caller's arrays that large). Returns n_pad, or -1 (no memory). */
int act_quantize_copy(const float *x, int n, float *D, uint8_t *m, int8_t *q);
/* The same through the table named `kernel` (-1 if it is unknown or unsupported here), also
 * copying the perm32 arrays qp[n_pad] and aqp[n_pad] and the perm64 arrays qp64[n_pad],
 * aqp64[n_pad] and m64[n_pad / 4] when those are not NULL; when all five are NULL it quantizes
 * with ACT_PLAIN (no perm arrays made), as prefill does for the panel GEMMs. */
int act_quantize_copy_with(const char *kernel, const float *x, int n, float *D, uint8_t *m,
                           int8_t *q, int8_t *qp, uint8_t *aqp, int8_t *qp64, uint8_t *aqp64,
                           int16_t *m64);

#endif
