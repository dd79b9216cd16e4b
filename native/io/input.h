/* input.h: opening the runtime's input files for reading (the model file, the prompt file, token
 * files, the suffix file): every reader opens its path through open_input(), which refuses
 * anything but a regular file before a read could block on it.
 */
#ifndef DITTO_INPUT_H
#define DITTO_INPUT_H

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

/* open_input()'s errno for a path that is neither a regular file nor a directory (a FIFO,
 * socket or device). No POSIX errno says "not a regular file", so a value none of them uses. */
#define INPUT_ENOTREG 10001

/* Open path read-only, refusing anything that is not a regular file, without blocking: the open
 * is non-blocking (O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever),
 * fstat() must say S_ISREG, then O_NONBLOCK is cleared so reads behave as usual. *st (when not
 * NULL) gets the file's fstat(). Returns the descriptor (O_CLOEXEC), or -1 with errno: open's,
 * fstat's or fcntl's own; EISDIR for a directory; INPUT_ENOTREG for a FIFO, socket or device. */
static inline int open_input(const char *path, struct stat *st) {
    struct stat local;
    if (!st) st = &local;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    int err = 0, flags;
    if (fstat(fd, st) != 0)
        err = errno;
    else if (S_ISDIR(st->st_mode))
        err = EISDIR;
    else if (!S_ISREG(st->st_mode))
        err = INPUT_ENOTREG;
    else if ((flags = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0)
        err = errno;
    if (err) {
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

#endif
