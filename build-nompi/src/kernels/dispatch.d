build-nompi/src/kernels/dispatch.o: src/kernels/dispatch.c \
 src/kernels/kernels_internal.h src/kernels/kernels.h src/base/pool.h
src/kernels/kernels_internal.h:
src/kernels/kernels.h:
src/base/pool.h:
