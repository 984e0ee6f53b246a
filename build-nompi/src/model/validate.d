build-nompi/src/model/validate.o: src/model/validate.c \
 src/model/validate.h src/io/weights.h src/kernels/kernels.h \
 src/base/pool.h src/family/family.h include/nextn.h src/base/error.h \
 src/model/model_internal.h src/io/safetensors.h src/model/experts.h \
 src/model/step.h
src/model/validate.h:
src/io/weights.h:
src/kernels/kernels.h:
src/base/pool.h:
src/family/family.h:
include/nextn.h:
src/base/error.h:
src/model/model_internal.h:
src/io/safetensors.h:
src/model/experts.h:
src/model/step.h:
