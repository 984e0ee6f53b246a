/* The registry of model families: lookup by model_type or architectures entry, and the list
 * of supported ones for error messages. Adding a family = one descriptor file + one line here. */
#include "family/family.h"

#include <stdio.h>
#include <string.h>

static const nx_family *const families[] = {&nx_family_hy_v3, &nx_family_glm4_moe, &nx_family_glm4_moe_lite,
                                              &nx_family_deepseek_v3, &nx_family_qwen3_5_moe, &nx_family_qwen3_next};
#define N_FAMILIES (sizeof families / sizeof *families)

size_t nx_family_count(void) { return N_FAMILIES; }

const nx_family *nx_family_at(size_t i) { return i < N_FAMILIES ? families[i] : NULL; }

const nx_family *nx_family_by_type(const char *model_type) {
    for (size_t i = 0; model_type && i < N_FAMILIES; i++)
        if (strcmp(families[i]->model_type, model_type) == 0) return families[i];
    return NULL;
}

const nx_family *nx_family_by_arch(const char *arch) {
    for (size_t i = 0; arch && i < N_FAMILIES; i++)
        for (nx_keys a = families[i]->architectures; *a; a++)
            if (strcmp(*a, arch) == 0) return families[i];
    return NULL;
}

const char *nx_family_list(char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < N_FAMILIES && o < cap; i++) {
        int n = snprintf(buf + o, cap - o, "%s%s (", i ? ", " : "", families[i]->model_type);
        if (n < 0) break;
        o += (size_t)n;
        for (nx_keys a = families[i]->architectures; *a && o < cap; a++) {
            n = snprintf(buf + o, cap - o, "%s%s", a == families[i]->architectures ? "" : ", ", *a);
            if (n < 0) break;
            o += (size_t)n;
        }
        if (o < cap) o += (size_t)snprintf(buf + o, cap - o, ")");
    }
    return buf;
}
