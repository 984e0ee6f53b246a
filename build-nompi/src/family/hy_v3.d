build-nompi/src/family/hy_v3.o: src/family/hy_v3.c src/family/family.h
src/family/family.h:
