build-nompi/tools/cli/convert.o: tools/cli/convert.c tools/cli/convert.h \
 tools/cli/cli.h include/nextn.h tools/cli/converter.h src/nextn_tools.h \
 src/base/clock.h src/base/pool.h src/decode/probe.h src/io/config.h \
 src/base/error.h src/io/weights.h src/kernels/kernels.h src/base/pool.h \
 src/family/family.h src/io/npy.h src/io/quantize.h src/io/safetensors.h \
 src/kernels/kernels.h src/model/dense_timing.h src/base/membw.h \
 src/serve/server.h src/text/chat.h src/text/jinja.h
tools/cli/convert.h:
tools/cli/cli.h:
include/nextn.h:
tools/cli/converter.h:
src/nextn_tools.h:
src/base/clock.h:
src/base/pool.h:
src/decode/probe.h:
src/io/config.h:
src/base/error.h:
src/io/weights.h:
src/kernels/kernels.h:
src/base/pool.h:
src/family/family.h:
src/io/npy.h:
src/io/quantize.h:
src/io/safetensors.h:
src/kernels/kernels.h:
src/model/dense_timing.h:
src/base/membw.h:
src/serve/server.h:
src/text/chat.h:
src/text/jinja.h:
