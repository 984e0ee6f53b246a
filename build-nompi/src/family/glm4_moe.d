build-nompi/src/family/glm4_moe.o: src/family/glm4_moe.c \
 src/family/family.h
src/family/family.h:
