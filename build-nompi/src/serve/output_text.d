build-nompi/src/serve/output_text.o: src/serve/output_text.c \
 src/serve/output_text.h src/constrain/tool_grammar.h \
 src/constrain/json_grammar.h include/nextn.h
src/serve/output_text.h:
src/constrain/tool_grammar.h:
src/constrain/json_grammar.h:
include/nextn.h:
