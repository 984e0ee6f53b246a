/* Small AVX-512 helpers shared by the AVX-512 kernel files (each compiled with AVX-512 flags;
 * never include this from a baseline file), and the x86 helpers of x86_common.h. */
#ifndef NX_KERNELS_AVX512_COMMON_H
#define NX_KERNELS_AVX512_COMMON_H

#include "kernels/x86_common.h"

/* Each AVX-512 table is built twice (avx512*_t0.c define NX_QPF_T0): its weight prefetches as
 * non-temporal lines (prefetchnta), and as ordinary ones (prefetcht0, the "-t0" tables), under
 * names of their own. Which reads faster depends on the cache design: QPF_HINT below. */
#ifndef NX_QPF_T0
#define NX_QPF_T0 0
#endif
#if NX_QPF_T0
#define NX_QPF_SUFFIX "-t0"
#define nx_kernels_avx512 nx_kernels_avx512_t0
#define nx_kernels_avx512vnni nx_kernels_avx512vnni_t0
#define nx_kernels_avx512vbmi nx_kernels_avx512vbmi_t0
#define nx_avx512_to_f32 nx_avx512_to_f32_t0
#define nx_avx512_dot_f32 nx_avx512_dot_f32_t0
#define nx_avx512_axpy_f32 nx_avx512_axpy_f32_t0
#define nx_avx512_attn_scores nx_avx512_attn_scores_t0
#define nx_avx512_attn_accum nx_avx512_attn_accum_t0
#define nx_avx512_exp_shift_f32 nx_avx512_exp_shift_f32_t0
#define nx_avx512_swiglu_f32 nx_avx512_swiglu_f32_t0
#define nx_avx512_rmsnorm_f32 nx_avx512_rmsnorm_f32_t0
#define nx_avx512_argmax_f32 nx_avx512_argmax_f32_t0
#define nx_avx512_exp_weights nx_avx512_exp_weights_t0
#define nx_avx512_delta_rule_f32 nx_avx512_delta_rule_f32_t0
#else
#define NX_QPF_SUFFIX ""
#endif

/* Software prefetch for the quantized kernels, which stream a register block of R consecutive
 * weight rows at once (decode reads more streams than the hardware prefetchers follow well).
 * A block of at most QPF_LINEAR bytes is swept linearly QPF_LINEAR bytes ahead, at the rate
 * the block consumes its rows: a sequential pattern the hardware prefetcher then extends. A
 * larger block prefetches the same columns of the rows whole blocks (>= QPF_AHEAD bytes)
 * further on (model decode is flat from 6 to 12 KB ahead and loses below). The VNNI kernels
 * read decode and verify calls as split streams instead (avx512_vnni.c). */
#ifndef QPF_LINEAR
#define QPF_LINEAR 8192
#endif
#ifndef QPF_AHEAD
#define QPF_AHEAD 8192
#endif

/* How the weight prefetches fill. Non-temporal (prefetchnta): weights are read once per step
 * and a step reads hundreds of MB, so lines filled as ordinary ones only push out what the step
 * does reuse (the KV cache, routers, norms, activations, the scale rows) from L2 and L3; on AMD
 * (Zen 4/5) that is 1.02-1.06x decode. On Intel's server cores a non-temporal line skips L2 and
 * its streamer, and 4-bit decode read weights at 0.55-0.6 of the machine's bandwidth against
 * 0.9-1.0 with prefetcht0 (1.5-1.7x): there the "-t0" tables run (dispatch.c picks by vendor).
 * The scale and bias hints below are prefetcht0 in both (non-temporal gained nothing there). */
#ifndef QPF_HINT
#define QPF_HINT (NX_QPF_T0 ? _MM_HINT_T0 : _MM_HINT_NTA)
#endif

/* Where a call's prefetches may go: the call's own weight rows up to `end`, then the first
 * next_len bytes at `next` (the rows the thread multiplies next, nx_matmul_rows_then). A hint
 * past both lands on the call's last line, already cached, rather than on rows this thread
 * does not read (another thread's, or another tensor). Addresses are compared as integers. */
typedef struct qpf_window {
    uintptr_t end, next;
    size_t next_len;
    size_t next_rs;   /* split streams (qpf_at_split): the row stride of the next call's streams */
    nx_side_pf *side; /* the thread's side spans, hinted a line per weight row (kernels.h) */
} qpf_window;

AI qpf_window qpf_window_of(const nx_linear *W, int64_t o1, const nx_rows *next, nx_side_pf *side) {
    qpf_window pw = {(uintptr_t)W->w + (size_t)o1 * nx_linear_weight_row_bytes(W), 0, 0, 0, side};
    if (next) {
        const size_t rb = nx_linear_weight_row_bytes(next->W);
        pw.next = (uintptr_t)next->W->w + (size_t)next->r0 * rb;
        pw.next_len = (size_t)(next->r1 - next->r0) * rb;
    }
    return pw;
}

/* The first scale and bias lines of `next`, for as many rows as the weight stream's overrun
 * covers (one sweep distance), so its first groups find them cached as well. */
AI void qpf_next_scales(const nx_rows *next) {
    if (!next || next->W->dtype != NX_DTYPE_U32) return;
    const nx_linear *N = next->W;
    const size_t srow = (size_t)(N->in / N->group) * nx_dtype_size(N->sdtype);
    size_t rows = QPF_LINEAR / nx_linear_weight_row_bytes(N) + 1;
    if (rows > (size_t)(next->r1 - next->r0)) rows = (size_t)(next->r1 - next->r0);
    const char *sc = (const char *)N->scales + (size_t)next->r0 * srow;
    const char *bi = N->biases ? (const char *)N->biases + (size_t)next->r0 * srow : NULL;
    for (size_t o = 0; o < rows * srow; o += 64) {
        _mm_prefetch(sc + o, QPF_HINT);
        if (bi) _mm_prefetch(bi + o, QPF_HINT);
    }
}

/* The prefetch stream of a register block of R rows starting at w0 (row stride wstride) that
 * reads `step` bytes of each row per iteration: when each row has consumed `done` bytes, row r's
 * hint is base + done·mul + r·rstride. A small block is swept linearly QPF_LINEAR ahead (rows r
 * are consecutive lines); a large one gets the same columns of the rows whole blocks ahead.
 * Computed once per register block: the hot loop then spends a multiply-add per step and an add
 * per row on its hints, not a division and a window test per line. */
typedef struct qpf_stream {
    uintptr_t base;
    size_t mul, rstride;
} qpf_stream;

AI qpf_stream qpf_stream_of(const uint8_t *w0, size_t wstride, int R, size_t step) {
    const size_t blk = (size_t)R * wstride;
    if (blk <= QPF_LINEAR) return (qpf_stream){(uintptr_t)w0 + QPF_LINEAR, (size_t)R, step};
    return (qpf_stream){(uintptr_t)w0 + (QPF_AHEAD + blk - 1) / blk * blk, 1, wstride};
}

/* Row 0's hint at `done`, moved into the window (rows r then follow at + r·rstride: the next
 * lines of the same region in a linear sweep; at most a few lines past the call's end once
 * both the call's rows and the next rows are covered). */
AI uintptr_t qpf_at(const qpf_window *pw, const qpf_stream *s, size_t done) {
    uintptr_t p = s->base + done * s->mul;
    if (__builtin_expect(p >= pw->end, 0)) {
        const size_t off = p - pw->end;
        p = off < pw->next_len ? pw->next + off : pw->end - 64;
    }
    return p;
}

/* Split streams (avx512_vnni.c, and the float kernels): a register block of R rows takes one
 * row from each of R equal parts of the call's rows, each part read as a stream with its own
 * hint QPF_SPLIT bytes ahead. */
#ifndef QPF_SPLIT
#define QPF_SPLIT 2048
#endif

/* Row 0's weight hint at `done` in a split register block, and in *rs the distance from one
 * part's hint to the next one's: past the first part's end, the next call's parts. */
AI uintptr_t qpf_at_split(const qpf_window *pw, const qpf_stream *s, size_t done, size_t *rs) {
    uintptr_t p = s->base + done;
    *rs = s->rstride;
    if (__builtin_expect(p >= pw->end, 0)) {
        const size_t off = p - pw->end;
        if (off < pw->next_len) {
            *rs = pw->next_rs;
            return pw->next + off;
        }
        return pw->end - 64; /* + r·rstride: the last line of part r, already read */
    }
    return p;
}

/* A split call's window past its first part: the first part of the rows the thread multiplies
 * next, R parts apart as that call splits them (R: its register block, for the same input
 * rows). Returns the rows of each of next's parts (0 without next). */
AI int64_t qpf_split_next(qpf_window *pw, const nx_rows *next, int R) {
    if (!next) return 0;
    const int64_t n = next->r1 - next->r0, q = (n - n % R) / R;
    pw->next_len = pw->next_rs = (size_t)q * nx_linear_weight_row_bytes(next->W);
    return q;
}

/* The scale and bias rows of a quantized call are two more streams, one line per 2-32 rows (a
 * bf16 scale per 64-element group): too sparse for the hardware prefetchers to run ahead of, so
 * without hints nearly every new line is a demand miss that stalls the core. Each register
 * block of R rows hints, as it starts, the scale and bias lines of the R rows SPF_AHEAD bytes of
 * weights further on, once per line. Past the call's rows they are most often the rows the
 * thread takes next (the next piece of the same tensor); hints stop at the tensor's end. */
typedef struct spf_stream {
    size_t ahead;        /* bytes from a block's scales to those of the rows it hints */
    uintptr_t lim;       /* end of the tensor's scales */
    ptrdiff_t bi_delta;  /* bias address - scale address, as integers (0: no biases) */
} spf_stream;

#ifndef SPF_AHEAD
#define SPF_AHEAD QPF_LINEAR
#endif
#ifndef SPF_HINT
#define SPF_HINT _MM_HINT_T0
#endif
AI size_t spf_rows(size_t wstride) { return (SPF_AHEAD + wstride - 1) / wstride; }

/* The hints of a call on quantized W (wstride packed bytes and sstride scale bytes per row). */
AI spf_stream spf_stream_of(const nx_linear *W, size_t wstride, size_t sstride) {
    return (spf_stream){.ahead = spf_rows(wstride) * sstride,
                        .lim = (uintptr_t)W->scales + (size_t)W->out * sstride,
                        .bi_delta = W->biases ? (ptrdiff_t)((uintptr_t)W->biases - (uintptr_t)W->scales) : 0};
}

/* Hints the scale (and bias) lines of bytes [sc + ahead, sc + ahead + len). */
AI void spf_hint(const spf_stream *s, const uint8_t *sc, size_t len) {
    uintptr_t p = ((uintptr_t)sc + s->ahead) & ~(uintptr_t)63;
    uintptr_t e = (uintptr_t)sc + s->ahead + len;
    if (e > s->lim) e = s->lim;
    for (; p < e; p += 64) {
        _mm_prefetch((const char *)p, SPF_HINT);
        if (s->bi_delta) _mm_prefetch((const char *)(p + (uintptr_t)s->bi_delta), SPF_HINT);
    }
}

/* The AVX-512 vector helpers (avx512.c), shared by the VNNI tables. */
void nx_avx512_to_f32(nx_dtype t, const void *src, float *dst, int64_t n);
float nx_avx512_dot_f32(const float *a, const float *b, int64_t n);
void nx_avx512_axpy_f32(float a, const float *x, float *y, int64_t n);
void nx_avx512_attn_scores(const float *q, int64_t g, const void *K, nx_dtype kvt, int64_t stride, int64_t n, int64_t hd,
                           float scale, float *out, int64_t ldo);
void nx_avx512_attn_accum(const float *w, int64_t ldw, int64_t g, const void *V, nx_dtype kvt, int64_t stride, int64_t n,
                          int64_t hd, float *o);
float nx_avx512_exp_shift_f32(float *x, int64_t n, float *mx);
void nx_avx512_swiglu_f32(float *g, const float *u, int64_t n);
void nx_avx512_rmsnorm_f32(const float *x, const float *w, float eps, int64_t n, float *out);
int64_t nx_avx512_argmax_f32(float *x, int64_t n, float *max);
double nx_avx512_exp_weights(const float *x, int64_t n, float m, double inv_t, double *w);
void nx_avx512_delta_rule_f32(const float *src, float *dst, int64_t dk, int64_t dv, const float *k, const float *v,
                              float decay, float beta, const float *q, float *o);

/* The vector-helper fields of every AVX-512 kernel table. */
#define NX_AVX512_VECTOR_HELPERS                                                               \
    .to_f32 = nx_avx512_to_f32, .dot_f32 = nx_avx512_dot_f32, .axpy_f32 = nx_avx512_axpy_f32, \
    .attn_scores = nx_avx512_attn_scores, .attn_accum = nx_avx512_attn_accum,                  \
    .exp_shift_f32 = nx_avx512_exp_shift_f32, .swiglu_f32 = nx_avx512_swiglu_f32,                 \
    .rmsnorm_f32 = nx_avx512_rmsnorm_f32, .argmax_f32 = nx_avx512_argmax_f32,                 \
    .exp_weights = nx_avx512_exp_weights, .delta_rule_f32 = nx_avx512_delta_rule_f32

/* Horizontal sum of 16 lanes in a fixed tree (the same order on every call). */
AI float hsum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* hsum16 of four vectors at once, each summed in exactly hsum16's order (lane i + lane i+8,
 * then + i+4, then + i+2, then + i+1; lanes of different vectors never mix), so a row reduced
 * here or alone gets the same bits. Returns [Σa, Σb, Σc, Σd]. */
AI __m128 hsum16x4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
    __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4e));      /* lanes 0,1: + lanes 2,3 */
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0xb1));      /* lane 0: + lane 1 */
    const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(first, s));
}

#endif
