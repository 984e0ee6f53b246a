build-nompi/src/model/state_file.o: src/model/state_file.c \
 src/base/error.h include/nextn.h src/base/file.h src/model/deltanet.h \
 src/model/model_internal.h src/base/pool.h src/io/safetensors.h \
 src/kernels/kernels.h src/io/weights.h src/family/family.h \
 src/model/experts.h src/model/step.h
src/base/error.h:
include/nextn.h:
src/base/file.h:
src/model/deltanet.h:
src/model/model_internal.h:
src/base/pool.h:
src/io/safetensors.h:
src/kernels/kernels.h:
src/io/weights.h:
src/family/family.h:
src/model/experts.h:
src/model/step.h:
