/* Regular files only, opened without blocking (see file.h). */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"

const char *nx_file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISLNK(mode)) return "a symbolic link";
    return S_ISREG(mode) ? "a regular file" : "a special file";
}

nx_status nx_file_open_regular(const char *path, int extra_flags, int *fd, struct stat *st, nx_error *err) {
    *fd = -1;
    if (!path || !*path) return nx_fail(err, NX_E_ARG, "empty file name");
    /* O_NONBLOCK: a FIFO without a writer opens at once instead of waiting for one */
    const int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | extra_flags);
    if (f < 0) {
        const int e = errno;
        if (e == ELOOP && (extra_flags & O_NOFOLLOW))
            return nx_fail(err, NX_E_IO, "%s: is a symbolic link (not followed here)", path);
        return nx_fail(err, NX_E_IO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat sb;
    if (fstat(f, &sb) != 0) {
        const int e = errno;
        close(f);
        return nx_fail(err, NX_E_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(f);
        return nx_fail(err, NX_E_IO, "%s: not a regular file (%s)", path, nx_file_kind(sb.st_mode));
    }
    const int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        const int e = errno;
        close(f);
        return nx_fail(err, NX_E_IO, "%s: %s", path, strerror(e));
    }
    if (st) *st = sb;
    *fd = f;
    return NX_OK;
}

nx_status nx_file_read_all(const char *path, size_t max_bytes, char **out, size_t *len, nx_error *err) {
    *out = NULL;
    if (len) *len = 0;
    int fd;
    struct stat sb;
    nx_status s = nx_file_open_regular(path, 0, &fd, &sb, err);
    if (s != NX_OK) return s;
    if ((uint64_t)sb.st_size > (uint64_t)max_bytes) {
        close(fd);
        return nx_fail(err, NX_E_FORMAT, "%s: file too large (%lld bytes, at most %zu)", path, (long long)sb.st_size,
                       max_bytes);
    }
    /* the size may change while reading: read to EOF, within max_bytes */
    size_t cap = (size_t)sb.st_size + 1, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            close(fd);
            return nx_fail(err, NX_E_NOMEM, "%s: out of memory", path);
        }
        if (n == cap) {
            if (cap > max_bytes) {
                free(buf);
                close(fd);
                return nx_fail(err, NX_E_FORMAT, "%s: file too large (more than %zu bytes)", path, max_bytes);
            }
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) free(buf);
            buf = nb;
            cap *= 2;
            continue;
        }
        const ssize_t k = read(fd, buf + n, cap - n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            const int e = errno;
            free(buf);
            close(fd);
            return nx_fail(err, NX_E_IO, "%s: read error: %s", path, strerror(e));
        }
        if (k == 0) break;
        n += (size_t)k;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return NX_OK;
}

nx_status nx_file_load_json(const char *path, size_t flags, json_t **out, nx_error *err) {
    *out = NULL;
    char *text;
    size_t len;
    nx_status s = nx_file_read_all(path, NX_JSON_FILE_MAX, &text, &len, err);
    if (s != NX_OK) return s;
    json_error_t je;
    *out = json_loadb(text, len, flags, &je);
    free(text);
    if (!*out) return nx_fail(err, NX_E_FORMAT, "%s: not valid JSON (%s, line %d)", path, je.text, je.line);
    return NX_OK;
}

#ifdef __linux__
/* A number read from a small file (cgroup controls), or false ("max", absent, unreadable). */
static bool read_u64_file(const char *path, uint64_t *v) {
    char *text;
    if (nx_file_read_all(path, 4096, &text, NULL, NULL) != NX_OK) return false;
    char *end;
    errno = 0;
    const unsigned long long x = strtoull(text, &end, 10);
    const bool ok = errno == 0 && end != text && (*end == '\n' || *end == '\0');
    free(text);
    if (ok) *v = (uint64_t)x;
    return ok;
}

/* What this process's memory cgroup leaves: its limit less its usage (v2: memory.max and
 * memory.current; v1: memory.limit_in_bytes and memory.usage_in_bytes), or UINT64_MAX without
 * a limit. Usage counts the group's page cache, reclaimable or not: an underestimate. */
static uint64_t cgroup_room(void) {
    char *text;
    if (nx_file_read_all("/proc/self/cgroup", (size_t)1 << 16, &text, NULL, NULL) != NX_OK) return UINT64_MAX;
    uint64_t room = UINT64_MAX;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = '\0';
        const char *ctl = c1 + 1, *cg = c2 + 1;
        const bool v2 = *ctl == '\0', v1 = strcmp(ctl, "memory") == 0;
        if (!v1 && !v2) continue;
        char lim[4096], use[4096];
        snprintf(lim, sizeof lim, "/sys/fs/cgroup%s%s/%s", v1 ? "/memory" : "", cg,
                 v1 ? "memory.limit_in_bytes" : "memory.max");
        snprintf(use, sizeof use, "/sys/fs/cgroup%s%s/%s", v1 ? "/memory" : "", cg,
                 v1 ? "memory.usage_in_bytes" : "memory.current");
        uint64_t l, u;
        if (read_u64_file(lim, &l) && read_u64_file(use, &u) && l < ((uint64_t)1 << 60)) {
            const uint64_t r = l > u ? l - u : 0;
            if (r < room) room = r;
        }
    }
    free(text);
    return room;
}
#endif

uint64_t nx_mem_available(void) {
#ifdef __linux__
    char *text;
    if (nx_file_read_all("/proc/meminfo", (size_t)1 << 20, &text, NULL, NULL) != NX_OK) return 0;
    const char *l = strstr(text, "MemAvailable:");
    unsigned long long kb = 0;
    if (!l || sscanf(l, "MemAvailable: %llu kB", &kb) != 1) kb = 0;
    free(text);
    const uint64_t sys = (uint64_t)kb * 1024, room = cgroup_room();
    return room < sys ? room : sys;
#else
    return 0;
#endif
}
