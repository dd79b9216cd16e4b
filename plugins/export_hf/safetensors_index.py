"""Lazy, mmapped access to the tensors of one or more ``.safetensors`` files.

The safetensors layout (huggingface/safetensors, "Format"): an 8-byte little-endian header
length N, N bytes of JSON mapping each tensor name to ``dtype``, ``shape`` and
``data_offsets`` [begin, end) relative to the byte after the header, then the data. The header is
parsed here so every dtype Ditto accepts (F32, F16, BF16) is read the same way, zero-copy from a
``numpy.memmap``; BF16 is widened to float32 through a uint16 view (bf16 is the top half of an
IEEE float32).
"""

from __future__ import annotations

import json
import math
import stat
import struct
from pathlib import Path

import attrs
import numpy as np

from ditto_core.base.errors import DittoError

#: safetensors dtype -> numpy dtype of the stored bytes
DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}


@attrs.frozen
class SafeTensor:
    """Where one tensor lives: file, dtype name, shape, absolute byte range."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def validate(path: Path) -> None:
    """Have the ``safetensors`` library itself open ``path`` (header only; the data stays
    mmapped and unread): it refuses what its loaders refuse, e.g. offsets that are negative,
    fractional, reversed, overlapping, leave gaps or bytes not covered by any tensor, point
    into the header or past the end, or do not match dtype × shape. Raises DittoError with the
    library's reason."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy"):
            pass
    except Exception as exc:  # SafetensorError (its only error type) or an OSError
        reason = str(exc).removeprefix("Error while deserializing header: ")
        raise DittoError(f"{path}: not a valid safetensors file: {reason} (the safetensors "
                         "library refuses it)") from None


def read_header(path: Path) -> dict[str, SafeTensor]:
    """Tensor name -> SafeTensor for one file. Raises DittoError naming the file for a file
    that is not a regular file or not safetensors, is truncated, fails the ``safetensors``
    library's own header validation (``validate``), or holds a dtype other than
    F32/F16/BF16."""
    try:
        st = path.stat()
        size = st.st_size
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            raise DittoError(f"{path}: not a regular file")
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise DittoError(f"{path}: truncated safetensors file ({size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100_000_000:
                raise DittoError(f"{path}: truncated or not a safetensors file (header of {n} "
                                 f"bytes, file of {size})")
            raw = f.read(n)
    except OSError as exc:
        raise DittoError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DittoError(f"{path}: not a safetensors file (bad JSON header: {exc})") from None
    if not isinstance(header, dict):
        raise DittoError(f"{path}: not a safetensors file (header is not a JSON object)")
    validate(path)
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:  # the library accepted the header: these are non-negative JSON integers
            dtype, shape = meta["dtype"], tuple(_uint(x) for x in meta["shape"])
            begin, end = (_uint(x) for x in meta["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise DittoError(f"{path}: malformed header entry for tensor {name!r}") from None
        if dtype not in DTYPES:
            raise DittoError(f"{path}: tensor {name!r} has dtype {dtype}; Ditto reads F32, F16 "
                             f"and BF16")
        if end - begin != math.prod(shape) * DTYPES[dtype].itemsize or begin > end:
            raise DittoError(f"{path}: tensor {name!r} byte range [{begin}, {end}) does not "
                             f"match {dtype} {list(shape)}")
        if base + end > size:
            raise DittoError(f"{path}: truncated: tensor {name!r} ends at byte {base + end}, "
                             f"the file has {size}")
        out[name] = SafeTensor(path, dtype, shape, base + begin, base + end)
    return out


def _uint(x) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise ValueError(x)
    return x


class SafetensorsIndex:
    """All tensors of a model (one file or shards listed in ``model.safetensors.index.json``)."""

    def __init__(self, files: list[Path]):
        self.tensors: dict[str, SafeTensor] = {}
        for f in files:
            for name, t in read_header(f).items():
                if name in self.tensors:
                    raise DittoError(f"{f}: tensor {name!r} is also in "
                                     f"{self.tensors[name].file}")
                self.tensors[name] = t

    def load_f32(self, name: str) -> np.ndarray:
        """float32 C-contiguous copy of tensor ``name`` (widened from F16/BF16).

        Only this tensor's bytes are mapped, and unmapped again once copied: mapped file pages
        count in the process's resident set, so a mapping kept open for a whole shard would
        make a 7B build's RSS grow to the size of the checkpoint (docs/BUILD.md, "Memory and disk")."""
        t = self.tensors[name]
        dtype = DTYPES[t.dtype]
        n = (t.end - t.begin) // dtype.itemsize
        if n == 0:
            return np.zeros(t.shape, np.float32)
        mm = np.memmap(t.file, dtype=dtype, mode="r", offset=t.begin, shape=(n,))
        try:
            raw = mm.view(np.ndarray)
            if t.dtype == "BF16":  # bf16 is the top half of an IEEE float32
                out = raw.astype(np.uint32)
                out <<= 16
                out = out.view(np.float32)
            else:
                out = np.array(raw, dtype=np.float32)
            del raw
        finally:
            mm._mmap.close()  # every array above is a copy: nothing refers to the mapping
            del mm
        return out.reshape(t.shape)
