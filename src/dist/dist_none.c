/* A build without MPI (dist.h): nx_dist_init says --split needs an MPI build; nothing else can
 * be reached, since no nx_dist exists. */
#include "base/error.h"
#include "dist/dist.h"

nx_status nx_dist_init(int *argc, char ***argv, double timeout_s, nx_dist **out, nx_error *err) {
    (void)argc, (void)argv, (void)timeout_s;
    *out = NULL;
    return nx_fail(err, NX_E_UNSUPPORTED,
                   "--split needs a build with MPI: install Open MPI (libopenmpi-dev, openmpi-bin; "
                   "scripts/setup.sh) and run make again");
}

int nx_dist_rank(const nx_dist *d) { return (void)d, 0; }
int nx_dist_size(const nx_dist *d) { return (void)d, 1; }
void nx_dist_finish(nx_dist *d, bool abort) { (void)d, (void)abort; }
void nx_dist_at_finish(nx_dist *d, void (*fn)(void *), void *user) { (void)d, (void)fn, (void)user; }
void nx_dist_net(const nx_dist *d, nx_net *out) { (void)d, *out = (nx_net){0}; }
const char *nx_dist_failure(const nx_dist *d) { return (void)d, ""; }
bool nx_dist_has_failed(const nx_dist *d) { return (void)d, false; }

static nx_status none(nx_error *err) { return nx_fail(err, NX_E_UNSUPPORTED, "this build has no MPI"); }
nx_status nx_dist_bcast(nx_dist *d, void *buf, size_t bytes, bool forever, nx_error *err) {
    return (void)d, (void)buf, (void)bytes, (void)forever, none(err);
}
nx_status nx_dist_send(nx_dist *d, int to, const void *buf, size_t bytes, nx_error *err) {
    return (void)d, (void)to, (void)buf, (void)bytes, none(err);
}
nx_status nx_dist_recv(nx_dist *d, int from, void *buf, size_t bytes, nx_error *err) {
    return (void)d, (void)from, (void)buf, (void)bytes, none(err);
}
nx_status nx_dist_allgather(nx_dist *d, void *buf, const int64_t *bytes, nx_error *err) {
    return (void)d, (void)buf, (void)bytes, none(err);
}
nx_status nx_dist_job_net(nx_dist *d, nx_net *sum, nx_error *err) {
    return (void)d, *sum = (nx_net){0}, none(err);
}
