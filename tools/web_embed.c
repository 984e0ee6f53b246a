/* Build step of the nextn program: writes a C file holding the chat page's files (web/) as a table
 * of nx_web_file (src/serve/server.h), which `nextn serve` serves at GET /. index.html is served
 * at "/", every other file at "/" and its name; the Content-Type follows the extension and the
 * ETag is a 64-bit FNV-1a hash of the bytes.
 *
 * Usage: web_embed OUT.c FILE... */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *content_type(const char *name) {
    static const char *const types[][2] = {
        {".html", "text/html; charset=utf-8"},       {".css", "text/css; charset=utf-8"},
        {".js", "text/javascript; charset=utf-8"},   {".svg", "image/svg+xml"},
        {".json", "application/json"},               {".png", "image/png"},
        {".ico", "image/x-icon"},                    {".txt", "text/plain; charset=utf-8"},
    };
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (strcmp(dot, types[i][0]) == 0) return types[i][1];
    return NULL;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    unsigned char *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + len, 1, cap - len, f)) > 0;) {
        len += k;
        if (len == cap) {
            unsigned char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    *n = len;
    return buf;
}

static int emit_file(FILE *out, size_t idx, const char *path, char *entry, size_t cap) {
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    const char *type = content_type(name);
    if (!type) {
        fprintf(stderr, "web_embed: %s: unknown file type (add its extension to content_type)\n", path);
        return 1;
    }
    size_t n = 0;
    unsigned char *data = slurp(path, &n);
    if (!data) {
        fprintf(stderr, "web_embed: %s: cannot read\n", path);
        return 1;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    fprintf(out, "static const unsigned char f%zu[%zu] = {", idx, n ? n : 1);
    for (size_t i = 0; i < n; i++) {
        h = (h ^ data[i]) * 0x100000001b3ull;
        fprintf(out, "%s%u,", i % 20 ? "" : "\n    ", data[i]);
    }
    fprintf(out, "%s};\n", n ? "\n" : "0");
    free(data);
    snprintf(entry, cap, "    {\"/%s\", \"%s\", \"\\\"%016llx\\\"\", f%zu, %zu},\n",
             strcmp(name, "index.html") == 0 ? "" : name, type, (unsigned long long)h, idx, n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: web_embed OUT.c FILE...\n");
        return 2;
    }
    FILE *out = fopen(argv[1], "w");
    if (!out) {
        fprintf(stderr, "web_embed: %s: cannot write\n", argv[1]);
        return 1;
    }
    const size_t nf = (size_t)argc - 2, cap = 512;
    char *entries = calloc(nf, cap);
    int rc = entries ? 0 : 1;
    fprintf(out, "/* The chat page's files, written by tools/web_embed.c from web/. */\n"
                 "#include \"serve/server.h\"\n\n"
                 "extern const nx_web_file nx_web_files[];\nextern const size_t nx_web_n_files;\n\n");
    for (size_t i = 0; rc == 0 && i < nf; i++) rc = emit_file(out, i, argv[i + 2], entries + i * cap, cap);
    if (rc == 0) {
        fprintf(out, "\nconst nx_web_file nx_web_files[] = {\n");
        for (size_t i = 0; i < nf; i++) fputs(entries + i * cap, out);
        fprintf(out, "};\nconst size_t nx_web_n_files = %zu;\n", nf);
    }
    free(entries);
    if (fclose(out) != 0) rc = 1;
    if (rc) remove(argv[1]);
    return rc;
}
