build-nompi/src/serve/glm_output.o: src/serve/glm_output.c \
 src/serve/glm_output.h src/base/strbuf.h include/nextn.h \
 src/constrain/tool_grammar.h src/constrain/json_grammar.h \
 src/serve/output_text.h
src/serve/glm_output.h:
src/base/strbuf.h:
include/nextn.h:
src/constrain/tool_grammar.h:
src/constrain/json_grammar.h:
src/serve/output_text.h:
