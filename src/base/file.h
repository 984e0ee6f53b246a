/* Opening files whose paths come from users and checkpoints (weights, config.json, tokenizer
 * files, state files). open() on a FIFO blocks until a writer appears, and a device can block or
 * stream forever, so these are opened non-blocking, checked to be regular files, and only then
 * switched back to blocking reads: anything else is a named error, never a hang. */
#ifndef NX_BASE_FILE_H
#define NX_BASE_FILE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "nextn.h"

/* Opens path read-only (plus extra_flags, e.g. O_NOFOLLOW) as *fd, a regular file, and fills
 * *st (may be NULL). A FIFO, socket, device or directory is NX_E_IO "PATH: not a regular file
 * (a FIFO)", a missing file NX_E_IO with strerror. */
nx_status nx_file_open_regular(const char *path, int extra_flags, int *fd, struct stat *st, nx_error *err);

/* Reads the whole regular file at path into a NUL-terminated malloc'd buffer (*len excludes the
 * NUL); a file over max_bytes is NX_E_FORMAT "PATH: file too large". */
nx_status nx_file_read_all(const char *path, size_t max_bytes, char **out, size_t *len, nx_error *err);

/* The most a JSON file beside the weights (config.json, the safetensors index,
 * tokenizer_config.json, generation_config.json) may hold: real ones are well under 16 MB. */
#define NX_JSON_FILE_MAX ((size_t)64 << 20)

/* Reads and parses such a JSON file with jansson's flags into *out (a new reference): NX_E_IO
 * for the file, NX_E_FORMAT "PATH: not valid JSON (..., line N)". */
nx_status nx_file_load_json(const char *path, size_t flags, json_t **out, nx_error *err);

/* Bytes of memory this process could be given without swapping (Linux: MemAvailable of
 * /proc/meminfo, which counts reclaimable page cache as available, and no more than its memory
 * cgroup's limit leaves); 0 when unknown (other systems, no /proc): callers then treat memory as
 * not known to suffice. */
uint64_t nx_mem_available(void);

/* "a FIFO", "a directory", ... for an st_mode that is not a regular file. */
const char *nx_file_kind(mode_t mode);

#endif
