build-nompi/src/text/unicode.o: src/text/unicode.c src/text/unicode.h
src/text/unicode.h:
