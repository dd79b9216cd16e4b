"""Edit fields of a Ditto model file image in place and fix up its CRC-32 (a test helper).

The struct layouts come from ditto_core.model.format (docs/FORMAT.md), so a mutated file differs
from a valid one only in the field a test changes: every check behind the checksum is reachable.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from ditto_core.model import format as F

TABLE_AT = F.HEADER_BYTES + F.CONFIG.size


class ModelImage:
    """A model file's bytes with typed access to header, config, tensor entries and the
    tokenizer header. ``save(path)`` writes it with the CRC-32 and file_size recomputed."""

    def __init__(self, data: bytes | bytearray | Path | str):
        if isinstance(data, (str, Path)):
            data = Path(data).read_bytes()
        self.b = bytearray(data)

    # ---- header / config
    def header(self) -> dict:
        return F.unpack(F.HEADER, F.HEADER_FIELDS, self.b, 0)

    def set_header(self, **kw) -> "ModelImage":
        h = self.header()
        h.update(kw)
        F.HEADER.pack_into(self.b, 0, *[h[k] for k in F.HEADER_FIELDS])
        return self

    def config(self) -> dict:
        return F.unpack(F.CONFIG, F.CONFIG_FIELDS, self.b, F.HEADER_BYTES)

    def set_config(self, **kw) -> "ModelImage":
        c = self.config()
        c.update(kw)
        F.CONFIG.pack_into(self.b, F.HEADER_BYTES, *[c[k] for k in F.CONFIG_FIELDS])
        return self

    # ---- tensor table
    def n_tensors(self) -> int:
        return self.config()["n_tensors"]

    def index(self, name: str) -> int:
        for i in range(self.n_tensors()):
            if self.entry(i)["name"].rstrip(b"\0") == name.encode():
                return i
        raise KeyError(name)

    def entry(self, i: int | str) -> dict:
        i = self.index(i) if isinstance(i, str) else i
        return F.unpack(F.TENSOR_ENTRY, F.TENSOR_ENTRY_FIELDS, self.b, TABLE_AT + 128 * i)

    def entries(self) -> list[dict]:
        return [self.entry(i) for i in range(self.n_tensors())]

    def set_entry(self, i: int | str, **kw) -> "ModelImage":
        i = self.index(i) if isinstance(i, str) else i
        e = self.entry(i)
        e.update(kw)
        F.TENSOR_ENTRY.pack_into(self.b, TABLE_AT + 128 * i, *[e[k] for k in F.TENSOR_ENTRY_FIELDS])
        return self

    # ---- tokenizer block
    def tokenizer_at(self) -> int:
        return TABLE_AT + 128 * self.n_tensors()

    def tokenizer(self) -> dict:
        return F.unpack(F.TOKENIZER_HEADER, F.TOKENIZER_HEADER_FIELDS, self.b, self.tokenizer_at())

    def set_tokenizer(self, **kw) -> "ModelImage":
        t = self.tokenizer()
        t.update(kw)
        F.TOKENIZER_HEADER.pack_into(self.b, self.tokenizer_at(),
                                     *[t[k] for k in F.TOKENIZER_HEADER_FIELDS])
        return self

    def token_sections(self) -> dict[str, int]:
        """Absolute offsets of the tokenizer arrays: scores, types, offsets, blob, merges,
        template (FORMAT.md "Tokenizer block")."""
        t = self.tokenizer()
        n = t["n_tokens"]
        p = self.tokenizer_at() + F.TOKENIZER_HEADER.size
        out = {"scores": p}
        p += 4 * n
        out["types"] = p
        p += 4 * n
        out["offsets"] = p
        p += 4 * (n + 1)
        out["blob"] = p
        p += F.round_up(t["blob_bytes"], 4)
        out["merges"] = p
        p += 8 * t["n_merges"]
        out["template"] = p
        return out

    # ---- output
    def fixed(self) -> bytes:
        """The bytes with file_size and CRC-32 recomputed."""
        self.set_header(file_size=len(self.b))
        self.set_header(crc32=zlib.crc32(bytes(self.b[F.HEADER_BYTES:])) & 0xFFFFFFFF)
        return bytes(self.b)

    def save(self, path: Path | str) -> Path:
        Path(path).write_bytes(self.fixed())
        return Path(path)
