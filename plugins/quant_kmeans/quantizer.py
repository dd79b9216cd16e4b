"""The ``kmeans`` quantizer: sub-block 1-D k-means codebooks (docs/QUANT.md, FORMAT.md).

Each row of a weight matrix W [out, in] is split into sub-blocks of G consecutive weights (the
row's last sub-block is shorter when G does not divide the row); each sub-block gets a codebook
of K = 2^b centroids (kmeans1d.py) and every weight the index of its nearest centroid. Centroids
are rounded to the codebook's storage precision *before* the indices are assigned, so each
weight maps to the nearest value that is actually stored. With ``int8`` codebooks a sub-block
stores an f16 scale ``s = f16(max|c| / 127)`` and the integers ``round(c / s)`` in −127..127
(``int8_codebooks``); the stored centroid is ``s · round(c / s)``.

The component is built on the quantizer kit (``ditto_core.kit.quantkit``), which plans, checks,
streams and reports; this module supplies the matrix method (``KMeansQuantizer.quantize_matrix``,
parallel over sub-blocks in numba) and the lloyd settings as component options.
"""

from __future__ import annotations

import sys
import zlib

import attrs
import numpy as np

from ditto_core.kit import quantkit
from ditto_core.model import codebook
from ditto_core.kit.quantkit import int8_codebooks  # noqa: F401  (part of this module's API)
from ditto_core.base.errors import DittoError
from ditto_core.base.options import option
from ditto_core.base.types import CodebookTensor
from ditto_core.base.untrusted import check_finite
from ditto_core.kit.components import QuantOptions

from . import kmeans1d, kmeans1d_weighted

METHODS = {"optimal": kmeans1d.METHOD_OPTIMAL, "lloyd": kmeans1d.METHOD_LLOYD}
DEFAULT_METHOD = "optimal"

#: Lloyd settings (k-means++ restarts, iteration cap, relative SSE-decrease tolerance)
LLOYD_RESTARTS = 4
LLOYD_MAX_ITER = 100
LLOYD_TOL = 1e-6


#: A sub-block lost precision to the codebook type's range when a stored centroid is off by more
#: than this fraction of the sub-block's largest |centroid| (f16 keeps 11 significant bits for
#: |c| >= 2^-14: half an ulp is 2^-11 relative; below that, subnormals keep fewer bits and
#: |c| < 2^-25 rounds to 0). Measured against the sub-block's scale, a centroid near 0 beside
#: normal-sized ones keeps its (negligible) absolute error without being reported.
UNDERFLOW_REL = 2.0 ** -10


def underflow_report(cent: np.ndarray, cb: np.ndarray, rel: float = UNDERFLOW_REL) -> dict | None:
    """Sub-blocks whose centroids lost precision when rounded to the codebook type.

    ``cent``: float64 [rows, S, K] exact centroids; ``cb``: the stored values (float32 of the
    same shape). A sub-block is affected when some ``|cb - cent|`` exceeds ``rel`` times its
    largest ``|cent|``. Returns None when no sub-block is affected, else
    ``{"sub_blocks": n affected, "smallest_centroid": the smallest largest-|c| of the affected
    sub-blocks, "first": (row, sub-block)}``."""
    scale = np.abs(cent).max(axis=2)
    err = np.abs(cb.astype(np.float64) - cent).max(axis=2)
    bad = (scale > 0) & (err > rel * scale)
    if not bad.any():
        return None
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    return {"sub_blocks": int(bad.sum()), "smallest_centroid": float(scale[bad].min()),
            "first": first}


def underflow_warning(name: str, under: dict, codebook_type: str, rel_error: float) -> str:
    """The stderr warning for a tensor whose centroids underflow ``codebook_type``."""
    return (f"warning: tensor {name!r}: {under['sub_blocks']} sub-block(s) (first: row "
            f"{under['first'][0]}, sub-block {under['first'][1]}) have centroids as small as "
            f"{under['smallest_centroid']:.3g}, below the precision of {codebook_type} "
            f"codebooks: they are stored rounded (towards 0); tensor relative error "
            f"{rel_error:.3g}. Use --codebook-type f32 or --keep-fp32 {name} to keep them")


def check_options(options: QuantOptions) -> str:
    """Validate ``options`` (b, G, codebook type, method, ``--tensor-type`` rules); return the
    method name (``optimal`` when none is given). Raises DittoError prefixed ``kmeans:``."""
    return KMeansQuantizer().check_options(options)


def quantize_matrix(W: np.ndarray, bits: int = 4, group_size: int = 256,
                    method: str = "optimal", codebook_type: str = "f16", seed: int = 0,
                    name: str = "tensor", restarts: int = LLOYD_RESTARTS,
                    max_iter: int = LLOYD_MAX_ITER, tol: float = LLOYD_TOL,
                    importance: np.ndarray | None = None) -> CodebookTensor:
    """Quantize one matrix with sub-block codebooks.

    ``W``: float32 [rows, cols] (any float dtype is converted). Returns a CodebookTensor with
    codebooks float32 [rows, S, 2^b] (values rounded to ``codebook_type``, ascending within a
    sub-block), indices uint8 [rows, cols] (nearest stored centroid, ties to the lower index)
    and ``rel_error`` = ‖W − Ŵ‖²/‖W‖² (0 for an all-zero W). ``codebook_type="int8"`` rounds
    the centroids with ``int8_codebooks`` and also returns ``scales`` [rows, S]. Deterministic
    for any thread count.

    ``importance``: float [cols], the per-input-channel importance (mean squared activation,
    ``ditto_core.eval.calibration``): the codebooks then minimise Σ importance[c]·(W[r,c] − Ŵ[r,c])²
    per sub-block (``kmeans1d_weighted``; ``quantkit.importance_weights`` normalises it).
    None: the unweighted k-means, byte for byte.

    Raises DittoError for b/G out of range, a non-2-D W, NaN/Inf (naming ``name`` and (row,
    col)), a bad importance vector, or a centroid (int8: a scale) that overflows f16 (use
    ``codebook_type="f32"``)."""
    check_options(QuantOptions(bits=bits, group_size=group_size, method=method,
                               codebook_type=codebook_type, seed=seed))
    W = np.ascontiguousarray(W, dtype=np.float32)
    if W.ndim != 2 or W.shape[0] == 0 or W.shape[1] == 0:
        raise DittoError(f"tensor {name!r}: expected a non-empty 2-D matrix, got shape {W.shape}")
    check_finite(W, name)
    imp = None if importance is None else quantkit.importance_weights(importance, W.shape[1],
                                                                     name)
    r = sub_block_codebooks(W, bits, group_size, METHODS[method], codebook_type, seed, name,
                            restarts, max_iter, tol, imp)
    return CodebookTensor(bits=bits, group_size=group_size, codebooks=r.codebooks,
                          indices=r.indices, codebook_type=codebook_type,
                          rel_error=r.sse / r.norm2 if r.norm2 > 0 else 0.0, scales=r.scales)


def sub_block_codebooks(W, bits, group_size, method, codebook_type, seed, name,
                        restarts=LLOYD_RESTARTS, max_iter=LLOYD_MAX_ITER, tol=LLOYD_TOL,
                        importance=None) -> quantkit.StoredCodebooks:
    """The k-means codebooks of checked, finite float32 ``W`` [rows, cols]: centroids of every
    sub-block (``kmeans1d.matrix_centroids``, method id ``method``, Lloyd seed from ``seed`` and
    ``name``; with ``importance`` — float64 [cols] > 0 from ``quantkit.importance_weights`` —
    the weighted ones of ``kmeans1d_weighted.matrix_centroids_weighted``), rounded to
    ``codebook_type`` (``quantkit.round_codebooks``), then each weight's
    nearest stored centroid (``kmeans1d.assign_matrix``). Returns ``StoredCodebooks`` with
    ‖W − Ŵ‖², ‖W‖² and, when centroids lost precision to the codebook type,
    ``report["codebook_underflow"]`` (``underflow_report``), also printed on stderr
    (``underflow_warning``: the file layout, fixed before any payload, cannot change the type
    any more)."""
    rows, cols = W.shape
    k = codebook.n_centroids(bits)
    s = codebook.n_sub_blocks(cols, group_size)
    cent = np.empty((rows, s, k), np.float64)
    tseed = (int(seed) * 0x9E3779B97F4A7C15 + zlib.crc32(name.encode())) & (2**64 - 1)
    if importance is None:
        Ws = kmeans1d.sort_sub_blocks(W, group_size)
        kmeans1d.matrix_centroids(Ws, group_size, k, method, np.uint64(tseed), restarts,
                                  max_iter, tol, cent)
        del Ws
    else:
        kmeans1d_weighted.matrix_centroids_weighted(W, importance, group_size, k, method,
                                                    np.uint64(tseed), restarts, max_iter, tol,
                                                    cent)
    cb, scales = quantkit.round_codebooks(cent, codebook_type, name)  # before assignment
    if scales is None:
        under = underflow_report(cent, cb)
    else:  # int8: the grid is relative to the sub-block's largest centroid; only its f16
        # scale can underflow; a normal f16 scale is within 2 ulps (2^-9) of max|c|/127, as
        # it may be bumped one step so that no centroid clips
        amax = np.abs(cent).max(axis=-1, keepdims=True) / 127.0
        under = underflow_report(amax, scales[..., None], rel=2.0 ** -8)
    indices = np.empty((rows, cols), np.uint8)
    sse_rows, norm_rows = kmeans1d.assign_matrix(W, group_size, cb, indices)
    sse, norm2 = float(sse_rows.sum()), float(norm_rows.sum())
    report = {}
    if under is not None:
        print(underflow_warning(name, under, codebook_type, sse / norm2 if norm2 > 0 else 0.0),
              file=sys.stderr, flush=True)
        report["codebook_underflow"] = {
            **under, "codebook_type": codebook_type,
            "reason": f"centroids below {codebook_type} precision, stored rounded"}
    return quantkit.StoredCodebooks(indices, cb, scales, sse, norm2, report)


def plan_tensors(shapes, options: QuantOptions):
    """The quantize plan (``quantkit.plan_tensors`` with the default embedding rule): name →
    ("f32", None) or ("codebook", (b, G, codebook_type))."""
    return plan_with_reasons(shapes, options)[0]


def plan_with_reasons(shapes, options: QuantOptions):
    """The quantize plan and, for every tensor planned f32, why (``quantkit.plan_tensors``:
    ``--tensor-type`` rules, ``keep_fp32`` globs, the embedding rule, the size guard).

    ``shapes``: name → shape. Returns ``(plan, reasons)``: ``plan[name]`` is ("f32", None) for
    vectors (reason "vector"), names a rule keeps f32 (reason "GLOB=f32"), names matching a
    ``keep_fp32`` glob (reason "keep_fp32 <glob>"), and matrices whose CODEBOOK payload would
    take at least the bytes of f32 (``ditto_core.model.codebook.saves_space``; reason
    ``REASON_CODEBOOK_LARGER`` — e.g. rows of 16 at b = 6: 64 centroids per 16 weights);
    ("codebook", (b', G', codebook_type)) for the embedding/classifier with b' = min(8, b + 2),
    G' = max(G, cols); for a V projection under GQA >= 4 with b' = min(8, b + 1)
    (``quantkit.ATTN_V_RULE``); else ("codebook", (b, G, codebook_type)) as a rule or the
    options say.
    ``reasons[name]`` is a dict {``reason``, and for the size rule ``codebook_bytes``,
    ``f32_bytes``, ``bits``, ``group_size``}."""
    plan, why = quantkit.plan_tensors(shapes, options, quantkit.parse_rules(options.tensor_types))
    reasons = {n: {k: v for k, v in r.items() if k != "rule"} for n, r in why.items()
               if plan[n][0] == "f32"}
    return plan, reasons


class KMeansQuantizer(quantkit.CodebookQuantizer):
    """Quantizer component ``kmeans`` (methods ``optimal`` — default — and ``lloyd``) on the
    quantizer kit: the kit plans (default embedding rule), checks, streams and reports; the
    per-tensor report adds ``codebook_underflow`` where centroids lost precision."""

    name = "kmeans"
    methods = tuple(METHODS)

    @attrs.frozen
    class Options:
        """``-O kmeans.KEY=VALUE``: settings of the ``lloyd`` method (docs/QUANT.md)."""

        lloyd_restarts: int = option(LLOYD_RESTARTS, "k-means++ restarts per sub-block "
                                     "(lloyd)", validator=attrs.validators.ge(1))
        lloyd_max_iter: int = option(LLOYD_MAX_ITER, "iteration cap per restart (lloyd)",
                                     validator=attrs.validators.ge(1))
        lloyd_tol: float = option(LLOYD_TOL, "stop when the SSE falls by less than this "
                                  "fraction (lloyd)", validator=attrs.validators.ge(0.0))

    def __init__(self, options: "KMeansQuantizer.Options | None" = None):
        self.options = options if options is not None else self.Options()

    def with_options(self, options: "KMeansQuantizer.Options") -> "KMeansQuantizer":
        """A copy of this quantizer configured with ``options``."""
        return KMeansQuantizer(options)

    def quantize_matrix(self, weights, bits, group_size, options: quantkit.MatrixOptions
                        ) -> quantkit.StoredCodebooks:
        """The kit's matrix hook: ``sub_block_codebooks`` with the method and importance of
        ``options`` and the lloyd settings of this component's options."""
        o = self.options
        return sub_block_codebooks(weights, bits, group_size, METHODS[options.method],
                                   options.codebook_type, options.seed, options.tensor,
                                   o.lloyd_restarts, o.lloyd_max_iter, o.lloyd_tol,
                                   options.importance)
