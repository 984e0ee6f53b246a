build-nompi/src/family/family.o: src/family/family.c src/family/family.h
src/family/family.h:
