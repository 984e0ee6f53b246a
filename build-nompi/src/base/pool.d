build-nompi/src/base/pool.o: src/base/pool.c src/base/pool.h
src/base/pool.h:
