"""Typed, range-checked reads of untrusted metadata: GGUF key/value pairs, HF config.json and
tokenizer JSON (docs/INPUTS.md). The one place where a value read from a model file becomes a
Python int/float/str/bool/list Ditto computes with.

Every failure is a DittoError ``<file>: <key> ...: <problem>, found <value> (<type>)``, so a
malformed file never ends in a TypeError, ZeroDivisionError or OverflowError further on.
Integers are Python ints (never bool); floats accept ints and must be finite unless said
otherwise; a float that the model file stores as float32 is checked to fit one.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .errors import DittoError

_MISSING = object()
#: Largest finite float32 (values above overflow when the model file stores them).
F32_MAX = 3.4028234663852886e38
#: Upper bound of every count/size field (the model file stores u32).
U32_MAX = 2**32 - 1


def _show(v: Any) -> str:
    r = repr(v)
    if len(r) > 60:
        r = r[:57] + "..."
    return f"{r} ({type(v).__name__})"


class Fields:
    """Checked access to one metadata mapping ``data`` read from file ``where``; ``kind`` is
    the word used in messages ("key" for GGUF and config.json)."""

    def __init__(self, data: Any, where: str, kind: str = "key", what: str = "metadata"):
        if not isinstance(data, Mapping):
            raise DittoError(f"{where}: the {what} must be a JSON object, found "
                             f"{type(data).__name__}")
        self.data, self.where, self.kind = data, where, kind

    def fail(self, key: str, problem: str, value: Any = _MISSING):
        found = "" if value is _MISSING else f", found {_show(value)}"
        raise DittoError(f"{self.where}: {self.kind} {key!r} {problem}{found}")

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The raw value of ``key``; a missing (or JSON null) key gives ``default`` or, with
        no default, DittoError 'missing'."""
        v = self.data.get(key)
        if v is None:
            if default is _MISSING:
                self.fail(key, "is missing")
            return default
        return v

    def int(self, key: str, default: Any = _MISSING, lo: int = 1, hi: int = U32_MAX) -> int:
        """An integer in [lo, hi] (default: a positive u32)."""
        v = self.get(key, default)
        if v is default and default is not _MISSING:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(key, f"must be an integer in [{lo}, {hi}]", v)
        if not lo <= v <= hi:
            self.fail(key, f"must be an integer in [{lo}, {hi}]", v)
        return int(v)

    def float(self, key: str, default: Any = _MISSING, lo: float = -F32_MAX,
              hi: float = F32_MAX, positive: bool = False) -> float:
        """A finite number in [lo, hi] (``positive``: also > 0); ints are accepted."""
        v = self.get(key, default)
        if v is default and default is not _MISSING:
            return v
        want = (f"must be a finite number > 0 (at most {hi:g})" if positive and lo <= 0 else
                f"must be a finite number in [{lo:g}, {hi:g}]")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.fail(key, want, v)
        f = float(v) if abs(v) < 1e308 or isinstance(v, float) else math.inf
        if not math.isfinite(f) or not lo <= f <= hi or (positive and f <= 0):
            self.fail(key, want, v)
        return f

    def _typed(self, key: str, default: Any, types, problem: str) -> Any:
        v = self.get(key, default)
        if v is default and default is not _MISSING:
            return v
        if not isinstance(v, types):
            self.fail(key, problem, v)
        return v

    def str(self, key: str, default: Any = _MISSING) -> str:
        return self._typed(key, default, str, "must be a string")

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        return self._typed(key, default, bool, "must be true or false")

    def mapping(self, key: str, default: Any = _MISSING) -> Mapping:
        return self._typed(key, default, Mapping, "must be an object")

    def list(self, key: str, item: type | tuple, default: Any = _MISSING,
             lo: float | None = None, hi: float | None = None, finite: bool = False) -> list:
        """A list whose items are all of type ``item`` (bool is never an int), with numeric
        items in [lo, hi] and finite when asked. The message names the first bad index."""
        v = self.get(key, default)
        if v is default and default is not _MISSING:
            return v
        if not isinstance(v, (list, tuple)):
            self.fail(key, "must be an array", v)
        names = item.__name__ if isinstance(item, type) else "/".join(t.__name__ for t in item)
        for i, x in enumerate(v):
            bad = (isinstance(x, bool) and bool not in (item if isinstance(item, tuple)
                                                        else (item,))) \
                or not isinstance(x, item)
            if not bad and (lo is not None or hi is not None or finite):
                bad = (finite and not math.isfinite(x)) or (lo is not None and x < lo) \
                    or (hi is not None and x > hi)
            if bad:
                rng = f" in [{lo}, {hi}]" if lo is not None or hi is not None else ""
                self.fail(key, f"must be an array of {names}{rng}; item {i} is {_show(x)}")
        return list(v)


def check_finite(W, name: str, where: str | None = None) -> None:
    """Raise DittoError naming ``where`` (a file, optional), tensor ``name`` and the (row, col)
    (or position) of the first NaN/Inf in the array ``W``: a model with a non-finite weight
    computes NaN logits (every token 0), so no stage accepts one."""
    import numpy as np

    bad = ~np.isfinite(W)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        at = f"(row, col) = {pos}" if len(pos) == 2 else f"position {pos}"
        prefix = f"{where}: " if where else ""
        raise DittoError(f"{prefix}tensor {name!r} has a non-finite value {W[pos]} at {at}")
