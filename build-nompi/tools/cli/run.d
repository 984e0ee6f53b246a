build-nompi/tools/cli/run.o: tools/cli/run.c tools/cli/cli.h \
 include/nextn.h
tools/cli/cli.h:
include/nextn.h:
