"""Importance files: per-input-channel activation statistics of every linear layer, as the
quantizer kit reads them (docs/QUANT.md "Activation-aware codebooks").

For a linear layer y = W x the importance of input channel c is the mean of x_c² over the
calibration tokens (the diagonal of XᵀX / T, the statistic llama.cpp's ``llama-imatrix``
stores). ``ditto_core.eval.calibration`` computes it by running the fp32 model; this module only
reads, writes and normalises it, so a quantizer plugin can use an importance file without
loading the calibration's model-running code (torch, the evaluation harness).

Importance file (``.npz``, written by ``save_importance``): one float64 [in_features] array per
Ditto tensor name, plus ``__meta__``, a JSON string: ``format`` ("ditto-importance"),
``version`` 1, ``statistic``, ``calibration`` {name, bytes, sha256}, ``model_sha256``,
``tokens``, ``chunks``, ``n_ctx``.
"""

from __future__ import annotations

import functools
import json
import os
import zipfile
from pathlib import Path

import attrs
import numpy as np

from ditto_core.base.errors import DittoError

FORMAT = "ditto-importance"
VERSION = 1
STATISTIC = "mean squared activation per input channel (diag of X^T X / tokens)"

#: Importances are divided by their tensor's mean; anything below this (a channel the calibration
#: text never activated) counts as this, so every weight keeps a positive weight in the k-means.
IMPORTANCE_FLOOR = 1e-6


@attrs.frozen
class Importance:
    """Per-tensor importance vectors (name → float64 [in_features]) and where they came from
    (``meta``: see the module docstring)."""

    vectors: dict
    meta: dict


def save_importance(imp: Importance, path: Path) -> None:
    """Write ``imp`` as an ``.npz`` importance file (module docstring), atomically. Raises
    DittoError naming the file when it cannot be written."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.npz")
    try:
        np.savez(tmp, __meta__=np.array(json.dumps(imp.meta, sort_keys=True)),
                 **{n: np.asarray(v, np.float64) for n, v in sorted(imp.vectors.items())})
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise DittoError(f"{path}: cannot write the importance file: "
                         f"{exc.strerror or exc}") from None


def load_importance(path) -> Importance:
    """Read an importance file (read once per path, size and modification time). Raises
    DittoError naming the file when it is not a ``ditto-importance`` .npz, or a vector is not
    a finite, non-negative 1-D float array."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise DittoError(f"{path}: cannot read the importance file: "
                         f"{exc.strerror or exc}") from None
    return _load(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _load(path: str, _size: int, _mtime: int) -> Importance:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"PK\x03\x04":  # np.load would read other bytes as .npy or pickle
            raise DittoError(f"{path}: not an importance file (.npz): not a zip archive "
                             "(`ditto calibrate` writes them)")
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise DittoError(f"{path}: not an importance file (.npz): {exc}") from None
    try:
        meta = json.loads(str(data.pop("__meta__")))
        ok = isinstance(meta, dict) and meta.get("format") == FORMAT
    except (KeyError, ValueError):
        ok = False
    if not ok:
        raise DittoError(f"{path}: not a Ditto importance file (no '__meta__' with format "
                         f"{FORMAT!r}); make one with `ditto calibrate`")
    if meta.get("version") != VERSION:
        raise DittoError(f"{path}: importance file version {meta.get('version')!r}, this Ditto "
                         f"reads version {VERSION}")
    for name, v in data.items():
        if v.ndim != 1 or v.dtype.kind != "f" or not np.isfinite(v).all() or (v < 0).any():
            raise DittoError(f"{path}: importance of {name!r} must be a finite, non-negative "
                             f"1-D float array (got {v.dtype}{list(v.shape)})")
    return Importance({n: v.astype(np.float64) for n, v in data.items()}, meta)


def importance_sha256(path) -> str:
    """SHA-256 of an importance file's bytes (its identity in cache keys and build.json)."""
    from ditto_core.base.cache import file_hash

    return file_hash(Path(path))


def importance_record(path) -> dict:
    """What build.json records of the importance file ``path``: ``path``, ``sha256``, and its
    ``calibration`` {name, bytes, sha256}, ``model_sha256``, ``tokens``, ``chunks``,
    ``statistic``. Raises DittoError for a bad file (``load_importance``)."""
    imp = load_importance(path)
    return {"path": str(path), "sha256": importance_sha256(path),
            **{k: imp.meta.get(k) for k in ("calibration", "model_sha256", "tokens", "chunks",
                                            "statistic")}}


def importance_weights(importance, cols: int, name: str = "tensor") -> np.ndarray:
    """Per-column k-means weights from a tensor's importance vector (mean squared activation
    per input channel): float64 [cols], divided by its mean and floored at
    ``IMPORTANCE_FLOOR`` (so all > 0; a vector of ones stays ones exactly). Raises DittoError
    naming the tensor for a wrong length, a negative or non-finite value, or an all-zero
    vector."""
    a = np.asarray(importance, dtype=np.float64)
    if a.shape != (cols,):
        raise DittoError(f"tensor {name!r}: importance has shape {list(a.shape)}, expected "
                         f"[{cols}] (one value per input channel)")
    if not np.isfinite(a).all() or (a < 0).any():
        raise DittoError(f"tensor {name!r}: importance values must be finite and >= 0")
    mean = a.mean()
    if mean <= 0:
        raise DittoError(f"tensor {name!r}: importance is all zero")
    return np.maximum(a / mean, IMPORTANCE_FLOOR)


def tensor_importance(options, name: str, cols: int) -> np.ndarray | None:
    """The k-means weights of tensor ``name`` (``importance_weights``) from the importance
    file ``options.importance`` (``options``: a QuantOptions; the file is read once,
    ``load_importance``), or None when no file is given or it has no vector for this tensor.
    Raises DittoError for a bad file or vector."""
    path = getattr(options, "importance", None)
    if not path:
        return None
    vec = load_importance(path).vectors.get(name)
    if vec is None:
        return None
    try:
        return importance_weights(vec, cols, name)
    except DittoError as exc:  # most likely the file of another model: name it
        raise DittoError(f"{path}: {exc} (an importance file is made for one model by "
                         "`ditto calibrate`)") from None
