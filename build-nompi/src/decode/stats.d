build-nompi/src/decode/stats.o: src/decode/stats.c include/nextn.h
include/nextn.h:
