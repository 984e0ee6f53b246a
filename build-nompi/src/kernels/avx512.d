build-nompi/src/kernels/avx512.o: src/kernels/avx512.c \
 src/kernels/avx512_common.h src/kernels/x86_common.h \
 src/kernels/kernels_internal.h src/kernels/kernels.h src/base/pool.h
src/kernels/avx512_common.h:
src/kernels/x86_common.h:
src/kernels/kernels_internal.h:
src/kernels/kernels.h:
src/base/pool.h:
