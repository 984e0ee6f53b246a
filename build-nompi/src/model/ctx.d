build-nompi/src/model/ctx.o: src/model/ctx.c src/base/error.h \
 include/nextn.h src/model/deltanet.h src/model/model_internal.h \
 src/base/pool.h src/io/safetensors.h src/kernels/kernels.h \
 src/io/weights.h src/family/family.h src/model/experts.h \
 src/model/step.h src/model/split.h
src/base/error.h:
include/nextn.h:
src/model/deltanet.h:
src/model/model_internal.h:
src/base/pool.h:
src/io/safetensors.h:
src/kernels/kernels.h:
src/io/weights.h:
src/family/family.h:
src/model/experts.h:
src/model/step.h:
src/model/split.h:
