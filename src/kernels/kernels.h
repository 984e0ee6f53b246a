/* Compute kernels on weights in their stored format (f32, f16, bf16, MLX affine 2-8 bit).
 * Every kernel has a scalar reference (ref.c: the test oracle, NX_ISA=ref, and the fallback for
 * shapes a SIMD kernel declines) and SIMD twins: on x86-64 avx2.c (with avx2_int8.c, and
 * avx2_vnni.c for AVX-VNNI), avx512.c, and for quantized weights avx512_vnni.c on int8 or int16
 * activations (built again as avx512_vbmi.c, adding 3/5/6-bit); on AArch64 neon.c, neon_dot.c
 * (sdot) and neon_i8mm.c (smmla). dispatch.c picks one table from the CPU's features;
 * NX_ISA=ref|avx2|avx2vnni|avx512|avx512vnni|avx512vbmi|neon|neondot|neoni8mm forces it.
 *
 * Numerics contract (greedy MTP == greedy AR depends on it): the result for one row never
 * depends on how many rows are computed together, on the thread count, or on which rows
 * share a call. Each output element is one dot product accumulated in a fixed order. */
#ifndef NX_KERNELS_H
#define NX_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"

typedef enum nx_dtype {
    NX_DTYPE_F32 = 0,
    NX_DTYPE_F16,
    NX_DTYPE_BF16,
    NX_DTYPE_U32, /* packed MLX affine quantized weights */
    NX_DTYPE_I32,
    NX_DTYPE_U8,
    NX_DTYPE_I8,
    NX_DTYPE_U16,
    NX_DTYPE_I16,
    NX_DTYPE_I64,
    NX_DTYPE_U64,
    NX_DTYPE_F64,
    NX_DTYPE_BOOL,
    NX_DTYPE_F8_E4M3,
    NX_DTYPE_F8_E5M2,
    NX_DTYPE_COUNT
} nx_dtype;

size_t nx_dtype_size(nx_dtype t);        /* bytes per element (U32: 4) */
const char *nx_dtype_name(nx_dtype t);   /* safetensors spelling: "BF16", ... */
int nx_dtype_from_name(const char *name); /* -1 if unknown */

/* A linear layer's weight W [out, in] as a read-only view into mapped file data (never
 * copied). y = x · Wᵀ. For quantized weights (dtype U32) `w` holds out rows of in*bits/32
 * words, and scales/biases [out, in/group] are in sdtype. Pointers may be unaligned. */
typedef struct nx_linear {
    nx_dtype dtype;    /* F32, F16, BF16 or U32 (affine quantized) */
    int64_t out, in;
    const void *w;
    int bits, group;   /* quantized only */
    nx_dtype sdtype;   /* dtype of scales and biases (F32/F16/BF16) */
    const void *scales, *biases;
    /* Activations never rounded below int16 for this weight: routers (a choice must not flip),
     * and every weight of a model loaded with act_bits 16 (nx_load_params). Otherwise the
     * integer kernels take int8 activations where they can (see Activation precision below). */
    bool x16;
} nx_linear;

size_t nx_linear_row_bytes(const nx_linear *W); /* stored bytes of one output row (+ its scales) */
/* Bytes of one output row of the weight itself (packed words for quantized weights; no scales
 * or biases). */
size_t nx_linear_weight_row_bytes(const nx_linear *W);
size_t nx_linear_bytes(const nx_linear *W);     /* stored bytes of the whole weight */
/* Rows [r0, r0 + n) of W as a weight of their own: a view into the same data and scales. */
nx_linear nx_linear_rows(const nx_linear *W, int64_t r0, int64_t n);

/* A thread's kernel working memory: the integer kernels' input staging and reuse cache, and the
 * side prefetch spans of its calls. Each thread of a pool has one, owned by the pool
 * (nx_pool_scratch); a call made outside a pool gets one of its own (NULL below). */
typedef struct nx_kscratch nx_kscratch;
/* Thread ith's within pool (ith 0: the caller outside jobs); NULL for a NULL pool. */
nx_kscratch *nx_kscratch_of(nx_pool *pool, int ith);
nx_kscratch *nx_kscratch_new(void); /* NULL when out of memory */
void nx_kscratch_free(nx_kscratch *s);

/* y[t*ldy + o] = Σ_i x[t*ldx + i] · W[o, i]  for t < T, o < W->out.
 * Each weight row is read once for all T rows. Threads split the outputs, each with its
 * scratch in pool (a NULL pool: the caller, with a scratch allocated for the call; if that
 * fails, the reference kernel computes it). */
void nx_matmul(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y,
               int64_t ldy, nx_pool *pool);

/* Several independent matmuls as one parallel job (one pool wake-up for all): the output
 * rows of every task are split across the threads. Same results as separate nx_matmul calls. */
typedef struct nx_matmul_task {
    const nx_linear *W;
    const float *x;
    int64_t ldx, T;
    float *y;
    int64_t ldy;
} nx_matmul_task;

void nx_matmul_many(const nx_matmul_task *tasks, int n, nx_pool *pool);

/* Input rows up to which nx_matmul_many shares the output rows (pool shares: a thread claims
 * them piece by piece, each piece one kernel call). Above it the rows are split once: each call
 * quantizes its input rows afresh, which many rows make too dear to repeat per piece. */
#define NX_SHARE_MAX_T 4

/* nx_matmul_many's sharing inside a pool job the caller runs (nx_pool_run, nth threads), for
 * matmuls between other per-thread work: one thread calls nx_matmul_shares_reset before any
 * thread works on the tasks (before nx_pool_run, or between two barriers), then every thread
 * calls nx_matmul_shares_work, which returns when no rows are left. The thread's calls hint
 * side[0..nside) along their weights (nx_span; NULL, 0: none). Where nx_matmul_many would
 * not share (T above NX_SHARE_MAX_T), each thread takes a fixed part of the rows instead, and
 * the reset does nothing (returns 0; 1 when the shares were set). Same results as nx_matmul. */
typedef struct nx_span nx_span;
int nx_matmul_shares_reset(const nx_matmul_task *tasks, int n, nx_pool *pool, int nth);
void nx_matmul_shares_work(const nx_matmul_task *tasks, int n, nx_pool *pool, int ith, int nth,
                           const nx_span *side, int nside);

/* Like nx_matmul on rows [o0, o1) only, on the calling thread with scratch s (NULL: one for the
 * call), for callers that schedule work themselves (several experts' matmuls in one job). */
void nx_matmul_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y,
                    int64_t ldy, int64_t o0, int64_t o1, nx_kscratch *s);

/* Rows [r0, r1) of a weight: what the calling thread multiplies next. */
typedef struct nx_rows {
    const nx_linear *W;
    int64_t r0, r1;
} nx_rows;

/* The rows of W that units [b, e) of a job cover, when the job cuts W's rows into units of
 * `unit` rows numbered from `base` (several weights' units follow each other): 0 if none. */
int nx_rows_of_units(const nx_linear *W, int64_t unit, long long base, long long b, long long e, nx_rows *r);

/* nx_matmul_rows, told which rows the thread reads next (NULL: none known). The kernels
 * prefetch a fixed distance ahead of the rows they read; near the end of the call that stream
 * moves on to the first bytes of `next` instead of running past the call's rows, so the next
 * call starts on warm lines and no bandwidth goes to rows another thread reads. Same results
 * as nx_matmul_rows. */
void nx_matmul_rows_then(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y,
                         int64_t ldy, int64_t o0, int64_t o1, const nx_rows *next, nx_kscratch *s);

/* Block-diagonal products (latent attention: each head's rows of a weight multiply that head's
 * own input). Block k is rows [k·rstride, k·rstride + rows) of W; its input rows are
 * x + k·xstep + t·ldx and its outputs y + k·ystep + t·ldy (element j: row k·rstride + j), for
 * t < T. */
typedef struct nx_blocks {
    const nx_linear *W;
    int64_t rstride, rows;
    const float *x;
    int64_t xstep, ldx, T;
    float *y;
    int64_t ystep, ldy;
} nx_blocks;

/* Blocks [k0, k1) of B on the calling thread with scratch s (NULL: one for the call), then the
 * rows `next` (a prefetch hint, as nx_matmul_rows_then). Each output is the same bits as a call
 * of nx_matmul_rows on its block's rows alone: where the kernels can, the blocks' inputs are
 * quantized together and their rows read as one stream, else it is such calls. */
void nx_matmul_blocks(const nx_blocks *B, int64_t k0, int64_t k1, const nx_rows *next, nx_kscratch *s);

/* Side spans: memory a thread reads soon besides weights (the KV cache rows its attention reads
 * after the projections), hinted by its matmul calls (AVX-512 kernels) a cache line per weight
 * row they start, paced by the weight stream: issued as one burst, such hints were evicted
 * before use. Taken in order, at most NX_SIDE_SPANS (more are ignored). */
#define NX_SIDE_SPANS 8
struct nx_span {
    const void *p;
    size_t len;
};

/* Dequantizes/converts row r of W into out[in] as f32 (embedding lookup). */
void nx_linear_get_row(const nx_linear *W, int64_t r, float *out);

/* Converts n elements of a stored vector (F32/F16/BF16) to f32. */
void nx_to_f32(nx_dtype t, const void *src, float *dst, int64_t n);

/* Small vector kernels used by attention and norms (dispatched). */
float nx_dot_f32(const float *a, const float *b, int64_t n);
void nx_axpy_f32(float a, const float *x, float *y, int64_t n); /* y += a·x */

/* Attention over n cached rows (row p at K + p·stride, resp. V + p·stride elements, hd each,
 * stored as kvt: NX_DTYPE_F32 or NX_DTYPE_F16) for g query heads sharing them (GQA), so each
 * cached row is read once for all g:
 *   out[h·ldo + p] = nx_dot_f32(q + h·hd, K_p, hd) · scale,
 *   o[h·hd + j] += Σ_p w[h·ldw + p]·V_p[j], terms added in ascending p,
 * exactly as the nx_dot_f32 / nx_axpy_f32 loops would give them on the rows as f32 (same bits,
 * fewer passes; an f16 row is widened exactly). hd <= NX_ATTN_MAX_HD. */
#define NX_ATTN_MAX_HD 1024
void nx_attn_scores(const float *q, int64_t g, const void *K, nx_dtype kvt, int64_t stride, int64_t n, int64_t hd,
                    float scale, float *out, int64_t ldo);
void nx_attn_accum(const float *w, int64_t ldw, int64_t g, const void *V, nx_dtype kvt, int64_t stride, int64_t n,
                   int64_t hd, float *o);

/* x[0..n) ← exp(x - max x); returns their sum and sets *mx to the max (n >= 1). Deterministic
 * per ISA (the SIMD exp is a fixed polynomial within 2 ulp of expf). */
float nx_exp_shift_f32(float *x, int64_t n, float *mx);

/* x[0..n) ← softmax(x): nx_exp_shift_f32, then each times 1/sum. */
void nx_softmax_f32(float *x, int64_t n);

/* g[i] ← silu(g[i])·u[i] = g[i] / (1 + e^-g[i]) · u[i] (SwiGLU), with the same exp as
 * nx_softmax_f32; u NULL: silu(g[i]) alone (the product with 1 is exact). */
void nx_swiglu_f32(float *g, const float *u, int64_t n);

/* out[i] ← x[i]·r·w[i] (w NULL: 1) with r = 1/sqrt(mean(x²) + eps), the sum of squares taken in
 * double as 8 partial sums (element i in sum i mod 8, the tail past the last whole 8 in sum 0)
 * added in a fixed tree: the same bits on every ISA. out may be x. */
void nx_rmsnorm_f32(const float *x, const float *w, float eps, int64_t n, float *out);

/* One row of the gated delta rule on one head's state S [dk][dv] (row i for key dim i), read from
 * src and written to dst (src == dst allowed): S = decay·S; kv = Sᵀk; δ = β·(v − kv); S += k δᵀ;
 * and when o is set, o = Sᵀq. Each element's sums run over i in order with a product rounded
 * before each add (no fused step), so every ISA gives the reference's bits. dv <= NX_ATTN_MAX_HD. */
void nx_delta_rule_f32(const float *src, float *dst, int64_t dk, int64_t dv, const float *k, const float *v,
                       float decay, float beta, const float *q, float *o);

/* w[i] ← exp((x[i] - m)·inv_t) in double for x[i] <= m (-inf: 0), the sampler's unnormalised
 * weights; returns their sum. Within 2 ulp of libm's exp on every ISA (the SIMD one is a fixed
 * degree-12 polynomial after range reduction), the sum's order fixed per ISA. */
double nx_exp_weights(const float *x, int64_t n, float m, double inv_t, double *w);

/* The first index of x's largest element (0 when every element is -inf, or n is 0), its value in
 * *max; NaN elements become -inf in place first, so they never win. */
int64_t nx_argmax_f32(float *x, int64_t n, float *max);

/* Activation precision of the integer kernels (avx512vnni/avx512vbmi): unless W->x16, 4-bit
 * weights (rows of whole 128-element blocks, or any rows of 64-element groups), 2-bit weights (whole 256-element blocks) and, with
 * VBMI, 3/5/6-bit weights take int8 activations, each element within 1/254 of its group's
 * largest (llama.cpp's q8): twice the multiply-adds per instruction of int16, so prefill and
 * verify stay near memory speed. Every other case rounds to int16, each element within 2^-15 of
 * its group's largest. Either way the numerics contract holds. */

/* Which ISA the dispatcher chose: "ref", "avx2", "avx512", "avx512vnni", "avx512vbmi". */
const char *nx_kernels_isa(void);
/* The best table this CPU runs, by CPUID alone (whatever NX_ISA or nx_kernels_force chose). */
const char *nx_kernels_best_isa(void);
/* Forces an ISA by name (tests); returns 0 on success, -1 if this CPU cannot run it. */
int nx_kernels_force(const char *isa);

#endif
