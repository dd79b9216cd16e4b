"""Seed corpora and fixed tokenizers for the libFuzzer targets in native/fuzz (docs/RELIABILITY.md).

    python native/fuzz/make_seeds.py OUT_DIR

writes, from the real bundled models (tinycoder's SentencePiece vocabulary, SmolLM2's byte-level
BPE vocabulary with its merges) and a small byte-level vocabulary (also with the ``qwen2``
pre-tokenizer, end-of-generation and FIM records):

- ``OUT_DIR/models/*.ditto``: tiny random-weight model files (dim 16, one layer; f32 and
  codebook tensors) carrying each tokenizer; ``$DITTO_FUZZ_MODELS`` of fuzz_tokenizer lists them;
- ``OUT_DIR/model/``: seeds of fuzz_model (the small model files, tied and untied);
- ``OUT_DIR/tokenizer/``: seeds of fuzz_tokenizer (flag byte + text for every flag combination,
  and whole small tokenizer blocks followed by text);
- ``OUT_DIR/tokenfile/``: seeds of fuzz_tokenfile (vocab size + token file text).

Needs Ditto installed (ditto_core and the bundled-model packages).
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import attrs
import numpy as np

from ditto_core.base.types import ModelConfig, TokenizerSpec
from ditto_core.model.modelfile import TensorInfo, expected_shapes, serialize_tokenizer, write_model
from ditto_core.stages.bundled import bundled_model
from ditto_core.stages.plugins import get_registry

TEXTS = ["hello world", "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
         "  leading  spaces\t\ttabs\n\nnewlines  ", "café naïve 日本語 😀 Ünïcödé",
         "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<s>a</s><unk>",
         "12345 3.14159 1e-5 0x1F", "'s 't 're 've 'm 'll 'd", "\u2581x\u2581\u2581y", ""]


def byte_vocab() -> TokenizerSpec:
    """Byte-level BPE over the 256 bytes, three control tokens, a few merges (262 tokens)."""
    tokens = [b"<|endoftext|>", b"<|im_start|>", b"<|im_end|>"] + [bytes([i]) for i in range(256)]
    merges = []
    for a, b in [(b"h", b"e"), (b"he", b"l"), (b" ", b"w")]:
        tokens.append(a + b)
        merges.append((tokens.index(a), tokens.index(b)))
    n = len(tokens)
    types = np.array([3] * 3 + [1] * (n - 3), dtype=np.uint32)
    return TokenizerSpec(kind="bpe_bytes", tokens=tuple(tokens), scores=np.zeros(n, np.float32),
                         token_types=types, merges=tuple(merges), pre="gpt2_digits", bos_id=1,
                         eos_id=2, pad_id=0, add_bos=False, chat_format="chatml")


def real_tokenizer(name: str) -> TokenizerSpec:
    """The tokenizer of a bundled GGUF model (read by Ditto's GGUF exporter; no weights)."""
    path = bundled_model(name)
    exporter = get_registry().get("exporter", "gguf")
    return exporter.load(path).tokenizer


def tiny_model(path: Path, tok: TokenizerSpec, *, tied: bool, seed: int) -> Path:
    """A one-layer model (dim 16, hidden 24, 2 heads of 8, 1 KV head) with random weights:
    the embedding and the FFN as codebook tensors (b = 1..3, G = 8/16/256), the rest f32."""
    from ditto_pack_bits import codebook_payload
    from ditto_core.base.types import CodebookTensor

    rng = np.random.default_rng(seed)
    cfg = ModelConfig(dim=16, hidden_dim=24, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                      vocab_size=len(tok.tokens), max_seq_len=32, rope_theta=10000.0,
                      norm_eps=1e-5, tied_embeddings=tied)
    infos, payloads = [], []
    for k, (name, shape) in enumerate(expected_shapes(cfg).items()):
        if len(shape) == 2 and ("token_embd" in name or "ffn" in name):
            bits, G = 1 + k % 3, (8, 16, 256)[k % 3]
            S = -(-shape[1] // G)
            cb = rng.normal(0, 0.3, size=(shape[0], S, 1 << bits)).astype(np.float16)
            idx = rng.integers(0, 1 << bits, size=shape, dtype=np.uint8)
            ct = CodebookTensor(bits=bits, group_size=G, codebooks=cb.astype(np.float32),
                                indices=idx, codebook_type="f16")
            infos.append(TensorInfo(name, "codebook", shape, bits, G, "f16"))
            payloads.append((name, codebook_payload(ct)))
        else:
            w = (rng.normal(0, 0.3, size=shape) + (1.0 if len(shape) == 1 else 0.0))
            infos.append(TensorInfo(name, "f32", shape))
            payloads.append((name, w.astype(np.float32)))
    write_model(path, cfg, tok, infos, payloads)
    return path


def main(out: Path) -> None:
    for sub in ("models", "model", "tokenizer", "tokenfile"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    byte_tok = byte_vocab()
    qwen2_tok = attrs.evolve(byte_tok, pre="qwen2", eog_ids=(0, 2), fim_ids=(0, 1, 2, -1, -1, 0))
    toks = {"bytes": byte_tok, "tinycoder": real_tokenizer("tinycoder"),
            "smollm2": real_tokenizer("smollm2"), "bytes_qwen2": qwen2_tok}
    for name, tok in toks.items():
        tiny_model(out / "models" / f"{name}.ditto", tok, tied=True, seed=1)
    # model seeds: the small ones (the byte vocabulary, tied and untied)
    tiny_model(out / "model" / "bytes_tied.ditto", byte_tok, tied=True, seed=2)
    tiny_model(out / "model" / "bytes_untied.ditto", byte_tok, tied=False, seed=3)
    # tokenizer seeds: fixed-tokenizer texts (byte 1 picks the model of $DITTO_FUZZ_MODELS)
    k = 0
    for flags in range(8):
        for which in range(len(toks)):
            for text in TEXTS:
                (out / "tokenizer" / f"text{k:03d}").write_bytes(
                    bytes([flags, which]) + text.encode())
                k += 1
    # ...and whole tokenizer blocks (flag bit 3): the byte vocabulary and a small SPM one
    spm_tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)] + \
        ["\u2581".encode(), "\u2581a".encode(), b"a", b"b", "\u2581ab".encode()]
    n = len(spm_tokens)
    spm = TokenizerSpec(kind="spm_bpe", tokens=tuple(spm_tokens),
                        scores=-np.arange(n, dtype=np.float32),
                        token_types=np.array([2, 3, 3] + [6] * 256 + [1] * 5, np.uint32),
                        merges=(), pre="none", bos_id=1, eos_id=2, unk_id=0, add_bos=True,
                        add_space_prefix=True, chat_format="none")
    for j, tok in enumerate((byte_tok, spm, qwen2_tok)):
        block = serialize_tokenizer(tok)
        for flags in (8, 9, 11, 15):
            (out / "tokenizer" / f"block{j}_{flags}").write_bytes(
                bytes([flags]) + struct.pack("<I", len(block)) + block + TEXTS[j + 3].encode())
    # token file seeds
    for k, text in enumerate(["[1, 2, 3]", "1\n2\n3\n", "[]", "[0,49151]", " 7 , 8 ,9 ",
                              "[1, 2, 99999999999999999999]", "[1, -2]", "1.5"]):
        (out / "tokenfile" / f"ids{k}").write_bytes(struct.pack("<I", 0) + text.encode())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_seeds.py OUT_DIR")
    main(Path(sys.argv[1]))
