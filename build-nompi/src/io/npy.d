build-nompi/src/io/npy.o: src/io/npy.c src/io/npy.h src/base/error.h \
 include/nextn.h
src/io/npy.h:
src/base/error.h:
include/nextn.h:
