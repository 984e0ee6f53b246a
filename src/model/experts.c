/* The residency plan and the expert cache (experts.h). */
#include "model/experts.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/clock.h"

#define XC_IO_THREADS 4
#define XC_REGIONS 9 /* weight, scales, biases of gate, up and down */
/* Slots are read with direct I/O where the file system has it: a buffered read spends the
 * decoding cores' time copying every byte through the page cache. Direct I/O reads whole aligned
 * blocks into aligned memory, so each region of a slot starts on a block, with room for its
 * bytes at their offset within their first block. */
#define XC_DIO 4096

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

/* A region's room in a slot: whole blocks for its n bytes at any offset within the first. */
static size_t region_room(size_t n) { return (n + 2 * XC_DIO - 2) & ~(size_t)(XC_DIO - 1); }

static size_t ffn_slot_bytes(const nx_ffn *f) {
    region r[XC_REGIONS];
    size_t b = 0;
    for (int i = 0, k = ffn_regions(f, r); i < k; i++) b += region_room(r[i].n);
    return b;
}

/* The MoE of layer slot l (the MTP layer at n_layers), or NULL for a dense one. */
static const nx_moe *layer_moe(const nx_weights *w, int32_t l) {
    const nx_layer *L = l < w->n_layers ? &w->layers[l] : w->has_mtp ? &w->mtp.layer : NULL;
    return L && L->is_moe ? &L->moe : NULL;
}

/* ---------------------------------------------------------------- the plan */

/* A layer's slot size: the largest of its experts. */
static size_t layer_slot_bytes(const nx_moe *M) {
    size_t sb = 0;
    for (int32_t e = 0; e < M->n_experts; e++) {
        const size_t b = ffn_slot_bytes(&M->experts[e]);
        if (b > sb) sb = b;
    }
    return sb;
}

/* The pool a layer of slot size sb uses: the smallest whose slots hold it. */
static int pool_of(const nx_xplan *plan, size_t sb) {
    int best = -1;
    for (int p = 0; p < plan->n_pools; p++)
        if (plan->slot_bytes[p] >= sb && (best < 0 || plan->slot_bytes[p] < plan->slot_bytes[best])) best = p;
    return best;
}

/* Adds a layer of E experts of slot size sb to the plan's pools: its own size's pool, a new one,
 * or past NX_XCACHE_POOLS sizes the largest pool, grown to hold it. */
static void pool_add(nx_xplan *plan, size_t sb, int32_t E) {
    int p = -1;
    for (int i = 0; i < plan->n_pools; i++)
        if (plan->slot_bytes[i] == sb) p = i;
    if (p < 0 && plan->n_pools < NX_XCACHE_POOLS) {
        p = plan->n_pools++;
        plan->slot_bytes[p] = sb;
    }
    if (p < 0) {
        p = 0;
        for (int i = 1; i < plan->n_pools; i++)
            if (plan->slot_bytes[i] > plan->slot_bytes[p]) p = i;
        if (sb > plan->slot_bytes[p]) plan->slot_bytes[p] = sb;
    }
    plan->pool_experts[p] += E;
}

/* ---------------------------------------------------------------- router statistics */

/* Router statistics inform the plan's expectations only; the cache stays CLOCK, because consecutive
 * tokens share experts and pre-gated reads need free slots (docs/performance.md, "Router statistics
 * and the cache"). */

static bool has_counts(nx_xcounts counts, const nx_weights *w) {
    for (int32_t l = 0; counts && l <= w->n_layers; l++) {
        const nx_moe *M = layer_moe(w, l);
        for (int32_t e = 0; M && counts[l] && e < M->n_experts; e++)
            if (counts[l][e]) return true;
    }
    return false;
}

static uint64_t layer_total(nx_xcounts counts, int32_t l, int32_t E) {
    uint64_t t = 0;
    for (int32_t e = 0; counts[l] && e < E; e++) t += counts[l][e];
    return t;
}

static int cmp_desc(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* Share of layer l's choices that its n most often routed experts take (n may be fractional): what
 * a cache of n of its experts holds when tokens route independently. Uniform without counts. */
static double top_share(nx_xcounts counts, int32_t l, int32_t E, double n) {
    const uint64_t total = layer_total(counts, l, E);
    double *f = total ? malloc((size_t)E * sizeof *f) : NULL;
    if (!f) return n / E;
    for (int32_t e = 0; e < E; e++) f[e] = (double)counts[l][e] / (double)total;
    qsort(f, (size_t)E, sizeof *f, cmp_desc);
    double m = 0;
    for (int32_t e = 0; e < E && n > 0; e++, n -= 1.0) m += f[e] * (n < 1.0 ? n : 1.0);
    free(f);
    return m < 1.0 ? m : 1.0;
}

/* The expected hit rate and bytes read per trunk token from router statistics: each layer's
 * share of its pool's slots holding its most often routed experts. */
static void plan_expect_stats(const nx_weights *w, const nx_config *cfg, nx_xcounts counts, nx_xplan *plan) {
    double hits = 0;
    int32_t n_moe = 0;
    for (int32_t l = 0; l < w->n_layers; l++) {
        const nx_moe *M = layer_moe(w, l);
        if (!M || M->n_experts == 0) continue;
        const int p = pool_of(plan, layer_slot_bytes(M));
        const double n = (double)plan->pool_slots[p] / (double)plan->pool_experts[p] * M->n_experts,
                     hit = top_share(counts, l, M->n_experts, n);
        hits += hit;
        n_moe++;
        plan->disk_per_token += (double)cfg->top_k * (double)nx_ffn_bytes(&M->experts[0]) * (1.0 - hit);
    }
    plan->hit_rate = n_moe ? hits / n_moe : 1.0;
    plan->from_stats = true;
}

/* The expected hit rate and bytes read per trunk token under the plan's slots, routing taken as
 * uniform. */
static void plan_expect(const nx_weights *w, const nx_config *cfg, nx_xplan *plan) {
    plan->hit_rate = (double)plan->slots / (double)plan->n_routed;
    for (int32_t l = 0; l < w->n_layers; l++) {
        const nx_moe *M = layer_moe(w, l);
        if (!M || M->n_experts == 0) continue;
        const int p = pool_of(plan, layer_slot_bytes(M));
        const double hit = (double)plan->pool_slots[p] / (double)plan->pool_experts[p];
        plan->disk_per_token += (double)cfg->top_k * (double)nx_ffn_bytes(&M->experts[0]) * (1.0 - hit);
    }
}

nx_status nx_xplan_make(const nx_weights *w, const nx_config *cfg, uint64_t tensor_bytes, uint64_t max_memory,
                        nx_xcounts counts, nx_xplan *plan, nx_error *err) {
    memset(plan, 0, sizeof *plan);
    for (int32_t l = 0; l <= w->n_layers; l++) {
        const nx_moe *M = layer_moe(w, l);
        if (!M || M->n_experts == 0) continue;
        for (int32_t e = 0; e < M->n_experts; e++) plan->routed += nx_ffn_bytes(&M->experts[e]);
        plan->n_routed += M->n_experts;
        pool_add(plan, layer_slot_bytes(M), M->n_experts);
    }
    plan->resident = tensor_bytes > plan->routed ? tensor_bytes - plan->routed : 0;
    plan->hit_rate = 1.0;
    if (max_memory == 0 || max_memory >= tensor_bytes || plan->n_routed == 0) return NX_OK;
    uint64_t floor_bytes = 0, all_bytes = 0; /* every pool's top-k slots; every expert in a slot */
    for (int p = 0; p < plan->n_pools; p++) {
        floor_bytes += (uint64_t)cfg->top_k * plan->slot_bytes[p];
        all_bytes += (uint64_t)plan->pool_experts[p] * plan->slot_bytes[p];
    }
    const uint64_t need = plan->resident + floor_bytes;
    if (max_memory < need)
        return nx_fail(err, NX_E_ARG,
                       "max_memory %llu bytes is too small: the weights that stay resident (all but the routed "
                       "experts) take %llu bytes and one layer's top-%d experts (per expert size) %llu more, %llu in all",
                       (unsigned long long)max_memory, (unsigned long long)plan->resident, cfg->top_k,
                       (unsigned long long)floor_bytes, (unsigned long long)need);
    for (int32_t l = 0; l <= w->n_layers; l++) {
        const nx_moe *M = layer_moe(w, l);
        if (M && M->n_experts > NX_XCACHE_MAX_EXPERTS)
            return nx_fail(err, NX_E_UNSUPPORTED, "layer %d has %d routed experts; streaming them handles at most %d",
                           l, M->n_experts, NX_XCACHE_MAX_EXPERTS);
    }
    const uint64_t budget = max_memory - plan->resident;
    if (budget >= all_bytes) return NX_OK; /* every expert fits after all */
    /* each pool its top-k slots, the rest in proportion to the pools' expert bytes (the same
     * share of every pool's experts is then cached) */
    const double rest = (double)(budget - floor_bytes) / (double)all_bytes;
    for (int p = 0; p < plan->n_pools; p++) {
        int64_t n = cfg->top_k + (int64_t)(rest * (double)plan->pool_experts[p]);
        if (n > plan->pool_experts[p]) n = plan->pool_experts[p];
        plan->pool_slots[p] = n;
        plan->slots += n;
        plan->cache_bytes += (uint64_t)n * plan->slot_bytes[p];
    }
    if (has_counts(counts, w)) plan_expect_stats(w, cfg, counts, plan);
    else plan_expect(w, cfg, plan);
    return NX_OK;
}

/* ---------------------------------------------------------------- the cache */

enum { SLOT_FREE, SLOT_LOADING, SLOT_READY, SLOT_FAILED };

typedef struct xslot {
    uint8_t *mem;          /* its bytes (slot_bytes of its pool) */
    int32_t layer, expert; /* what it holds (-1: nothing) */
    int32_t pins;
    int state;
    bool ref;   /* used since the clock hand last passed */
    bool ahead; /* read ahead and not pinned since */
    nx_ffn f; /* views into the slot's memory */
} xslot;

struct nx_xcache {
    const nx_store *st;
    const nx_weights *w;
    int32_t n_layers;   /* layer slots: trunk layers + the MTP layer */
    int32_t **slot_of;  /* [layer][expert] slot index, -1 when not cached; NULL for dense layers */
    int *pool;          /* [layer] the pool its experts use */
    nx_xplan plan;
    int64_t first[NX_XCACHE_POOLS]; /* a pool's slots are [first, first + pool_slots) */
    int64_t hand[NX_XCACHE_POOLS];  /* its clock's */
    int64_t n_slots;
    uint8_t *mem;       /* every slot's bytes (plan.cache_bytes), mapped at first use */
    xslot *slots;
    int64_t *queue;     /* slots to read, a ring of n_slots */
    int64_t q_head, q_len;
    pthread_t io[XC_IO_THREADS];
    int n_io;
    bool stop, started;
    pthread_mutex_t mu;
    pthread_cond_t work, done, released;
    const uint8_t **cover; /* sorted starts and ends of the routed experts' regions, in pairs */
    size_t n_cover;
    /* per file of the store, a descriptor for direct reads: -2 not opened yet, -1 none (the
     * system or file system has no direct I/O, or NX_DIRECT_IO=0) */
    _Atomic int *dfd;
    int n_files;
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
    xc->plan = *plan;
    xc->n_slots = plan->slots;
    pthread_mutex_init(&xc->mu, NULL);
    pthread_cond_init(&xc->work, NULL);
    pthread_cond_init(&xc->done, NULL);
    pthread_cond_init(&xc->released, NULL);
    xc->slot_of = calloc((size_t)xc->n_layers, sizeof *xc->slot_of);
    xc->pool = calloc((size_t)xc->n_layers, sizeof *xc->pool);
    xc->slots = calloc((size_t)xc->n_slots, sizeof *xc->slots);
    xc->queue = calloc((size_t)xc->n_slots, sizeof *xc->queue);
    xc->n_files = nx_store_n_files(st);
    xc->dfd = calloc((size_t)xc->n_files + 1, sizeof *xc->dfd);
    if (!xc->slot_of || !xc->pool || !xc->slots || !xc->queue || !xc->dfd || !build_cover(xc)) goto fail;
    const char *dio = getenv("NX_DIRECT_IO");
    for (int i = 0; i < xc->n_files; i++) atomic_init(&xc->dfd[i], dio && !strcmp(dio, "0") ? -1 : -2);
    for (int32_t l = 0; l < xc->n_layers; l++) {
        const nx_moe *M = layer_moe(w, l);
        if (!M) continue;
        xc->pool[l] = pool_of(plan, layer_slot_bytes(M));
        if (!(xc->slot_of[l] = malloc((size_t)M->n_experts * sizeof(int32_t)))) goto fail;
        for (int32_t e = 0; e < M->n_experts; e++) xc->slot_of[l][e] = -1;
    }
    for (int64_t i = 0; i < xc->n_slots; i++) xc->slots[i] = (xslot){.layer = -1, .expert = -1};
    for (int p = 1; p < plan->n_pools; p++) xc->first[p] = xc->first[p - 1] + plan->pool_slots[p - 1];
    for (int p = 0; p < plan->n_pools; p++) xc->hand[p] = xc->first[p];
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
    if (xc->mem) munmap(xc->mem, (size_t)xc->plan.cache_bytes);
    for (int32_t l = 0; xc->slot_of && l < xc->n_layers; l++) free(xc->slot_of[l]);
    free(xc->slot_of);
    free(xc->pool);
    free(xc->slots);
    free(xc->queue);
    free(xc->cover);
    for (int i = 0; xc->dfd && i < xc->n_files; i++)
        if (atomic_load(&xc->dfd[i]) >= 0) close(atomic_load(&xc->dfd[i]));
    free((void *)xc->dfd);
    pthread_mutex_destroy(&xc->mu);
    pthread_cond_destroy(&xc->work);
    pthread_cond_destroy(&xc->done);
    pthread_cond_destroy(&xc->released);
    free(xc);
}

/* Where region [p, p + n) lies: its file, descriptor and offset there; lead = its offset within
 * its first block (its bytes sit that far into the slot's room for it). */
typedef struct located {
    int file, fd;
    uint64_t off;
    size_t lead;
} located;

static bool locate(const nx_store *st, const region *r, located *at) {
    if (!nx_store_locate(st, r->p, r->n, &at->file, &at->fd, &at->off)) return false;
    at->lead = (size_t)(at->off % XC_DIO);
    return true;
}

/* File f's descriptor for direct reads, opened at first use (under the lock: it is called from
 * io_main before the read), or -1. Reopened through /proc/self/fd, so it is the very file the
 * store mapped even if the path now names another. */
static int direct_fd(nx_xcache *xc, const located *at) {
    int d = atomic_load(&xc->dfd[at->file]);
    if (d != -2) return d;
    d = -1;
#if defined(__linux__) && defined(O_DIRECT)
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", at->fd);
    d = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (d < 0) d = -1;
#endif
    atomic_store(&xc->dfd[at->file], d);
    return d;
}

/* The whole blocks around a region, read straight into its room at dst (aligned): false when
 * the file system refuses (the caller then reads it through the page cache). */
static bool read_direct(int d, const located *at, size_t n, uint8_t *dst) {
    const size_t want = at->lead + n, len = (want + XC_DIO - 1) & ~(size_t)(XC_DIO - 1);
    const off_t start = (off_t)(at->off - at->lead);
    size_t got = 0;
    while (got < want) {
        const ssize_t m = pread(d, dst + got, len - got, start + (off_t)got);
        if (m < 0 && errno == EINTR) continue;
        if (m <= 0 || (size_t)m % XC_DIO != 0) {
            if (m > 0 && got + (size_t)m >= want) return true; /* the file's last block */
            return false;
        }
        got += (size_t)m;
    }
    return true;
}

/* A region through the page cache, dropping the file's cached pages behind it (the slot is the
 * copy kept; the page cache would hold a second one). */
static bool read_buffered(const located *at, size_t n, uint8_t *dst) {
    for (size_t got = 0; got < n;) {
        const ssize_t m = pread(at->fd, dst + at->lead + got, n - got, (off_t)(at->off + got));
        if (m < 0 && errno == EINTR) continue;
        if (m <= 0) return false;
        got += (size_t)m;
    }
#ifdef POSIX_FADV_DONTNEED
    (void)posix_fadvise(at->fd, (off_t)at->off, (off_t)n, POSIX_FADV_DONTNEED);
#endif
    return true;
}

/* Opens the direct descriptors an expert's regions need. Under the lock. */
static void open_direct(nx_xcache *xc, const nx_ffn *src) {
    region r[XC_REGIONS];
    located at;
    for (int i = 0, k = ffn_regions(src, r); i < k; i++)
        if (locate(xc->st, &r[i], &at)) (void)direct_fd(xc, &at);
}

/* Reads one expert's regions into slot memory dst (slot_views' layout): directly where the
 * file allows, else (no descriptor, or the read refused) through the page cache. */
static bool read_expert(nx_xcache *xc, const nx_ffn *src, uint8_t *dst) {
    region r[XC_REGIONS];
    for (int i = 0, k = ffn_regions(src, r); i < k; i++) {
        located at;
        if (!locate(xc->st, &r[i], &at)) return false;
        const int d = atomic_load(&xc->dfd[at.file]);
        if ((d < 0 || !read_direct(d, &at, r[i].n, dst)) && !read_buffered(&at, r[i].n, dst)) return false;
        dst += region_room(r[i].n);
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
        uint8_t *dst = sl->mem;
        open_direct(xc, src);
        pthread_mutex_unlock(&xc->mu);
        const bool ok = read_expert(xc, src, dst);
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
    void *m = mmap(NULL, (size_t)xc->plan.cache_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return false;
    xc->mem = m;
    size_t off = 0;
    for (int p = 0; p < xc->plan.n_pools; p++)
        for (int64_t i = 0; i < xc->plan.pool_slots[p]; i++, off += xc->plan.slot_bytes[p])
            xc->slots[xc->first[p] + i].mem = xc->mem + off;
    for (int i = 0; i < XC_IO_THREADS; i++)
        if (pthread_create(&xc->io[xc->n_io], NULL, io_main, xc) == 0) xc->n_io++;
    return xc->n_io > 0;
}

/* The slot's views: src's linears with their regions moved into the slot (read_expert's
 * layout: each region in its room, lead bytes in). */
static void slot_views(const nx_store *st, uint8_t *p, const nx_ffn *src, nx_ffn *f) {
    *f = *src;
    nx_linear *ls[3] = {&f->gate, &f->up, &f->down};
    for (int j = 0; j < 3; j++) {
        nx_linear *W = ls[j];
        region r[3];
        const int k = linear_regions(W, r);
        const void **to[3] = {&W->w, &W->scales, &W->biases};
        for (int i = 0; i < k; i++) {
            located at;
            *to[i] = p + (locate(st, &r[i], &at) ? at.lead : 0);
            p += region_room(r[i].n);
        }
    }
}

/* A slot for a new expert: the clock's next slot that is neither pinned nor being read and
 * was not used since the hand last passed (used ones get a second chance); -1 if all are
 * pinned or being read. Under the lock. */
static int64_t victim(nx_xcache *xc, int pool) {
    const int64_t first = xc->first[pool], n = xc->plan.pool_slots[pool];
    for (int64_t tries = 0; tries < 2 * n + 1; tries++) {
        const int64_t s = xc->hand[pool];
        xslot *sl = &xc->slots[s];
        xc->hand[pool] = first + (s - first + 1) % n;
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
    const int64_t s = victim(xc, xc->pool[l]);
    if (s < 0) return -1;
    xslot *sl = &xc->slots[s];
    if (sl->layer >= 0) xc->slot_of[sl->layer][sl->expert] = -1;
    const nx_ffn *src = &layer_moe(xc->w, l)->experts[e];
    *sl = (xslot){.mem = sl->mem, .layer = l, .expert = e, .state = SLOT_LOADING, .ref = true};
    slot_views(xc->st, sl->mem, src, &sl->f);
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
        if (s >= 0) {
            st->hits++;
            st->ahead_used += xc->slots[s].ahead;
            xc->slots[s].ahead = false;
        }
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
            *sl = (xslot){.mem = sl->mem, .layer = -1, .expert = -1};
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
            if (xc->slot_of[layer][ids[i]] < 0) {
                const int64_t s = load(xc, layer, ids[i], st);
                if (s < 0) break;
                xc->slots[s].ahead = true;
                st->ahead++;
            }
    pthread_mutex_unlock(&xc->mu);
}
