/* fuzz_tokenfile.c: libFuzzer target for the token file parser of --ids / --score.
 * Input: byte 0..3 = vocab size (u32, 0 means 49152), then the file's text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../io/tokenfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    uint32_t vocab;
    memcpy(&vocab, data, 4);
    if (vocab == 0) vocab = 49152;
    char *text = malloc(size - 4 + 1);
    if (!text) return 0;
    memcpy(text, data + 4, size - 4);
    int32_t *ids = NULL;
    char err[512];
    long n = parse_token_file("fuzz.json", text, size - 4, vocab, &ids, err, sizeof err);
    if (n > (long)(size - 4)) abort(); /* at most one id per byte */
    for (long i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= vocab) abort();
    free(ids);
    free(text);
    return 0;
}
