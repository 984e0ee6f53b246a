/* libFuzzer target for JSON Schema `pattern` compilation (constrain/pattern.c): the input's first
 * two bytes pick the length limits, the rest is the pattern. Compilation either succeeds or says
 * why; a compiled automaton's every reachable state can still reach an accepting one through
 * bytes a JSON string carries without \u escapes (the trimming masking relies on), and its start
 * is live. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/pattern.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int feedable(int b) { return b >= 0x20 || b == 0x08 || b == 0x09 || b == 0x0A || b == 0x0C || b == 0x0D; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const int32_t min_len = data[0] % 8, max_len = data[1] % 16 < 8 ? -1 : min_len + data[1] % 8;
    char err[256] = "";
    nx_pattern *p = nx_pattern_compile((const char *)data + 2, size - 2, min_len, max_len, err, sizeof err);
    if (!p) {
        if (!err[0]) abort();
        return 0;
    }
    if (p->start == 0 || p->start >= p->n_states) abort();
    uint8_t *seen = calloc((size_t)p->n_states, 1);
    uint16_t *queue = malloc((size_t)p->n_states * sizeof *queue);
    if (!seen || !queue) abort();
    int32_t head = 0, tail = 0;
    queue[tail++] = p->start, seen[p->start] = 1;
    while (head < tail) {
        const uint16_t st = queue[head++];
        int moves = 0;
        for (int b = 0; b < 256; b++) {
            const uint16_t t = nx_pattern_step(p, st, (uint8_t)b);
            if (!t) continue;
            if (t >= p->n_states || !feedable(b)) abort();
            moves++;
            if (!seen[t]) seen[t] = 1, queue[tail++] = t;
        }
        if (!moves && !p->accept[st]) abort(); /* a dead end */
    }
    free(seen);
    free(queue);
    nx_pattern_free(p);
    return 0;
}
