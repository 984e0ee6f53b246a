build-nompi/src/decode/spec_rules.o: src/decode/spec_rules.c \
 src/decode/spec_rules.h include/nextn.h
src/decode/spec_rules.h:
include/nextn.h:
