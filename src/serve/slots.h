/* llama.cpp's slot actions, POST /slots/ID?action=save|restore|erase: checking the slot id, the
 * action and the file name a client sends, and the answers' JSON. No HTTP and no model here, so
 * the rules can be fuzzed on their own; the server runs the actions on its worker. */
#ifndef NX_SERVE_SLOTS_H
#define NX_SERVE_SLOTS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "nextn.h"
#include "serve/openai.h"

#define NX_SLOT_NAME_MAX 255 /* bytes of a slot file's name (a file name's usual limit) */
/* A save writes NAME.tmp.PID first (nx_state_save), whose name must fit the limit too. */
#define NX_SLOT_SAVE_NAME_MAX (NX_SLOT_NAME_MAX - 32)

typedef enum nx_slot_action {
    NX_SLOT_SAVE = 0, /* the context's rows to a file */
    NX_SLOT_RESTORE,  /* a file's rows into the context */
    NX_SLOT_ERASE,    /* the context emptied */
} nx_slot_action;

typedef struct nx_slot_request {
    int32_t id; /* the slot */
    nx_slot_action action;
    char filename[NX_SLOT_NAME_MAX + 1]; /* save, restore: a bare name inside --slot-save-path */
} nx_slot_request;

/* What an action did: rows saved / restored / erased, the file's bytes, and its milliseconds. */
typedef struct nx_slot_result {
    int32_t n;
    int64_t bytes;
    double ms;
} nx_slot_result;

/* Why name[0..len) cannot be a slot file's name, or NULL when it can: it must be a bare file
 * name, as llama.cpp's fs_validate_filename has it: 1..255 bytes of UTF-8 without control
 * characters, path separators ('/', '\\' and their look-alikes), ':*?"<>|', a leading '.'
 * (".", ".." and hidden files), "..", a leading or trailing space, or a trailing '.'. */
const char *nx_slot_filename_problem(const char *name, size_t len);

/* Checks one request: id is the URL's last segment (a slot, 0..n_slots-1), action the query's
 * "action" (NULL when absent), body the request body (save and restore: {"filename": NAME}, a
 * save's at most NX_SLOT_SAVE_NAME_MAX bytes; erase reads none). NX_OK and *out filled, or
 * NX_E_ARG and e describing the 400. */
nx_status nx_slot_request_parse(const char *id, const char *action, const char *body, size_t len, int n_slots,
                                nx_slot_request *out, nx_oai_error *e);

/* The default budget of --slot-save-path: a save that would take the directory's regular files
 * past it is refused (a state file of a long context is tens of MB; clients choose the names). */
#define NX_SLOT_SAVE_QUOTA_DEFAULT ((uint64_t)4096 << 20)

/* Bytes held by the regular files directly in dir (slot files and any other), into *bytes. */
nx_status nx_slot_dir_bytes(const char *dir, uint64_t *bytes, nx_error *err);

/* Whether a save of new_bytes fits dir's quota: the regular files already there plus the new
 * file (a file of the same name is replaced only once the new one is written, so both count)
 * at most quota bytes. NX_OK, or NX_E_ARG "slot save quota exceeded: ..." with the figures. */
nx_status nx_slot_quota_check(const char *dir, uint64_t new_bytes, uint64_t quota, nx_error *err);

/* Adds "save_quota": {"used_bytes", "limit_bytes"} to a slot's GET /slots object (used_bytes
 * -1 when the directory cannot be read). */
void nx_slot_quota_json(json_t *slot, const char *dir, uint64_t quota);

/* The answer to a finished action, as llama.cpp's server writes it (malloc'd JSON), or NULL when
 * out of memory:
 *   save     {"id_slot", "filename", "n_saved", "n_written", "timings": {"save_ms"}}
 *   restore  {"id_slot", "filename", "n_restored", "n_read", "timings": {"restore_ms"}}
 *   erase    {"id_slot", "n_erased"} */
char *nx_slot_response_json(const nx_slot_request *r, const nx_slot_result *res);

#endif
