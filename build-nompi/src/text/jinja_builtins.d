build-nompi/src/text/jinja_builtins.o: src/text/jinja_builtins.c \
 src/text/jinja_internal.h src/base/error.h include/nextn.h \
 src/text/jinja.h
src/text/jinja_internal.h:
src/base/error.h:
include/nextn.h:
src/text/jinja.h:
