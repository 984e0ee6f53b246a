build-nompi/src/model/experts.o: src/model/experts.c src/model/experts.h \
 src/base/error.h include/nextn.h src/io/safetensors.h \
 src/kernels/kernels.h src/base/pool.h src/io/weights.h \
 src/family/family.h src/base/clock.h
src/model/experts.h:
src/base/error.h:
include/nextn.h:
src/io/safetensors.h:
src/kernels/kernels.h:
src/base/pool.h:
src/io/weights.h:
src/family/family.h:
src/base/clock.h:
