/* Shared by the JSON-mode fuzz targets: feeds `bytes` (at most `limit`) to the automaton from
 * state `s`, and before each byte checks that the token mask of a small vocabulary of JSON
 * fragments agrees with feeding each fragment (end tokens aside once the object is complete);
 * once a byte is refused the state stays dead. Aborts on any disagreement. */
#ifndef NX_FUZZ_JSON_MASK_CHECK_H
#define NX_FUZZ_JSON_MASK_CHECK_H

#include <stdlib.h>
#include <string.h>

#include "constrain/json_grammar.h"

static void check_mask(nx_json_state *s, const uint8_t *bytes, size_t n, size_t limit) {
    static const char *const frag[] = {"{", "}", "\"", ":", ",", "1", "[", "]", " ", "\"a\":", "true", "null", "-2.5"};
    enum { NF = sizeof frag / sizeof *frag };
    const char *toks[NF + 1];
    size_t lens[NF + 1];
    for (int i = 0; i < NF; i++) toks[i] = frag[i], lens[i] = strlen(frag[i]);
    toks[NF] = NULL, lens[NF] = 0;
    const int32_t end = NF;
    nx_json_vocab *jv = NULL;
    if (nx_json_vocab_from_bytes(toks, lens, NF + 1, &end, 1, &jv, NULL) != NX_OK) abort();
    bool alive = true;
    for (size_t i = 0; i < n && i < limit; i++) {
        uint8_t allow[NF + 1];
        nx_json_allowed(jv, s, NF + 1, allow);
        for (int k = 0; alive && k < NF; k++) {
            nx_json_state t;
            nx_json_copy(&t, s);
            const bool fits = nx_json_feed(&t, (const uint8_t *)toks[k], lens[k]);
            if (!nx_json_complete(s) && allow[k] != fits) abort();
        }
        const bool ok = nx_json_step(s, bytes[i]);
        if (!alive && ok) abort(); /* dead stays dead */
        alive = alive && ok;
    }
    nx_json_vocab_free(jv);
}

#endif
