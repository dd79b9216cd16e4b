/* fuzz_model.c: libFuzzer target for the model loader and the forward pass.
 *
 * The input is a model file. Its header's file_size and CRC-32 are fixed up first (a mutated
 * file would otherwise stop at the checksum), so every check behind it is reached. A file the
 * loader accepts gets its tokenizer built and, when small enough to run quickly, a batched
 * prefill of three tokens (all logits) and one more position through forward(). Build and run: `make -C native fuzz` (docs/RELIABILITY.md).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../runtime/forward.h"
#include "../model/model.h"
#include "../runtime/prefill.h"
#include "../tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < DITTO_HEADER_BYTES || size > (64u << 20)) return 0;
    uint8_t *buf = malloc(size);
    if (!buf) return 0;
    memcpy(buf, data, size);
    uint64_t file_size = size;
    memcpy(buf + 16, &file_size, 8);
    uint32_t crc = crc32_update(0, buf + DITTO_HEADER_BYTES, size - DITTO_HEADER_BYTES);
    memcpy(buf + 12, &crc, 4);
    int fd = memfd_create("fuzz-model", MFD_CLOEXEC);
    if (fd < 0 || write(fd, buf, size) != (ssize_t)size) {
        if (fd >= 0) close(fd);
        free(buf);
        return 0;
    }
    free(buf);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    Model m;
    char err[1024];
    if (model_open(&m, path, MODEL_LOAD_AUTO, err, sizeof err) == 0) {
        const DittoConfig *c = &m.config;
        Tokenizer *tok = tokenizer_new(m.tokenizer_block, m.tokenizer_block_len, c->vocab_size,
                                       err, sizeof err);
        uint64_t work = (uint64_t)c->n_layers * ((uint64_t)c->dim + c->hidden_dim) *
                        ((uint64_t)c->dim + c->n_heads * (uint64_t)c->head_dim) +
                        (uint64_t)c->vocab_size * c->dim;
        if (tok && work <= (1u << 24)) {
            RunState s;
            Prefill p;
            int ctx = c->max_seq_len < 4 ? (int)c->max_seq_len : 4;
            int n = ctx - 1 > 0 ? ctx - 1 : 1;
            int32_t ids[3];
            for (int i = 0; i < 3; i++) ids[i] = (int32_t)((uint32_t)(i + 1) * 7919u % c->vocab_size);
            if (runstate_init(&s, c, ctx, KV_F32, KV_F32) == 0) {
                if (prefill_init(&p, c, 3, ctx) == 0) {
                    prefill(&m, &s, &p, ids, n, 0, PREFILL_ALL_LOGITS);
                    prefill_free(&p);
                    if (n < ctx) forward(&m, &s, ids[0], n);
                }
                runstate_free(&s);
            }
        }
        tokenizer_free(tok);
        model_close(&m);
    }
    close(fd);
    return 0;
}
