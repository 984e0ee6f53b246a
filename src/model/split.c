/* A model run by several ranks: the share of each rank, the operations rank 0 sends, the worker
 * ranks' loop, and the hooks of the forward pass (split.h, docs/multinode.md). */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "dist/dist.h"
#include "model/split.h"
#include "model/validate.h"

/* One message from rank 0: up to SPLIT_MAX_OPS operations in order, the last one's tokens. Its
 * size is fixed, so one broadcast carries it (~1.4 KB: small against a step's row blocks). */
#define SPLIT_MAX_OPS 16
#define SPLIT_MAX_TOKENS 256
#define SPLIT_MAX_CTX 64
enum { OP_CTX_NEW = 16, OP_CTX_FREE, OP_TRUNK, OP_MTP, OP_NET, OP_QUIT };

typedef struct split_op {
    int32_t op, ctx, a, b, c, d;
} split_op;

typedef struct split_msg {
    int32_t n_ops, n_tokens;
    split_op ops[SPLIT_MAX_OPS];
    int32_t tokens[SPLIT_MAX_TOKENS];
} split_msg;

struct nx_split_root {
    split_msg q;
    int32_t next_id;
};

/* ---------------------------------------------------------------- the share of each rank */

static uint64_t layer_bytes(const nx_layer *L) {
    uint64_t b = nx_attn_bytes(L);
    if (!L->is_moe) return b + nx_ffn_bytes(&L->dense);
    b += (uint64_t)nx_linear_bytes(&L->moe.router) + (L->moe.has_shared ? nx_ffn_bytes(&L->moe.shared) : 0);
    for (int32_t e = 0; e < L->moe.n_experts; e++) b += nx_ffn_bytes(&L->moe.experts[e]);
    return b;
}

/* Contiguous layer ranges balanced by bytes, the last rank's counting the head it also holds
 * (lm_head, MTP layer): rank r's range ends at the layer whose middle passes (r+1)/R of the whole,
 * each rank keeping at least one layer. */
nx_status nx_split_plan(const nx_model *m, int R, int32_t *lo, nx_error *err) {
    const int32_t N = m->cfg.n_layers;
    if (N < R)
        return nx_fail(err, NX_E_ARG, "--split pipeline over %d ranks needs at least %d trunk layers; the model has %d",
                       R, R, N);
    double total = (double)nx_linear_bytes(&m->w.lm_head), cum = 0;
    if (m->w.has_mtp) total += (double)layer_bytes(&m->w.mtp.layer) + (double)nx_linear_bytes(&m->w.mtp.eh_proj);
    for (int32_t l = 0; l < N; l++) total += (double)layer_bytes(&m->w.layers[l]);
    int32_t l = 0;
    lo[0] = 0;
    for (int r = 1; r < R; r++) {
        const double want = total * r / R;
        do cum += (double)layer_bytes(&m->w.layers[l++]);
        while (l < N - (R - r) && cum + 0.5 * (double)layer_bytes(&m->w.layers[l]) < want);
        lo[r] = l;
    }
    lo[R] = N;
    return NX_OK;
}

/* The ranks' layer ranges: a rank loaded from a share runs the range it was cut for, any other
 * the plan's (the same unless the shares were cut with other options, e.g. a head --no-mtp
 * leaves out); the ranges must join into 0 .. n_layers. A collective. */
static nx_status plan_layers(nx_model *m, nx_error *err) {
    const int R = m->ranks, N = m->cfg.n_layers;
    if (!(m->layer_lo = calloc((size_t)R + 1, sizeof *m->layer_lo))) return nx_fail(err, NX_E_NOMEM, "out of memory");
    nx_status st = nx_split_plan(m, R, m->layer_lo, err);
    if (st != NX_OK) return st;
    int32_t range[64][2];
    int64_t bytes[64];
    for (int r = 0; r < R; r++) bytes[r] = sizeof range[0];
    range[m->rank][0] = m->share.on ? m->share.lo : m->layer_lo[m->rank];
    range[m->rank][1] = m->share.on ? m->share.hi : m->layer_lo[m->rank + 1];
    if ((st = nx_dist_allgather(m->dist, range, bytes, err)) != NX_OK) return st;
    for (int r = 0; r < R; r++) {
        const int32_t want = r ? range[r - 1][1] : 0;
        if (range[r][0] != want || range[r][1] <= range[r][0] || (r == R - 1 && range[r][1] != N))
            return nx_fail(err, NX_E_ARG, "the ranks' trunk layers do not join into 0-%d: rank %d runs %d-%d after "
                           "layer %d (shares cut with other options than the job's, or mixed with a whole "
                           "checkpoint?)", N - 1, r, range[r][0], range[r][1] - 1, want - 1);
        m->layer_lo[r] = range[r][0];
    }
    return NX_OK;
}

/* What must be equal on every rank for their shares to make one model. */
static uint64_t fingerprint(const nx_model *m) {
    const nx_config *c = &m->cfg;
    const uint64_t v[] = {(uint64_t)c->n_layers, (uint64_t)c->hidden_size, (uint64_t)c->vocab_size,
                          (uint64_t)c->n_experts, (uint64_t)c->top_k, (uint64_t)m->w.has_mtp,
                          (uint64_t)m->kv_dtype, (uint64_t)m->draft_vocab, (uint64_t)m->split,
                          m->info.weight_bytes};
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) h = (h ^ v[i]) * 1099511628211ull;
    return h;
}

static void end_at_finish(void *m);

nx_status nx_split_setup(nx_model *m, nx_error *err) {
    m->rank = nx_dist_rank(m->dist);
    m->ranks = nx_dist_size(m->dist);
    if (m->split != NX_SPLIT_PIPELINE && m->split != NX_SPLIT_EXPERTS)
        return nx_fail(err, NX_E_ARG, "a model loaded with a dist needs split pipeline or experts");
    if (m->ranks > 64) return nx_fail(err, NX_E_UNSUPPORTED, "--split: at most 64 ranks, the job has %d", m->ranks);
    if (m->split == NX_SPLIT_EXPERTS && m->xc)
        return nx_fail(err, NX_E_UNSUPPORTED, "--split experts with streamed experts (--max-memory): use --split pipeline");
    nx_status st;
    uint64_t fp[64][2]; /* the model and options; the source checkpoint's tensors */
    int64_t bytes[64];
    for (int r = 0; r < m->ranks; r++) bytes[r] = sizeof fp[0];
    fp[m->rank][0] = fingerprint(m);
    fp[m->rank][1] = nx_store_digest(m->store);
    if ((st = nx_dist_allgather(m->dist, fp, bytes, err)) != NX_OK) return st;
    for (int r = 1; r < m->ranks; r++) {
        if (fp[r][1] != fp[0][1])
            return nx_fail(err, NX_E_ARG, "rank %d loaded another model than rank 0: its tensors (names, dtypes, "
                           "shapes) are another checkpoint's (digest %016llx, rank 0's %016llx; a share records its "
                           "source's as \"source_digest\" in nextn-share.json)", r, (unsigned long long)fp[r][1],
                           (unsigned long long)fp[0][1]);
        if (fp[r][0] != fp[0][0])
            return nx_fail(err, NX_E_ARG, "rank %d loaded another model or other options than rank 0 (shapes, "
                           "weight bytes, --kv-type, --draft-vocab, --no-mtp or --split differ)", r);
    }
    if (m->split == NX_SPLIT_PIPELINE && (st = plan_layers(m, err)) != NX_OK) return st;
    if (m->rank == 0) {
        if (!(m->root = calloc(1, sizeof *m->root))) return nx_fail(err, NX_E_NOMEM, "out of memory");
        nx_dist_at_finish(m->dist, end_at_finish, m);
    }
    return NX_OK;
}

bool nx_split_has_head(const nx_model *m) {
    return !m->dist || m->split != NX_SPLIT_PIPELINE || m->rank == m->ranks - 1;
}

void nx_split_experts_of(const nx_model *m, int rank, int32_t E, int32_t *e0, int32_t *e1) {
    const bool split = m->dist && m->split == NX_SPLIT_EXPERTS;
    const int R = split ? m->ranks : 1, r = split ? rank : 0;
    *e0 = (int32_t)((int64_t)E * r / R);
    *e1 = (int32_t)((int64_t)E * (r + 1) / R);
}

/* ---------------------------------------------------------------- rank 0's messages */

static nx_status flush(nx_model *m, const int32_t *tokens, int32_t n, nx_error *err) {
    split_msg *q = &m->root->q;
    q->n_tokens = n;
    if (n) memcpy(q->tokens, tokens, sizeof(int32_t) * (size_t)n);
    const nx_status st = nx_dist_bcast(m->dist, q, sizeof *q, false, err);
    q->n_ops = 0;
    return st;
}

/* Queues op; with tokens (a forward), sends the queue at once. */
static nx_status send_op(nx_model *m, split_op op, const int32_t *tokens, int32_t n, bool now, nx_error *err) {
    if (!m->root) return NX_OK;
    nx_error local;
    if (n > SPLIT_MAX_TOKENS) return nx_fail(err, NX_E_ARG, "split: %d rows in one forward (at most %d)", n, SPLIT_MAX_TOKENS);
    if (m->root->q.n_ops == SPLIT_MAX_OPS && flush(m, NULL, 0, err ? err : &local) != NX_OK) return NX_E_RANK;
    m->root->q.ops[m->root->q.n_ops++] = op;
    return now ? flush(m, tokens, n, err ? err : &local) : NX_OK;
}

void nx_split_end(nx_model *m) {
    if (!m->root) return;
    nx_dist_at_finish(m->dist, NULL, NULL);
    send_op(m, (split_op){.op = OP_QUIT}, NULL, 0, true, NULL);
    free(m->root);
    m->root = NULL;
}

/* The program exits with the model still loaded: the other ranks are told all the same. */
static void end_at_finish(void *m) { nx_split_end(m); }

void nx_split_ctx_new(nx_ctx *c) {
    nx_model *m = c->m;
    if (!m->root) return;
    c->split_id = m->root->next_id++ % SPLIT_MAX_CTX;
    send_op(m, (split_op){.op = OP_CTX_NEW, .ctx = c->split_id, .a = c->n_ctx}, NULL, 0, false, NULL);
}

void nx_split_ctx_free(nx_ctx *c) {
    free(c->split_logits);
    c->split_logits = NULL;
    send_op(c->m, (split_op){.op = OP_CTX_FREE, .ctx = c->split_id}, NULL, 0, false, NULL);
}

void nx_split_op(nx_ctx *c, int op, int32_t n) {
    send_op(c->m, (split_op){.op = op, .ctx = c->split_id, .a = n}, NULL, 0, false, NULL);
}

/* ---------------------------------------------------------------- forward hooks */

static void net_mark(nx_ctx *c) {
    nx_net n;
    nx_dist_net(c->m->dist, &n);
    c->net0_bytes = n.bytes + n.recv;
    c->net0_s = n.seconds;
    c->net0_msgs = n.messages;
}

void nx_split_traffic(nx_ctx *c) {
    nx_net n;
    nx_dist_net(c->m->dist, &n);
    c->traffic.net_bytes = n.bytes + n.recv - c->net0_bytes;
    c->traffic.net_s = n.seconds - c->net0_s;
    c->traffic.net_msgs = n.messages - c->net0_msgs;
}

static size_t row_bytes(const nx_model *m) { return sizeof(float) * (size_t)m->cfg.hidden_size; }

nx_status nx_split_trunk_in(nx_ctx *c, const int32_t *tokens, int32_t T, int32_t logits_from, int32_t *l0,
                            int32_t *l1, nx_error *err) {
    nx_model *m = c->m;
    net_mark(c);
    nx_status st = send_op(m, (split_op){.op = OP_TRUNK, .ctx = c->split_id, .a = T, .b = logits_from}, tokens, T,
                           true, err);
    if (st != NX_OK || m->split != NX_SPLIT_PIPELINE) return st;
    *l0 = m->layer_lo[m->rank];
    *l1 = m->layer_lo[m->rank + 1];
    return m->rank > 0 ? nx_dist_recv(m->dist, m->rank - 1, c->x, row_bytes(m) * (size_t)T, err) : NX_OK;
}

nx_status nx_split_trunk_pass(nx_ctx *c, int32_t T, nx_error *err) {
    nx_model *m = c->m;
    if (m->split == NX_SPLIT_PIPELINE && m->rank < m->ranks - 1)
        return nx_dist_send(m->dist, m->rank + 1, c->x, row_bytes(m) * (size_t)T, err);
    return nx_split_failed(c, err);
}

nx_status nx_split_logits(nx_ctx *c, float *logits, int32_t rows, nx_error *err) {
    nx_model *m = c->m;
    const int last = m->ranks - 1;
    const size_t bytes = sizeof(float) * (size_t)m->cfg.vocab_size * (size_t)rows;
    if (m->split != NX_SPLIT_PIPELINE || last == 0) return NX_OK;
    if (m->rank == last) return nx_dist_send(m->dist, 0, logits, bytes, err);
    return m->rank == 0 ? nx_dist_recv(m->dist, last, logits, bytes, err) : NX_OK;
}

nx_status nx_split_mtp_in(nx_ctx *c, const float *hidden, const int32_t *tokens, int32_t R, int32_t pos0,
                          int32_t logits_from, bool *here, nx_error *err) {
    nx_model *m = c->m;
    const size_t H = (size_t)m->cfg.hidden_size;
    net_mark(c);
    *here = nx_split_has_head(m);
    if (!m->root) return NX_OK;
    /* where the rows' hidden states are, as an offset each rank can resolve in its own context:
     * trunk positions (a catch-up) or the head's last output rows (a chained draft) */
    int32_t src;
    if (hidden >= c->hidden && hidden < c->hidden + (size_t)c->n_ctx * H) src = (int32_t)((size_t)(hidden - c->hidden) / H);
    else if (hidden >= c->mtp_out && hidden < c->mtp_out + (size_t)c->n_batch * H)
        src = -1 - (int32_t)((size_t)(hidden - c->mtp_out) / H);
    else return nx_fail(err, NX_E_STATE, "split: MTP rows from a hidden state the other ranks do not hold");
    return send_op(m, (split_op){OP_MTP, c->split_id, R, pos0, logits_from, src}, tokens, R, true, err);
}

nx_status nx_split_mtp_elsewhere(nx_ctx *c, int32_t R, float *logits, int32_t logits_from, nx_error *err) {
    nx_model *m = c->m;
    const int32_t V = m->cfg.vocab_size;
    c->mtp_past += R;
    c->mtp_rows = R;
    if (!logits || logits_from >= R) {
        nx_split_traffic(c);
        if (c->sink.forward) c->sink.forward(c->sink.user, true, R, &c->traffic);
        return NX_OK;
    }
    nx_status st = nx_split_logits(c, logits, R - logits_from, err);
    if (st != NX_OK) return st;
    st = nx_logits_check(logits, R - logits_from, V, m->draft_vocab, "MTP", err);
    nx_split_traffic(c);
    if (c->sink.forward) c->sink.forward(c->sink.user, true, R, &c->traffic);
    return st;
}

void nx_split_exchange(nx_ctx *c, float *ye, const int32_t *rows) {
    int64_t bytes[64];
    nx_error e;
    for (int q = 0; q < c->m->ranks; q++) bytes[q] = (int64_t)rows[q] * (int64_t)row_bytes(c->m);
    (void)nx_dist_allgather(c->m->dist, ye, bytes, &e); /* a failure stays in the dist */
}

bool nx_model_failed(const nx_model *m, nx_error *err) {
    if (!m->dist || !nx_dist_has_failed(m->dist)) return false;
    nx_fail(err, NX_E_RANK, "%s", nx_dist_failure(m->dist));
    return true;
}

nx_status nx_split_failed(const nx_ctx *c, nx_error *err) {
    const char *f = nx_dist_failure(c->m->dist);
    return f[0] ? nx_fail(err, NX_E_RANK, "%s", f) : NX_OK;
}

/* ---------------------------------------------------------------- the other ranks */

/* A buffer for the logits this rank computes for rank 0 (the last pipeline stage). */
static float *worker_logits(nx_ctx *c) {
    if (!c->split_logits) c->split_logits = calloc((size_t)c->n_batch * (size_t)c->m->cfg.vocab_size, sizeof(float));
    return c->split_logits;
}

/* One forward as rank 0 made it. An error of the model's own (bad logits) is rank 0's to
 * report, and the run goes on; a failure of the network ends the loop. */
static nx_status follow_forward(nx_ctx *c, const split_op *op, const int32_t *tokens, nx_error *err) {
    nx_model *m = c->m;
    const size_t H = (size_t)m->cfg.hidden_size;
    const int32_t rows = op->a, lf = op->op == OP_TRUNK ? op->b : op->c;
    const bool want = lf < rows && m->split == NX_SPLIT_PIPELINE && nx_split_has_head(m);
    float *lg = want ? worker_logits(c) : NULL;
    if (want && !lg) return nx_fail(err, NX_E_NOMEM, "rank %d: out of memory for logits", m->rank);
    nx_error local;
    if (op->op == OP_TRUNK) (void)nx_forward_trunk(c, tokens, rows, lg, lf, &local);
    else {
        const int32_t src = op->d;
        if (src >= c->n_ctx || (src < 0 && -1 - src >= c->n_batch))
            return nx_fail(err, NX_E_STATE, "rank %d: MTP rows from hidden state %d out of range", m->rank, src);
        const float *h = src >= 0 ? c->hidden + (size_t)src * H : c->mtp_out + (size_t)(-1 - src) * H;
        (void)nx_forward_mtp(c, h, tokens, rows, op->b, lg, lf, &local);
    }
    return nx_split_failed(c, err);
}

/* Runs op; *quit when rank 0 is done. */
static nx_status follow_op(nx_model *m, nx_ctx **ctx, const split_op *op, const int32_t *tokens, bool *quit,
                           nx_error *err) {
    if (op->op == OP_QUIT) return *quit = true, NX_OK;
    if (op->op == OP_NET) {
        nx_net sum;
        return nx_dist_job_net(m->dist, &sum, err);
    }
    if (op->ctx < 0 || op->ctx >= SPLIT_MAX_CTX)
        return nx_fail(err, NX_E_STATE, "rank %d: context id %d out of range", m->rank, op->ctx);
    nx_ctx **c = &ctx[op->ctx];
    if (op->op == OP_CTX_NEW) {
        nx_ctx_free(*c);
        nx_status st = nx_ctx_new(m, op->a, c, err);
        if (st == NX_OK) (*c)->split_id = op->ctx;
        return st;
    }
    if (!*c) return nx_fail(err, NX_E_STATE, "rank %d: no context %d", m->rank, op->ctx);
    switch (op->op) {
    case OP_CTX_FREE: nx_ctx_free(*c), *c = NULL; return NX_OK;
    case NX_SPLIT_TRUNCATE: nx_ctx_truncate(*c, op->a); return NX_OK;
    case NX_SPLIT_MTP_COMMIT: nx_mtp_commit(*c, op->a); return NX_OK;
    case NX_SPLIT_MTP_SKIP: nx_mtp_skip_to(*c, op->a); return NX_OK;
    case NX_SPLIT_MTP_RESET: nx_mtp_reset(*c); return NX_OK;
    case NX_SPLIT_KEEP_STATE: nx_ctx_keep_state_at(*c, op->a); return NX_OK;
    case OP_TRUNK: case OP_MTP: return follow_forward(*c, op, tokens, err);
    default: return nx_fail(err, NX_E_STATE, "rank %d: unknown operation %d from rank 0", m->rank, op->op);
    }
}

nx_status nx_model_follow(nx_model *m, nx_error *err) {
    if (!m->dist || m->rank == 0) return nx_fail(err, NX_E_STATE, "nx_model_follow: for the ranks other than 0");
    nx_ctx *ctx[SPLIT_MAX_CTX] = {0};
    split_msg *msg = malloc(sizeof *msg);
    nx_status st = msg ? NX_OK : nx_fail(err, NX_E_NOMEM, "out of memory");
    for (bool quit = false; st == NX_OK && !quit;) {
        if ((st = nx_dist_bcast(m->dist, msg, sizeof *msg, true, err)) != NX_OK) break;
        if (msg->n_ops < 0 || msg->n_ops > SPLIT_MAX_OPS || msg->n_tokens < 0 || msg->n_tokens > SPLIT_MAX_TOKENS) {
            st = nx_fail(err, NX_E_FORMAT, "rank %d: malformed message from rank 0", m->rank);
            break;
        }
        for (int i = 0; i < msg->n_ops && st == NX_OK && !quit; i++)
            st = follow_op(m, ctx, &msg->ops[i], msg->tokens, &quit, err);
    }
    for (int i = 0; i < SPLIT_MAX_CTX; i++) nx_ctx_free(ctx[i]);
    free(msg);
    return st;
}

nx_status nx_model_net(nx_model *m, double *bytes, int64_t *messages, double *seconds, nx_error *err) {
    *bytes = *seconds = 0;
    *messages = 0;
    if (!m->dist) return NX_OK;
    if (m->rank != 0) return nx_fail(err, NX_E_STATE, "nx_model_net: on rank 0");
    nx_net sum;
    nx_status st = send_op(m, (split_op){.op = OP_NET}, NULL, 0, true, err);
    if (st == NX_OK && (st = nx_dist_job_net(m->dist, &sum, err)) == NX_OK) {
        *bytes = sum.bytes;
        *messages = sum.messages;
        *seconds = sum.seconds;
    }
    return st;
}
