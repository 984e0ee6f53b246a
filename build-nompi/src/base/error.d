build-nompi/src/base/error.o: src/base/error.c src/base/error.h \
 include/nextn.h
src/base/error.h:
include/nextn.h:
