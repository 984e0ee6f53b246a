build-nompi/src/family/glm4_moe_lite.o: src/family/glm4_moe_lite.c \
 src/family/family.h
src/family/family.h:
