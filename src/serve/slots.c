/* POST /slots/ID?action=...: the request's checks and the answers' JSON (see slots.h). The file
 * name is the one thing a client puts into a path on the server's disk, so it is held to a bare
 * name inside --slot-save-path: nothing that climbs out of the directory or names another one. */
#include "serve/slots.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"

#include "text/unicode.h"

/* Code points a file name may not hold: controls (C0, DEL, C1), the separators and their
 * look-alikes (fullwidth full stop, division slash, set minus), characters Windows forbids,
 * the replacement character and the byte-order mark (as llama.cpp's fs_validate_filename). */
static bool forbidden(uint32_t cp) {
    if (cp <= 0x1F || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F)) return true;
    if (cp == 0xFF0E || cp == 0x2215 || cp == 0x2216 || cp == 0xFFFD || cp == 0xFEFF) return true;
    return cp < 0x80 && strchr("/\\:*?\"<>|", (int)cp) != NULL;
}

const char *nx_slot_filename_problem(const char *name, size_t len) {
    if (len == 0) return "it is empty";
    if (len > NX_SLOT_NAME_MAX) return "it is longer than 255 bytes";
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        const size_t k = nx_utf8_next(name + i, len - i, &cp);
        if (k == 0) return "it is not valid UTF-8";
        if (cp == 0) return "it contains a NUL byte";
        if (cp == '/' || cp == '\\') return "it contains a path separator";
        if (forbidden(cp)) return "it contains a control or reserved character";
        i += k;
    }
    if (name[0] == '.') return "it starts with '.'";
    if (memmem(name, len, "..", 2)) return "it contains '..'";
    if (name[0] == ' ' || name[len - 1] == ' ') return "it starts or ends with a space";
    if (name[len - 1] == '.') return "it ends with '.'";
    return NULL;
}

/* The slot in the URL: decimal digits naming one of the n_slots slots (one context each). */
static nx_status parse_slot(const char *id, int n_slots, int32_t *slot, nx_oai_error *e) {
    size_t n = strspn(id, "0123456789");
    if (n > 0 && id[n] == '\0') {
        while (*id == '0' && id[1]) id++; /* "00" is slot 0, as a number */
        if (strlen(id) <= 3 && atoi(id) < n_slots) {
            *slot = atoi(id);
            return NX_OK;
        }
        nx_oai_error_set(e, 400, "invalid_request_error", "id_slot", "invalid_slot",
                         "There is no slot %.40s: this server has %d slot%s, 0..%d.", id, n_slots,
                         n_slots == 1 ? "" : "s", n_slots - 1);
        return NX_E_ARG;
    }
    nx_oai_error_set(e, 400, "invalid_request_error", "id_slot", "invalid_slot",
                     "Invalid slot id '%.40s' in /slots/ID: expected a number (this server has %d slot%s, 0..%d).",
                     id, n_slots, n_slots == 1 ? "" : "s", n_slots - 1);
    return NX_E_ARG;
}

nx_status nx_slot_request_parse(const char *id, const char *action, const char *body, size_t len, int n_slots,
                                nx_slot_request *out, nx_oai_error *e) {
    memset(out, 0, sizeof *out);
    if (parse_slot(id ? id : "", n_slots, &out->id, e) != NX_OK) return NX_E_ARG;
    if (!action || !*action) {
        nx_oai_error_set(e, 400, "invalid_request_error", "action", "missing_required_parameter",
                         "Missing action: send /slots/0?action=save, restore or erase.");
        return NX_E_ARG;
    }
    if (strcmp(action, "save") == 0) out->action = NX_SLOT_SAVE;
    else if (strcmp(action, "restore") == 0) out->action = NX_SLOT_RESTORE;
    else if (strcmp(action, "erase") == 0) out->action = NX_SLOT_ERASE;
    else {
        nx_oai_error_set(e, 400, "invalid_request_error", "action", "invalid_value",
                         "Invalid action '%.40s': expected save, restore or erase.", action);
        return NX_E_ARG;
    }
    if (out->action == NX_SLOT_ERASE) return NX_OK;

    json_error_t jerr;
    json_t *root = json_loadb(body ? body : "", body ? len : 0, JSON_ALLOW_NUL, &jerr); /* a NUL gets named below */
    nx_status st = NX_E_ARG;
    const json_t *f = json_object_get(root, "filename");
    const char *why;
    if (!json_is_object(root))
        nx_oai_error_set(e, 400, "invalid_request_error", NULL, "invalid_json",
                         "The body must be a JSON object with a 'filename' (%s).",
                         root ? "got another JSON value" : jerr.text);
    else if (!json_is_string(f))
        nx_oai_error_set(e, 400, "invalid_request_error", "filename",
                         f ? "invalid_type" : "missing_required_parameter",
                         "'filename' must be a string: the name of a file in the server's slot directory.");
    else if ((why = nx_slot_filename_problem(json_string_value(f), json_string_length(f))))
        nx_oai_error_set(e, 400, "invalid_request_error", "filename", "invalid_filename",
                         "invalid filename '%.64s': %s (a bare file name inside the server's slot directory).",
                         json_string_value(f), why);
    else if (out->action == NX_SLOT_SAVE && json_string_length(f) > NX_SLOT_SAVE_NAME_MAX)
        nx_oai_error_set(e, 400, "invalid_request_error", "filename", "invalid_filename",
                         "invalid filename '%.64s...': a saved file's name is at most %d bytes.", json_string_value(f),
                         NX_SLOT_SAVE_NAME_MAX);
    else {
        memcpy(out->filename, json_string_value(f), json_string_length(f));
        st = NX_OK;
    }
    json_decref(root);
    return st;
}

char *nx_slot_response_json(const nx_slot_request *r, const nx_slot_result *res) {
    json_t *j;
    if (r->action == NX_SLOT_ERASE)
        j = json_pack("{s:i, s:i}", "id_slot", (int)r->id, "n_erased", (int)res->n);
    else
        j = json_pack("{s:i, s:s, s:i, s:I, s:{s:f}}", "id_slot", (int)r->id, "filename", r->filename,
                      r->action == NX_SLOT_SAVE ? "n_saved" : "n_restored", (int)res->n,
                      r->action == NX_SLOT_SAVE ? "n_written" : "n_read", (json_int_t)res->bytes, "timings",
                      r->action == NX_SLOT_SAVE ? "save_ms" : "restore_ms", res->ms);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return text;
}

nx_status nx_slot_dir_bytes(const char *dir, uint64_t *bytes, nx_error *err) {
    *bytes = 0;
    DIR *d = opendir(dir);
    /* the directory is not named: the message may reach clients, the server's paths are not theirs */
    if (!d) return nx_fail(err, NX_E_IO, "the slot directory cannot be read: %s", strerror(errno));
    const int dfd = dirfd(d);
    for (struct dirent *e; (e = readdir(d));) {
        struct stat sb;
        /* the entries themselves (no links followed): what the directory's disk holds */
        if (fstatat(dfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode))
            *bytes += (uint64_t)sb.st_size;
    }
    closedir(d);
    return NX_OK;
}

nx_status nx_slot_quota_check(const char *dir, uint64_t new_bytes, uint64_t quota, nx_error *err) {
    uint64_t used;
    nx_status st = nx_slot_dir_bytes(dir, &used, err);
    if (st != NX_OK) return st;
    if (used + new_bytes <= quota) return NX_OK;
    return nx_fail(err, NX_E_ARG,
                   "slot save quota exceeded: the file would take %.1f MiB, the slot directory holds %.1f MiB of "
                   "its %.1f MiB (--slot-save-quota)",
                   (double)new_bytes / 1048576.0, (double)used / 1048576.0, (double)quota / 1048576.0);
}

void nx_slot_quota_json(json_t *slot, const char *dir, uint64_t quota) {
    uint64_t used;
    const bool ok = nx_slot_dir_bytes(dir, &used, NULL) == NX_OK;
    json_object_set_new(slot, "save_quota", json_pack("{s:I, s:I}", "used_bytes", ok ? (json_int_t)used : -1,
                                                      "limit_bytes", (json_int_t)quota));
}
