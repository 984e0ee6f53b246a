build-nompi/src/base/file.o: src/base/file.c src/base/file.h \
 include/nextn.h src/base/error.h
src/base/file.h:
include/nextn.h:
src/base/error.h:
