build-nompi/src/model/model.o: src/model/model.c src/base/error.h \
 include/nextn.h src/base/file.h src/io/config.h src/io/weights.h \
 src/kernels/kernels.h src/base/pool.h src/family/family.h \
 src/io/layout.h src/io/safetensors.h src/model/model_internal.h \
 src/model/experts.h src/model/step.h src/model/split.h \
 src/model/validate.h src/text/chat.h src/text/jinja.h
src/base/error.h:
include/nextn.h:
src/base/file.h:
src/io/config.h:
src/io/weights.h:
src/kernels/kernels.h:
src/base/pool.h:
src/family/family.h:
src/io/layout.h:
src/io/safetensors.h:
src/model/model_internal.h:
src/model/experts.h:
src/model/step.h:
src/model/split.h:
src/model/validate.h:
src/text/chat.h:
src/text/jinja.h:
