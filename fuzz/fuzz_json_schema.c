/* libFuzzer target for JSON mode's schema compiler (nx_json_schema_new) and the automaton under
 * a compiled schema: the input is a schema, a NUL byte, then bytes of output. Compilation either
 * succeeds or names the problem; the automaton then takes any bytes without reading out of
 * bounds, a dead state stays dead, and the token mask agrees with feeding each token. */
#include <stdlib.h>
#include <string.h>

#include "decode/json_grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    const size_t slen = nul ? (size_t)(nul - data) : size;
    nx_json_schema *sc = NULL;
    nx_error err = {0};
    if (nx_json_schema_new((const char *)data, slen, &sc, &err) != NX_OK) {
        if (sc || !err.msg[0]) abort();
        return 0;
    }
    static const char *const frag[] = {"{", "}", "\"", ":", ",", "1", "[", "]", " ", "\"a\":", "true", "null", "-2.5"};
    enum { NF = sizeof frag / sizeof *frag };
    const char *toks[NF + 1];
    size_t lens[NF + 1];
    for (int i = 0; i < NF; i++) toks[i] = frag[i], lens[i] = strlen(frag[i]);
    toks[NF] = NULL, lens[NF] = 0;
    const int32_t end = NF;
    nx_json_vocab *jv = NULL;
    if (nx_json_vocab_from_bytes(toks, lens, NF + 1, &end, 1, &jv, NULL) != NX_OK) abort();
    nx_json_state s;
    nx_json_init_schema(&s, sc);
    bool alive = true;
    for (size_t i = slen + (nul ? 1 : 0); i < size; i++) {
        uint8_t allow[NF + 1];
        nx_json_allowed(jv, &s, NF + 1, allow);
        for (int k = 0; alive && k < NF; k++) {
            nx_json_state t = s;
            const bool fits = nx_json_feed(&t, (const uint8_t *)toks[k], lens[k]);
            if (!nx_json_complete(&s) && allow[k] != fits) abort();
        }
        const bool ok = nx_json_step(&s, data[i]);
        if (!alive && ok) abort(); /* dead stays dead */
        alive = alive && ok;
    }
    nx_json_vocab_free(jv);
    nx_json_schema_free(sc);
    return 0;
}
