/* `nextn serve`: the OpenAI-compatible HTTP server subcommand (see src/serve/server.h). */
#ifndef NX_CLI_SERVE_H
#define NX_CLI_SERVE_H

/* argv[0] is "serve". Returns the process exit status. */
int nx_cli_serve(int argc, char **argv);

#endif
