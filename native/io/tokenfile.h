/* tokenfile.h: parsing a token file (--ids, --score): token ids as decimal integers separated
 * by whitespace, commas, '[' or ']' (a JSON list works, so does one id per line).
 */
#ifndef DITTO_TOKENFILE_H
#define DITTO_TOKENFILE_H

#include <stddef.h>
#include <stdint.h>

/* Parse text[len] (not NUL-terminated) read from path (named in messages). Every id must be
 * < vocab and fit in int32. Returns the count with *ids malloc'd (the caller frees it), or -1 with a message
 * "<path>: <problem>" in err (unexpected character and its byte offset, id out of range, out
 * of memory). */
long parse_token_file(const char *path, const char *text, size_t len, uint32_t vocab,
                      int32_t **ids, char *err, size_t errlen);

#endif
