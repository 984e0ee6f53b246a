build-nompi/src/model/split.o: src/model/split.c src/base/error.h \
 include/nextn.h src/dist/dist.h src/model/split.h \
 src/model/model_internal.h src/base/pool.h src/io/safetensors.h \
 src/kernels/kernels.h src/io/weights.h src/family/family.h \
 src/model/experts.h src/model/step.h src/model/validate.h
src/base/error.h:
include/nextn.h:
src/dist/dist.h:
src/model/split.h:
src/model/model_internal.h:
src/base/pool.h:
src/io/safetensors.h:
src/kernels/kernels.h:
src/io/weights.h:
src/family/family.h:
src/model/experts.h:
src/model/step.h:
src/model/validate.h:
