build-nompi/src/io/layout.o: src/io/layout.c src/io/layout.h \
 src/base/error.h include/nextn.h src/io/safetensors.h \
 src/kernels/kernels.h src/base/pool.h src/io/weights.h \
 src/family/family.h src/io/config.h
src/io/layout.h:
src/base/error.h:
include/nextn.h:
src/io/safetensors.h:
src/kernels/kernels.h:
src/base/pool.h:
src/io/weights.h:
src/family/family.h:
src/io/config.h:
