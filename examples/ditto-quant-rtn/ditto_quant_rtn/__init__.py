"""Example third-party Ditto plugin: the ``rtn`` quantizer.

Uniform asymmetric round-to-nearest (RTN) per group of G consecutive weights of a row, with one
scale and one minimum per group, as GGUF's Q4_1 does for G = 32 (ggml-quants.c,
``quantize_row_q4_1_ref``): ``scale = (max − min) / (2^b − 1)``,
``q = clamp(round((w − min) / scale), 0, 2^b − 1)``, ``ŵ = min + scale · q``.

The result is a ``CodebookTensor`` whose codebook for each sub-block is the uniform grid
``min + scale · [0, 1, …, 2^b − 1]`` rounded to the requested codebook type, so Ditto packs
and runs it exactly like a k-means codebook. The quantizer component is built on Ditto's
quantizer kit (``ditto_core.quantkit``). This package imports only ``ditto_core``.
"""

from __future__ import annotations

import numpy as np

from ditto_core.errors import DittoError
from ditto_core.hookspecs import hookimpl
from ditto_core.quantkit import CodebookQuantizer
from ditto_core.types import CodebookTensor

_CB_NP = {"f16": np.float16, "f32": np.float32}


def rtn_matrix(W: np.ndarray, bits: int = 4, group_size: int = 256,
               codebook_type: str = "f16", name: str = "tensor") -> CodebookTensor:
    """Round-to-nearest quantization of ``W`` (float32 [rows, cols]) per sub-block of
    ``group_size`` weights of a row (the row's tail sub-block may be shorter).

    Returns a CodebookTensor: codebooks float32 [rows, S, 2^b] (the uniform grid, rounded to
    ``codebook_type``), indices uint8 [rows, cols], ``rel_error`` = ‖W − Ŵ‖²/‖W‖² measured
    against the stored (rounded) grid. Raises DittoError for b outside 1..8, G < 2, a bad
    codebook type, or NaN/Inf (naming ``name`` and (row, col))."""
    if not isinstance(bits, (int, np.integer)) or not 1 <= bits <= 8:
        raise DittoError(f"rtn: bit width b must be in 1..8, got {bits!r}")
    if not isinstance(group_size, (int, np.integer)) or group_size < 2:
        raise DittoError(f"rtn: group size G must be >= 2, got {group_size!r}")
    if codebook_type not in _CB_NP:
        raise DittoError(f"rtn: codebook type must be 'f16' or 'f32', got {codebook_type!r}")
    W = np.ascontiguousarray(W, dtype=np.float32)
    if W.ndim != 2:
        raise DittoError(f"tensor {name!r}: expected a 2-D matrix, got shape {W.shape}")
    bad = ~np.isfinite(W)
    if bad.any():
        r, c = (int(i) for i in np.argwhere(bad)[0])
        raise DittoError(f"tensor {name!r} has a non-finite value {W[r, c]} at (row, col) = "
                         f"({r}, {c})")
    rows, cols = W.shape
    k = 1 << bits
    s_count = -(-cols // group_size)
    grid = np.arange(k, dtype=np.float64)
    codebooks = np.empty((rows, s_count, k), np.float32)
    indices = np.empty((rows, cols), np.uint8)
    sse = 0.0
    for s in range(s_count):
        a, b = s * group_size, min((s + 1) * group_size, cols)
        x = W[:, a:b].astype(np.float64)
        lo = x.min(axis=1, keepdims=True)
        hi = x.max(axis=1, keepdims=True)
        scale = (hi - lo) / (k - 1)
        safe = np.where(scale > 0, scale, 1.0)
        q = np.clip(np.rint((x - lo) / safe), 0, k - 1)
        q[(scale == 0)[:, 0]] = 0
        with np.errstate(over="ignore"):
            cb = (lo + scale * grid[None, :]).astype(_CB_NP[codebook_type]).astype(np.float32)
        if not np.isfinite(cb).all():
            raise DittoError(f"tensor {name!r}: the grid of sub-block {s} overflows "
                             f"{codebook_type}; use --codebook-type f32")
        codebooks[:, s] = cb
        indices[:, a:b] = q.astype(np.uint8)
        rec = np.take_along_axis(cb.astype(np.float64), q.astype(np.intp), axis=1)
        sse += float(((x - rec) ** 2).sum())
    norm2 = float((W.astype(np.float64) ** 2).sum())
    return CodebookTensor(bits=bits, group_size=group_size, codebooks=codebooks,
                          indices=indices, codebook_type=codebook_type,
                          rel_error=sse / norm2 if norm2 > 0 else 0.0)


class RTNQuantizer(CodebookQuantizer):
    """Quantizer component ``rtn`` on Ditto's quantizer kit (``ditto_core.quantkit``): the kit
    plans (vectors, ``--tensor-type`` rules, ``--keep-fp32`` globs and matrices whose codebooks
    would not be smaller than f32 stay f32; no embedding rule: every matrix gets the same b and
    G), checks finiteness, streams, rounds the grid to the codebook type (f16, f32 or int8)
    and reports; ``quantize_matrix`` is ``rtn_matrix``'s grid and indices."""

    name = "rtn"
    methods = ("rtn",)
    embedding_extra_bits = None

    def quantize_matrix(self, weights, bits, group_size, options):
        q = rtn_matrix(weights, bits, group_size, "f32", options.tensor)
        return q.indices, q.codebooks


@hookimpl
def register_quantizers(register):
    register(RTNQuantizer())
