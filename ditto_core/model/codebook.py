"""The CODEBOOK encoding of the Ditto model file (docs/FORMAT.md, ``encoding = 1``), in one place.

Every Python part that needs a fact of the encoding takes it from here: the model file reader
and writer (``modelfile``), the ``bits`` packer, ``ditto inspect``, the quantizers (their size
guard and parameter checks) and the bench scripts. ``native/model/ditto_format.h`` holds the same
facts for the C runtime (``ditto_cb_*`` functions); ``tests/test_format_agree.py`` compiles a
C program with clang-22 and checks both give the same numbers.

The facts:

- element types (``codebook_type``): ``f32`` (id 0, 4 bytes), ``f16`` (id 1, IEEE binary16, 2
  bytes), ``int8`` (id 2, 1 byte per centroid plus one f16 scale per sub-block: centroid =
  scale · q, q in −127..127);
- sizes: S = ceil(cols / G) sub-blocks per row, K = 2^b centroids each; the codebook part is
  ``roundup(rows · S · (K · itemsize + scale bytes), 64)``, the indices ``rows · row_bytes``
  with ``row_bytes = ceil(cols / 8) · b``; the theoretical size (no padding) is
  ``ceil(rows · cols · b / 8) + rows · S · (K · itemsize + scale bytes)``;
- the b-bit index packing: groups of 8 consecutive indices of a row, each group stored in
  exactly b bytes read as one little-endian integer of 8·b bits, index j of the group (j =
  0..7) in bits ``[j·b, (j+1)·b)``; the last group is padded with zero indices. b = 8 is one
  byte per index, b = 4 two per byte (low nibble first), b = 3 eight indices in 3 bytes, b = 1
  eight per byte (bit j = index j).

The codec functions are vectorised NumPy (a 64-bit lane holds one group of 8 indices of ≤ 8
bits) and work on row chunks so a vocabulary-sized matrix does not need 8 bytes per index at
once.
"""

from __future__ import annotations

import math

import numpy as np

from ditto_core.base.errors import DittoError
from ditto_core.base.types import CodebookTensor
from . import format as F

#: codebook type name -> id in the tensor table (``DITTO_CB_*``)
TYPE_IDS = {"f32": F.CB_F32, "f16": F.CB_F16, "int8": F.CB_I8}
#: codebook type name -> bytes per stored centroid value
ITEMSIZE = {"f32": 4, "f16": 2, "int8": 1}
#: codebook type name -> bytes per sub-block on top of its centroids (int8: the f16 scale)
SCALE_BYTES = {"f32": 0, "f16": 0, "int8": 2}
#: codebook type name -> NumPy dtype of a stored centroid (little-endian)
DTYPES = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "int8": np.dtype("i1")}
#: the codebook type names, sorted
TYPES = tuple(sorted(TYPE_IDS))
#: id -> name
TYPE_NAMES = {v: k for k, v in TYPE_IDS.items()}

#: rows processed per chunk (bounds the uint64 temporaries to ~8 · _CHUNK · cols bytes)
_CHUNK = 2048


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def check_type(codebook_type) -> None:
    """Raise DittoError unless ``codebook_type`` is a type the format stores."""
    if codebook_type not in TYPE_IDS:
        *most, last = TYPES
        raise DittoError(f"codebook type must be {', '.join(map(repr, most))} or {last!r}, "
                         f"got {codebook_type!r}")


def _check_bits(bits) -> None:
    if not _is_int(bits) or not 1 <= bits <= 8:
        raise DittoError(f"bit width b must be an integer in 1..8, got {bits!r}")


def check_params(bits, group_size, codebook_type) -> None:
    """Raise DittoError unless the CODEBOOK parameters are what a model file may hold
    (FORMAT.md validity rule 12): bit width b an integer in 1..8, group size G an integer in
    ``MIN_GROUP_SIZE..MAX_GROUP_SIZE`` (2..2^24), codebook type one of ``TYPES``. The model
    file reader and writer, ``ditto build``'s quantize options and the quantizers check with
    it."""
    _check_bits(bits)
    if not _is_int(group_size) or not F.MIN_GROUP_SIZE <= group_size <= F.MAX_GROUP_SIZE:
        raise DittoError(f"group size G must be an integer in {F.MIN_GROUP_SIZE}.."
                         f"{F.MAX_GROUP_SIZE}, got {group_size!r}")
    check_type(codebook_type)


def n_centroids(bits: int) -> int:
    """K = 2^b centroids per sub-block."""
    return 1 << bits


def n_sub_blocks(cols: int, group_size: int) -> int:
    """S = ceil(cols / G) sub-blocks per row (the last one shorter when G does not divide
    cols)."""
    return -(-int(cols) // int(group_size))


def row_bytes(cols: int, bits: int) -> int:
    """Bytes of one packed row of indices: ``ceil(cols / 8) · b``."""
    return (int(cols) + 7) // 8 * int(bits)


def sub_block_bytes(bits: int, codebook_type: str) -> int:
    """Bytes one sub-block's codebook takes: 2^b centroids of ``ITEMSIZE[codebook_type]``
    bytes, plus the f16 scale for ``int8``."""
    return n_centroids(bits) * ITEMSIZE[codebook_type] + SCALE_BYTES[codebook_type]


def codebook_bytes(rows: int, cols: int, bits: int, group_size: int, codebook_type: str) -> int:
    """Bytes of the codebook part of a CODEBOOK payload, padded to 64:
    ``roundup(rows · S · sub_block_bytes, 64)``. Raises DittoError for bad parameters."""
    check_params(bits, group_size, codebook_type)
    return F.round_up(int(rows) * n_sub_blocks(cols, group_size)
                      * sub_block_bytes(bits, codebook_type), F.ALIGN)


def payload_bytes(rows: int, cols: int, bits: int, group_size: int, codebook_type: str) -> int:
    """Payload bytes of a CODEBOOK tensor (``nbytes`` in the tensor table):
    ``codebook_bytes + rows · row_bytes``. Raises DittoError for bad parameters."""
    return (codebook_bytes(rows, cols, bits, group_size, codebook_type)
            + int(rows) * row_bytes(cols, bits))


def theoretical_bytes(rows: int, cols: int, bits: int, group_size: int,
                      codebook_type: str) -> int:
    """Bytes with no padding at all: ``ceil(rows · cols · b / 8)`` index bytes plus ``rows · S``
    sub-block codebooks (``sub_block_bytes``)."""
    check_params(bits, group_size, codebook_type)
    return (math.ceil(int(rows) * int(cols) * bits / 8)
            + int(rows) * n_sub_blocks(cols, group_size) * sub_block_bytes(bits, codebook_type))


def f32_bytes(rows: int, cols: int) -> int:
    """Bytes of the same matrix in f32 (4 per weight)."""
    return 4 * int(rows) * int(cols)


def saves_space(rows: int, cols: int, bits: int, group_size: int, codebook_type: str) -> bool:
    """True when a [rows, cols] matrix is strictly smaller as a CODEBOOK payload than as f32.
    False e.g. for rows of 16 at b = 6 (64 f16 centroids per 16 weights ≈ 70 bpw)."""
    return payload_bytes(rows, cols, bits, group_size, codebook_type) < f32_bytes(rows, cols)


def check_int8_payload(rows: int, cols: int, bits: int, group_size: int, payload: np.ndarray
                       ) -> str | None:
    """FORMAT.md validity rule 12 for an int8 CODEBOOK payload (uint8 [nbytes]): every centroid
    in −127..127 and every f16 scale finite with its sign bit clear, as the C loader checks.
    Returns None, or what is wrong (naming the row and sub-block)."""
    S, K = n_sub_blocks(cols, group_size), n_centroids(bits)
    n = rows * S
    cent = payload[:n * K].view(np.int8)
    bad = np.flatnonzero(cent == -128)
    if bad.size:
        i = int(bad[0]) // K
        return (f"int8 centroid -128 at row {i // S} sub-block {i % S} (int8 codebooks use "
                f"-127..127)")
    scales = payload[n * K:n * K + 2 * n].view("<u2")
    bad = np.flatnonzero((scales & 0x8000) | ((scales & 0x7C00) == 0x7C00))
    if bad.size:
        i = int(bad[0])
        return (f"int8 codebook scale 0x{int(scales[i]):04x} at row {i // S} sub-block "
                f"{i % S} is negative, infinite or NaN")
    return None


def pack_indices(indices: np.ndarray, bits: int) -> np.ndarray:
    """Pack centroid indices at exactly ``bits`` bits each (FORMAT.md, CODEBOOK indices).

    ``indices``: uint8 [rows, cols], every value < 2^bits. Returns uint8 [rows, row_bytes] with
    ``row_bytes = ceil(cols / 8) · bits``. Raises DittoError for b outside 1..8, a non-2-D
    array or an index ≥ 2^b."""
    _check_bits(bits)
    idx = np.asarray(indices)
    if idx.ndim != 2:
        raise DittoError(f"indices must be a 2-D [rows, cols] array, got shape {idx.shape}")
    if idx.size and int(idx.max()) >= n_centroids(bits):
        raise DittoError(f"index {int(idx.max())} does not fit in b = {bits} bits")
    rows, cols = idx.shape
    n_groups = (cols + 7) // 8
    out = np.empty((rows, n_groups * bits), np.uint8)
    shifts = (np.arange(8, dtype=np.uint64) * np.uint64(bits))
    for a in range(0, rows, _CHUNK):
        b = min(a + _CHUNK, rows)
        chunk = np.zeros((b - a, n_groups * 8), np.uint64)
        chunk[:, :cols] = idx[a:b]
        lanes = np.bitwise_or.reduce(chunk.reshape(b - a, n_groups, 8) << shifts, axis=2)
        raw = lanes.astype("<u8").view(np.uint8).reshape(b - a, n_groups, 8)
        out[a:b] = raw[:, :, :bits].reshape(b - a, n_groups * bits)
    return out


def unpack_indices(packed: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """Inverse of ``pack_indices``: uint8 [rows, row_bytes] → uint8 [rows, cols].

    Raises DittoError if ``packed`` does not have ``ceil(cols / 8) · bits`` bytes per row."""
    _check_bits(bits)
    p = np.asarray(packed, dtype=np.uint8)
    if p.ndim != 2 or p.shape[1] != row_bytes(cols, bits):
        raise DittoError(f"packed indices of shape {p.shape} do not hold rows of {cols} "
                         f"{bits}-bit indices ({row_bytes(cols, bits)} bytes per row)")
    rows = p.shape[0]
    n_groups = (cols + 7) // 8
    out = np.empty((rows, cols), np.uint8)
    shifts = (np.arange(8, dtype=np.uint64) * np.uint64(bits))
    mask = np.uint64(n_centroids(bits) - 1)
    for a in range(0, rows, _CHUNK):
        b = min(a + _CHUNK, rows)
        raw = np.zeros((b - a, n_groups, 8), np.uint8)
        raw[:, :, :bits] = p[a:b].reshape(b - a, n_groups, bits)
        lanes = raw.view("<u8")  # [rows, n_groups, 1]
        vals = (lanes >> shifts) & mask  # [rows, n_groups, 8]
        out[a:b] = vals.reshape(b - a, n_groups * 8)[:, :cols]
    return out


def codebook_payload(t: CodebookTensor) -> bytes:
    """The CODEBOOK payload of ``t`` (FORMAT.md): codebooks ``[rows][S][2^b]`` in
    ``t.codebook_type`` (f16 or f32, little-endian; for ``int8`` the int8 centroids
    ``codebooks / scales`` followed by the f16 ``scales`` [rows][S]), zero-padded to a multiple
    of 64 bytes, then the packed indices, ``rows · ceil(cols / 8) · b`` bytes.

    Raises DittoError if the codebook shape is not [rows, ceil(cols / G), 2^b], the codebook
    values change when stored in ``codebook_type`` (they must already be rounded to it; int8:
    every centroid is its sub-block's f16 scale times an integer in −127..127), or an index is
    out of range."""
    check_type(t.codebook_type)
    _check_bits(t.bits)
    idx = np.asarray(t.indices)
    if idx.ndim != 2:
        raise DittoError(f"codebook tensor indices must be [rows, cols], got {idx.shape}")
    rows, cols = idx.shape
    s = n_sub_blocks(cols, t.group_size)
    want = (rows, s, n_centroids(t.bits))
    cb = np.asarray(t.codebooks)
    if cb.shape != want:
        raise DittoError(f"codebooks have shape {cb.shape}, expected {want} for a "
                         f"{rows}x{cols} tensor with b = {t.bits}, G = {t.group_size}")
    if t.codebook_type == "int8":
        cb_raw = _int8_codebook_bytes(cb, t.scales, (rows, s))
    else:
        stored = cb.astype(DTYPES[t.codebook_type])
        if not np.array_equal(stored.astype(np.float32), cb.astype(np.float32)):
            raise DittoError(f"codebook values are not exactly representable as "
                             f"{t.codebook_type}")
        cb_raw = stored.tobytes()
    pad = b"\0" * (-len(cb_raw) % F.ALIGN)
    return cb_raw + pad + pack_indices(idx, t.bits).tobytes()


def _int8_codebook_bytes(cb: np.ndarray, scales, shape) -> bytes:
    """int8 centroids [rows][S][K] then f16 scales [rows][S] (FORMAT.md ``int8``) from the
    stored float centroids ``cb`` and their ``scales``. Raises DittoError when they do not
    have that form."""
    if scales is None or np.asarray(scales).shape != shape:
        raise DittoError(f"int8 codebooks need scales of shape {shape}, got "
                         f"{None if scales is None else np.asarray(scales).shape}")
    sc = np.asarray(scales, np.float32)
    s16 = sc.astype("<f2")
    if not (np.array_equal(s16.astype(np.float32), sc) and np.isfinite(sc).all()
            and (sc >= 0).all()):
        raise DittoError("int8 codebook scales must be finite, non-negative f16 values")
    cbf = cb.astype(np.float64)
    scd = sc.astype(np.float64)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scd > 0, cbf / np.where(scd > 0, scd, 1.0), 0.0)
    qi = np.rint(q)
    if (not np.array_equal(qi * scd, cbf) or (np.abs(qi) > 127).any()
            or ((scd == 0) & (cbf != 0)).any()):
        raise DittoError("int8 codebook values must be their sub-block's scale times an "
                         "integer in -127..127")
    return qi.astype(np.int8).tobytes() + s16.tobytes()


def split_payload(rows: int, cols: int, bits: int, group_size: int, codebook_type: str,
                  payload: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Views of a CODEBOOK payload: (codebooks float16/float32 [rows, S, 2^b], packed indices
    uint8 [rows, row_bytes]); for ``int8`` the codebooks are the stored centroids as float32
    (int8 value times the sub-block's f16 scale, a copy). Raises DittoError if the payload has
    the wrong length."""
    check_params(bits, group_size, codebook_type)
    dt = DTYPES[codebook_type]
    s = n_sub_blocks(cols, group_size)
    k = n_centroids(bits)
    cb_len = rows * s * k * dt.itemsize
    cb_len_all = cb_len + rows * s * SCALE_BYTES[codebook_type]
    cb_bytes = codebook_bytes(rows, cols, bits, group_size, codebook_type)
    rb = row_bytes(cols, bits)
    p = np.asarray(payload, dtype=np.uint8).reshape(-1)
    if p.size != cb_bytes + rows * rb:
        raise DittoError(f"CODEBOOK payload is {p.size} bytes, a {rows}x{cols} tensor with "
                         f"b = {bits}, G = {group_size}, {codebook_type} codebooks needs "
                         f"{cb_bytes + rows * rb}")
    codebooks = p[:cb_len].view(dt).reshape(rows, s, k)
    if codebook_type == "int8":
        scales = p[cb_len:cb_len_all].view("<f2").reshape(rows, s).astype(np.float32)
        codebooks = codebooks.astype(np.float32) * scales[..., None]
    packed = p[cb_bytes:].reshape(rows, rb)
    return codebooks, packed


def dequantize(info, payload: np.ndarray) -> np.ndarray:
    """Reference decoder of one tensor: float32 [rows, cols] (or [n] for a vector).

    ``info``: a ``ditto_core.model.modelfile.TensorInfo`` (encoding "f32" or "codebook", shape,
    bits, group_size, codebook_type); ``payload``: its uint8 payload (``ModelFile.payload(name)``).
    ``W[r][c] = codebook[r][c // G][index[r][c]]`` (FORMAT.md). Raises DittoError for a payload
    of the wrong length or an unknown encoding."""
    p = np.asarray(payload, dtype=np.uint8).reshape(-1)
    shape = tuple(info.shape)
    if info.encoding == "f32":
        n = int(np.prod(shape))
        if p.size != 4 * n:
            raise DittoError(f"tensor {info.name!r}: f32 payload is {p.size} bytes, "
                             f"expected {4 * n}")
        return p.view("<f4").astype(np.float32).reshape(shape)
    if info.encoding != "codebook":
        raise DittoError(f"tensor {info.name!r}: unknown encoding {info.encoding!r}")
    rows = 1 if len(shape) == 1 else shape[0]
    cols = shape[-1]
    try:
        codebooks, packed = split_payload(rows, cols, info.bits, info.group_size,
                                          info.codebook_type, p)
    except DittoError as exc:
        raise DittoError(f"tensor {info.name!r}: {exc}") from None
    idx = unpack_indices(packed, info.bits, cols)
    cb = codebooks.astype(np.float32)
    sub = np.arange(cols) // info.group_size  # sub-block of each column
    out = np.empty((rows, cols), np.float32)
    for a in range(0, rows, _CHUNK):
        b = min(a + _CHUNK, rows)
        out[a:b] = cb[a:b][np.arange(b - a)[:, None], sub[None, :], idx[a:b]]
    return out.reshape(shape)
