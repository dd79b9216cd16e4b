"""Reader and writer of the Ditto model file (``.ditto``, docs/FORMAT.md, format version 1).

``write_model`` computes the whole layout (tensor table, offsets aligned to 64 bytes, byte
lengths from the FORMAT.md formulas) before any payload is written, then streams payloads in
table order into a temporary file in the destination directory, computing the CRC-32 on the way,
and renames it into place: a failure (including KeyboardInterrupt) leaves nothing behind.

``ModelFile`` maps a file read-only and gives zero-copy numpy views of the payloads after
checking magic, version, size, CRC-32, the tensor table and that config and tensors agree.
"""

from __future__ import annotations

import math
import os
import re
import stat
import tempfile
import zlib
from pathlib import Path
from typing import Callable, Iterable, Sequence

import attrs
import numpy as np

from ditto_core.base.errors import DittoError
from ditto_core.base.outputs import file_kind
from ditto_core.base.types import ModelConfig, TokenizerSpec
from . import codebook as CB
from . import format as F


# --------------------------------------------------------------------------------------------
# Tensor descriptions and payload sizes
# --------------------------------------------------------------------------------------------

@attrs.frozen
class TensorInfo:
    """One entry of the tensor table.

    ``encoding``: ``"f32"`` (row-major float32) or ``"codebook"`` (sub-block codebooks of
    ``2**bits`` centroids per ``group_size`` consecutive weights of a row, FORMAT.md "CODEBOOK").
    ``shape``: ``(rows, cols)`` = ``(out_features, in_features)`` for a matrix, ``(n,)`` for a
    vector. ``offset``/``nbytes``: payload position and length in bytes (filled in by
    ``write_model``/``ModelFile``; 0 in a plan).
    """

    name: str
    encoding: str
    shape: tuple[int, ...] = attrs.field(converter=lambda s: tuple(int(x) for x in s))
    bits: int = 0
    group_size: int = 0
    codebook_type: str | None = None
    offset: int = 0
    nbytes: int = 0

    @property
    def rows(self) -> int:
        """Output channels; 1 for a vector."""
        return 1 if len(self.shape) == 1 else self.shape[0]

    @property
    def cols(self) -> int:
        """Input channels (row length), or the vector's length."""
        return self.shape[-1]

    @property
    def n_sub_blocks(self) -> int:
        """S = ceil(cols / G) sub-blocks per row (0 for an f32 tensor)."""
        return CB.n_sub_blocks(self.cols, self.group_size) if self.encoding == "codebook" else 0

    @property
    def n_weights(self) -> int:
        return self.rows * self.cols

    @property
    def bpw(self) -> float:
        """Bits per weight, ``8 · nbytes / (rows · cols)`` (FORMAT.md)."""
        return 8.0 * self.expected_nbytes() / self.n_weights

    @property
    def theoretical_bytes(self) -> int:
        """Bytes with no padding at all: 4 per f32 weight, or ``codebook.theoretical_bytes``
        (b-bit indices plus the sub-block codebooks)."""
        if self.encoding == "f32":
            return 4 * self.n_weights
        return CB.theoretical_bytes(self.rows, self.cols, self.bits, self.group_size,
                                    self.codebook_type)

    def expected_nbytes(self) -> int:
        """Payload bytes this tensor must have, from the FORMAT.md formulas
        (``codebook.payload_bytes`` for a CODEBOOK tensor)."""
        if self.encoding == "f32":
            return f32_nbytes(self.shape)
        return CB.payload_bytes(self.rows, self.cols, self.bits, self.group_size,
                                self.codebook_type)


def f32_nbytes(shape: Sequence[int]) -> int:
    """Bytes of a row-major float32 tensor of ``shape`` (4 per element)."""
    return 4 * math.prod(int(x) for x in shape)


#: why a planned CODEBOOK tensor was stored as f32 instead (quantizer plans and reports)
REASON_CODEBOOK_LARGER = "codebook larger than f32"


# --------------------------------------------------------------------------------------------
# Config <-> tensors
# --------------------------------------------------------------------------------------------

def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The Ditto tensor names of a model of ``config`` (FORMAT.md "Tensor names") and their
    shapes, in the canonical file order: the Llama set, plus for ``arch == "qwen2"`` the
    vectors ``blk.N.attn_q.bias`` [n_heads·head_dim], ``attn_k.bias`` and ``attn_v.bias``
    [n_kv_heads·head_dim] after each layer's ``attn_v.weight``."""
    c = config
    q = c.n_heads * c.head_dim
    kv = c.n_kv_heads * c.head_dim
    bias = c.arch == "qwen2"
    out = {"token_embd.weight": (c.vocab_size, c.dim)}
    for i in range(c.n_layers):
        p = f"blk.{i}."
        out[p + "attn_norm.weight"] = (c.dim,)
        out[p + "attn_q.weight"] = (q, c.dim)
        out[p + "attn_k.weight"] = (kv, c.dim)
        out[p + "attn_v.weight"] = (kv, c.dim)
        if bias:
            out[p + "attn_q.bias"] = (q,)
            out[p + "attn_k.bias"] = (kv,)
            out[p + "attn_v.bias"] = (kv,)
        out[p + "attn_output.weight"] = (c.dim, q)
        out[p + "ffn_norm.weight"] = (c.dim,)
        out[p + "ffn_gate.weight"] = (c.hidden_dim, c.dim)
        out[p + "ffn_up.weight"] = (c.hidden_dim, c.dim)
        out[p + "ffn_down.weight"] = (c.dim, c.hidden_dim)
    out["output_norm.weight"] = (c.dim,)
    if not c.tied_embeddings:
        out["output.weight"] = (c.vocab_size, c.dim)
    return out


#: ModelConfig.arch -> the name messages use
ARCH_NAMES = {"llama": "Llama", "qwen2": "Qwen2"}


#: config field -> its upper limit (FORMAT.md "Validity rules"); every one is >= 1
CONFIG_LIMITS = {"dim": F.MAX_DIM, "hidden_dim": F.MAX_HIDDEN_DIM, "n_layers": F.MAX_LAYERS,
                 "n_heads": F.MAX_DIM, "n_kv_heads": F.MAX_DIM, "head_dim": F.MAX_DIM,
                 "vocab_size": F.MAX_VOCAB, "max_seq_len": F.MAX_SEQ_LEN}


def check_config_values(config: ModelConfig, where: str) -> None:
    """Raise DittoError (prefixed with ``where``) unless the config values are those of a
    valid model file (FORMAT.md "Validity rules", the same rules as native/model/model.c): every
    size an integer in 1..its limit (``CONFIG_LIMITS``), n_heads · head_dim <= MAX_DIM,
    n_kv_heads dividing n_heads, head_dim even, rope_theta and norm_eps finite and > 0 (as
    float32, the stored type), ``arch`` one of ``format.ARCHITECTURES``."""
    c = config
    if c.arch not in F.ARCHITECTURES:
        raise DittoError(f"{where}: config arch = {c.arch!r} must be one of "
                         f"{sorted(F.ARCHITECTURES)}")
    for field, limit in CONFIG_LIMITS.items():
        v = getattr(c, field)
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 1 <= v <= limit:
            raise DittoError(f"{where}: config {field} = {v!r} must be an integer in "
                             f"1..{limit}")
    if c.n_heads * c.head_dim > F.MAX_DIM:
        raise DittoError(f"{where}: config n_heads * head_dim = {c.n_heads * c.head_dim} "
                         f"exceeds {F.MAX_DIM}")
    if c.n_heads % c.n_kv_heads:
        raise DittoError(f"{where}: n_heads {c.n_heads} is not a multiple of "
                         f"n_kv_heads {c.n_kv_heads} (GQA)")
    if c.head_dim % 2:
        raise DittoError(f"{where}: head_dim {c.head_dim} must be even for RoPE")
    for field in ("rope_theta", "norm_eps"):
        v = getattr(c, field)
        v32 = None
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            with np.errstate(over="ignore"):
                v32 = float(np.float64(v).astype(np.float32))
        if v32 is None or not math.isfinite(v32) or v32 <= 0:
            raise DittoError(f"{where}: config {field} = {v!r} must be a finite number > 0 "
                             f"(as float32)")


def check_config(config: ModelConfig, shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """Raise DittoError (prefixed with ``where``, a file name) unless the config values are
    valid (``check_config_values``) and ``shapes`` holds exactly the tensors ``config``
    implies, with their shapes."""
    c = config
    check_config_values(c, where)
    want = expected_shapes(c)
    for name, shape in shapes.items():
        if name not in want:
            raise DittoError(f"{where}: unexpected tensor {name!r} for a {c.n_layers}-layer "
                             f"{ARCH_NAMES[c.arch]} model"
                             + (" with tied embeddings" if name == "output.weight" else ""))
        if tuple(shape) != want[name]:
            raise DittoError(f"{where}: tensor {name!r} has shape {tuple(shape)}, the config "
                             f"implies {want[name]}")
    missing = [n for n in want if n not in shapes]
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise DittoError(f"{where}: missing tensor(s) {', '.join(missing[:3])}{more}")


# --------------------------------------------------------------------------------------------
# Tokenizer block
# --------------------------------------------------------------------------------------------

def _pad4(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def _enum(table: dict, value, what: str) -> int:
    if value not in table:
        raise DittoError(f"tokenizer {what} must be one of {sorted(table)}, got {value!r}")
    return table[value]


_UNICODE_FORMS = {"nfc": F.TX_NFC, "nfd": F.TX_NFD, "nfkc": F.TX_NFKC, "nfkd": F.TX_NFKD}


def _ext_record(tag: int, payload: bytes, a: int = 0, b: int = 0) -> bytes:
    return F.EXT_RECORD.pack(tag, a, b, len(payload)) + _pad4(payload)


def serialize_ext(tok: TokenizerSpec) -> bytes:
    """The tokenizer extension section (FORMAT.md "Tokenizer extension"): normalizer steps,
    added tokens, chat text, as records ``(tag, a, b, len)`` + payload padded to 4 bytes.
    Raises DittoError for an unknown normalizer step."""
    out = []
    for step in tok.normalizer:
        kind = step[0]
        if kind == "lowercase":
            out.append(_ext_record(F.TX_LOWERCASE, b""))
        elif kind == "strip":
            out.append(_ext_record(F.TX_STRIP, b"", int(step[1]), int(step[2])))
        elif kind == "replace":
            pat, content = step[1].encode("utf-8"), step[2].encode("utf-8")
            if not pat:
                raise DittoError("tokenizer: Replace normalizer with an empty pattern")
            out.append(_ext_record(F.TX_REPLACE, pat + content, len(pat)))
        elif kind == "prepend":
            out.append(_ext_record(F.TX_PREPEND, step[1].encode("utf-8")))
        elif kind in _UNICODE_FORMS:
            out.append(_ext_record(_UNICODE_FORMS[kind], b""))
        else:
            raise DittoError(f"tokenizer: unknown normalizer step {kind!r}")
    for tid, flags, text in tok.added:
        out.append(_ext_record(F.TX_ADDED, bytes(text), int(tid), int(flags)))
    if tok.chat_prefix is not None:
        out.append(_ext_record(F.TX_CHAT_PREFIX, tok.chat_prefix.encode("utf-8")))
        out.append(_ext_record(F.TX_CHAT_SUFFIX, (tok.chat_suffix or "").encode("utf-8")))
    for tid in tok.eog_ids:
        out.append(_ext_record(F.TX_EOG, b"", int(tid)))
    for role, tid in enumerate(tok.fim_ids):
        if tid >= 0:
            out.append(_ext_record(F.TX_FIM, b"", int(tid), role))
    return b"".join(out)


def check_special_ids(eog_ids, fim_ids, n: int, where: str) -> None:
    """FORMAT.md rule 24 for the EOG and FIM records: ids in [0, n), no EOG id twice, ``fim_ids``
    empty or one id (-1: none) per DITTO_FIM_* role. Raises DittoError naming ``where``."""
    if len(set(eog_ids)) != len(eog_ids):
        raise DittoError(f"{where}: an end-of-generation token is listed twice")
    for tid in eog_ids:
        if not 0 <= tid < n:
            raise DittoError(f"{where}: end-of-generation token {tid} is outside the "
                             f"vocabulary of {n} tokens")
    if fim_ids and len(fim_ids) != F.FIM_ROLES:
        raise DittoError(f"{where}: {len(fim_ids)} FIM ids, expected {F.FIM_ROLES}")
    for tid in fim_ids:
        if not -1 <= tid < n:
            raise DittoError(f"{where}: FIM token {tid} is outside the vocabulary of {n} tokens")


def parse_ext(buf: bytes, where: str) -> dict:
    """Inverse of ``serialize_ext``: the TokenizerSpec fields ``normalizer``, ``added``,
    ``chat_prefix``, ``chat_suffix``. Raises DittoError for a malformed or unknown record."""
    normalizer, added, chat, eog, fim = [], [], {}, [], {}
    pos = 0
    while pos < len(buf):
        if len(buf) - pos < F.EXT_RECORD.size:
            raise DittoError(f"{where}: truncated tokenizer extension record at byte {pos}")
        tag, a, b, n = F.EXT_RECORD.unpack_from(buf, pos)
        pos += F.EXT_RECORD.size
        if pos + F.round_up(n, 4) > len(buf):
            raise DittoError(f"{where}: tokenizer extension record {tag} overruns the section")
        pay = bytes(buf[pos:pos + n])
        pos += F.round_up(n, 4)
        try:
            text = pay.decode("utf-8")
        except UnicodeDecodeError:
            raise DittoError(f"{where}: tokenizer extension record {tag} is not UTF-8") from None
        if tag == F.TX_LOWERCASE:
            normalizer.append(("lowercase",))
        elif tag == F.TX_STRIP:
            normalizer.append(("strip", bool(a), bool(b)))
        elif tag == F.TX_REPLACE:
            normalizer.append(("replace", pay[:a].decode("utf-8"), pay[a:].decode("utf-8")))
        elif tag == F.TX_PREPEND:
            normalizer.append(("prepend", text))
        elif tag in _UNICODE_FORMS.values():
            normalizer.append((next(k for k, v in _UNICODE_FORMS.items() if v == tag),))
        elif tag == F.TX_ADDED:
            added.append((a, b, pay))
        elif tag == F.TX_CHAT_PREFIX:
            chat["chat_prefix"] = text
        elif tag == F.TX_CHAT_SUFFIX:
            chat["chat_suffix"] = text
        elif tag in (F.TX_EOG, F.TX_FIM):
            if n or (tag == F.TX_EOG and b):
                raise DittoError(f"{where}: tokenizer extension record {tag} (EOG/FIM) has a "
                                 f"payload of {n} bytes or b = {b}; both must be 0")
            if tag == F.TX_EOG:
                eog.append(a)
            elif b >= F.FIM_ROLES or b in fim:
                raise DittoError(f"{where}: FIM record with role {b} (a role is 0..."
                                 f"{F.FIM_ROLES - 1}, at most once)")
            else:
                fim[b] = a
        else:
            raise DittoError(f"{where}: unknown tokenizer extension record {tag}")
    fim_ids = tuple(fim.get(r, -1) for r in range(F.FIM_ROLES)) if fim else ()
    return dict(normalizer=tuple(normalizer), added=tuple(added), eog_ids=tuple(eog),
                fim_ids=fim_ids, **chat)


def tokenizer_needs_v2(tok: TokenizerSpec) -> bool:
    """True when the tokenizer uses version-2 features (flags or an extension section)."""
    return bool(tok.flags or tok.normalizer or tok.added or tok.chat_prefix is not None
                or tok.eog_ids or any(i >= 0 for i in tok.fim_ids))


def serialize_tokenizer(tok: TokenizerSpec) -> bytes:
    """The tokenizer block (FORMAT.md "Tokenizer block"): a 64-byte DittoTokenizerHeader, then
    scores f32[n], types u32[n], offsets u32[n+1], blob, merges (u32, u32)[n_merges] and the
    chat template, each zero-padded to a multiple of 4 bytes. Raises DittoError for an
    inconsistent spec (array lengths, ids out of range, unknown kind/pre/chat format)."""
    n = len(tok.tokens)
    scores = np.asarray(tok.scores, dtype="<f4")
    types = np.asarray(tok.token_types, dtype="<u4")
    if scores.shape != (n,) or types.shape != (n,):
        raise DittoError(f"tokenizer: {n} tokens but {scores.shape} scores and {types.shape} "
                         f"token types")
    kind = _enum(F.TOKENIZER_KINDS, tok.kind, "kind")
    pre = _enum(F.PRE_TOKENIZERS, tok.pre, "pre-tokenizer")
    chat = _enum(F.CHAT_FORMATS, tok.chat_format, "chat format")
    for what in ("bos_id", "eos_id", "unk_id", "pad_id"):
        v = getattr(tok, what)
        if not -1 <= v < n:
            raise DittoError(f"tokenizer: {what} {v} is outside the vocabulary of {n} tokens")
    lengths = np.fromiter((len(t) for t in tok.tokens), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**32:
        raise DittoError("tokenizer: token text exceeds 4 GiB")
    offsets = offsets.astype("<u4")
    blob = b"".join(bytes(t) for t in tok.tokens)
    merges = np.asarray(tok.merges, dtype="<u4").reshape(-1, 2)
    if merges.size and merges.max() >= n:
        raise DittoError(f"tokenizer: a merge refers to token id {int(merges.max())} >= {n}")
    template = tok.chat_template.encode("utf-8")
    if tok.flags & ~F.TOKF_ALL:
        raise DittoError(f"tokenizer: unknown flags 0x{tok.flags:x}")
    check_special_ids(tok.eog_ids, tok.fim_ids, n, "tokenizer")
    ext = serialize_ext(tok)
    head = F.pack(F.TOKENIZER_HEADER, F.TOKENIZER_HEADER_FIELDS, kind=kind, pre=pre,
                  n_tokens=n, n_merges=len(merges), bos_id=tok.bos_id, eos_id=tok.eos_id,
                  unk_id=tok.unk_id, pad_id=tok.pad_id, add_bos=int(tok.add_bos),
                  add_space_prefix=int(tok.add_space_prefix), chat_format=chat,
                  blob_bytes=len(blob), template_bytes=len(template), flags=tok.flags,
                  ext_bytes=len(ext))
    return b"".join([head, scores.tobytes(), types.tobytes(), offsets.tobytes(), _pad4(blob),
                     merges.tobytes(), _pad4(template), ext])


def parse_tokenizer(buf, where: str = "tokenizer block") -> TokenizerSpec:
    """Inverse of ``serialize_tokenizer``: read a tokenizer block from a bytes-like ``buf``.
    Raises DittoError (prefixed with ``where``) if the block is truncated or malformed."""
    mv = memoryview(buf).cast("B")
    if len(mv) < F.TOKENIZER_HEADER.size:
        raise DittoError(f"{where}: truncated tokenizer header")
    h = F.unpack(F.TOKENIZER_HEADER, F.TOKENIZER_HEADER_FIELDS, mv)
    n, m = h["n_tokens"], h["n_merges"]
    sizes = [4 * n, 4 * n, 4 * (n + 1), F.round_up(h["blob_bytes"], 4), 8 * m,
             F.round_up(h["template_bytes"], 4), h["ext_bytes"]]
    if F.TOKENIZER_HEADER.size + sum(sizes) != len(mv):
        raise DittoError(f"{where}: the tokenizer block's sections take "
                         f"{F.TOKENIZER_HEADER.size + sum(sizes)} bytes, the block has {len(mv)}")
    if h["add_bos"] > 1 or h["add_space_prefix"] > 1:
        raise DittoError(f"{where}: tokenizer add_bos = {h['add_bos']} and add_space_prefix = "
                         f"{h['add_space_prefix']} must be 0 or 1")
    if h["reserved"]:
        raise DittoError(f"{where}: tokenizer reserved header bytes 60..63 must be zero")
    if h["flags"] & ~F.TOKF_ALL or h["ext_bytes"] % 4:
        raise DittoError(f"{where}: tokenizer flags 0x{h['flags']:x} or extension of "
                         f"{h['ext_bytes']} bytes (not a multiple of 4) unknown to this Ditto")
    for what in ("bos_id", "eos_id", "unk_id", "pad_id"):
        if not -1 <= h[what] < n:
            raise DittoError(f"{where}: tokenizer {what} {h[what]} is outside [-1, {n})")
    pos = F.TOKENIZER_HEADER.size
    parts = []
    for size in sizes:
        parts.append(mv[pos:pos + size])
        pos += size
    scores = np.frombuffer(parts[0], dtype="<f4").astype(np.float32)
    types = np.frombuffer(parts[1], dtype="<u4").astype(np.uint32)
    offsets = np.frombuffer(parts[2], dtype="<u4").astype(np.int64)
    if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != h["blob_bytes"]:
        raise DittoError(f"{where}: token offsets are not increasing within the text blob")
    blob = bytes(parts[3][:h["blob_bytes"]])
    tokens = tuple(blob[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()))
    bad_type = np.flatnonzero((types < F.TT_NORMAL) | (types > F.TT_BYTE))
    if bad_type.size:
        raise DittoError(f"{where}: token {int(bad_type[0])} has unknown type "
                         f"{int(types[bad_type[0]])}")
    for i in np.flatnonzero((types == F.TT_CONTROL) | (types == F.TT_USER_DEFINED)).tolist():
        try:
            tokens[i].decode("utf-8")
        except UnicodeDecodeError:
            raise DittoError(f"{where}: control/user-defined token {i} is not valid UTF-8 "
                             f"text") from None
    if h["kind"] == F.TOK_SPM_BPE:
        for i in np.flatnonzero(types == F.TT_BYTE).tolist():
            if not re.fullmatch(rb"<0x[0-9A-Fa-f]{2}>", tokens[i]):
                raise DittoError(f"{where}: byte token {i} is not of the form <0xXX>")
    merges_arr = np.frombuffer(parts[4], dtype="<u4").reshape(-1, 2)
    if merges_arr.size and merges_arr.max() >= n:
        raise DittoError(f"{where}: a merge refers to token id {int(merges_arr.max())} >= {n}")
    merges = tuple(map(tuple, merges_arr.tolist()))
    if merges:
        texts = set(tokens)
        for r, (a, b) in enumerate(merges):
            if tokens[a] + tokens[b] not in texts:
                raise DittoError(f"{where}: merge {r} ({a}, {b}): no token has the "
                                 f"concatenated text")
    try:
        template = bytes(parts[5][:h["template_bytes"]]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DittoError(f"{where}: chat template is not UTF-8: {exc}") from None

    def name_of(table, value, what):
        for k, v in table.items():
            if v == value:
                return k
        raise DittoError(f"{where}: unknown tokenizer {what} {value}")

    ext = parse_ext(parts[6], where)
    check_special_ids(ext["eog_ids"], ext["fim_ids"], n, where)
    return TokenizerSpec(
        kind=name_of(F.TOKENIZER_KINDS, h["kind"], "kind"), tokens=tokens, scores=scores,
        token_types=types, merges=merges, pre=name_of(F.PRE_TOKENIZERS, h["pre"], "pre"),
        bos_id=h["bos_id"], eos_id=h["eos_id"], unk_id=h["unk_id"], pad_id=h["pad_id"],
        add_bos=bool(h["add_bos"]), add_space_prefix=bool(h["add_space_prefix"]),
        chat_format=name_of(F.CHAT_FORMATS, h["chat_format"], "chat format"),
        chat_template=template, flags=h["flags"], **ext)


def tokenizers_equal(a: TokenizerSpec, b: TokenizerSpec) -> bool:
    """True if two specs are equal field by field, including the score and type arrays."""
    return (a == b and np.array_equal(np.asarray(a.scores, np.float32),
                                      np.asarray(b.scores, np.float32))
            and np.array_equal(np.asarray(a.token_types, np.uint32),
                               np.asarray(b.token_types, np.uint32)))


# --------------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------------

def _config_bytes(config: ModelConfig, n_tensors: int) -> bytes:
    return F.pack(F.CONFIG, F.CONFIG_FIELDS, arch=F.ARCHITECTURES[config.arch], dim=config.dim,
                  hidden_dim=config.hidden_dim, n_layers=config.n_layers,
                  n_heads=config.n_heads, n_kv_heads=config.n_kv_heads,
                  head_dim=config.head_dim, vocab_size=config.vocab_size,
                  max_seq_len=config.max_seq_len, rope_theta=float(config.rope_theta),
                  norm_eps=float(config.norm_eps),
                  tied_embeddings=int(bool(config.tied_embeddings)), n_tensors=n_tensors)


def _entry_bytes(t: TensorInfo) -> bytes:
    name = t.name.encode("utf-8")
    return F.pack(F.TENSOR_ENTRY, F.TENSOR_ENTRY_FIELDS, name=name,
                  encoding=F.ENCODINGS[t.encoding],
                  codebook_type=CB.TYPE_IDS[t.codebook_type] if t.codebook_type else 0,
                  bits=t.bits, group_size=t.group_size, rows=t.rows, cols=t.cols,
                  offset=t.offset, nbytes=t.nbytes, ndim=len(t.shape))


def _check_tensor_info(t: TensorInfo, where: str) -> None:
    raw = t.name.encode("utf-8")
    if not raw or len(raw) >= F.NAME_BYTES or b"\0" in raw:
        raise DittoError(f"{where}: tensor name {t.name!r} must be 1..{F.NAME_BYTES - 1} bytes "
                         f"of UTF-8 without NUL")
    if len(t.shape) not in (1, 2) or min(t.shape) <= 0:
        raise DittoError(f"{where}: tensor {t.name!r} has shape {t.shape}; 1-D or 2-D, "
                         f"positive sizes")
    if max(t.shape) > 2**31 - 1 or t.n_weights > F.MAX_WEIGHTS:
        raise DittoError(f"{where}: tensor {t.name!r} of shape {t.shape} is too large "
                         f"(rows, cols <= 2^31-1, rows * cols <= 2^40)")
    if len(t.shape) == 1 and t.encoding != "f32":
        raise DittoError(f"{where}: tensor {t.name!r} is a vector and must be f32")
    if t.encoding == "f32":
        if t.bits or t.group_size or t.codebook_type:
            raise DittoError(f"{where}: f32 tensor {t.name!r} must have bits = group_size = 0 "
                             f"and no codebook type")
        if t.n_weights > F.MAX_F32_ELEMENTS:
            raise DittoError(f"{where}: f32 tensor {t.name!r} has more than 2^31-1 elements")
    elif t.encoding == "codebook":
        try:
            CB.check_params(t.bits, t.group_size, t.codebook_type)
        except DittoError as exc:
            raise DittoError(f"{where}: tensor {t.name!r}: {exc}") from None
    else:
        raise DittoError(f"{where}: tensor {t.name!r} has unknown encoding {t.encoding!r}")


def plan_layout(config: ModelConfig, tokenizer: TokenizerSpec, tensors: Sequence[TensorInfo],
                where: str = "model") -> tuple[bytes, int, list[TensorInfo], int]:
    """Lay out a model file: returns (bytes [64, payload start) i.e. config + tensor table +
    tokenizer block + zero padding, ``meta_size`` (the same without padding), the tensors with
    ``offset``/``nbytes`` filled in, file size).
    Raises DittoError for a config not matching the tensors or a bad tensor description."""
    for t in tensors:
        _check_tensor_info(t, where)
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise DittoError(f"{where}: tensor {dup!r} appears twice")
    check_config(config, {t.name: t.shape for t in tensors}, where)
    if len(tokenizer.tokens) != config.vocab_size:
        raise DittoError(f"{where}: tokenizer has {len(tokenizer.tokens)} tokens, config "
                         f"vocab_size is {config.vocab_size}")
    tok = serialize_tokenizer(tokenizer)
    parse_tokenizer(tok, where)  # the block must pass the reader's rules (FORMAT.md)
    meta_size = F.CONFIG.size + F.TENSOR_ENTRY.size * len(tensors) + len(tok)
    pos = F.round_up(F.HEADER_BYTES + meta_size)
    laid = []
    for t in tensors:
        nbytes = t.expected_nbytes()
        laid.append(attrs.evolve(t, offset=pos, nbytes=nbytes))
        pos = F.round_up(pos + nbytes)
    end = laid[-1].offset + laid[-1].nbytes if laid else pos
    meta = (_config_bytes(config, len(laid)) + b"".join(_entry_bytes(t) for t in laid) + tok)
    meta += b"\0" * (F.round_up(F.HEADER_BYTES + len(meta)) - F.HEADER_BYTES - len(meta))
    return meta, meta_size, laid, end


def _as_bytes(name: str, info: TensorInfo, payload, where: str) -> memoryview:
    if isinstance(payload, np.ndarray):
        if info.encoding == "f32":
            if payload.dtype != np.float32 or tuple(payload.shape) != info.shape:
                raise DittoError(f"{where}: tensor {name!r} payload is {payload.dtype} "
                                 f"{tuple(payload.shape)}, expected float32 {info.shape}")
            payload = payload.astype("<f4", copy=False)
        payload = np.ascontiguousarray(payload)
        return memoryview(payload).cast("B")
    return memoryview(payload).cast("B")


def write_model(path, config: ModelConfig, tokenizer: TokenizerSpec,
                tensors: Sequence[TensorInfo],
                payloads: Iterable[tuple[str, bytes | np.ndarray]],
                progress: Callable[[TensorInfo], None] | None = None) -> list[TensorInfo]:
    """Write a Ditto model file at ``path`` atomically; return the tensor table written.

    ``tensors`` fixes the file order and encodings (offset/nbytes are computed here from the
    FORMAT.md formulas). ``payloads`` yields ``(name, data)`` in the same order; ``data`` is
    bytes or an array whose raw bytes are the payload (a float32 array of ``info.shape`` for an
    f32 tensor). ``progress(info)`` is called after each payload is written.

    Raises DittoError naming the file (and tensor) when the config does not match the tensors,
    a payload comes out of order, has the wrong byte length or is missing, or the destination
    cannot be written or is not a regular file (``outputs.output_target``: a symlink is
    written through). Nothing is left at ``path`` (or in its directory) on any failure.
    """
    from ditto_core.base.outputs import output_target

    path = output_target(path, "model file")  # a symlink is written through, never replaced
    where = str(path)
    meta, meta_size, laid, file_size = plan_layout(config, tokenizer, tensors, where)
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise DittoError(f"{path}: cannot write the model file: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * F.HEADER_BYTES)
            crc = zlib.crc32(meta)
            f.write(meta)
            pos = F.HEADER_BYTES + len(meta)
            it = iter(payloads)
            for info in laid:
                try:
                    name, data = next(it)
                except StopIteration:
                    raise DittoError(f"{where}: no payload for tensor {info.name!r}") from None
                if name != info.name:
                    raise DittoError(f"{where}: payload for tensor {name!r} arrived where "
                                     f"{info.name!r} was expected (payloads must follow the "
                                     f"tensor order)")
                buf = _as_bytes(name, info, data, where)
                if len(buf) != info.nbytes:
                    raise DittoError(f"{where}: tensor {name!r} payload is {len(buf)} bytes, "
                                     f"its {info.encoding} layout needs {info.nbytes}")
                pad = b"\0" * (info.offset - pos)
                crc = zlib.crc32(buf, zlib.crc32(pad, crc))
                f.write(pad)
                f.write(buf)
                pos = info.offset + info.nbytes
                if progress is not None:
                    progress(info)
            extra = next(it, None)
            if extra is not None:
                raise DittoError(f"{where}: payload for unknown tensor {extra[0]!r}")
            assert pos == file_size
            f.seek(0)
            version = F.VERSION if tokenizer_needs_v2(tokenizer) else F.VERSION_MIN
            f.write(F.pack(F.HEADER, F.HEADER_FIELDS, magic=F.MAGIC, version=version,
                           crc32=crc & 0xFFFFFFFF, file_size=file_size,
                           meta_size=meta_size))
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates the file 0600; give it the mode open() would (0666 minus the umask)
        os.chmod(tmp_name, 0o666 & ~_current_umask())
        os.replace(tmp_name, path)
    except BaseException as exc:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise DittoError(f"{path}: cannot write the model file: {exc.strerror or exc}") \
                from None
        raise
    return laid


def _current_umask() -> int:
    """The process umask (read by setting it and restoring it at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# --------------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------------

class ModelFile:
    """A Ditto model file opened read-only with mmap.

    Attributes: ``path``, ``version``, ``crc32``, ``file_size``, ``meta_size``, ``config``
    (ModelConfig; ``rope_theta``/``norm_eps`` as stored, float32-rounded), ``tokenizer``
    (TokenizerSpec), ``tensors`` (name -> TensorInfo, in file order).

    Opening raises DittoError naming the file for: bad magic, unknown version, non-zero reserved
    header bytes 32..63, a size different
    from the header's ``file_size`` (truncated), a CRC-32 mismatch (unless ``verify=False``), a
    tensor payload outside the file or not 64-byte aligned or of the wrong length, or a config
    that does not match the tensors.
    """

    def __init__(self, path, verify: bool = True):
        self.path = Path(path)
        where = str(self.path)
        try:
            st = self.path.stat()
        except OSError as exc:
            raise DittoError(f"{where}: cannot open model file: {exc.strerror or exc}") from None
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device: refused as ditto-run refuses it
            raise DittoError(f"{where}: not a regular file ({file_kind(st.st_mode)})")
        size = st.st_size
        if size < F.HEADER_BYTES:
            raise DittoError(f"{where}: not a Ditto model file (only {size} bytes)")
        try:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise DittoError(f"{where}: cannot map model file: {exc}") from None
        mm = self._mm
        h = F.unpack(F.HEADER, F.HEADER_FIELDS, mm)
        if h["magic"] != F.MAGIC:
            raise DittoError(f"{where}: not a Ditto model file (magic {h['magic']!r}, "
                             f"expected {F.MAGIC!r})")
        if not F.VERSION_MIN <= h["version"] <= F.VERSION:
            raise DittoError(f"{where}: unsupported Ditto format version {h['version']} "
                             f"(this Ditto reads versions {F.VERSION_MIN}..{F.VERSION})")
        if any(h["reserved"]):
            first = next(i for i, x in enumerate(h["reserved"]) if x)
            raise DittoError(f"{where}: header reserved bytes 32..63 must be zero, byte "
                             f"{32 + first} is 0x{h['reserved'][first]:02x} (a newer or "
                             f"damaged file; the CRC does not cover the header)")
        if h["file_size"] != size:
            raise DittoError(f"{where}: file is {size} bytes but its header says "
                             f"{h['file_size']}: truncated or damaged")
        if F.HEADER_BYTES + h["meta_size"] > size or h["meta_size"] < F.CONFIG.size:
            raise DittoError(f"{where}: metadata size {h['meta_size']} does not fit the file")
        if verify:
            crc = 0
            step = 1 << 26
            for a in range(F.HEADER_BYTES, size, step):
                crc = zlib.crc32(mm[a:min(a + step, size)], crc)
            if crc != h["crc32"]:
                raise DittoError(f"{where}: checksum mismatch (CRC-32 {crc:08x}, header says "
                                 f"{h['crc32']:08x}): the file is damaged")
        self.version, self.crc32 = h["version"], h["crc32"]
        self.file_size, self.meta_size = h["file_size"], h["meta_size"]
        meta_end = F.HEADER_BYTES + self.meta_size

        c = F.unpack(F.CONFIG, F.CONFIG_FIELDS, mm, F.HEADER_BYTES)
        arch = next((k for k, v in F.ARCHITECTURES.items() if v == c["arch"]), None)
        if arch is None:
            raise DittoError(f"{where}: unknown architecture id {c['arch']} (1 = Llama, "
                             f"2 = Qwen2)")
        if any(c["reserved"]):
            raise DittoError(f"{where}: config reserved bytes 52..63 must be zero")
        if c["tied_embeddings"] > 1:
            raise DittoError(f"{where}: config tied_embeddings = {c['tied_embeddings']} must be "
                             f"0 or 1")
        self.config = ModelConfig(
            dim=c["dim"], hidden_dim=c["hidden_dim"], n_layers=c["n_layers"],
            n_heads=c["n_heads"], n_kv_heads=c["n_kv_heads"], head_dim=c["head_dim"],
            vocab_size=c["vocab_size"], max_seq_len=c["max_seq_len"],
            rope_theta=c["rope_theta"], norm_eps=c["norm_eps"],
            tied_embeddings=bool(c["tied_embeddings"]), arch=arch)
        n_t = c["n_tensors"]
        table_at = F.HEADER_BYTES + F.CONFIG.size
        tok_at = table_at + F.TENSOR_ENTRY.size * n_t
        if tok_at + F.TOKENIZER_HEADER.size > meta_end:
            raise DittoError(f"{where}: tensor table of {n_t} entries does not fit the metadata")
        payload_start = F.round_up(meta_end)
        enc_names = {v: k for k, v in F.ENCODINGS.items()}
        self.tensors: dict[str, TensorInfo] = {}
        for i in range(n_t):
            e = F.unpack(F.TENSOR_ENTRY, F.TENSOR_ENTRY_FIELDS, mm, table_at + i * 128)
            raw_name, nul, padding = e["name"].partition(b"\0")
            if not nul or not raw_name:
                raise DittoError(f"{where}: tensor table entry {i} has no NUL-terminated name")
            try:
                name = raw_name.decode("utf-8")
            except UnicodeDecodeError:
                raise DittoError(f"{where}: tensor entry {i} has a name that is not UTF-8") \
                    from None
            if any(padding):
                raise DittoError(f"{where}: tensor {name!r}: name is not NUL-padded")
            if any(e["reserved"]):
                raise DittoError(f"{where}: tensor {name!r}: reserved bytes 116..127 must be "
                                 f"zero")
            if e["encoding"] == F.ENC_F32 and e["codebook_type"]:
                raise DittoError(f"{where}: f32 tensor {name!r} must have bits = group_size = "
                                 f"0 and no codebook type")
            if e["encoding"] not in enc_names:
                raise DittoError(f"{where}: tensor {name!r} has unknown encoding "
                                 f"{e['encoding']}")
            enc = enc_names[e["encoding"]]
            if e["ndim"] not in (1, 2) or (e["ndim"] == 1 and e["rows"] != 1):
                raise DittoError(f"{where}: tensor {name!r} has bad ndim {e['ndim']} / rows "
                                 f"{e['rows']}")
            shape = (e["cols"],) if e["ndim"] == 1 else (e["rows"], e["cols"])
            if enc == "codebook":
                if e["codebook_type"] not in CB.TYPE_NAMES:
                    raise DittoError(f"{where}: tensor {name!r} has unknown codebook type "
                                     f"{e['codebook_type']}")
                info = TensorInfo(name, enc, shape, e["bits"], e["group_size"],
                                  CB.TYPE_NAMES[e["codebook_type"]], e["offset"], e["nbytes"])
            else:
                info = TensorInfo(name, enc, shape, e["bits"], e["group_size"], None,
                                  e["offset"], e["nbytes"])
            _check_tensor_info(info, where)
            if info.nbytes != info.expected_nbytes():
                raise DittoError(f"{where}: tensor {name!r} has {info.nbytes} payload bytes, "
                                 f"its layout needs {info.expected_nbytes()}")
            if info.offset % F.ALIGN or info.offset < payload_start:
                raise DittoError(f"{where}: tensor {name!r} payload offset {info.offset} is "
                                 f"misaligned or inside the metadata")
            if info.offset + info.nbytes > size:
                raise DittoError(f"{where}: tensor {name!r} payload [{info.offset}, "
                                 f"{info.offset + info.nbytes}) runs past the end ({size})")
            if name in self.tensors:
                raise DittoError(f"{where}: tensor {name!r} appears twice")
            if info.codebook_type == "int8":
                bad = CB.check_int8_payload(info.rows, info.cols, info.bits, info.group_size,
                                            np.frombuffer(mm, np.uint8, info.nbytes, info.offset))
                if bad:
                    raise DittoError(f"{where}: tensor {info.name}: {bad}")
            self.tensors[name] = info
        by_offset = sorted(self.tensors.values(), key=lambda t: t.offset)
        for a, b in zip(by_offset, by_offset[1:]):
            if b.offset < a.offset + a.nbytes:
                raise DittoError(f"{where}: tensor {b.name!r}: payload at offset {b.offset} "
                                 f"overlaps the payload of {a.name!r} "
                                 f"[{a.offset}, {a.offset + a.nbytes})")
        self.tokenizer = parse_tokenizer(mm[tok_at:meta_end], where)
        if len(self.tokenizer.tokens) != self.config.vocab_size:
            raise DittoError(f"{where}: tokenizer has {len(self.tokenizer.tokens)} tokens, "
                             f"config vocab_size is {self.config.vocab_size}")
        check_config(self.config, {n: t.shape for n, t in self.tensors.items()}, where)

    @classmethod
    def open(cls, path, verify: bool = True) -> "ModelFile":
        """Same as ``ModelFile(path, verify)``."""
        return cls(path, verify)

    def __enter__(self) -> "ModelFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Drop this object's mapping (views already handed out keep it alive)."""
        self._mm = None

    def _info(self, name: str) -> TensorInfo:
        if self._mm is None:
            raise DittoError(f"{self.path}: model file is closed")
        try:
            return self.tensors[name]
        except KeyError:
            raise DittoError(f"{self.path}: no tensor named {name!r}") from None

    def payload(self, name: str) -> np.ndarray:
        """uint8 [nbytes] zero-copy view of tensor ``name``'s payload (read-only mmap)."""
        info = self._info(name)
        return self._mm[info.offset:info.offset + info.nbytes].view(np.ndarray)

    def f32(self, name: str) -> np.ndarray:
        """float32 view of an f32 tensor, shape ``info.shape``. DittoError for other
        encodings."""
        info = self._info(name)
        if info.encoding != "f32":
            raise DittoError(f"{self.path}: tensor {name!r} is {info.encoding}, not f32")
        return self.payload(name).view("<f4").reshape(info.shape)

    @property
    def payload_bytes(self) -> int:
        """Sum of the tensor payload sizes (no padding, no metadata)."""
        return sum(t.nbytes for t in self.tensors.values())
