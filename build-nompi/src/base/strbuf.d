build-nompi/src/base/strbuf.o: src/base/strbuf.c src/base/strbuf.h \
 include/nextn.h
src/base/strbuf.h:
include/nextn.h:
