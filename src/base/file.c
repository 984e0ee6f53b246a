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

uint64_t nx_mem_available(void) {
#ifdef __linux__
    char *text;
    if (nx_file_read_all("/proc/meminfo", (size_t)1 << 20, &text, NULL, NULL) != NX_OK) return 0;
    const char *l = strstr(text, "MemAvailable:");
    unsigned long long kb = 0;
    if (!l || sscanf(l, "MemAvailable: %llu kB", &kb) != 1) kb = 0;
    free(text);
    return (uint64_t)kb * 1024;
#else
    return 0;
#endif
}
