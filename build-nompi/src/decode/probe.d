build-nompi/src/decode/probe.o: src/decode/probe.c src/base/error.h \
 include/nextn.h src/decode/probe.h src/decode/spec_rules.h \
 src/model/step.h
src/base/error.h:
include/nextn.h:
src/decode/probe.h:
src/decode/spec_rules.h:
src/model/step.h:
