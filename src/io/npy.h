/* NumPy .npy files (little-endian, C order): float32 arrays written by `nextn eval` and the
 * activation dumps so Python tools can compare against a reference, read back by tests; arrays
 * of other dtypes written in pieces by `nextn forge` (its training shards). */
#ifndef NX_IO_NPY_H
#define NX_IO_NPY_H

#include <stdint.h>
#include <stdio.h>

#include "base/error.h"

#define NX_NPY_MAX_DIMS 8

/* Writes data (prod(shape) floats; n_dims 0..8, n_dims == 0 is a scalar) as a version 1.0
 * .npy file with dtype '<f4'. */
nx_status nx_npy_write_f32(const char *path, const float *data, int n_dims, const int64_t *shape,
                           nx_error *err);

/* Creates path and writes a version 1.0 .npy header for an array of numpy dtype `descr` ('<f4',
 * '<f2', '<i4', ...) and the given shape; *out is the open file, positioned where the caller
 * writes the prod(shape) elements in C order (and closes it). For arrays written in pieces. */
nx_status nx_npy_begin(const char *path, const char *descr, int n_dims, const int64_t *shape, FILE **out,
                       nx_error *err);

/* Reads a '<f4' C-order .npy file (versions 1-3). On success *data is malloc'd (owned by the
 * caller; never NULL, even for zero elements), *n_dims and shape[0..*n_dims) are set. The
 * header is validated: magic, version, dict keys, dtype, fortran_order, and a data size that
 * matches the file. */
nx_status nx_npy_read_f32(const char *path, float **data, int *n_dims,
                          int64_t shape[NX_NPY_MAX_DIMS], nx_error *err);

#endif
