build-nompi/src/serve/dsv31_output.o: src/serve/dsv31_output.c \
 src/serve/dsv31_output.h src/constrain/tool_grammar.h \
 src/constrain/json_grammar.h include/nextn.h src/serve/output_text.h
src/serve/dsv31_output.h:
src/constrain/tool_grammar.h:
src/constrain/json_grammar.h:
include/nextn.h:
src/serve/output_text.h:
