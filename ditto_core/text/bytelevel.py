"""The GPT-2 byte-to-unicode mapping used by byte-level BPE vocabularies.

GPT-2 (Radford et al. 2019, the released ``encoder.py``) stores each token of a byte-level BPE
vocabulary as printable unicode: byte values that are printable Latin-1 map to themselves, the
other 68 bytes to U+0100 upwards, in byte order. HF ``tokenizers`` (ByteLevel) and llama.cpp's
GGUF converter keep this form; Ditto's model file stores the raw bytes (docs/FORMAT.md), so the
exporters undo it with ``unicode_to_bytes``.
"""

from __future__ import annotations

from functools import lru_cache

from ditto_core.base.errors import DittoError


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """byte value 0..255 -> the single character GPT-2 uses for it."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """Inverse of ``byte_to_unicode``."""
    return {c: b for b, c in byte_to_unicode().items()}


def unicode_to_bytes(text: str, where: str = "") -> bytes:
    """Raw bytes of a GPT-2 byte-level token string, e.g. ``"Ġthe"`` -> ``b" the"``.
    Raises DittoError if a character is not in the GPT-2 byte alphabet."""
    table = unicode_to_byte()
    try:
        return bytes(table[c] for c in text)
    except KeyError as exc:
        raise DittoError(f"{where}token {text!r} has character {exc.args[0]!r} outside the "
                         f"GPT-2 byte-level alphabet") from None

