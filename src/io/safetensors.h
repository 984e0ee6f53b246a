/* safetensors checkpoints as a read-only tensor store: every file is mmap'd, every header is
 * treated as hostile and validated before a single tensor pointer is handed out, and tensors
 * from all files of a directory (single file, sharded with an index, MLX sidecars) are found
 * by name through one hash table. Tensor data is a view into the mapping, possibly unaligned. */
#ifndef NX_IO_SAFETENSORS_H
#define NX_IO_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/kernels.h"

#define NX_ST_MAX_DIMS 8
#define NX_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* bytes, as the reference reader */

typedef struct nx_tensor {
    const char *name;
    nx_dtype dtype;
    int n_dims;
    int64_t shape[NX_ST_MAX_DIMS];
    const uint8_t *data; /* into the file mapping; may be unaligned */
    size_t nbytes;       /* == prod(shape) * nx_dtype_size(dtype) */
    int file;            /* index of the file it came from (nx_store_file_name) */
} nx_tensor;

/* ---------------------------------------------------------------- one file in memory */

/* Parses and validates one safetensors image buf[0..len) (a whole file). On success *out is a
 * malloc'd array of *n_out tensors whose data points into buf and whose names are owned by
 * the array (free it with nx_safetensors_free_parsed); `file` fields are 0. `filename` only
 * labels error messages. Checks: header length <= 100 MB and <= len - 8, a JSON object, every
 * entry with a known dtype, <= 8 non-negative dims, overflow-checked sizes, data_offsets
 * inside the data buffer and equal to the tensor's size, no overlapping tensors, and a
 * string-to-string __metadata__. Unaligned offsets are accepted (MLX does not pad). */
nx_status nx_safetensors_parse(const uint8_t *buf, size_t len, const char *filename,
                               nx_tensor **out, size_t *n_out, nx_error *err);
void nx_safetensors_free_parsed(nx_tensor *tensors, size_t n);

/* Writes a safetensors file of n tensors (data taken from t[i].data, t[i].nbytes bytes which
 * must equal prod(shape)·sizeof(dtype)), in array order. align = 8 pads the header with spaces
 * as Hugging Face's writer does; align <= 1 writes it unpadded as MLX does. metadata_json, if
 * non-NULL, is a JSON object text stored as "__metadata__" (e.g. {"format":"mlx"}). */
nx_status nx_safetensors_write(const char *path, const nx_tensor *t, size_t n, int align,
                               const char *metadata_json, nx_error *err);

/* ---------------------------------------------------------------- a checkpoint directory */

typedef struct nx_store nx_store;

/* Opens a checkpoint directory: the union of every file named in model.safetensors.index.json
 * (whose weight_map is verified: each tensor must exist in the file it names) and every
 * model*.safetensors file in the directory, so sidecars such as model-mtp.safetensors are
 * picked up even when the index does not list them. A tensor name present in two files is an
 * error naming both. */
nx_status nx_store_open(const char *dir, nx_store **out, nx_error *err);
/* As nx_store_open, but the files the index names that are not in the directory are left out
 * with their tensors: a tool that needs a few tensors (graft's head) can read a checkpoint of
 * which only the shards holding them were downloaded. Files that are present are checked as
 * nx_store_open checks them. */
nx_status nx_store_open_partial(const char *dir, nx_store **out, nx_error *err);
/* As nx_store_open, but the mappings read no more than the pages touched (no readahead) until
 * nx_store_use marks what is used: the model loader's, which reads only headers and small
 * tensors before it decides what stays resident. */
nx_status nx_store_open_lazy(const char *dir, nx_store **out, nx_error *err);
void nx_store_free(nx_store *st);

/* The tensor called `name`, or NULL. Owned by the store. */
const nx_tensor *nx_store_find(const nx_store *st, const char *name);

/* Iteration over every tensor: i in [0, nx_store_count), in file order then header order. */
size_t nx_store_count(const nx_store *st);
const nx_tensor *nx_store_tensor(const nx_store *st, size_t i);

/* The files of the store (base names, e.g. "model-00001-of-00002.safetensors"). */
int nx_store_n_files(const nx_store *st);
const char *nx_store_file_name(const nx_store *st, int file);
/* Base name of the file a tensor came from. */
const char *nx_store_file_of(const nx_store *st, const nx_tensor *t);
/* The directory the store was opened from. */
const char *nx_store_dir(const nx_store *st);

/* Whether every mapped file is still the one loaded: the same inode (the descriptor stays open,
 * so a checkpoint replaced by rename does not count) with the same size and modification time.
 * A file overwritten or truncated in place is NX_E_IO naming it (reading a truncated mapping
 * would raise SIGBUS). One fstat per file. */
nx_status nx_store_check(const nx_store *st, nx_error *err);

/* Residency of mapped bytes [p, p + n) (inside one file's mapping; anything else is ignored).
 * Opening a store reads only the headers (and a lazy store's mappings no more than the pages
 * touched, no readahead, until the loader says what is used): `use` marks bytes the forwards read
 * (readahead, huge pages); prefault also reads their pages and sets up their page tables now
 * rather than one fault per page during the first forwards; lock also keeps them in memory
 * (mlock: NX_E_NOMEM past the process's limit). */
void nx_store_use(const nx_store *st, const void *p, size_t n);
void nx_store_prefault(const nx_store *st, const void *p, size_t n);
nx_status nx_store_lock(const nx_store *st, const void *p, size_t n, nx_error *err);
/* Reads file `file`'s pages in through its mapping (nx_store_use marked its tensors first), the
 * part from the first 2 MB boundary past the header first: the page cache grows its folios as a
 * read goes on, so a read that begins at the header leaves the next 2 MB in 4 KB pages, and one
 * that begins on a boundary gets 2 MB ones from there on. */
void nx_store_read_in(const nx_store *st, int file);
/* The share of the store's resident pages this process maps with 2 MB page-table entries, over
 * every file (-1 where the system does not say); with share, each file's too (share[i]: -1 for a
 * file with none resident), from one reading of the process's mappings. Decoding streams the
 * weights, and each 4 KB page costs a page walk the 2 MB ones do not; a file written or read
 * before (a download, a copy) can sit in the page cache in 4 KB pages, which it keeps while
 * cached. */
double nx_store_huge_share(const nx_store *st, double *share);
/* Caches file `file` anew where that gives it 2 MB pages: first a 2 MB window of it mapped in 4 KB
 * pages (up to 15 places tried) is dropped from the page cache and read again through the
 * mapping; only if that comes back on one 2 MB page is the whole file (its dirty pages written
 * first), so a system that cannot cache files in 2 MB pages pays one 2 MB read. Before any lock
 * (nx_store_lock). Returns whether the file was re-read. */
bool nx_store_recache(const nx_store *st, int file);
/* The file that holds mapped bytes [p, p + n): its index (nx_store_file_name), its descriptor
 * and their offset in it, for reading them with pread (it stays open as long as the store);
 * false when no file does. */
bool nx_store_locate(const nx_store *st, const void *p, size_t n, int *file, int *fd, uint64_t *off);

/* ---------------------------------------------------------------- one rank's share */

/* A tensor of the checkpoint a share was cut from (docs/multinode.md) that the share does not hold
 * whole: absent (rows_lo == rows_hi), or only rows [rows_lo, rows_hi) of its first dimension,
 * stored under its own name with that many rows. */
typedef struct nx_tensor_decl {
    const char *name;
    nx_dtype dtype;
    int n_dims;
    int64_t shape[NX_ST_MAX_DIMS]; /* the whole tensor's */
    int64_t rows_lo, rows_hi;
} nx_tensor_decl;

/* Makes every declared tensor one of the store's at its whole shape, so a share loads as the
 * checkpoint it was cut from: the bytes the share lacks read as zeros (read-only anonymous pages,
 * which cost address space, not memory) and held rows are the file's pages, mapped where the
 * whole tensor's rows would be. Errors (label names the declaring file): a tensor declared absent
 * that a file holds, declared rows missing or of another shape. Once per store. */
nx_status nx_store_declare(nx_store *st, const nx_tensor_decl *d, size_t n, const char *label, nx_error *err);
/* Whether t's bytes come from a file (false: declared absent). */
bool nx_store_holds(const nx_store *st, const nx_tensor *t);
/* A digest of every tensor's name, dtype and shape (declared ones at their whole shapes),
 * independent of file order: equal for a checkpoint and every share cut from it. */
uint64_t nx_store_digest(const nx_store *st);

/* Total bytes mapped (all files, headers included) and total tensor bytes. */
uint64_t nx_store_mapped_bytes(const nx_store *st);
uint64_t nx_store_tensor_bytes(const nx_store *st);

#endif
