build-nompi/src/io/safetensors.o: src/io/safetensors.c \
 src/io/safetensors.h src/base/error.h include/nextn.h \
 src/kernels/kernels.h src/base/pool.h src/base/file.h
src/io/safetensors.h:
src/base/error.h:
include/nextn.h:
src/kernels/kernels.h:
src/base/pool.h:
src/base/file.h:
