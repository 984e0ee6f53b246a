build-nompi/src/base/membw.o: src/base/membw.c src/base/membw.h \
 src/base/pool.h src/base/clock.h
src/base/membw.h:
src/base/pool.h:
src/base/clock.h:
