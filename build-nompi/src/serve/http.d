build-nompi/src/serve/http.o: src/serve/http.c src/serve/worker.h \
 src/base/strbuf.h include/nextn.h src/constrain/tool_grammar.h \
 src/constrain/json_grammar.h src/serve/chat_format.h src/serve/metrics.h \
 src/serve/slots.h src/serve/openai.h src/serve/server.h src/text/chat.h \
 src/text/jinja.h src/base/clock.h src/base/error.h
src/serve/worker.h:
src/base/strbuf.h:
include/nextn.h:
src/constrain/tool_grammar.h:
src/constrain/json_grammar.h:
src/serve/chat_format.h:
src/serve/metrics.h:
src/serve/slots.h:
src/serve/openai.h:
src/serve/server.h:
src/text/chat.h:
src/text/jinja.h:
src/base/clock.h:
src/base/error.h:
