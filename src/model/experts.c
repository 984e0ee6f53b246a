/* The residency plan and the expert cache (experts.h). */
#include "model/experts.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/clock.h"

#define XC_ALIGN 64
#define XC_IO_THREADS 4
#define XC_REGIONS 9 /* weight, scales, biases of gate, up and down */

/* ---------------------------------------------------------------- regions of an expert */

typedef struct region {
    const uint8_t *p; /* in the mapping */
    size_t n;
} region;

/* The stored regions of one linear: its weight, and for quantized ones scales and biases. */
static int linear_regions(const nx_linear *W, region *r) {
    int k = 0;
    r[k++] = (region){W->w, (size_t)W->out * nx_linear_weight_row_bytes(W)};
    if (W->dtype == NX_DTYPE_U32 && W->group > 0) {
        const size_t sb = (size_t)W->out * (size_t)(W->in / W->group) * nx_dtype_size(W->sdtype);
        if (W->scales) r[k++] = (region){W->scales, sb};
        if (W->biases) r[k++] = (region){W->biases, sb};
    }
    return k;
}

static int ffn_regions(const nx_ffn *f, region r[XC_REGIONS]) {
    int k = linear_regions(&f->gate, r);
    k += linear_regions(&f->up, r + k);
    return k + linear_regions(&f->down, r + k);
}

static size_t align_up(size_t n) { return (n + XC_ALIGN - 1) & ~(size_t)(XC_ALIGN - 1); }

static size_t ffn_slot_bytes(const nx_ffn *f) {
    region r[XC_REGIONS];
    size_t b = 0;
    for (int i = 0, k = ffn_regions(f, r); i < k; i++) b += align_up(r[i].n);
    return b;
}

/* The MoE of layer slot l (the MTP layer at n_layers), or NULL for a dense one. */
static const nx_moe *layer_moe(const nx_weights *w, int32_t l) {
    const nx_layer *L = l < w->n_layers ? &w->layers[l] : w->has_mtp ? &w->mtp.layer : NULL;
    return L && L->is_moe ? &L->moe : NULL;
}

/* ---------------------------------------------------------------- the plan */

nx_status nx_xplan_make(const nx_weights *w, const nx_config *cfg, uint64_t tensor_bytes, uint64_t max_memory,
                        nx_xplan *plan, nx_error *err) {
    memset(plan, 0, sizeof *plan);
    double active = 0; /* a trunk token's routed expert bytes */
    for (int32_t l = 0; l <= w->n_layers; l++) {
        const nx_moe *M = layer_moe(w, l);
        if (!M) continue;
        for (int32_t e = 0; e < M->n_experts; e++) {
            plan->routed += nx_ffn_bytes(&M->experts[e]);
            const size_t sb = ffn_slot_bytes(&M->experts[e]);
            if (sb > plan->slot_bytes) plan->slot_bytes = sb;
        }
        plan->n_routed += M->n_experts;
        if (l < w->n_layers && M->n_experts > 0)
            active += (double)cfg->top_k * (double)nx_ffn_bytes(&M->experts[0]);
    }
    plan->resident = tensor_bytes > plan->routed ? tensor_bytes - plan->routed : 0;
    plan->hit_rate = 1.0;
    if (max_memory == 0 || max_memory >= tensor_bytes || plan->n_routed == 0) return NX_OK;
    const uint64_t need = plan->resident + (uint64_t)cfg->top_k * plan->slot_bytes;
    if (max_memory < need)
        return nx_fail(err, NX_E_ARG,
                       "max_memory %llu bytes is too small: the weights that stay resident (all but the routed "
                       "experts) take %llu bytes and one layer's top-%d experts %llu more, %llu in all",
                       (unsigned long long)max_memory, (unsigned long long)plan->resident, cfg->top_k,
                       (unsigned long long)((uint64_t)cfg->top_k * plan->slot_bytes), (unsigned long long)need);
    for (int32_t l = 0; l <= w->n_layers; l++) {
        const nx_moe *M = layer_moe(w, l);
        if (M && M->n_experts > NX_XCACHE_MAX_EXPERTS)
            return nx_fail(err, NX_E_UNSUPPORTED, "layer %d has %d routed experts; streaming them handles at most %d",
                           l, M->n_experts, NX_XCACHE_MAX_EXPERTS);
    }
    const uint64_t slots = (max_memory - plan->resident) / plan->slot_bytes;
    if (slots >= (uint64_t)plan->n_routed) return NX_OK; /* every expert fits after all */
    plan->slots = (int64_t)slots;
    plan->hit_rate = (double)slots / (double)plan->n_routed;
    plan->disk_per_token = active * (1.0 - plan->hit_rate);
    return NX_OK;
}

/* ---------------------------------------------------------------- the cache */

enum { SLOT_FREE, SLOT_LOADING, SLOT_READY, SLOT_FAILED };

typedef struct xslot {
    int32_t layer, expert; /* what it holds (-1: nothing) */
    int32_t pins;
    int state;
    bool ref; /* used since the clock hand last passed */
    nx_ffn f; /* views into the slot's memory */
} xslot;

struct nx_xcache {
    const nx_store *st;
    const nx_weights *w;
    int32_t n_layers;   /* layer slots: trunk layers + the MTP layer */
    int32_t **slot_of;  /* [layer][expert] slot index, -1 when not cached; NULL for dense layers */
    int64_t n_slots;
    size_t slot_bytes;
    uint8_t *mem;       /* n_slots * slot_bytes, mapped at first use */
    xslot *slots;
    int64_t hand;       /* the clock's */
    int64_t *queue;     /* slots to read, a ring of n_slots */
    int64_t q_head, q_len;
    pthread_t io[XC_IO_THREADS];
    int n_io;
    bool stop, started;
    pthread_mutex_t mu;
    pthread_cond_t work, done, released;
    const uint8_t **cover; /* sorted starts and ends of the routed experts' regions, in pairs */
    size_t n_cover;
};

typedef struct span {
    const uint8_t *p;
    size_t n;
} span;

static int cmp_span(const void *a, const void *b) {
    const uint8_t *x = ((const span *)a)->p, *y = ((const span *)b)->p;
    return x < y ? -1 : x > y;
}

/* The routed experts' regions as a sorted table of [start, end) pairs (regions do not overlap). */
static bool build_cover(nx_xcache *xc) {
    size_t n = 0;
    for (int32_t l = 0; l < xc->n_layers; l++) {
        const nx_moe *M = layer_moe(xc->w, l);
        n += M ? (size_t)M->n_experts * XC_REGIONS : 0;
    }
    span *ps = malloc((n + 1) * sizeof *ps);
    xc->cover = malloc((2 * n + 1) * sizeof *xc->cover);
    if (!ps || !xc->cover) {
        free(ps);
        return false;
    }
    size_t k = 0;
    for (int32_t l = 0; l < xc->n_layers; l++) {
        const nx_moe *M = layer_moe(xc->w, l);
        for (int32_t e = 0; M && e < M->n_experts; e++) {
            region r[XC_REGIONS];
            for (int i = 0, m = ffn_regions(&M->experts[e], r); i < m; i++) ps[k++] = (span){r[i].p, r[i].n};
        }
    }
    qsort(ps, k, sizeof *ps, cmp_span);
    for (size_t i = 0; i < k; i++) {
        xc->cover[2 * i] = ps[i].p;
        xc->cover[2 * i + 1] = ps[i].p + ps[i].n;
    }
    xc->n_cover = k;
    free(ps);
    return true;
}

bool nx_xcache_covers(const nx_xcache *xc, const void *p, size_t n) {
    if (!xc || !xc->n_cover) return false;
    const uint8_t *a = p, *b = a + n;
    /* the first region ending after a */
    size_t lo = 0, hi = xc->n_cover;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (xc->cover[2 * mid + 1] <= a) lo = mid + 1;
        else hi = mid;
    }
    return lo < xc->n_cover && xc->cover[2 * lo] < b;
}

nx_xcache *nx_xcache_new(const nx_store *st, const nx_weights *w, const nx_xplan *plan) {
    nx_xcache *xc = calloc(1, sizeof *xc);
    if (!xc) return NULL;
    xc->st = st;
    xc->w = w;
    xc->n_layers = w->n_layers + 1;
    xc->n_slots = plan->slots;
    xc->slot_bytes = plan->slot_bytes;
    pthread_mutex_init(&xc->mu, NULL);
    pthread_cond_init(&xc->work, NULL);
    pthread_cond_init(&xc->done, NULL);
    pthread_cond_init(&xc->released, NULL);
    xc->slot_of = calloc((size_t)xc->n_layers, sizeof *xc->slot_of);
    xc->slots = calloc((size_t)xc->n_slots, sizeof *xc->slots);
    xc->queue = calloc((size_t)xc->n_slots, sizeof *xc->queue);
    if (!xc->slot_of || !xc->slots || !xc->queue || !build_cover(xc)) goto fail;
    for (int32_t l = 0; l < xc->n_layers; l++) {
        const nx_moe *M = layer_moe(w, l);
        if (!M) continue;
        if (!(xc->slot_of[l] = malloc((size_t)M->n_experts * sizeof(int32_t)))) goto fail;
        for (int32_t e = 0; e < M->n_experts; e++) xc->slot_of[l][e] = -1;
    }
    for (int64_t i = 0; i < xc->n_slots; i++) xc->slots[i] = (xslot){.layer = -1, .expert = -1};
    return xc;
fail:
    nx_xcache_free(xc);
    return NULL;
}

void nx_xcache_free(nx_xcache *xc) {
    if (!xc) return;
    pthread_mutex_lock(&xc->mu);
    xc->stop = true;
    pthread_cond_broadcast(&xc->work);
    pthread_mutex_unlock(&xc->mu);
    for (int i = 0; i < xc->n_io; i++) pthread_join(xc->io[i], NULL);
    if (xc->mem) munmap(xc->mem, (size_t)xc->n_slots * xc->slot_bytes);
    for (int32_t l = 0; xc->slot_of && l < xc->n_layers; l++) free(xc->slot_of[l]);
    free(xc->slot_of);
    free(xc->slots);
    free(xc->queue);
    free(xc->cover);
    pthread_mutex_destroy(&xc->mu);
    pthread_cond_destroy(&xc->work);
    pthread_cond_destroy(&xc->done);
    pthread_cond_destroy(&xc->released);
    free(xc);
}

/* Reads one expert's regions into slot memory dst, dropping the file's cached pages behind
 * them (the slot is the copy kept; the page cache would hold a second one). */
static bool read_expert(const nx_store *st, const nx_ffn *src, uint8_t *dst) {
    region r[XC_REGIONS];
    for (int i = 0, k = ffn_regions(src, r); i < k; i++) {
        int fd;
        uint64_t off;
        if (!nx_store_locate(st, r[i].p, r[i].n, &fd, &off)) return false;
        for (size_t got = 0; got < r[i].n;) {
            const ssize_t m = pread(fd, dst + got, r[i].n - got, (off_t)(off + got));
            if (m < 0 && errno == EINTR) continue;
            if (m <= 0) return false;
            got += (size_t)m;
        }
#ifdef POSIX_FADV_DONTNEED
        (void)posix_fadvise(fd, (off_t)off, (off_t)r[i].n, POSIX_FADV_DONTNEED);
#endif
        dst += align_up(r[i].n);
    }
    return true;
}

static void *io_main(void *arg) {
    nx_xcache *xc = arg;
    pthread_mutex_lock(&xc->mu);
    for (;;) {
        while (!xc->stop && xc->q_len == 0) pthread_cond_wait(&xc->work, &xc->mu);
        if (xc->stop) break;
        const int64_t s = xc->queue[xc->q_head];
        xc->q_head = (xc->q_head + 1) % xc->n_slots;
        xc->q_len--;
        xslot *sl = &xc->slots[s];
        const nx_ffn *src = &layer_moe(xc->w, sl->layer)->experts[sl->expert];
        uint8_t *dst = xc->mem + (size_t)s * xc->slot_bytes;
        pthread_mutex_unlock(&xc->mu);
        const bool ok = read_expert(xc->st, src, dst);
        pthread_mutex_lock(&xc->mu);
        sl->state = ok ? SLOT_READY : SLOT_FAILED;
        pthread_cond_broadcast(&xc->done);
    }
    pthread_mutex_unlock(&xc->mu);
    return NULL;
}

/* Slot memory and the I/O threads, at first use (a model loaded only to be described never
 * needs them). Under the lock. */
static bool start(nx_xcache *xc) {
    if (xc->started) return xc->mem != NULL;
    xc->started = true;
    void *m = mmap(NULL, (size_t)xc->n_slots * xc->slot_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return false;
    xc->mem = m;
    for (int i = 0; i < XC_IO_THREADS; i++)
        if (pthread_create(&xc->io[xc->n_io], NULL, io_main, xc) == 0) xc->n_io++;
    return xc->n_io > 0;
}

/* The slot's views: src's linears with their regions moved into the slot. */
static void slot_views(const nx_xcache *xc, int64_t s, const nx_ffn *src, nx_ffn *f) {
    uint8_t *p = xc->mem + (size_t)s * xc->slot_bytes;
    *f = *src;
    nx_linear *ls[3] = {&f->gate, &f->up, &f->down};
    for (int j = 0; j < 3; j++) {
        nx_linear *W = ls[j];
        region r[3];
        const int k = linear_regions(W, r);
        W->w = p;
        p += align_up(r[0].n);
        if (k > 1) {
            W->scales = p;
            p += align_up(r[1].n);
        }
        if (k > 2) {
            W->biases = p;
            p += align_up(r[2].n);
        }
    }
}

/* A slot for a new expert: the clock's next slot that is neither pinned nor being read and
 * was not used since the hand last passed (used ones get a second chance); -1 if all are
 * pinned or being read. Under the lock. */
static int64_t victim(nx_xcache *xc) {
    for (int64_t tries = 0; tries < 2 * xc->n_slots + 1; tries++) {
        xslot *sl = &xc->slots[xc->hand];
        const int64_t s = xc->hand;
        xc->hand = (xc->hand + 1) % xc->n_slots;
        if (sl->pins > 0 || sl->state == SLOT_LOADING) continue;
        if (sl->ref) {
            sl->ref = false;
            continue;
        }
        return s;
    }
    return -1;
}

/* Puts expert e of layer l in a free slot and queues its read; -1 when no slot is free. */
static int64_t load(nx_xcache *xc, int32_t l, int32_t e, nx_xstats *st) {
    const int64_t s = victim(xc);
    if (s < 0) return -1;
    xslot *sl = &xc->slots[s];
    if (sl->layer >= 0) xc->slot_of[sl->layer][sl->expert] = -1;
    const nx_ffn *src = &layer_moe(xc->w, l)->experts[e];
    *sl = (xslot){.layer = l, .expert = e, .state = SLOT_LOADING, .ref = true};
    slot_views(xc, s, src, &sl->f);
    xc->slot_of[l][e] = (int32_t)s;
    xc->queue[(xc->q_head + xc->q_len++) % xc->n_slots] = s;
    pthread_cond_signal(&xc->work);
    st->bytes += (double)nx_ffn_bytes(src);
    return s;
}

int32_t nx_xcache_pin(nx_xcache *xc, int32_t layer, const int32_t *ids, int32_t n, const nx_ffn **out,
                      nx_xstats *st) {
    const nx_moe *M = layer_moe(xc->w, layer);
    pthread_mutex_lock(&xc->mu);
    if (!start(xc)) { /* no memory for slots: the mapping it is */
        pthread_mutex_unlock(&xc->mu);
        for (int32_t i = 0; i < n; i++) out[i] = &M->experts[ids[i]];
        return n;
    }
    int32_t got = 0;
    while (got < n) {
        const int32_t e = ids[got];
        int64_t s = xc->slot_of[layer][e];
        if (s >= 0) st->hits++;
        else if ((s = load(xc, layer, e, st)) >= 0) st->misses++;
        else if (got > 0) break;
        else { /* every slot is pinned by other forwards: wait for one */
            pthread_cond_wait(&xc->released, &xc->mu);
            continue;
        }
        xc->slots[s].pins++;
        xc->slots[s].ref = true;
        out[got++] = &xc->slots[s].f;
    }
    pthread_mutex_unlock(&xc->mu);
    return got;
}

void nx_xcache_wait(nx_xcache *xc, int32_t layer, const int32_t *ids, int32_t n, const nx_ffn **out, nx_xstats *st) {
    const nx_moe *M = layer_moe(xc->w, layer);
    const double t0 = nx_now_s();
    pthread_mutex_lock(&xc->mu);
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = xc->slot_of[layer][ids[i]];
        if (s < 0 || out[i] != &xc->slots[s].f) continue; /* on the mapping */
        while (xc->slots[s].state == SLOT_LOADING) pthread_cond_wait(&xc->done, &xc->mu);
        if (xc->slots[s].state == SLOT_FAILED) out[i] = &M->experts[ids[i]];
    }
    pthread_mutex_unlock(&xc->mu);
    st->wait_s += nx_now_s() - t0;
}

void nx_xcache_unpin(nx_xcache *xc, int32_t layer, const int32_t *ids, int32_t n) {
    pthread_mutex_lock(&xc->mu);
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = xc->slot_of[layer][ids[i]];
        if (s < 0) continue;
        xslot *sl = &xc->slots[s];
        if (sl->pins > 0) sl->pins--;
        if (sl->state == SLOT_FAILED && sl->pins == 0) { /* read again next time */
            xc->slot_of[layer][ids[i]] = -1;
            *sl = (xslot){.layer = -1, .expert = -1};
        }
    }
    pthread_cond_broadcast(&xc->released);
    pthread_mutex_unlock(&xc->mu);
}

void nx_xcache_prefetch(nx_xcache *xc, int32_t layer, const int32_t *ids, int32_t n, nx_xstats *st) {
    if (layer < 0 || layer >= xc->n_layers || !xc->slot_of[layer]) return;
    pthread_mutex_lock(&xc->mu);
    if (start(xc))
        for (int32_t i = 0; i < n; i++)
            if (xc->slot_of[layer][ids[i]] < 0 && load(xc, layer, ids[i], st) < 0) break;
    pthread_mutex_unlock(&xc->mu);
}
