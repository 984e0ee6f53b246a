/* `nextn convert` and `nextn graft`: the command-line front ends of converter.c. */
#ifndef NX_CLI_CONVERT_H
#define NX_CLI_CONVERT_H

int cli_convert(int argc, char **argv);
int cli_graft(int argc, char **argv);

#endif
