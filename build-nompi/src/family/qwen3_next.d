build-nompi/src/family/qwen3_next.o: src/family/qwen3_next.c \
 src/family/family.h
src/family/family.h:
