/* tokenfile.c: the token file format of --ids and --score (native/README.md). */
#include "tokenfile.h"

#include <stdio.h>
#include <stdlib.h>

/* Parse a token file: ids separated by whitespace, commas, '[' or ']'. Returns the count, or
 * -1 with a message in err. *ids is malloc'd. */
long parse_token_file(const char *path, const char *text, size_t len, uint32_t vocab,
                      int32_t **ids, char *err, size_t errlen) {
    long n = 0, cap = 64;
    int32_t *v = malloc((size_t)cap * sizeof(int32_t));
    if (!v) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t i = 0;
    while (i < len) {
        char c = text[i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == '[' || c == ']') {
            i++;
            continue;
        }
        if (c < '0' || c > '9') {
            snprintf(err, errlen, "%s: unexpected character '%c' at byte %zu (expected token ids)",
                     path, c, i);
            free(v);
            return -1;
        }
        uint64_t id = 0;
        while (i < len && text[i] >= '0' && text[i] <= '9') {
            id = id * 10 + (uint64_t)(text[i] - '0');
            if (id > vocab) id = vocab; /* saturate: reported below */
            i++;
        }
        if (id >= vocab || id > INT32_MAX) { /* ids are int32: a vocab above 2^31 cannot be */
            snprintf(err, errlen, "%s: token id at byte %zu is out of range (vocab_size=%u)",
                     path, i, vocab);
            free(v);
            return -1;
        }
        if (n == cap) {
            int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof(int32_t));
            if (!nv) {
                free(v);
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            v = nv;
        }
        v[n++] = (int32_t)id;
    }
    *ids = v;
    return n;
}
