build-nompi/src/constrain/proc_util.o: src/constrain/proc_util.c \
 src/constrain/proc_util.h
src/constrain/proc_util.h:
