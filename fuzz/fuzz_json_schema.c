/* libFuzzer target for JSON mode's schema compiler (nx_json_schema_new) and the automaton under
 * a compiled schema: the input is a schema, a NUL byte, then bytes of output. Compilation either
 * succeeds or names the problem; the automaton then takes any bytes without reading out of
 * bounds, a dead state stays dead, and the token mask agrees with feeding each token. */
#include <stdlib.h>
#include <string.h>

#include "constrain/json_grammar.h"
#include "json_mask_check.h"

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
    nx_json_state s;
    nx_json_init_schema(&s, sc);
    const size_t from = slen + (nul ? 1 : 0);
    check_mask(&s, data + from, size - from, size);
    nx_json_schema_free(sc);
    return 0;
}
