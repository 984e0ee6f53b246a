build-nompi/src/kernels/dtype.o: src/kernels/dtype.c \
 src/kernels/kernels_internal.h src/kernels/kernels.h src/base/pool.h
src/kernels/kernels_internal.h:
src/kernels/kernels.h:
src/base/pool.h:
