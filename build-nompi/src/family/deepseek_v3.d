build-nompi/src/family/deepseek_v3.o: src/family/deepseek_v3.c \
 src/family/family.h
src/family/family.h:
