/* tokenizer_driver.c: run native/tokenizer/tokenizer.c on texts from stdin (for the sanitizer test).
 *
 * usage: tokenizer_driver BLOCK_FILE N_VOCAB < records
 * BLOCK_FILE holds a tokenizer block (docs/FORMAT.md). Each record on stdin is a u32
 * little-endian byte count followed by that many bytes of text. For each record it prints
 *   P <ids>      token ids, control tokens as plain text   (or "E <message>" on an error)
 *   S <ids>      token ids, control tokens parsed          (or "E <message>")
 *   D <hex>      the streaming decoder's output for the S ids, show_special on, as hex
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static int32_t *encode(const Tokenizer *t, const char *s, size_t n, int special, long *n_ids,
                       char *err, size_t errlen) {
    long need = tokenizer_encode(t, s, n, special, 0, NULL, 0, err, errlen);
    *n_ids = need;
    if (need < 0) return NULL;
    int32_t *ids = malloc(sizeof(int32_t) * ((size_t)need + 1));
    if (!ids) return NULL;
    long got = tokenizer_encode(t, s, n, special, 0, ids, (size_t)need, err, errlen);
    if (got != need) {
        free(ids);
        return NULL;
    }
    return ids;
}

static void print_ids(char tag, const int32_t *ids, long n, const char *err) {
    if (n < 0) {
        printf("E %s\n", err);
        return;
    }
    putchar(tag);
    for (long i = 0; i < n; i++) printf(" %d", ids[i]);
    putchar('\n');
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s BLOCK_FILE N_VOCAB < records\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *block = malloc((size_t)size);
    if (!block || fread(block, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "%s: cannot read\n", argv[1]);
        return 1;
    }
    fclose(f);
    char err[256];
    Tokenizer *t = tokenizer_new(block, (size_t)size, (uint32_t)atol(argv[2]), err, sizeof err);
    free(block); /* the tokenizer keeps its own copy */
    if (!t) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    size_t cap = tokenizer_max_decode_bytes(t);
    char *piece = malloc(cap);
    uint8_t len4[4];
    while (piece && fread(len4, 1, 4, stdin) == 4) {
        size_t n = (size_t)len4[0] | (size_t)len4[1] << 8 | (size_t)len4[2] << 16 |
                   (size_t)len4[3] << 24;
        char *text = malloc(n ? n : 1); /* exactly n bytes: ASan sees any over-read */
        if (!text || fread(text, 1, n, stdin) != n) {
            fprintf(stderr, "truncated record\n");
            return 1;
        }
        long np, ns;
        int32_t *plain = encode(t, text, n, 0, &np, err, sizeof err);
        print_ids('P', plain, np, err);
        int32_t *special = encode(t, text, n, 1, &ns, err, sizeof err);
        print_ids('S', special, ns, err);
        TokenDecoder d;
        token_decoder_init(&d);
        printf("D ");
        for (long i = 0; i <= ns; i++) {
            size_t k = i < ns ? token_decode(t, &d, special[i], 1, piece, cap)
                              : token_decoder_flush(&d, piece, cap);
            for (size_t j = 0; j < k; j++) printf("%02x", (unsigned char)piece[j]);
        }
        putchar('\n');
        free(plain);
        free(special);
        free(text);
    }
    free(piece);
    tokenizer_free(t);
    return 0;
}
