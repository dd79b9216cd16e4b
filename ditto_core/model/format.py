"""Constants and binary struct layouts of the Ditto model file, format version 1.

This module mirrors ``native/model/ditto_format.h`` (C) for Python; the single source of truth is
docs/FORMAT.md. ``tests/test_format_agree.py`` parses the C header's ``#define`` lines and the
``sizeof``/``offsetof`` values a clang-22 build prints, and checks they equal the values here.

All numbers are little-endian (the ``<`` in every struct format). Each ``*_FIELDS`` tuple names
the fields of a struct in declaration order; reserved fields are named ``reserved`` and are
written as zeros.
"""

from __future__ import annotations

import struct

MAGIC = b"DITTOMDL"  # DITTO_MAGIC, 8 bytes, no terminator
VERSION = 2  # DITTO_VERSION: newest written (2 = tokenizer flags + extension section)
VERSION_MIN = 1  # DITTO_VERSION_MIN: oldest read (1 = tokenizer flags and ext_bytes zero)
HEADER_BYTES = 64  # DITTO_HEADER_BYTES
ALIGN = 64  # DITTO_ALIGN: every tensor payload starts at a multiple of this
NAME_BYTES = 64  # DITTO_NAME_BYTES

ARCH_LLAMA = 1  # DITTO_ARCH_LLAMA
ARCH_QWEN2 = 2  # DITTO_ARCH_QWEN2: Llama + f32 biases on the q, k, v projections

ENC_F32 = 0  # DITTO_ENC_F32
ENC_CODEBOOK = 1  # DITTO_ENC_CODEBOOK

MIN_GROUP_SIZE = 2  # DITTO_MIN_GROUP_SIZE: smallest codebook group size G
MAX_GROUP_SIZE = 1 << 24  # DITTO_MAX_GROUP_SIZE: largest G (G >= cols is one sub-block per row)

# Limits of a valid model file (FORMAT.md "Validity rules"), the same numbers as the C header.
MAX_DIM = 1 << 20  # DITTO_MAX_DIM: dim and n_heads * head_dim
MAX_HIDDEN_DIM = 1 << 22  # DITTO_MAX_HIDDEN_DIM
MAX_LAYERS = 4096  # DITTO_MAX_LAYERS
MAX_VOCAB = 1 << 24  # DITTO_MAX_VOCAB
MAX_SEQ_LEN = 2**31 - 1  # DITTO_MAX_SEQ_LEN: positions are int in the runtime
MAX_F32_ELEMENTS = 2**31 - 1  # DITTO_MAX_F32_ELEMENTS: the f32 GEMV indexes with int
MAX_WEIGHTS = 1 << 40  # DITTO_MAX_WEIGHTS: rows * cols of any tensor

CB_F32 = 0  # DITTO_CB_F32
CB_F16 = 1  # DITTO_CB_F16
CB_I8 = 2  # DITTO_CB_I8: int8 centroids + one f16 scale per sub-block

TOK_BPE_BYTES = 1  # DITTO_TOK_BPE_BYTES
TOK_SPM_BPE = 2  # DITTO_TOK_SPM_BPE

PRE_NONE = 0  # DITTO_PRE_NONE
PRE_GPT2 = 1  # DITTO_PRE_GPT2
PRE_GPT2_DIGITS = 2  # DITTO_PRE_GPT2_DIGITS
PRE_QWEN2 = 3  # DITTO_PRE_QWEN2

TT_NORMAL = 1  # DITTO_TT_NORMAL
TT_UNKNOWN = 2  # DITTO_TT_UNKNOWN
TT_CONTROL = 3  # DITTO_TT_CONTROL
TT_USER_DEFINED = 4  # DITTO_TT_USER_DEFINED
TT_UNUSED = 5  # DITTO_TT_UNUSED
TT_BYTE = 6  # DITTO_TT_BYTE

TOKF_ADDED_RECORDS = 0x1  # DITTO_TOKF_ADDED_RECORDS
TOKF_PREFIX_SPACE = 0x2  # DITTO_TOKF_PREFIX_SPACE
TOKF_MS_SHIFT = 2  # DITTO_TOKF_MS_SHIFT
TOKF_MS_MASK = 0xC  # DITTO_TOKF_MS_MASK
TOKF_MS_SPLIT = 0x10  # DITTO_TOKF_MS_SPLIT
TOKF_RANK_MERGES = 0x20  # DITTO_TOKF_RANK_MERGES
TOKF_FUSE_UNK = 0x40  # DITTO_TOKF_FUSE_UNK
TOKF_DECODE_STRIP = 0x80  # DITTO_TOKF_DECODE_STRIP
TOKF_DECODE_METASPACE = 0x100  # DITTO_TOKF_DECODE_METASPACE
TOKF_ALL = 0x1FF  # DITTO_TOKF_ALL

MS_NONE = 0  # DITTO_MS_NONE
MS_ALWAYS = 1  # DITTO_MS_ALWAYS
MS_FIRST = 2  # DITTO_MS_FIRST
MS_NEVER = 3  # DITTO_MS_NEVER

TX_LOWERCASE = 1  # DITTO_TX_LOWERCASE
TX_STRIP = 2  # DITTO_TX_STRIP
TX_REPLACE = 3  # DITTO_TX_REPLACE
TX_PREPEND = 4  # DITTO_TX_PREPEND
TX_NFC = 5  # DITTO_TX_NFC
TX_NFD = 6  # DITTO_TX_NFD
TX_NFKC = 7  # DITTO_TX_NFKC
TX_NFKD = 8  # DITTO_TX_NFKD
TX_ADDED = 16  # DITTO_TX_ADDED
TX_CHAT_PREFIX = 32  # DITTO_TX_CHAT_PREFIX
TX_CHAT_SUFFIX = 33  # DITTO_TX_CHAT_SUFFIX
TX_EOG = 48  # DITTO_TX_EOG
TX_FIM = 49  # DITTO_TX_FIM

FIM_PREFIX = 0  # DITTO_FIM_PREFIX
FIM_SUFFIX = 1  # DITTO_FIM_SUFFIX
FIM_MIDDLE = 2  # DITTO_FIM_MIDDLE
FIM_PAD = 3  # DITTO_FIM_PAD
FIM_REPO = 4  # DITTO_FIM_REPO
FIM_SEP = 5  # DITTO_FIM_SEP
FIM_ROLES = 6  # DITTO_FIM_ROLES

ADDED_SPECIAL = 0x1  # DITTO_ADDED_SPECIAL
ADDED_LSTRIP = 0x2  # DITTO_ADDED_LSTRIP
ADDED_RSTRIP = 0x4  # DITTO_ADDED_RSTRIP
ADDED_NORMALIZED = 0x8  # DITTO_ADDED_NORMALIZED
ADDED_SINGLE_WORD = 0x10  # DITTO_ADDED_SINGLE_WORD

#: extension record header: tag, a, b, payload length
EXT_RECORD = struct.Struct("<4I")

CHAT_NONE = 0  # DITTO_CHAT_NONE
CHAT_CHATML = 1  # DITTO_CHAT_CHATML

# Python-side names of the enums (the strings used by ditto_core.base.types / TensorInfo); the
# codebook types are in ditto_core/model/codebook.py with the rest of the CODEBOOK encoding.
ENCODINGS = {"f32": ENC_F32, "codebook": ENC_CODEBOOK}
TOKENIZER_KINDS = {"bpe_bytes": TOK_BPE_BYTES, "spm_bpe": TOK_SPM_BPE}
PRE_TOKENIZERS = {"none": PRE_NONE, "gpt2": PRE_GPT2, "gpt2_digits": PRE_GPT2_DIGITS,
                  "qwen2": PRE_QWEN2}
CHAT_FORMATS = {"none": CHAT_NONE, "chatml": CHAT_CHATML}
ARCHITECTURES = {"llama": ARCH_LLAMA, "qwen2": ARCH_QWEN2}  # ModelConfig.arch -> config arch

#: DittoHeader (64 bytes)
HEADER = struct.Struct("<8sIIQQ32s")
HEADER_FIELDS = ("magic", "version", "crc32", "file_size", "meta_size", "reserved")

#: DittoConfig (64 bytes)
CONFIG = struct.Struct("<9I2f2I12s")
CONFIG_FIELDS = ("arch", "dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                 "vocab_size", "max_seq_len", "rope_theta", "norm_eps", "tied_embeddings",
                 "n_tensors", "reserved")

#: DittoTensorEntry (128 bytes)
TENSOR_ENTRY = struct.Struct("<64s4I4QI12s")
TENSOR_ENTRY_FIELDS = ("name", "encoding", "codebook_type", "bits", "group_size", "rows", "cols",
                       "offset", "nbytes", "ndim", "reserved")

#: DittoTokenizerHeader (64 bytes)
TOKENIZER_HEADER = struct.Struct("<4I4i8I")
TOKENIZER_HEADER_FIELDS = ("kind", "pre", "n_tokens", "n_merges", "bos_id", "eos_id", "unk_id",
                           "pad_id", "add_bos", "add_space_prefix", "chat_format", "blob_bytes",
                           "template_bytes", "flags", "ext_bytes", "reserved")

#: struct name in the C header -> (struct.Struct, field names)
STRUCTS = {
    "DittoHeader": (HEADER, HEADER_FIELDS),
    "DittoConfig": (CONFIG, CONFIG_FIELDS),
    "DittoTensorEntry": (TENSOR_ENTRY, TENSOR_ENTRY_FIELDS),
    "DittoTokenizerHeader": (TOKENIZER_HEADER, TOKENIZER_HEADER_FIELDS),
}

assert HEADER.size == HEADER_BYTES
assert CONFIG.size == 64
assert TENSOR_ENTRY.size == 128
assert TOKENIZER_HEADER.size == 64


def field_offsets(st: struct.Struct, fields: tuple[str, ...]) -> dict[str, int]:
    """Byte offset of each field of a struct layout (the C ``offsetof``), from its format."""
    codes = _split_format(st.format)
    assert len(codes) == len(fields), (st.format, fields)
    out, pos = {}, 0
    for name, code in zip(fields, codes):
        out[name] = pos
        pos += struct.calcsize("<" + code)
    return out


def _split_format(fmt: str) -> list[str]:
    """``"<9I2f12s"`` -> one code per field: ``["I"] * 9 + ["f", "f", "12s"]``."""
    codes, num = [], ""
    for ch in fmt.lstrip("<"):
        if ch.isdigit():
            num += ch
        elif ch == "s":
            codes.append(f"{num or 1}s")
            num = ""
        else:
            codes.extend([ch] * int(num or 1))
            num = ""
    return codes


def pack(st: struct.Struct, fields: tuple[str, ...], **values) -> bytes:
    """Pack a struct from keyword values; a missing ``reserved`` field is zeros."""
    args = []
    for name, code in zip(fields, _split_format(st.format)):
        if name == "reserved" and name not in values:
            args.append(b"" if code.endswith("s") else 0)
        else:
            args.append(values[name])
    return st.pack(*args)


def unpack(st: struct.Struct, fields: tuple[str, ...], buf, offset: int = 0) -> dict:
    """Unpack a struct into a dict of field name -> value."""
    return dict(zip(fields, st.unpack_from(buf, offset)))


def round_up(n: int, align: int = ALIGN) -> int:
    """Smallest multiple of ``align`` that is ≥ n."""
    return (n + align - 1) // align * align

