build-nompi/src/text/chat.o: src/text/chat.c src/text/chat.h \
 include/nextn.h src/text/jinja.h src/base/error.h src/base/file.h
src/text/chat.h:
include/nextn.h:
src/text/jinja.h:
src/base/error.h:
src/base/file.h:
