/* `nextn serve`: the OpenAI-compatible HTTP server subcommand (see src/serve/server.h). */
#ifndef NX_CLI_SERVE_H
#define NX_CLI_SERVE_H

#include <stddef.h>

#include "nextn_tools.h"

/* The chat page's files, embedded from web/ by the build (tools/web_embed.c). */
extern const nx_web_file nx_web_files[];
extern const size_t nx_web_n_files;

/* argv[0] is "serve". Returns the process exit status. */
int nx_cli_serve(int argc, char **argv);

#endif
