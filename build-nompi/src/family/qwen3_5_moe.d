build-nompi/src/family/qwen3_5_moe.o: src/family/qwen3_5_moe.c \
 src/family/family.h
src/family/family.h:
