/* output.h: writing an output file of ditto-run (--dump-logits) by the project's output rule
 * (docs/RELIABILITY.md): an output path that is one of the run's inputs, or is not a regular
 * file (a directory, FIFO, device node, socket), is refused; a symbolic link is written through
 * (its target is replaced atomically, the link stays); nothing is ever replaced half-written.
 */
#ifndef DITTO_OUTPUT_H
#define DITTO_OUTPUT_H

#include <stddef.h>

/* Write data[len] to path: a temporary file in the target's directory, fsync'ed, then renamed
 * over the target (created 0666 minus the umask, or with the mode of the file it replaces).
 * inputs[n_inputs] (NULL entries skipped): the files this run reads, compared by device and
 * inode. Returns 0, or -1 with a message "<path>: <problem>" in err; on failure the target is
 * untouched and no temporary file is left. */
int output_write_file(const char *path, const void *data, size_t len,
                      const char *const *inputs, size_t n_inputs, char *err, size_t errlen);

#endif
