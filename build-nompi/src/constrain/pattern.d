build-nompi/src/constrain/pattern.o: src/constrain/pattern.c \
 src/constrain/pattern.h src/text/unicode.h
src/constrain/pattern.h:
src/text/unicode.h:
