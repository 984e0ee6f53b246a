build-nompi/src/decode/generate.o: src/decode/generate.c src/base/clock.h \
 src/base/error.h include/nextn.h src/decode/draft_auto.h \
 src/decode/spec_rules.h src/model/step.h
src/base/clock.h:
src/base/error.h:
include/nextn.h:
src/decode/draft_auto.h:
src/decode/spec_rules.h:
src/model/step.h:
