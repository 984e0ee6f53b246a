/* AVX-512 VNNI kernels for 2- to 8-bit affine weights (the MLX recipes), on CPUs with VNNI
 * (Cascade Lake, Ice Lake, Zen 4 and later); other weights go to the AVX-512 table.
 *
 * Float kernels spend one FMA per 16 weights and input row, which caps a multi-row verify well
 * below memory speed. Here each input row is first rounded per weight group to int8 (vpdpbusd,
 * 64 multiply-adds per instruction; each element within 1/254 of its group's largest) or int16
 * (vpdpwssd, 32; within 2^-15), by a power-of-two scale d, and the packed weights are widened
 * to bytes or words without any float conversion (which precision: kernels.h, x16 and
 * act8_takes). Sums are exact in int32; per group and input row they become s·d·Σq·x̂, and the
 * bias term b·Σx uses the float sums.
 *
 * Numerics contract: the integer image of an input row depends on that row alone, integer sums
 * are exact, and the float epilogue runs in a fixed order, so a row's result is the same
 * whatever T, the row split or the thread count. */
#include <math.h>

#include "kernels/avx512_common.h"

/* Built twice: as the "avx512vnni" table, and (avx512_vbmi.c, with NX_VNNI_VBMI 1 and VBMI
 * enabled) as "avx512vbmi", which also runs 3-, 5- and 6-bit weights: their fields straddle
 * bytes, and vpermb + vpsrlvw pull each into its own word. */
#ifndef NX_VNNI_VBMI
#define NX_VNNI_VBMI 0
#endif

/* The widest rows the kernels take, in elements and in groups (a row's image and its groups'
 * scales are staged per call, vnni_matmul_rows). */
#define XQ_MAX 32768
#define XG_MAX 1024

/* Scale and bias line hints a register block of split streams spreads over its units. */
#define SQ_MAX 64

typedef struct vargs {
    const uint8_t *w;       /* first row of the register block */
    size_t wstride;         /* packed bytes per row */
    const uint8_t *sc, *bi; /* scales/biases of the first row (bi may be NULL) */
    size_t sstride;
    nx_dtype sdt;
    int64_t in, group;
    /* 3/5/6-bit (VBMI build): per word lane of each 32-element half of a 64-element block, the
     * byte pair holding the element and the shift that brings it to bit 0 */
    __m512i pick[2], shift[2];
    /* the same widths on int8 (VBMI build): per byte of the vector, the packed byte that lands in
     * it (each 64-bit lane gets the BITS bytes holding 8 elements), and per byte of a lane, the
     * bit offset vpmultishiftqb pulls its element from */
    __m512i pick8, shift8;
    /* 3-bit by blocks of four 64-element groups (K_A8Q, VBMI build): per weight vector of the
     * block, the packed byte (of the block's 96) that lands in each byte */
    __m512i pickq[4];
    qpf_window pf; /* where the weight prefetches may go */
    spf_stream spf; /* and the scale and bias prefetches */
    int split;      /* register blocks take their rows from R parts (split streams, below) */
    const nx_rows *next; /* the rows the thread multiplies next (NULL: none) */
    /* split: the scale rows of next (nsc NULL: none), nsrow bytes a row, its parts nq rows long,
     * and its hints' bias offset and end (nspf; ahead 0) */
    const uint8_t *nsc;
    size_t nsrow;
    int64_t nq;
    spf_stream nspf;
    /* split: the register block's scale and bias line hints, which mk_block issues one per unit
     * (side_put, side_step) */
    uintptr_t sq[SQ_MAX];
    int sqn;
    /* the groups [g_lo, g_hi) of every row this call multiplies; below all of a row (column
     * chunks, vnni_matmul_rows), the register block's sums carried in acc between chunks */
    int64_t g_lo, g_hi;
    int carry_out; /* sums carried out to the next chunk (in from the one before: g_lo > 0) */
    float *accs; /* per row of the call, 4 x 16 floats (NULL: whole rows) */
    float *acc;  /* the register block's (mk_int) */
} vargs;

/* Split streams. A register block multiplies R weight rows at once; taken as R consecutive rows,
 * its reads interleave R rows a row apart, which the hardware prefetchers do not follow. Taken
 * instead as one row from each of R equal parts of the call's rows (rows o, o + q, o + 2q, ...
 * for q = rows / R), each part is a stream of its own with its own prefetch QPF_SPLIT bytes
 * ahead, which reads memory faster. Near a part's end its prefetches move on to the same part
 * of the rows the thread multiplies next. Each row's result is the same bits whichever rows
 * share its block. Taken where every input row goes through the weights in one pass (T <= 4:
 * decode and verify). */

/* Side streams, spread. A split block's R rows have their scales and biases in 2R places of
 * their own; their hints for a row ahead, issued together as the block starts its row, cost
 * more than their bytes. Queued instead (side_put) and issued one per unit of the row as
 * mk_block goes (side_step; what is left at the row's end, side_rest). */
AI void side_put(vargs *b, uintptr_t p) {
    if (b->sqn < SQ_MAX) b->sq[b->sqn++] = p;
    else _mm_prefetch((const char *)p, SPF_HINT);
}

/* The next queued hint, at unit *si of the row. */
AI void side_step(const vargs *a, int *si) {
    if (*si < a->sqn) _mm_prefetch((const char *)a->sq[(*si)++], SPF_HINT);
}

/* The queued hints not yet issued, at the row's end. */
AI void side_rest(const vargs *a, int si) {
    for (; si < a->sqn; si++) _mm_prefetch((const char *)a->sq[si], SPF_HINT);
}

/* The scale (and bias) lines that begin within bytes [sc + ahead, sc + ahead + len): within one
 * part, consecutive rows hint each line once. */
AI void spf_hint_from(vargs *b, const spf_stream *s, const uint8_t *sc, size_t len) {
    const uintptr_t a = (uintptr_t)sc + s->ahead;
    uintptr_t e = a + len;
    if (e > s->lim) e = s->lim;
    for (uintptr_t p = (a + 63) & ~(uintptr_t)63; p < e; p += 64) {
        side_put(b, p);
        if (s->bi_delta) side_put(b, p + (uintptr_t)s->bi_delta);
    }
}

/* The scale (and bias) line holding byte ahead of sc, for rows of at most one line of scales:
 * every line holding the start of a row is then hinted by that row's hint, so no line is
 * missed; no loop and no branch per row (an exact line walk's branches mispredict). */
AI void spf_hint_line(vargs *b, const spf_stream *s, const uint8_t *sc) {
    const uintptr_t p = (uintptr_t)sc + s->ahead;
    side_put(b, p);
    if (s->bi_delta) side_put(b, p + (uintptr_t)s->bi_delta);
}

/* The scale (and bias) lines of one row of len bytes at sc (and lead bytes before it): its first
 * line where the row fits one (spf_hint_line), else every line in range (spf_hint_from). */
AI void spf_hint_row(vargs *b, const spf_stream *s, const uint8_t *sc, size_t len, size_t lead) {
    if (len <= 64) spf_hint_line(b, s, sc);
    else spf_hint_from(b, s, sc - lead, len + lead);
}

/* Row h of each of the next call's R parts: hints for its scale (and bias) lines, the line it
 * begins in too when it is its part's first row (rows of at most a line: that line). */
AI void spf_hint_next(vargs *a, int R, int64_t h) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const uint8_t *sc = a->nsc + (size_t)(r * a->nq + h) * a->nsrow; /* nspf.ahead is 0 */
        spf_hint_row(a, &a->nspf, sc, a->nsrow, h ? 0 : (uintptr_t)sc & 63);
    }
}

/* A split call's window past its first part (qpf_split_next: the first part of the next rows,
 * R parts apart as that call splits them, R being its register block for the same input rows),
 * and where the next rows' scales are, for the scale hints to run on into as each part nears its
 * end (hinted as the call starts, they would leave L1 before they are read). */
AI void split_next(vargs *b, int R) {
    const nx_rows *next = b->next;
    const int64_t q = qpf_split_next(&b->pf, next, R);
    if (q == 0 || next->W->dtype != NX_DTYPE_U32) return;
    const nx_linear *N = next->W;
    b->nsrow = (size_t)(N->in / N->group) * nx_dtype_size(N->sdtype);
    b->nsc = (const uint8_t *)N->scales + (size_t)next->r0 * b->nsrow;
    b->nq = q;
    b->nspf = (spf_stream){.ahead = 0,
                           .lim = (uintptr_t)N->scales + (size_t)N->out * b->nsrow,
                           .bi_delta = N->biases ? (ptrdiff_t)((uintptr_t)N->biases - (uintptr_t)N->scales) : 0};
}

/* 32 elements (within one group) rounded to int16 at scale 1/inv, in natural order. */
AI __m512i q32(const float *x, __m512 iv) {
    const __m256i lo = _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), iv)));
    const __m256i hi = _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16), iv)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* The order of an input row's int16 image: per block, the order in which the kernel's weight
 * vectors hold the elements, so that no shuffle is needed per weight block.
 * - XL_STRIDE4, blocks of 128 as elements 4k+j for j = 0..3 in turn, k = 0..31: 2-bit (the four
 *   2-bit fields of each of 32 packed bytes, widened to words) and 4-bit (the four nibbles of
 *   each of 32 packed 16-bit words) wherever groups tile 128-element blocks;
 * - XL_EVENODD, blocks of 64 as elements 0,2,…,62 then 1,3,…,63: 8-bit (low and high byte of
 *   32 words) and the remaining 4-bit cases (low and high nibble of 32 bytes widened to words);
 * - XL_NATURAL: 3, 5 and 6 bits (each field pulled into its word by vpermb). */
enum { XL_NATURAL, XL_EVENODD, XL_STRIDE4, XL8_NATURAL, XL8_EVENODD, XL8_STRIDE4, XL8_PARTS, XL8_PARTS4 };

/* 4-bit weights go by 128-element blocks when a block never straddles a group boundary
 * except at its middle (64-element groups, paired) and the row is whole blocks. */
static int q4_by128(int64_t in, int64_t group) { return in % 128 == 0 && (group == 64 || group % 128 == 0); }

/* 3-bit weights of 64-element groups on int8 (VBMI build) go by 256-element blocks of four
 * groups (96 packed bytes) when the row is whole blocks: each weight vector, pulled by one
 * two-source byte permute, holds 16 elements of every group, one group per 128-bit lane, so one
 * float epilogue per weight row and input row serves four groups. */
static int q3_by256(int bits, int64_t in, int64_t group) {
    return NX_VNNI_VBMI && bits == 3 && group == 64 && in % 256 == 0;
}

/* 4-bit weights of 64- or 128-element groups on int8 go the same way (K_A8Q) when the row is
 * whole 256-element blocks: two 64-byte loads and one lane shuffle each way gather the groups'
 * bytes so their nibbles are the four weight vectors, and one float epilogue serves four groups
 * (two of 128), since the epilogue, not the multiplies, bounds a call of 2 or more input rows. */
static int q4_by256(int bits, int64_t in, int64_t group) {
    return bits == 4 && (group == 64 || group == 128) && in % 256 == 0;
}

/* 2-bit weights on int8 go by 256-element blocks (64 packed bytes): a block holds 4 groups of
 * 64 (4 int32 lanes each), 2 of 128 (8 lanes each) or a part of one larger group. */
static int q2_by256(int64_t in, int64_t group) {
    return in % 256 == 0 && (group == 64 || group == 128 || group % 256 == 0);
}

/* 4-bit weights of 64-element groups on rows of an odd number of groups (in % 128 == 64: the
 * latent attention's 192-wide query absorption) go by 128-element blocks with one 64-element
 * block at the row's end (q4_tail64), rather than on int16 at a third of the speed. */
static int q4_tail64(int64_t in, int64_t group) { return group == 64 && in % 128 == 64; }

/* With 8-bit activations (int8 bytes, vpdpbusd: 64 multiply-adds per instruction):
 * - XL8_EVENODD: 4-bit weights by 128-element blocks (q4_by128 or q4_tail64, where q4_by256
 *   does not take them), elements 0,2,…,126 then 1,3,…,127 (low and high nibbles of 64 packed
 *   bytes); a last block of 64 (q4_tail64) as elements 0,2,…,62 then 1,3,…,63;
 * - XL8_PARTS: 3-bit weights by blocks of 4 groups of 64 (q3_by256): vector j of the block
 *   holds elements 16j..16j+15 of each group, group q in bytes 16q.., in natural order;
 * - XL8_PARTS4: 4-bit weights by 256-element blocks of groups of 64 or 128 (q4_by256): group q
 *   of the block in bytes 16q.. (64) or 32q.. (128) of every vector, vectors 0 and 1 holding the
 *   even and the odd elements of its first half, vectors 2 and 3 of its second (the low and
 *   high nibbles of the first and the second half of its packed bytes);
 * - XL8_STRIDE4: 2-bit weights by 256-element blocks (q2_by256), elements 4k+j for j = 0..3 in
 *   turn, k = 0..63 (the four 2-bit fields of 64 packed bytes);
 * - XL8_NATURAL: 3-, 5- and 6-bit weights (VBMI build) by 64-element blocks in natural order
 *   (vpermb + vpmultishiftqb put element j in byte j).
 * 8-bit weights keep int16: their per-group float epilogue, not the multiplies, bounds them, so
 * int8 would lose precision for no speed. */
static int act8_takes(int bits, int64_t in, int64_t group) {
    if (bits == 3 || bits == 5 || bits == 6) return NX_VNNI_VBMI && group % 64 == 0;
    return (bits == 4 && (q4_by128(in, group) || q4_tail64(in, group))) || (bits == 2 && q2_by256(in, group));
}

static int x_layout(int act, int bits, int64_t in, int64_t group) {
    if (act == 8 && q3_by256(bits, in, group)) return XL8_PARTS;
    if (act == 8 && q4_by256(bits, in, group)) return XL8_PARTS4;
    if (act == 8) return bits == 2 ? XL8_STRIDE4 : bits == 4 ? XL8_EVENODD : XL8_NATURAL;
    if (bits == 2 || (bits == 4 && q4_by128(in, group))) return XL_STRIDE4;
    return bits == 4 || bits == 8 ? XL_EVENODD : XL_NATURAL;
}

/* Bits [2k, 2k + w) of every byte of v at bit 0, the rest zero (w = 2: k = 1..3; w = 4: k = 2).
 * With GF, the VBMI build (whose table also asks for GFNI) does it in one vgf2p8affineqb, a
 * bit-matrix multiply per byte (the matrix's byte 7 - i picks output bit i); otherwise a 16-bit
 * shift and a mask. Only 1-row calls take the affine op: at 2 or more rows, where the
 * multiplies make a call partly compute-bound, the shift and mask are faster. */
AI __m512i byte_field(__m512i v, int k, int w, const int GF) {
#if NX_VNNI_VBMI
    if (GF) {
        uint64_t m = 0;
        for (int i = 0; i < w; i++) m |= (uint64_t)1 << (2 * k + i) << (8 * (7 - i));
        return _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64((long long)m), 0);
    }
#else
    (void)GF;
#endif
    return _mm512_and_si512(_mm512_srli_epi16(v, 2 * k), _mm512_set1_epi8((char)((1 << w) - 1)));
}

/* 2^k for -126 <= k <= 127, exactly (the group scales; no libm call per group). */
static inline float pow2f(int k) {
    const uint32_t u = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The e with x < 2^e <= 2x, for finite x > 0 (frexpf's exponent). */
static inline int exp_above(float x) {
    if (x < 0x1p-126f) { /* subnormal */
        int e;
        frexpf(x, &e);
        return e;
    }
    uint32_t u;
    memcpy(&u, &x, 4);
    return (int)((u >> 23) & 0xffu) - 126;
}

/* Word indices into a 64-word pair of registers: the even and odd words, and per field j the
 * words 4k+j (k < 16, zero after). Constant tables: quantize_row runs on every matmul call. */
#define IX4(f, j, b) f(b, j), f(b + 1, j), f(b + 2, j), f(b + 3, j)
#define IX16(f, j, b) IX4(f, j, b), IX4(f, j, b + 4), IX4(f, j, b + 8), IX4(f, j, b + 12)
#define IX32(f, j) IX16(f, j, 0), IX16(f, j, 16)
#define IX_EVEN(k, j) 2 * (k) + (j)
#define IX_FIELD(k, j) ((k) < 16 ? 4 * (k) + (j) : 0)
static const int16_t ev[32] = {IX32(IX_EVEN, 0)}, od[32] = {IX32(IX_EVEN, 1)};
static const int16_t q4[4][32] = {{IX32(IX_FIELD, 0)}, {IX32(IX_FIELD, 1)}, {IX32(IX_FIELD, 2)}, {IX32(IX_FIELD, 3)}};

/* The int16 (act 16) or int8 (act 8) image of one input row, in x_layout's order. d[g] = the
 * group's scale, X[g] = Σ x over the group in f32 (for the bias term); a group with a NaN or
 * infinity gets d = NaN so the outputs it touches are NaN, as a float dot product would be. */
static void quantize_row(const float *x, int64_t in, int64_t group, int act, int bits, void *xqv, float *d,
                         float *X) {
    float inv[XG_MAX];
    for (int64_t g = 0; g < in / group; g++) {
        const float *xg = x + g * group;
        __m512 mx = _mm512_setzero_ps(), sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < group; j += 16) {
            __m512 v = _mm512_loadu_ps(xg + j);
            mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
            sum = _mm512_add_ps(sum, v);
        }
        float amax = _mm512_reduce_max_ps(mx);
        X[g] = hsum16(sum);
        /* d = 2^-k with max|x|/d in [2^14, 2^15): scaling by it is exact, so only the rounding
         * to an integer loses anything (an x with 15 significant bits relative to the group's
         * largest is kept exactly), and s·d is exact too */
        inv[g] = 0.0f;
        d[g] = 0.0f;
        if (act == 8) {
            /* llama.cpp's q8 activations (nx_act8_scale) */
            nx_act8_scale(amax, X[g], &d[g], &inv[g]);
        } else if (!isfinite(X[g]) || !isfinite(amax)) {
            d[g] = NAN;
        } else if (amax > 0.0f) {
            /* int16: a power of two putting max|x| in [2^14, 2^15); below 2^-111 the exponent
             * stops at 126 and precision degrades gracefully */
            int k = 15 - exp_above(amax);
            if (k > 126) k = 126;
            inv[g] = pow2f(k);
            d[g] = pow2f(-k);
        }
    }
    const int lay = x_layout(act, bits, in, group);
    const int64_t blk = lay == XL8_STRIDE4 || lay == XL8_PARTS || lay == XL8_PARTS4 ? 256 : lay == XL_STRIDE4 || lay == XL8_EVENODD ? 128 : 64;
    for (int64_t b0 = 0; b0 < in; b0 += blk) {
        __m512i n[8];
        /* every block has at least 64 elements; q4_tail64's last one has only those */
        const int nc = (int)((in - b0 < blk ? in - b0 : blk) / 32);
        n[0] = q32(x + b0, _mm512_set1_ps(inv[b0 / group]));
        n[1] = q32(x + b0 + 32, _mm512_set1_ps(inv[(b0 + 32) / group]));
        for (int c = 2; c < nc; c++)
            n[c] = q32(x + b0 + 32 * c, _mm512_set1_ps(inv[(b0 + 32 * c) / group]));
        int16_t *q = (int16_t *)xqv + b0;
        int8_t *q8 = (int8_t *)xqv + b0;
        if (lay == XL8_EVENODD && nc == 2) { /* the evens, then the odds, of the last 64 */
            const __m512i e = _mm512_loadu_si512(ev), o = _mm512_loadu_si512(od);
            _mm256_storeu_si256((__m256i *)q8, _mm512_cvtepi16_epi8(_mm512_permutex2var_epi16(n[0], e, n[1])));
            _mm256_storeu_si256((__m256i *)(q8 + 32), _mm512_cvtepi16_epi8(_mm512_permutex2var_epi16(n[0], o, n[1])));
        } else if (lay == XL8_PARTS4) { /* 64 elements p: evens and odds, in the halves of their group */
            const __m512i e = _mm512_loadu_si512(ev), o = _mm512_loadu_si512(od);
            for (int p = 0; p < 4; p++) {
                const __m256i E = _mm512_cvtepi16_epi8(_mm512_permutex2var_epi16(n[2 * p], e, n[2 * p + 1]));
                const __m256i O = _mm512_cvtepi16_epi8(_mm512_permutex2var_epi16(n[2 * p], o, n[2 * p + 1]));
                if (group == 64) { /* group p: its first 32 elements to vectors 0/1, the rest to 2/3 */
                    _mm_storeu_si128((__m128i *)(q8 + 16 * p), _mm256_castsi256_si128(E));
                    _mm_storeu_si128((__m128i *)(q8 + 64 + 16 * p), _mm256_castsi256_si128(O));
                    _mm_storeu_si128((__m128i *)(q8 + 128 + 16 * p), _mm256_extracti128_si256(E, 1));
                    _mm_storeu_si128((__m128i *)(q8 + 192 + 16 * p), _mm256_extracti128_si256(O, 1));
                } else { /* half p % 2 of group p / 2 */
                    _mm256_storeu_si256((__m256i *)(q8 + 128 * (p & 1) + 32 * (p >> 1)), E);
                    _mm256_storeu_si256((__m256i *)(q8 + 128 * (p & 1) + 64 + 32 * (p >> 1)), O);
                }
            }
        } else if (lay == XL8_PARTS) { /* 32 elements c: group c/2, vectors 2·(c%2) and the next */
            for (int c = 0; c < 8; c++) {
                const __m256i b = _mm512_cvtepi16_epi8(n[c]);
                _mm_storeu_si128((__m128i *)(q8 + 64 * (2 * (c & 1)) + 16 * (c >> 1)), _mm256_castsi256_si128(b));
                _mm_storeu_si128((__m128i *)(q8 + 64 * (2 * (c & 1) + 1) + 16 * (c >> 1)), _mm256_extracti128_si256(b, 1));
            }
        } else if (lay == XL8_NATURAL) { /* |x̂| <= 127: narrowing is exact */
            _mm256_storeu_si256((__m256i *)q8, _mm512_cvtepi16_epi8(n[0]));
            _mm256_storeu_si256((__m256i *)(q8 + 32), _mm512_cvtepi16_epi8(n[1]));
        } else if (lay == XL8_EVENODD) {
            const __m512i e = _mm512_loadu_si512(ev), o = _mm512_loadu_si512(od);
            _mm256_storeu_si256((__m256i *)q8, _mm512_cvtepi16_epi8(_mm512_permutex2var_epi16(n[0], e, n[1])));
            _mm256_storeu_si256((__m256i *)(q8 + 32), _mm512_cvtepi16_epi8(_mm512_permutex2var_epi16(n[2], e, n[3])));
            _mm256_storeu_si256((__m256i *)(q8 + 64), _mm512_cvtepi16_epi8(_mm512_permutex2var_epi16(n[0], o, n[1])));
            _mm256_storeu_si256((__m256i *)(q8 + 96), _mm512_cvtepi16_epi8(_mm512_permutex2var_epi16(n[2], o, n[3])));
        } else if (lay == XL8_STRIDE4) { /* per field j: elements 4k+j of each 128-element half */
            for (int j = 0; j < 4; j++)
                for (int h = 0; h < 2; h++) {
                    const __m512i idx = _mm512_loadu_si512(q4[j]), *m = n + 4 * h;
                    const __m512i lo = _mm512_permutex2var_epi16(m[0], idx, m[1]);
                    const __m512i hi = _mm512_permutex2var_epi16(m[2], idx, m[3]);
                    _mm256_storeu_si256((__m256i *)(q8 + 64 * j + 32 * h),
                                        _mm512_cvtepi16_epi8(_mm512_inserti64x4(lo, _mm512_castsi512_si256(hi), 1)));
                }
        } else if (lay == XL_NATURAL) {
            _mm512_storeu_si512(q, n[0]);
            _mm512_storeu_si512(q + 32, n[1]);
        } else if (lay == XL_EVENODD) {
            _mm512_storeu_si512(q, _mm512_permutex2var_epi16(n[0], _mm512_loadu_si512(ev), n[1]));
            _mm512_storeu_si512(q + 32, _mm512_permutex2var_epi16(n[0], _mm512_loadu_si512(od), n[1]));
        } else {
            for (int j = 0; j < 4; j++) {
                const __m512i idx = _mm512_loadu_si512(q4[j]);
                const __m512i lo = _mm512_permutex2var_epi16(n[0], idx, n[1]);
                const __m512i hi = _mm512_permutex2var_epi16(n[2], idx, n[3]);
                _mm512_storeu_si512(q + 32 * j, _mm512_inserti64x4(lo, _mm512_castsi512_si256(hi), 1));
            }
        }
    }
}

/* 16 scales or biases (elements i..i+15 of a stored vector) as f32; lanes past n are 0. */
AI __m512 load_sc16(nx_dtype dt, const uint8_t *p, int64_t i, int64_t n) {
    const __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
    if (dt == NX_DTYPE_F32) return _mm512_maskz_loadu_ps(m, p + 4 * i);
    __m256i h = _mm256_maskz_loadu_epi16(m, p + 2 * i);
    if (dt == NX_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The end of a register block: one fixed tree per output (four rows' trees at once: the same
 * order as one alone). */
AI void finish(const int R, const int TT, __m512 tot[4][4], float *y, int64_t ldy, int64_t ys) {
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) {
        if (R == 4 && ys == 1) {
            _mm_storeu_ps(y + t * ldy, hsum16x4(tot[0][t], tot[1][t], tot[2][t], tot[3][t]));
        } else if (R == 4) {
            float o4[4];
            _mm_storeu_ps(o4, hsum16x4(tot[0][t], tot[1][t], tot[2][t], tot[3][t]));
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) y[t * ldy + r * ys] = o4[r];
        } else {
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) y[t * ldy + r * ys] = hsum16(tot[r][t]);
        }
    }
}

/* Groups g0..g0+gn-1 of each row and input row of the block: s·d into sd (one vector multiply
 * per 16 groups), and the bias terms b_g·X_g into the lanes of acc, which the groups' scaled
 * integer sums are then added to: here, with the scales, rather than as a pass at the block's
 * end, which short rows pay most for. */
AI void stage_sd(const int R, const int TT, const vargs *a, const float *d, const float *X, int64_t ldg, int64_t g0,
                 int64_t gn, float sd[4][4][16], __m512 acc[4][4]) {
    const __mmask16 gm = gn >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << gn) - 1u);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m512 s = load_sc16(a->sdt, a->sc + r * a->sstride, g0, gn);
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) _mm512_store_ps(sd[r][t], _mm512_mul_ps(s, _mm512_maskz_loadu_ps(gm, d + t * ldg + g0)));
        if (a->bi) {
            const __m512 b = load_sc16(a->sdt, a->bi + r * a->sstride, g0, gn);
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++)
                acc[r][t] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(gm, X + t * ldg + g0), acc[r][t]);
        }
    }
}

/* Groups whose combined scales s·d are staged together (one vector multiply per 16 groups). */
#define SG 16

/* acc += float(is)·(s·d) for one unit of integer sums: GPU groups from gi on, each in 16/GPU
 * consecutive lanes (1: one group in all lanes; 2: lanes 0-7 and 8-15; 4: quarters), their
 * staged scales spread over the lanes by the index vector lanes (group gi + lane·GPU/16). */
AI void scale_row(const int GPU, const int TT, const __m512i is[4], float sd[4][SG], int64_t gi, __m512i lanes,
                  __m512 acc[4]) {
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) {
        const __m512 s = GPU > 1 ? _mm512_permutexvar_ps(lanes, _mm512_load_ps(sd[t])) : _mm512_set1_ps(sd[t][gi]);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[t]), s, acc[t]);
    }
}

/* The same for the R rows of a register block. */
AI void scale_in(const int GPU, const int R, const int TT, __m512i is[4][4], float sd[4][4][SG], int64_t gi,
                 __m512i lanes, __m512 acc[4][4]) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) scale_row(GPU, TT, is[r], sd[r], gi, lanes, acc[r]);
}

/* How a kernel reads a block of weights against its activation image:
 * - K_W16: 64-element blocks on int16 inputs, two weight vectors of 32 words: 8-bit (low and
 *   high byte of each packed word), 4-bit rows that are not whole 128-element blocks (nibbles of
 *   32 bytes widened to words), 3/5/6-bit (each field pulled into its word by vpermb, VBMI);
 * - K_S4: 128-element blocks on int16 inputs in stride-4 order, four vectors of 2-bit fields
 *   (32 bytes widened to words) or 4-bit nibbles (32 packed words), no shuffle;
 * - K_A8: int8 inputs (vpdpbusd: unsigned weight bytes times signed inputs, 64 multiply-adds per
 *   instruction) against the fields of 64 packed bytes: 4-bit, 128-element blocks as low and
 *   high nibbles; 2-bit, 256-element blocks as four 2-bit fields; 3/5/6-bit (VBMI), 64-element
 *   blocks of 8·BITS bytes, each element pulled into its own byte;
 * - K_A8Q: int8 inputs against 3- or 4-bit weights of 64-element groups by 256-element blocks,
 *   each group in its own lane quarter of every weight vector (4-bit groups of 128: a lane half),
 *   one epilogue per block (3-bit,
 *   VBMI: one vpermt2b per weight vector from the block's 96 packed bytes, then vpmultishiftqb
 *   as K_A8, XL8_PARTS; 4-bit: two lane shuffles of the block's 128 bytes, then nibbles,
 *   XL8_PARTS4). */
enum { K_W16, K_S4, K_A8, K_A8Q };

/* The packed bytes per row one block of block_products reads. */
AI size_t block_step(const int KIND, const int BITS) {
    const int ODD = BITS == 3 || BITS == 5 || BITS == 6;
    if (KIND == K_A8Q) return (size_t)(32 * BITS);
    return KIND == K_A8 ? (size_t)(ODD ? 8 * BITS : 64) : (size_t)(KIND == K_W16 ? 64 : 128) * BITS / 8;
}

/* The four weight vectors of a 256-element block of 4-bit weights (K_A8Q, 128 packed bytes at pr):
 * the first half of each group's bytes, then the second, as low and high nibbles. */
AI void weights_q4x4(const int GPU, const int TT, const uint8_t *pr, __m512i w[4]) {
    const __m512i A = _mm512_loadu_si512(pr), B = _mm512_loadu_si512(pr + 64), m4 = _mm512_set1_epi8(0x0f);
    const __m512i lo = GPU == 4 ? _mm512_shuffle_i64x2(A, B, _MM_SHUFFLE(2, 0, 2, 0))
                                : _mm512_shuffle_i64x2(A, B, _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i hi = GPU == 4 ? _mm512_shuffle_i64x2(A, B, _MM_SHUFFLE(3, 1, 3, 1))
                                : _mm512_shuffle_i64x2(A, B, _MM_SHUFFLE(3, 2, 3, 2));
    w[0] = _mm512_and_si512(lo, m4);
    w[1] = byte_field(lo, 2, 4, TT == 1);
    w[2] = _mm512_and_si512(hi, m4);
    w[3] = byte_field(hi, 2, 4, TT == 1);
}

/* The four weight vectors of a 256-element block of 2-bit weights (K_A8, 64 packed bytes). */
AI void weights_q2x4(const int TT, const uint8_t *pr, __m512i w[4]) {
    const __m512i v = _mm512_loadu_si512(pr), m2 = _mm512_set1_epi8(0x03);
    w[0] = _mm512_and_si512(v, m2);
    w[1] = byte_field(v, 1, 2, TT == 1);
    w[2] = byte_field(v, 2, 2, TT == 1);
    w[3] = byte_field(v, 3, 2, TT == 1);
}

/* Row 0's weight hint for the block at packed byte offset off of a register block's rows, and in
 * *prs the distance to row 1's (row r's: + r·*prs). */
AI uintptr_t block_hint(const vargs *a, const qpf_stream *ps, size_t off, size_t *prs) {
    *prs = ps->rstride;
    return a->split ? qpf_at_split(&a->pf, ps, off, prs) : qpf_at(&a->pf, ps, off);
}

/* Adds one block's products (elements e0.. of R weight rows, TT input rows) into the exact
 * int32 lane sums is[r][t]; ps is the register block's prefetch stream. */
AI void block_products(const int KIND, const int BITS, const int GPU, const int R, const int TT, const vargs *a,
                       const qpf_stream *ps, const void *xq, int64_t ldq, int64_t e0, __m512i is[4][4]) {
    const int ODD = BITS == 3 || BITS == 5 || BITS == 6;
    /* weight (and input) vectors per block */
    const int NX = KIND == K_S4 || KIND == K_A8Q || (KIND == K_A8 && BITS == 2) ? 4 : KIND == K_A8 && ODD ? 1 : 2;
    const uint8_t *p = a->w + (size_t)e0 * BITS / 8;
    size_t prs;
    const uintptr_t pf = block_hint(a, ps, (size_t)e0 * BITS / 8, &prs);
    __m512i xv[4][4];
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++)
#pragma GCC unroll 4
        for (int j = 0; j < NX; j++)
            xv[t][j] = KIND == K_A8 || KIND == K_A8Q ? _mm512_loadu_si512((const int8_t *)xq + t * ldq + e0 + 64 * j)
                                    : _mm512_loadu_si512((const int16_t *)xq + t * ldq + e0 + 32 * j);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const uint8_t *pr = p + r * a->wstride;
        _mm_prefetch((const char *)(pf + (size_t)r * prs), QPF_HINT);
        if (KIND == K_A8Q) _mm_prefetch((const char *)(pf + (size_t)r * prs + 64), QPF_HINT); /* 2 lines */
        __m512i w[4];
        if (KIND == K_A8Q && BITS == 4) {
            weights_q4x4(GPU, TT, pr, w);
        } else if (KIND == K_A8Q) {
#if NX_VNNI_VBMI
            const __m512i A = _mm512_loadu_si512(pr), mb = _mm512_set1_epi8((char)((1 << BITS) - 1));
            const __m512i B = _mm512_maskz_loadu_epi8((__mmask64)((1ull << (32 * BITS - 64)) - 1u), pr + 64);
#pragma GCC unroll 4
            for (int j = 0; j < NX; j++)
                w[j] = _mm512_and_si512(_mm512_multishift_epi64_epi8(a->shift8, _mm512_permutex2var_epi8(A, a->pickq[j], B)), mb);
#else
            w[0] = w[1] = w[2] = w[3] = _mm512_setzero_si512(); /* not taken: q3_by256 declines */
#endif
        } else if (KIND == K_A8 && ODD) {
#if NX_VNNI_VBMI
            const __m512i v = _mm512_maskz_loadu_epi8((__mmask64)((1ull << (8 * BITS)) - 1u), pr);
            w[0] = _mm512_and_si512(_mm512_multishift_epi64_epi8(a->shift8, _mm512_permutexvar_epi8(a->pick8, v)),
                                    _mm512_set1_epi8((char)((1 << BITS) - 1)));
#else
            w[0] = _mm512_setzero_si512(); /* not taken: act8_takes declines these widths */
#endif
        } else if (KIND == K_A8 && BITS == 2) {
            weights_q2x4(TT, pr, w);
        } else if (KIND == K_A8) {
            const __m512i v = _mm512_loadu_si512(pr), m4 = _mm512_set1_epi8(0x0f);
            w[0] = _mm512_and_si512(v, m4);
            w[1] = byte_field(v, 2, 4, TT == 1);
        } else if (KIND == K_S4) {
            const __m512i v = BITS == 2 ? _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)pr))
                                        : _mm512_loadu_si512(pr);
            const __m512i mb = _mm512_set1_epi16((1 << BITS) - 1);
            w[0] = _mm512_and_si512(v, mb);
            w[1] = _mm512_and_si512(_mm512_srli_epi16(v, BITS), mb);
            w[2] = _mm512_and_si512(_mm512_srli_epi16(v, 2 * BITS), mb);
            w[3] = _mm512_srli_epi16(v, 3 * BITS);
        } else if (BITS == 4) {
            const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)pr));
            w[0] = _mm512_and_si512(v, _mm512_set1_epi16(0x0f));
            w[1] = _mm512_srli_epi16(v, 4);
        } else if (BITS == 8) { /* low and high byte of each word: even and odd elements */
            const __m512i v = _mm512_loadu_si512(pr);
            w[0] = _mm512_and_si512(v, _mm512_set1_epi16(0xff));
            w[1] = _mm512_srli_epi16(v, 8);
        } else {
#if NX_VNNI_VBMI
            const __m512i v = _mm512_maskz_loadu_epi8((__mmask64)((1ull << (8 * BITS)) - 1u), pr);
            const __m512i mb = _mm512_set1_epi16((1 << BITS) - 1);
            w[0] = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi8(a->pick[0], v), a->shift[0]), mb);
            w[1] = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi8(a->pick[1], v), a->shift[1]), mb);
#else
            w[0] = w[1] = _mm512_setzero_si512(); /* not taken: vnni_takes declines these widths */
#endif
        }
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++)
#pragma GCC unroll 4
            for (int j = 0; j < NX; j++)
                is[r][t] = KIND == K_A8 || KIND == K_A8Q ? _mm512_dpbusd_epi32(is[r][t], w[j], xv[t][j])
                                        : _mm512_dpwssd_epi32(is[r][t], w[j], xv[t][j]);
    }
}

/* The last block of a q4_tail64 row (K_A8, 4-bit, groups of 64): one group, its 32 packed
 * bytes as one weight vector (the low nibbles, then the high ones) against the image's 64 bytes
 * (the group's evens, then its odds), so every lane holds that group. */
AI void tail_products(const int R, const int TT, const vargs *a, const qpf_stream *ps, const void *xq, int64_t ldq,
                      int64_t e0, __m512i is[4][4]) {
    size_t prs;
    const uintptr_t pf = block_hint(a, ps, (size_t)e0 / 2, &prs);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m512i xv[4];
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++) xv[t] = _mm512_loadu_si512((const int8_t *)xq + t * ldq + e0);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        _mm_prefetch((const char *)(pf + (size_t)r * prs), QPF_HINT);
        const __m256i v = _mm256_loadu_si256((const __m256i *)(a->w + (size_t)e0 / 2 + r * a->wstride));
        const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m4)),
                                             _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), 1);
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) is[r][t] = _mm512_dpbusd_epi32(is[r][t], w, xv[t]);
    }
}

/* Units taken row by row (mk_block): 4- and 2-bit weights on int8 by 256-element blocks, at 2
 * input rows. One row's sums are live at a time instead of the register block's, so the block's
 * input vectors stay in registers; at more rows, or for other kinds, the registers run out and
 * block_products is faster. */
AI int by_rows(const int KIND, const int BITS, const int TT) {
    return TT == 2 && ((KIND == K_A8Q && BITS == 4) || (KIND == K_A8 && BITS == 2));
}

/* A by_rows unit, one weight row: adds its products with the block (packed bytes at pr, its
 * weight hint at pfr) to the int32 lane sums is[t] of the TT input rows, whose vectors are xv. */
AI void row_products(const int KIND, const int GPU, const int TT, const uint8_t *pr, uintptr_t pfr,
                     const __m512i xv[4][4], __m512i is[4]) {
    __m512i w[4];
    _mm_prefetch((const char *)pfr, QPF_HINT);
    if (KIND == K_A8Q) {
        _mm_prefetch((const char *)(pfr + 64), QPF_HINT); /* 2 lines */
        weights_q4x4(GPU, TT, pr, w);
    } else {
        weights_q2x4(TT, pr, w);
    }
#pragma GCC unroll 4
    for (int t = 0; t < TT; t++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) is[t] = _mm512_dpbusd_epi32(is[t], w[j], xv[t][j]);
}

/* R weight rows × TT input rows. Per unit (one group of nblk blocks, or GPU = 2 or 4 groups
 * sharing one block) and input row: exact int32 lane sums of q·x̂, then
 * acc += float(sum)·(s·d), after the bias terms b_g·X_g of every 16 groups (stage_sd) went into
 * the same lanes. NB fixes the blocks per group at compile time (0: from the group size). */
AI void mk_block(const int KIND, const int BITS, const int GPU, const int NB, const int R, const int TT,
                 const vargs *a, const void *xq, int64_t ldq, const float *d, const float *X, int64_t ldg, float *y,
                 int64_t ldy, int64_t ys) {
    const int64_t blk = KIND == K_W16 || (KIND == K_A8 && BITS != 2 && BITS != 4) ? 64
                        : KIND == K_A8Q || (KIND == K_A8 && BITS == 2)          ? 256
                                                                                : 128;
    const int64_t g_end = a->g_hi;
    const int64_t nblk = GPU > 1 ? 1 : NB ? NB : a->group / blk;
    const int rowwise = nblk == 1 && by_rows(KIND, BITS, TT);
    __m512 acc[4][4];
    float sd[4][4][SG] __attribute__((aligned(64)));
    /* split: row r's hint QPF_SPLIT bytes ahead in its own part (a->wstride apart) */
    const qpf_stream ps = a->split ? (qpf_stream){(uintptr_t)a->w + QPF_SPLIT, 1, a->wstride}
                                   : qpf_stream_of(a->w, a->wstride, R, block_step(KIND, BITS));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++)
            acc[r][t] = a->g_lo > 0 ? _mm512_load_ps(a->acc + 64 * r + 16 * t) : _mm512_setzero_ps();
    int si = 0; /* side hints issued */
    for (int64_t g0 = a->g_lo; g0 < g_end; g0 += SG) {
        const int64_t gn = g_end - g0 < SG ? g_end - g0 : SG;
        stage_sd(R, TT, a, d, X, ldg, g0, gn, sd, acc);
        /* the spread index steps with gi (a broadcast of gi per unit cost 12% of a 4-bit T=1
         * call in cache) */
        __m512i lanes = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          GPU == 4 ? 2 : 3);
        for (int64_t gi = 0; gi < gn; gi += GPU, lanes = _mm512_add_epi32(lanes, _mm512_set1_epi32(GPU))) {
            side_step(a, &si);
            if (rowwise) { /* row by row: one row's sums live at a time, the inputs stay in registers */
                const int64_t e0 = (g0 + gi) * a->group;
                size_t prs;
                const uintptr_t pf = block_hint(a, &ps, (size_t)e0 * BITS / 8, &prs);
                __m512i xv[4][4];
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++)
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) {
                        xv[t][j] = _mm512_loadu_si512((const int8_t *)xq + t * ldq + e0 + 64 * j);
                        __asm__("" : "+v"(xv[t][j])); /* held: not reloaded as each row's operand */
                    }
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    __m512i is[4];
#pragma GCC unroll 4
                    for (int t = 0; t < TT; t++) is[t] = _mm512_setzero_si512();
                    row_products(KIND, GPU, TT, a->w + (size_t)e0 * BITS / 8 + r * a->wstride, pf + (size_t)r * prs,
                                 xv, is);
                    scale_row(GPU, TT, is, sd[r], gi, lanes, acc[r]);
                }
                continue;
            }
            __m512i is[4][4];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
#pragma GCC unroll 4
                for (int t = 0; t < TT; t++) is[r][t] = _mm512_setzero_si512();
            /* a group left over at the row's end (q4_tail64: gn is odd only there, chunks of
             * groups being multiples of SG) */
            if (KIND == K_A8 && BITS == 4 && GPU == 2 && gi + 1 == gn) {
                tail_products(R, TT, a, &ps, xq, ldq, (g0 + gi) * a->group, is);
                scale_in(1, R, TT, is, sd, gi, lanes, acc);
                continue;
            }
            for (int64_t k = 0; k < nblk; k++)
                block_products(KIND, BITS, GPU, R, TT, a, &ps, xq, ldq, (g0 + gi) * a->group + k * blk, is);
            scale_in(GPU, R, TT, is, sd, gi, lanes, acc);
        }
    }
    side_rest(a, si);
    if (a->carry_out) { /* a column chunk: the sums go on with the next one */
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) _mm512_store_ps(a->acc + 64 * r + 16 * t, acc[r][t]);
        return;
    }
    finish(R, TT, acc, y, ldy, ys);
}

/* Rows [r0, r1) of the call (a multiple of R) as consecutive register blocks of R rows, in one
 * function (an indirect call and shape switch per block cost 7-15% on 512-wide rows). */
AI void mk_int(const int KIND, const int BITS, const int GPU, const int NB, const int R, const int TT,
               const vargs *a, int64_t r0, int64_t r1, const void *xq, int64_t ldq, const float *d, const float *X,
               int64_t ldg, float *y, int64_t ldy) {
    vargs b = *a;
    nx_side_pf *side = a->pf.side;
    if (R > 1 && a->split) { /* row o of each of the R parts: rows o + r·q */
        const int64_t q = (r1 - r0) / R;
        b.wstride = (size_t)q * a->wstride;
        b.sstride = (size_t)q * a->sstride;
        b.pf.end = (uintptr_t)(a->w + (size_t)(r0 + q) * a->wstride); /* where part 1 begins */
        const int64_t ahead = (int64_t)((QPF_SPLIT + a->wstride - 1) / a->wstride); /* rows */
        b.spf.ahead = (size_t)ahead * a->sstride;
        split_next(&b, R);
        for (int64_t o = r0; o < r0 + q; o++) {
            b.sqn = 0;
            b.w = a->w + (size_t)o * a->wstride;
            b.sc = a->sc + (size_t)o * a->sstride;
            b.bi = a->bi ? a->bi + (size_t)o * a->sstride : NULL;
            const int64_t h = o - r0 + ahead; /* the row of each part whose scales are hinted */
            /* Rows of at most 32 bytes of scales share their lines two or more to a line, so
             * every other block's hints still reach every line; the blocks between skip theirs
             * (never the next call's first row, which hints the line it begins in too). */
            const int skip = ((o - r0) & 1) && a->sstride <= 32 && (h < q || (b.nsrow <= 32 && h != q));
            if (!skip && h < q) {
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) spf_hint_row(&b, &b.spf, b.sc + r * b.sstride, a->sstride, 0);
            } else if (!skip && b.nsc && h - q < b.nq) {
                spf_hint_next(&b, R, h - q);
            }
            nx_side_hint(side, R);
            mk_block(KIND, BITS, GPU, NB, R, TT, &b, xq, ldq, d, X, ldg, y + o, ldy, q);
        }
        return;
    }
    b.split = 0; /* and no side hints queued: vargs of a call start with none */
    for (int64_t o = r0; o < r1; o += R) {
        b.w = a->w + (size_t)o * a->wstride;
        b.sc = a->sc + (size_t)o * a->sstride;
        b.bi = a->bi ? a->bi + (size_t)o * a->sstride : NULL;
        b.acc = a->accs ? a->accs + 64 * (size_t)o : NULL;
        spf_hint(&b.spf, b.sc, (size_t)R * a->sstride);
        nx_side_hint(side, R);
        mk_block(KIND, BITS, GPU, NB, R, TT, &b, xq, ldq, d, X, ldg, y + o, ldy, 1);
    }
}

/* Calls K(params..., R, TT, ...) with R and TT as compile-time constants: the n rows of the call
 * as register blocks of R rows, then the remaining rows one at a time. */
#define VNNI_SHAPE(K, RR, T_, ...)                                                             \
    do {                                                                                       \
        const int64_t nf_ = n - n % (RR);                                                      \
        K(__VA_ARGS__, RR, T_, a, 0, nf_, xq, ldq, d, X, ldg, y, ldy);                         \
        K(__VA_ARGS__, 1, T_, a, nf_, n, xq, ldq, d, X, ldg, y, ldy);                          \
    } while (0)
/* One kernel family: R x TT register blocks of the given kind for TT = 1, 2, 3, 4 input rows
 * (R = 4, 4, 3, 2: the R×TT int32 sums, the weights and the activations share 32 registers),
 * each a function of its own, and NAME(TT, ...) choosing: built into one function, the shapes'
 * register allocation changed with any edit to one of them. */
#define VNNI_ARGS                                                                              \
    const vargs *a, int64_t n, const void *xq, int64_t ldq, const float *d, const float *X, int64_t ldg, float *y, \
        int64_t ldy
#define VNNI_SHAPE_FN(NAME, RR, T_, ...)                                                       \
    static __attribute__((noinline)) void NAME(VNNI_ARGS) { VNNI_SHAPE(mk_int, RR, T_, __VA_ARGS__); }
#define VNNI_FAMILY(NAME, KIND, BITS, GPU, NB)                                                 \
    VNNI_SHAPE_FN(NAME##_t1, 4, 1, KIND, BITS, GPU, NB)                                        \
    VNNI_SHAPE_FN(NAME##_t2, 4, 2, KIND, BITS, GPU, NB)                                        \
    VNNI_SHAPE_FN(NAME##_t3, 3, 3, KIND, BITS, GPU, NB)                                        \
    VNNI_SHAPE_FN(NAME##_t4, 2, 4, KIND, BITS, GPU, NB)                                        \
    static void NAME(int TT, VNNI_ARGS) {                                                      \
        (TT == 1 ? NAME##_t1 : TT == 2 ? NAME##_t2 : TT == 3 ? NAME##_t3 : NAME##_t4)(a, n, xq, ldq, d, X, ldg, y, ldy); \
    }
#define VNNI_PASS TT, a, n, xq, ldq, d, X, ldg, y, ldy

/* Kernels on 64-element blocks, one group per unit: 64-element groups get the block loop
 * unrolled away, other sizes loop over their blocks. */
#define VNNI_KERNEL(NAME, KIND, BITS)                                                          \
    VNNI_FAMILY(NAME##_g64, KIND, BITS, 1, 1)                                                  \
    VNNI_FAMILY(NAME##_g, KIND, BITS, 1, 0)                                                    \
    static void NAME(int TT, VNNI_ARGS) {                                                      \
        if (a->group == 64) NAME##_g64(VNNI_PASS);                                             \
        else NAME##_g(VNNI_PASS);                                                              \
    }

VNNI_KERNEL(kern_v8, K_W16, 8)
#if NX_VNNI_VBMI
VNNI_KERNEL(kern_v3, K_W16, 3)
VNNI_KERNEL(kern_v5, K_W16, 5)
VNNI_KERNEL(kern_v6, K_W16, 6)
VNNI_KERNEL(kern_v5a8, K_A8, 5)
VNNI_KERNEL(kern_v6a8, K_A8, 6)

/* 3-bit on int8: blocks of four groups where q3_by256 takes the row. */
VNNI_FAMILY(v3a8_q, K_A8Q, 3, 4, 0)
VNNI_FAMILY(v3a8_g64, K_A8, 3, 1, 1)
VNNI_FAMILY(v3a8_g, K_A8, 3, 1, 0)
static void kern_v3a8(int TT, VNNI_ARGS) {
    if (q3_by256(3, a->in, a->group)) v3a8_q(VNNI_PASS);
    else if (a->group == 64) v3a8_g64(VNNI_PASS);
    else v3a8_g(VNNI_PASS);
}
#endif

VNNI_FAMILY(v2_g64, K_S4, 2, 2, 0)
VNNI_FAMILY(v2_g, K_S4, 2, 1, 0)
static void kern_v2(int TT, VNNI_ARGS) {
    if (a->group == 64) v2_g64(VNNI_PASS);
    else v2_g(VNNI_PASS);
}

VNNI_FAMILY(v4_w16, K_W16, 4, 1, 0)
VNNI_FAMILY(v4_g64, K_S4, 4, 2, 0)
VNNI_FAMILY(v4_g, K_S4, 4, 1, 0)
static void kern_v4(int TT, VNNI_ARGS) {
    if (!q4_by128(a->in, a->group)) v4_w16(VNNI_PASS);
    else if (a->group == 64) v4_g64(VNNI_PASS);
    else v4_g(VNNI_PASS);
}

VNNI_FAMILY(v2a8_g64, K_A8, 2, 4, 0)
VNNI_FAMILY(v2a8_g128, K_A8, 2, 2, 0)
VNNI_FAMILY(v2a8_g, K_A8, 2, 1, 0)
static void kern_v2a8(int TT, VNNI_ARGS) {
    if (a->group == 64) v2a8_g64(VNNI_PASS);
    else if (a->group == 128) v2a8_g128(VNNI_PASS);
    else v2a8_g(VNNI_PASS);
}

VNNI_FAMILY(v4a8_q64, K_A8Q, 4, 4, 0)
VNNI_FAMILY(v4a8_q128, K_A8Q, 4, 2, 0)
VNNI_FAMILY(v4a8_g64, K_A8, 4, 2, 0)
VNNI_FAMILY(v4a8_g, K_A8, 4, 1, 0)
static void kern_v4a8(int TT, VNNI_ARGS) {
    if (q4_by256(4, a->in, a->group)) {
        if (a->group == 64) v4a8_q64(VNNI_PASS);
        else v4a8_q128(VNNI_PASS); /* groups of 128 */
    } else if (a->group == 64) v4a8_g64(VNNI_PASS);
    else v4a8_g(VNNI_PASS);
}

typedef void kern_fn(int TT, VNNI_ARGS);

/* The kernels by weight width, on int16 and on int8 activations (NULL where vnni_takes or
 * act8_takes declines the width). */
static kern_fn *const kerns_a16[9] = {
    [2] = kern_v2, [4] = kern_v4, [8] = kern_v8,
#if NX_VNNI_VBMI
    [3] = kern_v3, [5] = kern_v5, [6] = kern_v6,
#endif
};
static kern_fn *const kerns_a8[9] = {
    [2] = kern_v2a8, [4] = kern_v4a8,
#if NX_VNNI_VBMI
    [3] = kern_v3a8, [5] = kern_v5a8, [6] = kern_v6a8,
#endif
};

/* Whether this file runs W: 4- or 8-bit with whole 64-element blocks per group, 2-bit with
 * whole 128-element blocks per group or per pair of 64-element groups, 3/5/6-bit (VBMI build)
 * with whole 64-element blocks; and at least one input row's int16 image fits the stack buffer. */
static int vnni_takes(const nx_linear *W) {
    if (W->dtype != NX_DTYPE_U32 || W->in > XQ_MAX || W->in / W->group > XG_MAX) return 0;
    if (W->bits == 4 || W->bits == 8) return W->group % 64 == 0;
    if (W->bits == 2) return W->group % 128 == 0 || (W->group == 64 && W->in % 128 == 0);
    if (W->bits == 3 || W->bits == 5 || W->bits == 6) return NX_VNNI_VBMI && W->group % 64 == 0;
    return 0;
}

/* The last few input rows a thread quantized, kept with their image: decode multiplies one input
 * by many matrices in a row (gate then up; every routed expert's gate and up), and quantizing a
 * 1024-wide row costs about as much as streaming 8 KB of 4-bit weights. Reused only when the
 * rows' bytes, count, width, group size and layout all match, so results do not change. 16384
 * floats: a 2-row verify of 4096-wide rows, and 8192-wide rows (an output projection). */
#define QC_FLOATS 16384
#define QC_GROUPS 1024
typedef struct qcache {
    int64_t T, in, group;
    int act, lay;
    float x[QC_FLOATS];
    int16_t xq[QC_FLOATS] __attribute__((aligned(64)));
    float dg[QC_GROUPS], Xg[QC_GROUPS];
} qcache;

/* The input rows' images staged per call when they are not the cached ones: XS_WORDS int16
 * (twice as many int8 bytes) and their groups' scales and sums. Each chunk of input rows that
 * fits is one pass over the call's weights, so the staging is large. */
#define XS_WORDS 131072
#define XS_GROUPS 4096

/* Column chunks (vnni_matmul_rows): a register block's 4 input rows' images kept below
 * ACC_X_BYTES per chunk (they stay in L1 across the row block), and each row's 4 x 16 carried
 * sums for up to ACC_ROWS rows. */
#define ACC_X_BYTES 16384
#define ACC_ROWS 256

/* The thread's scratch (nx_kscratch's vnni bytes; both builds share the layout). */
typedef struct vnni_scratch {
    qcache qc;
    struct {
        int16_t xq[XS_WORDS] __attribute__((aligned(64)));
        float dg[XS_GROUPS], Xg[XS_GROUPS];
    } xstage;
    float accs[ACC_ROWS * 64] __attribute__((aligned(64)));
} vnni_scratch;
_Static_assert(sizeof(vnni_scratch) <= NX_VNNI_SCRATCH_BYTES, "VNNI staging exceeds NX_VNNI_SCRATCH_BYTES");

/* The activation width W's calls take (kernels.h, Activation precision). */
static int act_of(const nx_linear *W) { return !W->x16 && act8_takes(W->bits, W->in, W->group) ? 8 : 16; }

/* A call's kernel arguments for W on act-bit activations, its rows ending at o1 (the prefetch
 * window), then the rows next; the register blocks' rows and images are set per block. */
static vargs vargs_of(const nx_linear *W, int act, int64_t o1, const nx_rows *next, nx_kscratch *s) {
    const int64_t in = W->in, ngroups = in / W->group;
    vargs a = {.wstride = (size_t)in * (size_t)W->bits / 8,
               .sstride = (size_t)ngroups * nx_dtype_size(W->sdtype),
               .sdt = W->sdtype,
               .in = in,
               .group = W->group,
               .pf = qpf_window_of(W, o1, next, &s->side),
               .next = next,
               .g_hi = ngroups};
    a.spf = spf_stream_of(W, a.wstride, a.sstride);
    /* 3/5/6-bit (VBMI build): the lane tables of the activation width in use */
    const int odd = W->bits == 3 || W->bits == 5 || W->bits == 6;
    if (odd && act == 16) {
        int8_t pick[2][64];
        int16_t shift[2][32];
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const int bit = (32 * h + l) * W->bits;
                pick[h][2 * l] = (int8_t)(bit >> 3);
                pick[h][2 * l + 1] = (int8_t)((bit >> 3) + 1);
                shift[h][l] = (int16_t)(bit & 7);
            }
        for (int h = 0; h < 2; h++) {
            a.pick[h] = _mm512_loadu_si512(pick[h]);
            a.shift[h] = _mm512_loadu_si512(shift[h]);
        }
    } else if (odd) {
        int8_t pick8[64], shift8[64];
        for (int p = 0; p < 64; p++) {
            pick8[p] = (int8_t)(p / 8 * W->bits + (p % 8 < W->bits ? p % 8 : 0));
            shift8[p] = (int8_t)(p % 8 * W->bits);
        }
        a.pick8 = _mm512_loadu_si512(pick8);
        a.shift8 = _mm512_loadu_si512(shift8);
        if (q3_by256(W->bits, in, W->group)) {
            /* vector j, byte p: 64-bit lane p/8 holds 8 elements of group q = p/16 (24 packed
             * bytes each), its (2j + (p/8)%2)-th 8 (3 packed bytes each) */
            for (int j = 0; j < 4; j++) {
                int8_t pq[64];
                for (int p = 0; p < 64; p++)
                    pq[p] = (int8_t)(p / 16 * 24 + (2 * j + p / 8 % 2) * 3 + (p % 8 < 3 ? p % 8 : 0));
                a.pickq[j] = _mm512_loadu_si512(pq);
            }
        }
    }
    return a;
}

static int vnni_matmul_rows(const nx_linear *W, const float *x, int64_t ldx, int64_t T, float *y,
                            int64_t ldy, int64_t o0, int64_t o1, const nx_rows *next, nx_kscratch *s) {
    if (!vnni_takes(W)) return nx_kernels_avx512.matmul_rows(W, x, ldx, T, y, ldy, o0, o1, next, s);
    vnni_scratch *vs = (vnni_scratch *)(void *)s->vnni;
    const int64_t in = W->in, ngroups = in / W->group;
    const int act = act_of(W);
    kern_fn *const kern = (act == 8 ? kerns_a8 : kerns_a16)[W->bits];
    vargs a = vargs_of(W, act, o1, next, s);
    int16_t *xq = vs->xstage.xq;
    float *dg = vs->xstage.dg, *Xg = vs->xstage.Xg;
    /* input rows per chunk: as many images as the staging holds (an int8 image takes half the
     * bytes of an int16 one) */
    int64_t tc = XS_WORDS * 16 / (in * act);
    if (tc > XS_GROUPS / ngroups) tc = XS_GROUPS / ngroups;
    const int cached = T * in <= QC_FLOATS && T * ngroups <= QC_GROUPS;
    /* split streams where the input rows go through the weights in one pass */
    a.split = T <= 4 && (cached || tc >= T);
    if (!a.split) qpf_next_scales(next); /* split calls hint them as their parts end (mk_int) */
    const int64_t ob = a.split ? o1 - o0 : nx_rows_per_block(a.wstride);
    /* Column chunks. Off the split path (5 or more input rows: prefill), each register block of
     * 4 input rows reads 4 x in bytes of images per 2 weight rows; past 32 KB they leave L1
     * before the next block rereads them. Such rows go through a row block in chunks of whole
     * 16-group stagings with at most ACC_X_BYTES of images, each register block's sums stored
     * between chunks: the same operations in the same order, the same bits. */
    int64_t kcg = ngroups;
    if (!a.split && in * act / 2 > 2 * ACC_X_BYTES && ob <= ACC_ROWS) {
        kcg = ACC_X_BYTES * 2 / act / W->group / SG * SG;
        if (kcg < SG) kcg = SG;
        a.accs = vs->accs;
    }
    if (cached) {
        qcache *q = &vs->qc;
        const int lay = x_layout(act, W->bits, in, W->group);
        int hit = q->T == T && q->in == in && q->group == W->group && q->act == act && q->lay == lay;
        for (int64_t t = 0; hit && t < T; t++) hit = !memcmp(q->x + t * in, x + t * ldx, sizeof(float) * (size_t)in);
        if (!hit) {
            for (int64_t t = 0; t < T; t++) {
                memcpy(q->x + t * in, x + t * ldx, sizeof(float) * (size_t)in);
                quantize_row(x + t * ldx, in, W->group, act, W->bits, (char *)q->xq + t * in * act / 8,
                             q->dg + t * ngroups, q->Xg + t * ngroups);
            }
            q->T = T;
            q->in = in;
            q->group = W->group;
            q->act = act;
            q->lay = lay;
        }
        xq = q->xq;
        dg = q->dg;
        Xg = q->Xg;
        tc = T;
    }
    for (int64_t c0 = 0; c0 < T; c0 += tc) {
        const int64_t c1 = c0 + tc < T ? c0 + tc : T;
        for (int64_t t = c0; t < c1 && !cached; t++)
            quantize_row(x + t * ldx, in, W->group, act, W->bits, (char *)xq + (t - c0) * in * act / 8,
                         dg + (t - c0) * ngroups, Xg + (t - c0) * ngroups);
        for (int64_t b0 = o0; b0 < o1; b0 += ob) {
            const int64_t b1 = b0 + ob < o1 ? b0 + ob : o1;
            for (int64_t t = c0; t < c1; t += 4) {
                const int tt = c1 - t < 4 ? (int)(c1 - t) : 4;
                const int64_t q0 = (t - c0) * in, g0 = (t - c0) * ngroups;
                a.w = (const uint8_t *)W->w + (size_t)b0 * a.wstride;
                a.sc = (const uint8_t *)W->scales + (size_t)b0 * a.sstride;
                a.bi = W->biases ? (const uint8_t *)W->biases + (size_t)b0 * a.sstride : NULL;
                for (a.g_lo = 0; a.g_lo < ngroups; a.g_lo = a.g_hi) {
                    a.g_hi = a.g_lo + kcg < ngroups ? a.g_lo + kcg : ngroups;
                    a.carry_out = a.g_hi < ngroups;
                    kern(tt, &a, b1 - b0, (const char *)xq + q0 * act / 8, in, dg + g0, Xg + g0, ngroups,
                         y + t * ldy + b0, ldy);
                }
            }
        }
    }
    return 1;
}

/* nx_matmul_blocks on blocks that follow each other in W (short rows: a latent attention's
 * per-head absorption and output, 55-74 KB a head): every block's input rows quantized first,
 * then each block's rows as consecutive register blocks of R rows, which for such rows are one
 * run of memory, so the linear prefetch sweep runs on from block to block as over one weight.
 * Called head by head, each call began its four split streams cold (1.2-1.3x the time of one
 * call over the same rows, one thread streaming). A row's result is the same bits whichever
 * rows share its register block, so each output is what a call on its block alone gives.
 * Declines more than 4 input rows (prefill), rows wider than 4096 and blocks with rows
 * between them. */
static int vnni_matmul_blocks(const nx_blocks *B, int64_t k0, int64_t k1, const nx_rows *next, nx_kscratch *s) {
    const nx_linear *W = B->W;
    const int64_t T = B->T, nb = k1 - k0, in = W->in;
    if (!vnni_takes(W) || B->rstride != B->rows || T > 4 || in > 4096) return 0;
    const int64_t ngroups = in / W->group;
    const int act = act_of(W);
    if (nb * T * in * act > (int64_t)XS_WORDS * 16 || nb * T * ngroups > XS_GROUPS) return 0;
    vnni_scratch *vs = (vnni_scratch *)(void *)s->vnni;
    kern_fn *const kern = (act == 8 ? kerns_a8 : kerns_a16)[W->bits];
    vargs a = vargs_of(W, act, k1 * B->rows, next, s);
    qpf_next_scales(next);
    char *xq = (char *)vs->xstage.xq;
    float *dg = vs->xstage.dg, *Xg = vs->xstage.Xg;
    for (int64_t k = 0; k < nb; k++)
        for (int64_t t = 0; t < T; t++)
            quantize_row(B->x + (k0 + k) * B->xstep + t * B->ldx, in, W->group, act, W->bits,
                         xq + (k * T + t) * in * act / 8, dg + (k * T + t) * ngroups, Xg + (k * T + t) * ngroups);
    for (int64_t k = 0; k < nb; k++) {
        const int64_t o = (k0 + k) * B->rows;
        a.w = (const uint8_t *)W->w + (size_t)o * a.wstride;
        a.sc = (const uint8_t *)W->scales + (size_t)o * a.sstride;
        a.bi = W->biases ? (const uint8_t *)W->biases + (size_t)o * a.sstride : NULL;
        kern((int)T, &a, B->rows, xq + k * T * in * act / 8, in, dg + k * T * ngroups, Xg + k * T * ngroups, ngroups,
             B->y + (k0 + k) * B->ystep, B->ldy);
    }
    return 1;
}

#if NX_VNNI_VBMI
const nx_kernel_table nx_kernels_avx512vbmi = {
    .name = "avx512vbmi" NX_QPF_SUFFIX,
#else
const nx_kernel_table nx_kernels_avx512vnni = {
    .name = "avx512vnni" NX_QPF_SUFFIX,
#endif
    .matmul_rows = vnni_matmul_rows,
    .matmul_blocks = vnni_matmul_blocks,
    NX_AVX512_VECTOR_HELPERS,
};
