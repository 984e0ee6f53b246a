/* The transport of a run across several processes (MPI ranks, docs/multinode.md): what the
 * model's split (src/model/split.c) needs and no more — the root's command broadcast, row blocks
 * from rank to rank, and one all-gather per MoE layer. Every wait has a deadline, so a rank that
 * dies or stops answering ends the run with an error naming it, never a hang; after the first
 * failure every call fails at once. Counts bytes, messages and seconds spent waiting. Built from
 * dist.c with MPI, else from dist_none.c (nx_dist_init then says --split needs an MPI build). */
#ifndef NX_DIST_H
#define NX_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nextn.h"

/* Traffic of this rank since it started: bytes and messages it sent, bytes it received, and wall
 * seconds it waited on the network (sends, receives and collectives from posting to completion). */
typedef struct nx_net {
    double bytes, recv, seconds;
    int64_t messages;
} nx_net;

/* The root (rank 0) sends bytes at buf to every rank; the others receive into buf. forever: the
 * receivers wait without a deadline (a worker idling between commands). */
nx_status nx_dist_bcast(nx_dist *d, void *buf, size_t bytes, bool forever, nx_error *err);
nx_status nx_dist_send(nx_dist *d, int to, const void *buf, size_t bytes, nx_error *err);
nx_status nx_dist_recv(nx_dist *d, int from, void *buf, size_t bytes, nx_error *err);
/* In place: rank r's block is bytes[r] bytes at buf + Σ_{q<r} bytes[q]; every rank ends with all
 * blocks. */
nx_status nx_dist_allgather(nx_dist *d, void *buf, const int64_t *bytes, nx_error *err);
/* Sums every rank's counters at the root (a collective: every rank calls it). */
nx_status nx_dist_job_net(nx_dist *d, nx_net *sum, nx_error *err);
void nx_dist_net(const nx_dist *d, nx_net *out);
/* fn(user) runs at nx_dist_finish unless cleared (fn NULL) before: rank 0's last word to the
 * others when the program exits without freeing the model. */
void nx_dist_at_finish(nx_dist *d, void (*fn)(void *), void *user);
/* The first failure's message (empty while none). */
const char *nx_dist_failure(const nx_dist *d);
/* Whether the run failed, from any thread (the message is complete once this is true). */
bool nx_dist_has_failed(const nx_dist *d);

#endif
