build-nompi/src/serve/hy_output.o: src/serve/hy_output.c \
 src/serve/hy_output.h include/nextn.h src/base/strbuf.h \
 src/constrain/tool_grammar.h src/constrain/json_grammar.h
src/serve/hy_output.h:
include/nextn.h:
src/base/strbuf.h:
src/constrain/tool_grammar.h:
src/constrain/json_grammar.h:
