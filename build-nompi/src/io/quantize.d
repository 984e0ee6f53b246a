build-nompi/src/io/quantize.o: src/io/quantize.c src/io/quantize.h \
 src/kernels/kernels.h src/base/pool.h
src/io/quantize.h:
src/kernels/kernels.h:
src/base/pool.h:
