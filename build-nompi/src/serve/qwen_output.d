build-nompi/src/serve/qwen_output.o: src/serve/qwen_output.c \
 src/serve/qwen_output.h src/constrain/tool_grammar.h \
 src/constrain/json_grammar.h include/nextn.h src/serve/output_text.h
src/serve/qwen_output.h:
src/constrain/tool_grammar.h:
src/constrain/json_grammar.h:
include/nextn.h:
src/serve/output_text.h:
