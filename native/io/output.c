/* output.c: write an output file atomically, never replacing an input or a special file. */
#define _POSIX_C_SOURCE 200809L
#include "output.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(err, errlen, "%s: %s", path, msg);
    return -1;
}

static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

/* The file to write for path: path itself, or what a symlink (chain) points to. A dangling
 * link resolves to its final target, created if its directory exists. Returns a malloc'ed
 * string, or NULL with err set. */
static char *resolve_target(const char *path, char *err, size_t errlen) {
    char *cur = strdup(path);
    for (int depth = 0; cur; depth++) {
        struct stat ls;
        if (lstat(cur, &ls) != 0 || !S_ISLNK(ls.st_mode)) return cur;
        if (depth >= 40) {
            free(cur);
            fail(err, errlen, path, "too many levels of symbolic links");
            return NULL;
        }
        char link[PATH_MAX];
        ssize_t n = readlink(cur, link, sizeof link - 1);
        if (n < 0) {
            fail(err, errlen, path, "cannot read the symbolic link: %s", strerror(errno));
            free(cur);
            return NULL;
        }
        link[n] = 0;
        char *next;
        if (link[0] == '/') {
            next = strdup(link);
        } else { /* relative to the link's directory */
            const char *slash = strrchr(cur, '/');
            size_t dlen = slash ? (size_t)(slash - cur) + 1 : 0;
            next = malloc(dlen + (size_t)n + 1);
            if (next) {
                memcpy(next, cur, dlen);
                memcpy(next + dlen, link, (size_t)n + 1);
            }
        }
        free(cur);
        cur = next;
    }
    fail(err, errlen, path, "out of memory");
    return NULL;
}

static int write_all(int fd, const unsigned char *p, size_t len) {
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int output_write_file(const char *path, const void *data, size_t len,
                      const char *const *inputs, size_t n_inputs, char *err, size_t errlen) {
    char *target = resolve_target(path, err, errlen);
    if (!target) return -1;
    int rc = -1, fd = -1;
    char *tmp = NULL;
    const char *via = strcmp(target, path) ? " (the symbolic link's target)" : "";
    struct stat st;
    int exists = stat(target, &st) == 0;
    if (!exists && errno != ENOENT) {
        fail(err, errlen, path, "cannot check the output path: %s", strerror(errno));
        goto done;
    }
    if (exists && !S_ISREG(st.st_mode)) {
        fail(err, errlen, path, "is %s%s; the output must be a regular file, refusing to "
             "replace it", file_kind(st.st_mode), via);
        goto done;
    }
    for (size_t i = 0; exists && i < n_inputs; i++) {
        struct stat in;
        if (inputs[i] && stat(inputs[i], &in) == 0 && in.st_dev == st.st_dev &&
            in.st_ino == st.st_ino) {
            fail(err, errlen, path, "is an input of this run (%s)%s; refusing to overwrite it",
                 inputs[i], via);
            goto done;
        }
    }
    const char *slash = strrchr(target, '/');
    size_t dlen = slash ? (size_t)(slash - target) + 1 : 0;
    const char *base = target + dlen;
    tmp = malloc(dlen + strlen(base) + 16);
    if (!tmp) {
        fail(err, errlen, path, "out of memory");
        goto done;
    }
    memcpy(tmp, target, dlen);
    sprintf(tmp + dlen, ".%s.XXXXXX", base);
    fd = mkstemp(tmp);
    if (fd < 0) {
        fail(err, errlen, path, "cannot write: %s", strerror(errno));
        free(tmp);
        tmp = NULL;
        goto done;
    }
    mode_t mode;
    if (exists) {
        mode = st.st_mode & 07777;
    } else {
        mode_t mask = umask(022);
        umask(mask);
        mode = 0666 & ~mask;
    }
    if (write_all(fd, data, len) != 0 || fchmod(fd, mode) != 0 || fsync(fd) != 0) {
        fail(err, errlen, path, "cannot write: %s", strerror(errno));
        goto done;
    }
    int c = close(fd);
    fd = -1;
    if (c != 0) {
        fail(err, errlen, path, "cannot write: %s", strerror(errno));
        goto done;
    }
    if (rename(tmp, target) != 0) {
        fail(err, errlen, path, "cannot write: %s", strerror(errno));
        goto done;
    }
    free(tmp);
    tmp = NULL;
    rc = 0;
done:
    if (fd >= 0) close(fd);
    if (tmp) {
        unlink(tmp);
        free(tmp);
    }
    free(target);
    return rc;
}
