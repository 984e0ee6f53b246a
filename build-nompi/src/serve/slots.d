build-nompi/src/serve/slots.o: src/serve/slots.c src/serve/slots.h \
 include/nextn.h src/serve/openai.h src/base/error.h src/text/unicode.h
src/serve/slots.h:
include/nextn.h:
src/serve/openai.h:
src/base/error.h:
src/text/unicode.h:
