/* neon_dot.c built again with smmla (FEAT_I8MM) for pairs of weight rows and input rows: the
 * "neoni8mm" table. */
#define NX_NEON_I8MM 1
#include "kernels/neon_dot.c"
