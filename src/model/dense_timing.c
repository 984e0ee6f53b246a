/* nx_model_time_dense: the routing-independent matmuls of one trunk step, timed alone, so the
 * cost of verifying k+1 rows of them can be compared with one row without the expert traffic
 * that routing adds; nx_model_read_bandwidth: a bandwidth reading on the model's threads. */
#include "model/dense_timing.h"

#include <stdlib.h>

#include "base/clock.h"
#include "base/error.h"
#include "model/model_internal.h"

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static void ffn_pass(const nx_ffn *f, const float *x, int64_t H, int32_t T, float *g, float *y, nx_pool *pool) {
    const int64_t F = f->gate.out;
    const nx_matmul_task gu[2] = {{&f->gate, x, H, T, g, F}, {&f->up, x, H, T, g + (size_t)T * F, F}};
    nx_matmul_many(gu, 2, pool);
    nx_matmul(&f->down, g, F, T, y, H, pool);
}


nx_status nx_model_time_dense(nx_model *m, int32_t T, int reps, double *seconds, double *bytes,
                              nx_error *err) {
    if (T < 1 || T > 64 || reps < 1)
        return nx_fail(err, NX_E_ARG, "dense timing: T must be 1..64 and reps >= 1 (got %d, %d)", T, reps);
    const nx_weights *w = &m->w;
    const int64_t H = m->cfg.hidden_size;
    int64_t width = max64(H, w->lm_head.out);
    for (int32_t l = 0; l < w->n_layers; l++) {
        const nx_layer *L = &w->layers[l];
        nx_linear aw[NX_ATTN_LINEARS];
        for (int i = 0, n = nx_attn_linears(L, aw); i < n; i++) width = max64(width, max64(aw[i].out, aw[i].in));
        if (L->is_moe) width = max64(width, 2 * max64(L->moe.shared.gate.out, L->moe.router.out));
        else width = max64(width, 2 * L->dense.gate.out);
    }
    float *x = malloc((size_t)T * (size_t)width * sizeof *x);
    float *y = malloc((size_t)T * (size_t)width * sizeof *y);
    float *z = malloc((size_t)T * (size_t)width * sizeof *z);
    if (!x || !y || !z) {
        free(x);
        free(y);
        free(z);
        return nx_fail(err, NX_E_NOMEM, "dense timing: out of memory");
    }
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < (size_t)T * (size_t)width; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 40) / (double)(1ull << 24) - 0.5);
    }
    double best = 0, nbytes = 0;
    for (int rep = -1; rep < reps; rep++) {
        nbytes = 0;
        const double t0 = nx_now_s();
        for (int32_t l = 0; l < w->n_layers; l++) {
            const nx_layer *L = &w->layers[l];
            nx_linear aw[NX_ATTN_LINEARS];
            for (int i = 0, n = nx_attn_linears(L, aw); i < n; i++) {
                nx_matmul(&aw[i], x, aw[i].in, T, y, aw[i].out, m->pool);
                nbytes += (double)nx_linear_bytes(&aw[i]);
            }
            if (L->is_moe) {
                nx_matmul(&L->moe.router, x, H, T, y, L->moe.router.out, m->pool);
                nbytes += (double)nx_linear_bytes(&L->moe.router);
                if (L->moe.has_shared) {
                    ffn_pass(&L->moe.shared, x, H, T, z, y, m->pool);
                    nbytes += (double)nx_ffn_bytes(&L->moe.shared);
                }
            } else {
                ffn_pass(&L->dense, x, H, T, z, y, m->pool);
                nbytes += (double)nx_ffn_bytes(&L->dense);
            }
        }
        nx_matmul(&w->lm_head, x, H, T, y, w->lm_head.out, m->pool);
        nbytes += (double)nx_linear_bytes(&w->lm_head);
        const double dt = nx_now_s() - t0;
        if (rep >= 0 && (best == 0 || dt < best)) best = dt;
    }
    free(x);
    free(y);
    free(z);
    *seconds = best;
    *bytes = nbytes;
    return NX_OK;
}

double nx_model_read_bandwidth(nx_model *m, nx_membw *b) {
    double best = 0;
    for (int pat = 0; pat < NX_MEMBW_PATTERNS; pat++) {
        const double g = nx_membw_pass(b, m->pool, (nx_membw_pattern)pat);
        if (g > best) best = g;
    }
    return best;
}
