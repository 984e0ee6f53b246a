build-nompi/src/model/deltanet.o: src/model/deltanet.c \
 src/model/deltanet.h src/model/model_internal.h src/base/pool.h \
 src/io/safetensors.h src/base/error.h include/nextn.h \
 src/kernels/kernels.h src/io/weights.h src/family/family.h \
 src/model/experts.h src/model/step.h src/base/clock.h
src/model/deltanet.h:
src/model/model_internal.h:
src/base/pool.h:
src/io/safetensors.h:
src/base/error.h:
include/nextn.h:
src/kernels/kernels.h:
src/io/weights.h:
src/family/family.h:
src/model/experts.h:
src/model/step.h:
src/base/clock.h:
