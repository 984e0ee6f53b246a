build-nompi/src/kernels/ref.o: src/kernels/ref.c \
 src/kernels/kernels_internal.h src/kernels/kernels.h src/base/pool.h
src/kernels/kernels_internal.h:
src/kernels/kernels.h:
src/base/pool.h:
