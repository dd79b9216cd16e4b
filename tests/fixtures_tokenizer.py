"""Session fixtures and helpers for the C tokenizer (native/tokenizer/tokenizer.c).

- ``tokenizer_lib``: native/tokenizer/tokenizer.c + the unicode tables compiled with clang-22
  into a shared library, called through ctypes (``CTokenizer``).
- ``smollm2_spec`` / ``smollm2_ctok``: SmolLM2's tokenizer as the GGUF exporter reads it, serialized
  to a model-file tokenizer block (ditto_core.model.modelfile.serialize_tokenizer) and loaded in C.
- ``smollm2_hf``: the reference: HF ``tokenizers`` built straight from the GGUF's vocab and merges
  (the recipe of tests/data/README.md), independent of Ditto's exporter, as a tokenizer.json.
- ``smollm2_tok_model``: a tiny .ditto file with SmolLM2's tokenizer, for the program's --tokens.
- ``spm_model``: a SentencePiece BPE model (byte_fallback) trained by the ``sentencepiece``
  library on Python standard-library source, and ``spec_from_sentencepiece`` to convert it.
- ``tiny_spec``: tinycoder's GGUF SentencePiece vocabulary; ``sentencepiece_model_from_spec``
  turns a vocabulary into a sentencepiece model so the library can serve as its reference.

Expensive builds are cached per process (``functools.lru_cache``) so that test modules importing
these fixtures share them.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import json
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ditto_core.base.types import TokenizerSpec
from ditto_core.model.modelfile import serialize_tokenizer

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native"
GOLDEN = ROOT / "tests" / "data" / "smollm2_tokenizer_golden.jsonl"
UNICODE = NATIVE / "tokenizer" / "unicode"
TOKENIZER_SOURCES = [NATIVE / "tokenizer" / "tokenizer.c", UNICODE / "unicode_tables.c",
                     UNICODE / "unicode_case.c", UNICODE / "unicode_norm.c",
                     UNICODE / "unicode_word.c"]
WARN = ["-std=c11", "-Wall", "-Wextra", "-Werror"]

# GGUF token types (FORMAT.md)
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6

# Edge cases of our own (the golden file has its own set).
EDGE_CORPUS = [
    "",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "a",
    "'",
    "'s",
    "x'",
    "''s''",
    "def f(x):\r\n\treturn x  \r\n",
    "int main() {\n\tint a[3] = {1, 2, 3};\n\t\treturn a[0];\n}\n",
    "    if x:\n        y = 1\n\n\n    else:\n\t\ty = 2  \n",
    "line with trailing spaces    \n    \n",
    "a  b   c    d     e",
    "tab\t\t\tseparated\tvalues\t",
    "\n\n\n\n",
    " \n \n ",
    "123 4567 89012345678901234567890",
    "3.14e-10 0x1F 0b1010 1_000_000",
    "x²+y³ ٣٤٥ ½ Ⅻ 𝟘𝟙",
    "中文字符测试，标点符号！",
    "日本語のひらがなとカタカナ、漢字",
    "한국어 문장입니다.",
    "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 🙂🙂🙂",
    "e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937",
    "עברית ومزيج عربي RTL \u200f mark",
    "I'm you're he's they've we'll she'd IT'S DON'T",
    "don't won't can't shouldn't y'all",
    "nbsp\u00a0here, ideographic\u3000space, nel\u0085line, em\u2003space",
    "info\x1cseparators\x1d\x1e\x1f",
    "controls \x00\x01\x07\x08\x0b\x0c\x1b[31m\x7f",
    "missing byte tokens: \x04 \x06 \x13\x14\x16\x1d",
    "Ω≈ç√∫˜µ≤≥÷ åß∂ƒ©˙∆˚¬…æ",
    "zero\u200bwidth\u200cjoiner\u200d",
    "   leading and trailing   ",
    "email@example.com https://x.y/z?a=1&b=2#c",
    "~~~~~~~~~~ ---------- ========== !!!!!!!!!!",
    "a" * 300,
    "ab" * 200 + " " + "9" * 50,
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|>text<|im_end|>",
    "<|im_start|<|im_end|>|>",
]


class TokenizerError(Exception):
    """tokenizer_encode returned -1; the message is the C error text."""


class CTokenizer:
    """ctypes view of one ``Tokenizer *`` built from a tokenizer block (bytes)."""

    def __init__(self, lib: ctypes.CDLL, block: bytes, n_vocab: int):
        self.lib = lib
        self._block = block
        err = ctypes.create_string_buffer(512)
        self.ptr = lib.tokenizer_new(block, len(block), n_vocab, err, len(err))
        if not self.ptr:
            raise TokenizerError(err.value.decode())
        self.max_piece = lib.tokenizer_max_decode_bytes(self.ptr)

    def __del__(self):
        if getattr(self, "ptr", None):
            self.lib.tokenizer_free(self.ptr)
            self.ptr = None

    def encode(self, text: str | bytes, parse_special: bool = False,
               add_bos: bool = False) -> list[int]:
        """Token ids of ``text`` (str is UTF-8 encoded). Raises TokenizerError on -1."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        err = ctypes.create_string_buffer(512)
        cap = 4
        while True:  # start small so that the "needs more room" path is exercised too
            buf = (ctypes.c_int32 * cap)()
            n = self.lib.tokenizer_encode(self.ptr, data, len(data), int(parse_special),
                                          int(add_bos), buf, cap, err, len(err))
            if n < 0:
                raise TokenizerError(err.value.decode())
            if n <= cap:
                return list(buf[:n])
            cap = n

    def decode_pieces(self, ids, show_special: bool = False) -> list[bytes]:
        """What the streaming decoder prints for each id, then the flush output last."""
        dec = (ctypes.c_uint8 * 64)()  # TokenDecoder is 16 bytes; extra room is harmless
        self.lib.token_decoder_init(dec)
        out = ctypes.create_string_buffer(self.max_piece)
        pieces = []
        for i in ids:
            n = self.lib.token_decode(self.ptr, dec, int(i), int(show_special), out,
                                      self.max_piece)
            pieces.append(out.raw[:n])
        n = self.lib.token_decoder_flush(dec, out, self.max_piece)
        pieces.append(out.raw[:n])
        return pieces

    def decode(self, ids, show_special: bool = False) -> bytes:
        return b"".join(self.decode_pieces(ids, show_special))

    def find(self, text: str) -> int:
        return self.lib.tokenizer_find(self.ptr, text.encode("utf-8"))


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    vp, sz, i32p = ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int32)
    lib.tokenizer_new.restype = vp
    lib.tokenizer_new.argtypes = [ctypes.c_char_p, sz, ctypes.c_uint32, ctypes.c_char_p, sz]
    lib.tokenizer_free.argtypes = [vp]
    lib.tokenizer_encode.restype = ctypes.c_long
    lib.tokenizer_encode.argtypes = [vp, ctypes.c_char_p, sz, ctypes.c_int, ctypes.c_int, i32p,
                                     sz, ctypes.c_char_p, sz]
    lib.token_decoder_init.argtypes = [vp]
    lib.token_decode.restype = sz
    lib.token_decode.argtypes = [vp, vp, ctypes.c_int32, ctypes.c_int, ctypes.c_char_p, sz]
    lib.token_decoder_flush.restype = sz
    lib.token_decoder_flush.argtypes = [vp, ctypes.c_char_p, sz]
    lib.tokenizer_max_decode_bytes.restype = sz
    lib.tokenizer_max_decode_bytes.argtypes = [vp]
    for name in ("tokenizer_bos", "tokenizer_eos", "tokenizer_find"):
        getattr(lib, name).restype = ctypes.c_int32
    lib.tokenizer_bos.argtypes = lib.tokenizer_eos.argtypes = [vp]
    lib.tokenizer_find.argtypes = [vp, ctypes.c_char_p]
    lib.unicode_class.restype = ctypes.c_int
    lib.unicode_class.argtypes = [ctypes.c_uint32]
    return lib


@functools.lru_cache(maxsize=None)
def build_tokenizer_lib(out_dir: str) -> ctypes.CDLL:
    """Compile the tokenizer into ``out_dir``/libditto_tokenizer.so (clang-22 -O2, warnings as
    errors) and load it."""
    so = Path(out_dir) / "libditto_tokenizer.so"
    so.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["clang-22", *WARN, "-O2", "-shared", "-fPIC", "-I", str(NATIVE),
                    *map(str, TOKENIZER_SOURCES), "-o", str(so)], check=True)
    return _declare(ctypes.CDLL(str(so)))


def build_driver(out: Path, flags: list[str], compiler: str = "clang-22") -> Path:
    """Compile tests/tokenizer_driver.c with the tokenizer into executable ``out``."""
    subprocess.run([compiler, *WARN, *flags, "-I", str(NATIVE),
                    str(ROOT / "tests" / "tokenizer_driver.c"), *map(str, TOKENIZER_SOURCES),
                    "-o", str(out)], check=True)
    return out


@functools.lru_cache(maxsize=None)
def _gguf_spec(path: str) -> TokenizerSpec:
    from ditto_export_gguf.exporter import GGUFExporter
    return GGUFExporter().load(Path(path)).tokenizer


@functools.lru_cache(maxsize=None)
def _hf_from_gguf(path: str, out_dir: str):
    """HF ``tokenizers`` built from the GGUF's own vocab and merges (the recipe of
    tests/data/README.md, tests/fixtures_hf.py ``build_bytelevel_tokenizer``), saved as a
    tokenizer.json and loaded back from it."""
    import gguf
    from tokenizers import Tokenizer

    from .fixtures_hf import build_bytelevel_tokenizer, gguf_meta

    out = Path(out_dir) / "tokenizer.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    build_bytelevel_tokenizer(gguf_meta(gguf.GGUFReader(path))).save(str(out))
    return Tokenizer.from_file(str(out))


def tiny_model_with_tokenizer(path: Path, spec: TokenizerSpec, dim: int = 8,
                              weights: dict | None = None) -> Path:
    """A .ditto file (ditto_core.model.modelfile.write_model) with tokenizer ``spec`` and a 1-layer
    Llama of width ``dim`` with zero weights (or ``weights[name]`` where given): enough for the
    program's ``--tokens``."""
    from ditto_core.base.types import ModelConfig
    from ditto_core.model.modelfile import TensorInfo, expected_shapes, write_model

    cfg = ModelConfig(dim=dim, hidden_dim=2 * dim, n_layers=1, n_heads=2, n_kv_heads=1,
                      head_dim=dim // 2, vocab_size=len(spec.tokens), max_seq_len=64,
                      rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=True)
    shapes = expected_shapes(cfg)
    infos = [TensorInfo(name, "f32", shape) for name, shape in shapes.items()]
    write_model(path, cfg, spec, infos,
                ((name, (weights or {}).get(name, np.zeros(shape, np.float32)))
                 for name, shape in shapes.items()))
    return path


def golden_rows() -> list[dict]:
    """Rows of tests/data/smollm2_tokenizer_golden.jsonl (llama.cpp's token ids; provenance in
    tests/data/README.md)."""
    with open(GOLDEN, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def spec_from_sentencepiece(sp) -> TokenizerSpec:
    """TokenizerSpec (kind ``spm_bpe``) of a loaded ``sentencepiece.SentencePieceProcessor``.

    Pieces are kept as the model stores them (U+2581 for a space, ``<0xXX>`` byte pieces), with
    their scores; types follow GGUF numbering from the processor's IsUnknown/IsControl/IsUnused/
    IsByte. ``add_space_prefix`` is read off the model's behaviour: with add_dummy_prefix the
    first piece of "a" starts with U+2581."""
    n = sp.get_piece_size()
    tokens, scores, types = [], np.zeros(n, np.float32), np.zeros(n, np.uint32)
    for i in range(n):
        tokens.append(sp.id_to_piece(i).encode("utf-8"))
        scores[i] = sp.get_score(i)
        types[i] = (TT_UNKNOWN if sp.is_unknown(i) else TT_CONTROL if sp.is_control(i)
                    else TT_UNUSED if sp.is_unused(i) else TT_BYTE if sp.is_byte(i)
                    else TT_NORMAL)
    return TokenizerSpec(kind="spm_bpe", tokens=tuple(tokens), scores=scores, token_types=types,
                         bos_id=sp.bos_id(), eos_id=sp.eos_id(), unk_id=sp.unk_id(),
                         pad_id=sp.pad_id(), add_bos=True,
                         add_space_prefix=sp.encode_as_pieces("a")[0].startswith("\u2581"))


def _pb_varint(v: int) -> bytes:
    out = bytearray()
    while True:
        out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
        v >>= 7
        if not v:
            return bytes(out)


def _pb_field(num: int, value) -> bytes:
    """One protobuf field: int -> varint, float -> fixed32, bytes -> length-delimited."""
    if isinstance(value, float):
        return _pb_varint(num << 3 | 5) + struct.pack("<f", value)
    if isinstance(value, int):
        return _pb_varint(num << 3) + _pb_varint(value)
    return _pb_varint(num << 3 | 2) + _pb_varint(len(value)) + value


def sentencepiece_model_from_spec(spec: TokenizerSpec) -> bytes:
    """A serialized sentencepiece ``ModelProto`` (sentencepiece_model.proto) holding the pieces,
    scores and types of a ``spm_bpe`` spec, for a BPE model with byte fallback and Llama's
    normalizer (identity rules, add_dummy_prefix = spec.add_space_prefix, no whitespace
    collapsing): how sentencepiece itself tokenizes that vocabulary (e.g. a GGUF's, for which
    no tokenizer.model ships). Field numbers: pieces 1 {piece 1, score 2, type 3},
    trainer_spec 2 {model_type 3 (BPE = 2), vocab_size 4, byte_fallback 35}, normalizer_spec 3
    {name 1, precompiled_charsmap 2, add_dummy_prefix 3, remove_extra_whitespaces 4}."""
    out = bytearray()
    for text, score, typ in zip(spec.tokens, spec.scores.tolist(), spec.token_types.tolist()):
        out += _pb_field(1, _pb_field(1, bytes(text)) + _pb_field(2, float(score))
                         + _pb_field(3, int(typ)))
    byte_fallback = int(any(int(t) == TT_BYTE for t in spec.token_types))
    out += _pb_field(2, _pb_field(3, 2) + _pb_field(4, len(spec.tokens))
                     + _pb_field(35, byte_fallback))
    out += _pb_field(3, _pb_field(1, b"identity") + _pb_field(2, b"")
                     + _pb_field(3, int(spec.add_space_prefix)) + _pb_field(4, 0))
    return bytes(out)


def spm_training_text() -> str:
    """Training text: source of a few standard-library modules (real prose and code)."""
    import argparse
    import textwrap
    import string
    return "\n".join(inspect.getsource(m) for m in (textwrap, string, argparse))


@functools.lru_cache(maxsize=None)
def train_spm(out_dir: str, vocab_size: int = 800):
    """Train a SentencePiece BPE model (byte_fallback, identity normalization, no whitespace
    collapsing, as Llama's) on ``spm_training_text`` and load it."""
    import sentencepiece as spm

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    corpus = d / "corpus.txt"
    corpus.write_text(spm_training_text(), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(d / "spm"), model_type="bpe",
        vocab_size=vocab_size, byte_fallback=True, character_coverage=1.0,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, num_threads=1, minloglevel=2)
    return spm.SentencePieceProcessor(model_file=str(d / "spm.model"))


@pytest.fixture(scope="session")
def tokenizer_lib(tmp_path_factory) -> ctypes.CDLL:
    return build_tokenizer_lib(str(tmp_path_factory.getbasetemp() / "tokenizer_lib"))


@pytest.fixture(scope="session")
def smollm2_spec(smollm2_gguf) -> TokenizerSpec:
    return _gguf_spec(str(smollm2_gguf))


@pytest.fixture(scope="session")
def smollm2_block(smollm2_spec) -> bytes:
    return serialize_tokenizer(smollm2_spec)


@pytest.fixture(scope="session")
def smollm2_ctok(tokenizer_lib, smollm2_block, smollm2_spec) -> CTokenizer:
    return CTokenizer(tokenizer_lib, smollm2_block, len(smollm2_spec.tokens))


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_gguf, tmp_path_factory):
    return _hf_from_gguf(str(smollm2_gguf), str(tmp_path_factory.getbasetemp() / "smollm2_tok"))


@pytest.fixture(scope="session")
def smollm2_tok_model(smollm2_spec, tmp_path_factory) -> Path:
    """A tiny .ditto model file carrying SmolLM2's tokenizer (for the program's --tokens)."""
    return tiny_model_with_tokenizer(tmp_path_factory.mktemp("tok_model") / "smollm2_tok.ditto",
                                     smollm2_spec)


@pytest.fixture(scope="session")
def spm_model(tmp_path_factory):
    return train_spm(str(tmp_path_factory.getbasetemp() / "spm"))


@pytest.fixture(scope="session")
def tiny_spec(tiny_gguf) -> TokenizerSpec:
    """tinycoder's 32000-piece SentencePiece vocabulary as the GGUF exporter reads it."""
    return _gguf_spec(str(tiny_gguf))


@pytest.fixture(scope="session")
def spm_ctok(tokenizer_lib, spm_model) -> CTokenizer:
    spec = spec_from_sentencepiece(spm_model)
    return CTokenizer(tokenizer_lib, serialize_tokenizer(spec), len(spec.tokens))
