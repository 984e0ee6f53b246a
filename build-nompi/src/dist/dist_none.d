build-nompi/src/dist/dist_none.o: src/dist/dist_none.c src/base/error.h \
 include/nextn.h src/dist/dist.h
src/base/error.h:
include/nextn.h:
src/dist/dist.h:
