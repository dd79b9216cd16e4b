"""Example third-party Ditto plugin: the ``rtn`` quantizer.

Uniform asymmetric round-to-nearest (RTN) per group of G consecutive weights of a row, with one
scale and one minimum per group, as GGUF's Q4_1 does for G = 32 (ggml-quants.c,
``quantize_row_q4_1_ref``): ``scale = (max − min) / (2^b − 1)``,
``q = clamp(round((w − min) / scale), 0, 2^b − 1)``, ``ŵ = min + scale · q``.

The result is a ``CodebookTensor`` whose codebook for each sub-block is the uniform grid
``min + scale · [0, 1, …, 2^b − 1]`` rounded to the requested codebook type, so Ditto packs
and runs it exactly like a k-means codebook. The quantizer component is built on Ditto's
quantizer kit (``ditto_core.kit.quantkit``). This package imports only ``ditto_core``.
"""

from __future__ import annotations

import numpy as np

from ditto_core.base.errors import DittoError
from ditto_core.base.types import CodebookTensor
from ditto_core.base.untrusted import check_finite
from ditto_core.kit.hookspecs import hookimpl
from ditto_core.kit.quantkit import CodebookQuantizer, round_codebooks
from ditto_core.model import codebook


def rtn_matrix(W: np.ndarray, bits: int = 4, group_size: int = 256,
               codebook_type: str = "f16", name: str = "tensor") -> CodebookTensor:
    """Round-to-nearest quantization of ``W`` (float32 [rows, cols]) per sub-block of
    ``group_size`` weights of a row (the row's tail sub-block may be shorter).

    Returns a CodebookTensor: codebooks float32 [rows, S, 2^b] (the uniform grid, rounded to
    ``codebook_type`` with ``quantkit.round_codebooks``; int8 also gives ``scales``), indices
    uint8 [rows, cols], ``rel_error`` = ‖W − Ŵ‖²/‖W‖² measured against the stored (rounded)
    grid. Raises DittoError for b, G or codebook type outside what the model file stores
    (``codebook.check_params``), or NaN/Inf (naming ``name`` and (row, col))."""
    try:
        codebook.check_params(bits, group_size, codebook_type)
    except DittoError as exc:
        raise DittoError(f"rtn: {exc}") from None
    W = np.ascontiguousarray(W, dtype=np.float32)
    if W.ndim != 2:
        raise DittoError(f"tensor {name!r}: expected a 2-D matrix, got shape {W.shape}")
    check_finite(W, name)
    rows, cols = W.shape
    k = codebook.n_centroids(bits)
    s_count = codebook.n_sub_blocks(cols, group_size)
    grid = np.arange(k, dtype=np.float64)
    cent = np.empty((rows, s_count, k), np.float64)
    indices = np.empty((rows, cols), np.uint8)
    for s in range(s_count):
        a, b = s * group_size, min((s + 1) * group_size, cols)
        x = W[:, a:b].astype(np.float64)
        lo = x.min(axis=1, keepdims=True)
        scale = (x.max(axis=1, keepdims=True) - lo) / (k - 1)
        q = np.clip(np.rint((x - lo) / np.where(scale > 0, scale, 1.0)), 0, k - 1)
        q[(scale == 0)[:, 0]] = 0
        cent[:, s] = lo + scale * grid[None, :]
        indices[:, a:b] = q.astype(np.uint8)
    codebooks, scales = round_codebooks(cent, codebook_type, name)
    sub = np.arange(cols) // group_size
    rec = codebooks.astype(np.float64)[np.arange(rows)[:, None], sub[None, :], indices]
    sse = float(((W.astype(np.float64) - rec) ** 2).sum())
    norm2 = float((W.astype(np.float64) ** 2).sum())
    return CodebookTensor(bits=bits, group_size=group_size, codebooks=codebooks,
                          indices=indices, codebook_type=codebook_type,
                          rel_error=sse / norm2 if norm2 > 0 else 0.0, scales=scales)


class RTNQuantizer(CodebookQuantizer):
    """Quantizer component ``rtn`` on Ditto's quantizer kit (``ditto_core.kit.quantkit``): the kit
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
