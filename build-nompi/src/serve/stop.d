build-nompi/src/serve/stop.o: src/serve/stop.c src/serve/stop.h \
 src/base/strbuf.h include/nextn.h
src/serve/stop.h:
src/base/strbuf.h:
include/nextn.h:
