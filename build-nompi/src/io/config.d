build-nompi/src/io/config.o: src/io/config.c src/io/config.h \
 src/base/error.h include/nextn.h src/io/weights.h src/kernels/kernels.h \
 src/base/pool.h src/family/family.h src/base/file.h
src/io/config.h:
src/base/error.h:
include/nextn.h:
src/io/weights.h:
src/kernels/kernels.h:
src/base/pool.h:
src/family/family.h:
src/base/file.h:
