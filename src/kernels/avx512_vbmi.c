/* The "avx512vbmi" kernel table: avx512_vnni.c built again with AVX-512 VBMI enabled, which
 * adds 3-, 5- and 6-bit weights (on int8 and int16 activations), and GFNI, which pulls 2- and
 * 4-bit fields out of their bytes in one instruction (Ice Lake, Zen 4 and later). */
#define NX_VNNI_VBMI 1
#include "avx512_vnni.c"
