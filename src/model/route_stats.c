/* Router statistics (route_stats.h). The file:
 *   {"format": "nextn router statistics", "model_type": "hy_v3",
 *    "layers": [null, [c0, c1, ...], ...],   one entry per trunk layer (null: dense)
 *    "mtp": [c0, c1, ...] or null}           the MTP layer's experts
 * Counts are how many times each expert was chosen, summed over every row of every forward. */
#include "model/route_stats.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"

#define FORMAT "nextn router statistics"

static const nx_moe *slot_moe(const nx_weights *w, int32_t s) {
    const nx_layer *L = s < w->n_layers ? &w->layers[s] : w->has_mtp ? &w->mtp.layer : NULL;
    return L && L->is_moe && L->moe.n_experts > 0 ? &L->moe : NULL;
}

void nx_route_stats_free(nx_route_stats *rs) {
    for (int32_t s = 0; s < rs->n_slots; s++) {
        if (rs->prior) free(rs->prior[s]);
        if (rs->live) free(rs->live[s]);
    }
    free(rs->prior);
    free(rs->live);
    free(rs->n_experts);
    memset(rs, 0, sizeof *rs);
}

/* One layer's counts from the file: an array of n non-negative integers, or null for none. */
static nx_status read_counts(json_t *a, int32_t n, const char *path, const char *field, uint64_t *out,
                             nx_error *err) {
    if (n == 0) {
        if (json_is_null(a) || (json_is_array(a) && json_array_size(a) == 0)) return NX_OK;
        return nx_fail(err, NX_E_FORMAT, "router statistics %s: %s has counts but the model's layer has no routed "
                       "experts (statistics of another model?)", path, field);
    }
    if (!json_is_array(a) || json_array_size(a) != (size_t)n)
        return nx_fail(err, NX_E_FORMAT, "router statistics %s: %s must be an array of %d counts (the layer's "
                       "routed experts), got %s of %zu", path, field, n,
                       json_is_array(a) ? "an array" : "no array", json_is_array(a) ? json_array_size(a) : 0);
    for (int32_t e = 0; e < n; e++) {
        json_t *v = json_array_get(a, (size_t)e);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return nx_fail(err, NX_E_FORMAT, "router statistics %s: %s[%d] is not a non-negative integer", path,
                           field, e);
        out[e] = (uint64_t)json_integer_value(v);
    }
    return NX_OK;
}

static nx_status read_prior(nx_route_stats *rs, const char *model_type, const char *path, nx_error *err) {
    json_t *root;
    nx_status st = nx_file_load_json(path, 0, &root, err);
    if (st != NX_OK) return st;
    json_t *fmt = json_object_get(root, "format"), *mt = json_object_get(root, "model_type"),
           *layers = json_object_get(root, "layers");
    const int32_t n_trunk = rs->n_slots - 1;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), FORMAT) != 0)
        st = nx_fail(err, NX_E_FORMAT, "router statistics %s: \"format\" is not \"" FORMAT "\"", path);
    else if (!json_is_string(mt) || strcmp(json_string_value(mt), model_type) != 0)
        st = nx_fail(err, NX_E_FORMAT, "router statistics %s: \"model_type\" is %s, the model is %s", path,
                     json_is_string(mt) ? json_string_value(mt) : "missing", model_type);
    else if (!json_is_array(layers) || json_array_size(layers) != (size_t)n_trunk)
        st = nx_fail(err, NX_E_FORMAT, "router statistics %s: \"layers\" must list the model's %d layers, got %zu",
                     path, n_trunk, json_is_array(layers) ? json_array_size(layers) : 0);
    char field[48];
    for (int32_t s = 0; st == NX_OK && s < rs->n_slots; s++) {
        json_t *a = s < n_trunk ? json_array_get(layers, (size_t)s) : json_object_get(root, "mtp");
        if (s < n_trunk) snprintf(field, sizeof field, "layers[%d]", s);
        else snprintf(field, sizeof field, "mtp");
        if (s == n_trunk && !a && rs->n_experts[s] > 0) continue; /* a file written without the head */
        st = read_counts(a, rs->n_experts[s], path, field, rs->prior[s], err);
    }
    json_decref(root);
    rs->has_prior = st == NX_OK;
    return st;
}

nx_status nx_route_stats_init(nx_route_stats *rs, const nx_weights *w, const char *model_type, const char *path,
                              nx_error *err) {
    memset(rs, 0, sizeof *rs);
    rs->n_slots = w->n_layers + 1;
    rs->n_experts = calloc((size_t)rs->n_slots, sizeof *rs->n_experts);
    rs->prior = calloc((size_t)rs->n_slots, sizeof *rs->prior);
    rs->live = calloc((size_t)rs->n_slots, sizeof *rs->live);
    bool ok = rs->n_experts && rs->prior && rs->live;
    for (int32_t s = 0; ok && s < rs->n_slots; s++) {
        const nx_moe *M = slot_moe(w, s);
        if (!M) continue;
        rs->n_experts[s] = M->n_experts;
        rs->prior[s] = calloc((size_t)M->n_experts, sizeof(uint64_t));
        rs->live[s] = calloc((size_t)M->n_experts, sizeof(uint64_t));
        ok = rs->prior[s] && rs->live[s];
    }
    if (!ok) {
        nx_route_stats_free(rs);
        return nx_fail(err, NX_E_NOMEM, "out of memory for router statistics");
    }
    if (!path || access(path, F_OK) != 0) return NX_OK; /* nothing gathered yet */
    const nx_status st = read_prior(rs, model_type, path, err);
    if (st != NX_OK) nx_route_stats_free(rs);
    return st;
}

void nx_route_tally(nx_route_stats *rs, int32_t slot, const int32_t *ids, int64_t n) {
    if (!rs->live || slot < 0 || slot >= rs->n_slots || !rs->live[slot]) return;
    uint64_t *c = rs->live[slot];
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < rs->n_experts[slot]) __atomic_fetch_add(&c[ids[i]], 1, __ATOMIC_RELAXED);
}

static json_t *counts_json(const nx_route_stats *rs, int32_t s) {
    if (rs->n_experts[s] == 0) return json_null();
    json_t *a = json_array();
    for (int32_t e = 0; a && e < rs->n_experts[s]; e++) {
        const uint64_t v = rs->prior[s][e] + __atomic_load_n(&rs->live[s][e], __ATOMIC_RELAXED);
        json_array_append_new(a, json_integer((json_int_t)v));
    }
    return a;
}

nx_status nx_route_stats_save(const nx_route_stats *rs, const char *model_type, const char *path, nx_error *err) {
    if (!rs->live) return nx_fail(err, NX_E_STATE, "router statistics %s: nothing was counted", path);
    json_t *root = json_object(), *layers = json_array();
    if (!root || !layers) {
        json_decref(root);
        json_decref(layers);
        return nx_fail(err, NX_E_NOMEM, "out of memory");
    }
    json_object_set_new(root, "format", json_string(FORMAT));
    json_object_set_new(root, "model_type", json_string(model_type));
    for (int32_t s = 0; s + 1 < rs->n_slots; s++) json_array_append_new(layers, counts_json(rs, s));
    json_object_set_new(root, "layers", layers);
    json_object_set_new(root, "mtp", counts_json(rs, rs->n_slots - 1));
    const size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    nx_status st = NX_OK;
    if (!tmp) st = nx_fail(err, NX_E_NOMEM, "out of memory");
    else snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    if (st == NX_OK && json_dump_file(root, tmp, JSON_COMPACT) != 0)
        st = nx_fail(err, NX_E_IO, "router statistics %s: cannot write %s: %s", path, tmp, strerror(errno));
    else if (st == NX_OK && rename(tmp, path) != 0)
        st = nx_fail(err, NX_E_IO, "router statistics %s: cannot rename %s into place: %s", path, tmp,
                     strerror(errno));
    if (st != NX_OK && tmp) unlink(tmp);
    free(tmp);
    json_decref(root);
    return st;
}
