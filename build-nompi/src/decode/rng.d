build-nompi/src/decode/rng.o: src/decode/rng.c src/decode/rng.h
src/decode/rng.h:
