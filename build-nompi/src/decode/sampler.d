build-nompi/src/decode/sampler.o: src/decode/sampler.c src/base/error.h \
 include/nextn.h src/constrain/procs.h src/decode/rng.h \
 src/decode/spec_rules.h src/kernels/kernels.h src/base/pool.h
src/base/error.h:
include/nextn.h:
src/constrain/procs.h:
src/decode/rng.h:
src/decode/spec_rules.h:
src/kernels/kernels.h:
src/base/pool.h:
