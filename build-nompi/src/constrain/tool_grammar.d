build-nompi/src/constrain/tool_grammar.o: src/constrain/tool_grammar.c \
 src/constrain/tool_grammar.h src/constrain/json_grammar.h \
 include/nextn.h src/base/error.h src/constrain/pattern.h
src/constrain/tool_grammar.h:
src/constrain/json_grammar.h:
include/nextn.h:
src/base/error.h:
src/constrain/pattern.h:
