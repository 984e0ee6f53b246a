build-nompi/src/constrain/json_grammar.o: src/constrain/json_grammar.c \
 src/constrain/json_grammar.h include/nextn.h src/base/error.h \
 src/constrain/pattern.h
src/constrain/json_grammar.h:
include/nextn.h:
src/base/error.h:
src/constrain/pattern.h:
