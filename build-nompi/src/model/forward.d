build-nompi/src/model/forward.o: src/model/forward.c src/base/clock.h \
 src/base/error.h include/nextn.h src/io/quantize.h src/kernels/kernels.h \
 src/base/pool.h src/model/validate.h src/io/weights.h \
 src/family/family.h src/model/deltanet.h src/model/model_internal.h \
 src/io/safetensors.h src/model/experts.h src/model/step.h \
 src/model/forward.h src/model/split.h
src/base/clock.h:
src/base/error.h:
include/nextn.h:
src/io/quantize.h:
src/kernels/kernels.h:
src/base/pool.h:
src/model/validate.h:
src/io/weights.h:
src/family/family.h:
src/model/deltanet.h:
src/model/model_internal.h:
src/io/safetensors.h:
src/model/experts.h:
src/model/step.h:
src/model/forward.h:
src/model/split.h:
