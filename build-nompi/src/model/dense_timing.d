build-nompi/src/model/dense_timing.o: src/model/dense_timing.c \
 src/model/dense_timing.h src/base/membw.h src/base/pool.h \
 include/nextn.h src/base/clock.h src/base/error.h \
 src/model/model_internal.h src/io/safetensors.h src/kernels/kernels.h \
 src/io/weights.h src/family/family.h src/model/experts.h \
 src/model/step.h
src/model/dense_timing.h:
src/base/membw.h:
src/base/pool.h:
include/nextn.h:
src/base/clock.h:
src/base/error.h:
src/model/model_internal.h:
src/io/safetensors.h:
src/kernels/kernels.h:
src/io/weights.h:
src/family/family.h:
src/model/experts.h:
src/model/step.h:
