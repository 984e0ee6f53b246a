build-nompi/src/text/tokenizer.o: src/text/tokenizer.c include/nextn.h \
 src/base/error.h src/base/file.h src/base/strbuf.h \
 src/text/tokenizer_internal.h src/text/unicode.h
include/nextn.h:
src/base/error.h:
src/base/file.h:
src/base/strbuf.h:
src/text/tokenizer_internal.h:
src/text/unicode.h:
