build-nompi/src/serve/metrics.o: src/serve/metrics.c src/serve/metrics.h \
 include/nextn.h src/serve/slots.h src/serve/openai.h src/base/strbuf.h
src/serve/metrics.h:
include/nextn.h:
src/serve/slots.h:
src/serve/openai.h:
src/base/strbuf.h:
