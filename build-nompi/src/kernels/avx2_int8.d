build-nompi/src/kernels/avx2_int8.o: src/kernels/avx2_int8.c \
 src/kernels/x86_common.h src/kernels/kernels_internal.h \
 src/kernels/kernels.h src/base/pool.h
src/kernels/x86_common.h:
src/kernels/kernels_internal.h:
src/kernels/kernels.h:
src/base/pool.h:
