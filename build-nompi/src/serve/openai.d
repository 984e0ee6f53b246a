build-nompi/src/serve/openai.o: src/serve/openai.c src/serve/openai.h \
 include/nextn.h
src/serve/openai.h:
include/nextn.h:
