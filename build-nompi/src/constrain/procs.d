build-nompi/src/constrain/procs.o: src/constrain/procs.c \
 src/constrain/procs.h include/nextn.h src/base/error.h \
 src/constrain/json_grammar.h src/constrain/proc_util.h \
 src/constrain/tool_grammar.h
src/constrain/procs.h:
include/nextn.h:
src/base/error.h:
src/constrain/json_grammar.h:
src/constrain/proc_util.h:
src/constrain/tool_grammar.h:
