build-nompi/src/serve/chat_format.o: src/serve/chat_format.c \
 src/serve/chat_format.h src/base/strbuf.h include/nextn.h \
 src/constrain/tool_grammar.h src/constrain/json_grammar.h \
 src/serve/dsv31_output.h src/serve/glm_output.h src/serve/hy_output.h \
 src/serve/qwen_output.h
src/serve/chat_format.h:
src/base/strbuf.h:
include/nextn.h:
src/constrain/tool_grammar.h:
src/constrain/json_grammar.h:
src/serve/dsv31_output.h:
src/serve/glm_output.h:
src/serve/hy_output.h:
src/serve/qwen_output.h:
