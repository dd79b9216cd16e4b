"""The ``kmeans`` quantizer: sub-block 1-D k-means codebooks (docs/QUANT.md, FORMAT.md).

Each row of a weight matrix W [out, in] is split into sub-blocks of G consecutive weights (the
row's last sub-block is shorter when G does not divide the row); each sub-block gets a codebook
of K = 2^b centroids (kmeans1d.py) and every weight the index of its nearest centroid. Centroids
are rounded to the codebook's storage precision (f16 by default) *before* the indices are
assigned, so each weight maps to the nearest value that is actually stored. With ``int8``
codebooks a sub-block stores an f16 scale ``s = f16(max|c| / 127)`` and the integers
``round(c / s)`` in −127..127 (``int8_codebooks``); the stored centroid is ``s · round(c / s)``.
"""

from __future__ import annotations

import sys
import time
import zlib

import attrs
import numpy as np

from ditto_core import format as F
from ditto_core import quantkit
from ditto_core.quantkit import int8_codebooks  # noqa: F401  (part of this module's API)
from ditto_core.components import QuantOptions
from ditto_core.errors import DittoError
from ditto_core.untrusted import check_finite
from ditto_core.options import option
from ditto_core.types import Checkpoint, CodebookTensor, QuantizedModel

from . import kmeans1d

METHODS = {"optimal": kmeans1d.METHOD_OPTIMAL, "lloyd": kmeans1d.METHOD_LLOYD}
DEFAULT_METHOD = "optimal"

#: Lloyd settings (k-means++ restarts, iteration cap, relative SSE-decrease tolerance)
LLOYD_RESTARTS = 4
LLOYD_MAX_ITER = 100
LLOYD_TOL = 1e-6

#: tensors kept in f32 by default, on top of ``--keep-fp32`` (norms are always f32)
DEFAULT_KEEP_FP32: tuple[str, ...] = ()

#: The embedding and the classifier (tied in SmolLM2) are quantized with this many more bits
#: than the other matrices (capped at 8), with one codebook per row (group size max(G, cols)),
#: same codebook type. docs/QUANT.md "Default policy": on SmolLM2 at b = 4 (rows of 576) this
#: takes the next-token KL divergence from 0.608 (embedding at b = 4, G = 256) to 0.256, against
#: 0.250 with the embedding in f32, at 7.78 bpw; b + 2 at G = 256 gave
#: 0.252 at 11.33 bpw (its 64-weight tail sub-block carries 64 centroids), b + 1 at G = 256
#: 0.266 at 7.67 bpw.
EMBEDDING_EXTRA_BITS = 2
EMBEDDING_NAMES = ("token_embd.weight", "output.weight")

CODEBOOK_TYPES = tuple(sorted(F.CODEBOOK_TYPES))  # the types the model file stores


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
    """Validate ``options``; return the method name. Raises DittoError for b outside 1..8,
    G < 2, an unknown codebook type or method."""
    try:
        quantkit.check_params(options.bits, options.group_size, options.codebook_type)
        quantkit.parse_rules(options.tensor_types)
    except DittoError as exc:
        raise DittoError(f"kmeans: {exc}") from None
    method = options.method or DEFAULT_METHOD
    if method not in METHODS:
        raise DittoError(f"kmeans: unknown method {method!r}; choose one of "
                         f"{', '.join(METHODS)}")
    return method


def quantize_matrix(W: np.ndarray, bits: int = 4, group_size: int = 256,
                    method: str = "optimal", codebook_type: str = "f16", seed: int = 0,
                    name: str = "tensor", restarts: int = LLOYD_RESTARTS,
                    max_iter: int = LLOYD_MAX_ITER, tol: float = LLOYD_TOL) -> CodebookTensor:
    """Quantize one matrix with sub-block codebooks.

    ``W``: float32 [rows, cols] (any float dtype is converted). Returns a CodebookTensor with
    codebooks float32 [rows, S, 2^b] (values rounded to ``codebook_type``, ascending within a
    sub-block), indices uint8 [rows, cols] (nearest stored centroid, ties to the lower index)
    and ``rel_error`` = ‖W − Ŵ‖²/‖W‖² (0 for an all-zero W). ``codebook_type="int8"`` rounds
    the centroids with ``int8_codebooks`` and also returns ``scales`` [rows, S]. Deterministic
    for any thread count.

    Raises DittoError for b/G out of range, a non-2-D W, NaN/Inf (naming ``name`` and (row,
    col)), or a centroid (int8: a scale) that overflows f16 (use ``codebook_type="f32"``)."""
    return _quantize(W, bits, group_size, method, codebook_type, seed, name, restarts,
                     max_iter, tol)[0]


def _quantize(W, bits, group_size, method, codebook_type, seed, name,
              restarts=LLOYD_RESTARTS, max_iter=LLOYD_MAX_ITER, tol=LLOYD_TOL):
    """``quantize_matrix`` returning (CodebookTensor, ‖W − Ŵ‖², ‖W‖², underflow_report or
    None). A centroid that underflows the codebook type prints ``underflow_warning`` on
    stderr (the file layout, fixed before any payload, cannot change the type any more)."""
    opts = QuantOptions(bits=bits, group_size=group_size, method=method,
                        codebook_type=codebook_type, seed=seed)
    check_options(opts)
    W = np.ascontiguousarray(W, dtype=np.float32)
    if W.ndim != 2 or W.shape[0] == 0 or W.shape[1] == 0:
        raise DittoError(f"tensor {name!r}: expected a non-empty 2-D matrix, got shape {W.shape}")
    check_finite(W, name)
    rows, cols = W.shape
    k = 1 << bits
    s = -(-cols // group_size)
    cent = np.empty((rows, s, k), np.float64)
    tseed = (int(seed) * 0x9E3779B97F4A7C15 + zlib.crc32(name.encode())) & (2**64 - 1)
    Ws = kmeans1d.sort_sub_blocks(W, group_size)
    kmeans1d.matrix_centroids(Ws, group_size, k, METHODS[method], np.uint64(tseed), restarts,
                              max_iter, tol, cent)
    del Ws
    cb, scales = quantkit.round_codebooks(cent, codebook_type, name)  # before assignment
    if scales is None:
        under = underflow_report(cent, cb)
    else:  # int8: the grid is relative to the sub-block's largest centroid; only its f16
        # scale can underflow; a normal f16 scale is within 2 ulps (2^-9) of max|c|/127, as
        # it may be bumped one step so that no centroid clips
        amax = np.abs(cent).max(axis=-1, keepdims=True) / 127.0
        under = underflow_report(amax, scales[..., None], rel=2.0 ** -8)
    indices = np.empty((rows, cols), np.uint8)
    sse_rows, norm_rows = kmeans1d.assign_nearest(W, group_size, cb, indices)
    err = float(sse_rows.sum())
    norm2 = float(norm_rows.sum())
    rel = err / norm2 if norm2 > 0 else 0.0
    if under is not None:
        print(underflow_warning(name, under, codebook_type, rel), file=sys.stderr, flush=True)
    return CodebookTensor(bits=bits, group_size=group_size, codebooks=cb, indices=indices,
                          codebook_type=codebook_type, rel_error=rel, scales=scales), err, norm2, \
        under


def embedding_bits(bits: int, extra: int = EMBEDDING_EXTRA_BITS) -> int:
    """Bit width of token_embd/output (the default policy): ``min(8, b + extra)``."""
    return min(8, bits + extra)


def embedding_group_size(group_size: int, cols: int) -> int:
    """Group size of token_embd/output (the default policy): ``max(G, cols)``, i.e. one
    codebook per row, so a row's tail sub-block never carries 2^b' centroids for a few
    weights (docs/QUANT.md)."""
    return max(int(group_size), int(cols))


def plan_tensors(shapes, options: QuantOptions, default_keep=DEFAULT_KEEP_FP32,
                 embedding_extra_bits: int = EMBEDDING_EXTRA_BITS):
    """The quantize plan: name → ("f32", None) or ("codebook", (b, G, codebook_type)); see
    ``plan_with_reasons`` (this is its plan alone)."""
    return plan_with_reasons(shapes, options, default_keep, embedding_extra_bits)[0]


def plan_with_reasons(shapes, options: QuantOptions, default_keep=DEFAULT_KEEP_FP32,
                      embedding_extra_bits: int = EMBEDDING_EXTRA_BITS):
    """The quantize plan and, for every tensor planned f32, why (``quantkit.plan_tensors``:
    ``--tensor-type`` rules, ``keep_fp32`` and ``default_keep`` globs, the embedding rule with
    ``embedding_extra_bits``, the size guard).

    ``shapes``: name → shape. Returns ``(plan, reasons)``: ``plan[name]`` is ("f32", None) for
    vectors (reason "vector"), names a rule keeps f32 (reason "GLOB=f32"), names matching a
    ``keep_fp32`` glob (reason "keep_fp32 <glob>"), and matrices whose CODEBOOK payload would
    take at least the bytes of f32 (``ditto_core.modelfile.codebook_saves_space``; reason
    ``REASON_CODEBOOK_LARGER`` — e.g. rows of 16 at b = 6: 64 centroids per 16 weights);
    ("codebook", (b', G', codebook_type)) for the embedding/classifier with b' =
    ``embedding_bits(b)``, G' = ``embedding_group_size(G, cols)``; else ("codebook", (b, G,
    codebook_type)) as a rule or the options say. ``reasons[name]`` is a dict {``reason``, and
    for the size rule ``codebook_bytes``, ``f32_bytes``, ``bits``, ``group_size``}."""
    plan, why = quantkit.plan_tensors(
        shapes, attrs.evolve(options, keep_fp32=tuple(options.keep_fp32) + tuple(default_keep)),
        quantkit.parse_rules(options.tensor_types), embedding_extra_bits)
    reasons = {n: {k: v for k, v in r.items() if k != "rule"} for n, r in why.items()
               if plan[n][0] == "f32"}
    return plan, reasons


class KMeansQuantizer:
    """Quantizer component ``kmeans`` (methods ``optimal`` — default — and ``lloyd``)."""

    name = "kmeans"

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

    def check_options(self, options: QuantOptions) -> str:
        """Validate b, G, codebook type and method without a checkpoint (a pipeline may call
        this before exporting); return the resolved method. Raises DittoError."""
        return check_options(options)

    def quantize(self, checkpoint: Checkpoint, options: QuantOptions) -> QuantizedModel:
        """Plan every tensor now; quantize lazily, one tensor at a time, as the packer pulls.

        ``report``: ``quantizer``, ``method`` (the resolved one: ``optimal`` when none was
        given), ``bits``, ``embedding_bits``, ``group_size``, ``codebook_type``; per tensor
        planned f32, at once, ``{encoding: "f32", reason, ...}`` (``plan_with_reasons``); per
        quantized tensor, as it is produced, ``{encoding, bits, rel_error, sse, norm2,
        seconds}``; and running totals ``total_rel_error`` (Σ‖W−Ŵ‖² / Σ‖W‖² over quantized
        tensors), ``quantized_weights``, ``seconds``. Raises DittoError for bad options (now)
        and for non-finite weights (when the tensor is reached)."""
        method = check_options(options)  # before any tensor is touched
        plan, reasons = plan_with_reasons(checkpoint.shapes, options)
        rules = quantkit.plan_tensors(checkpoint.shapes, options,
                                      quantkit.parse_rules(options.tensor_types))[1]
        report = {"quantizer": self.name, "method": method, "bits": options.bits,
                  "rules": list(options.tensor_types),
                  "embedding_bits": embedding_bits(options.bits),
                  "group_size": options.group_size, "codebook_type": options.codebook_type,
                  "tensors": {n: {"encoding": "f32", **r} for n, r in reasons.items()},
                  "total_rel_error": 0.0, "quantized_weights": 0, "seconds": 0.0}
        totals = {"sse": 0.0, "norm2": 0.0}

        def tensors():
            for name, (encoding, params) in plan.items():
                W = np.ascontiguousarray(checkpoint.tensors[name](), dtype=np.float32)
                if encoding == "f32":
                    check_finite(W, name)
                    yield name, W
                    continue
                t0 = time.perf_counter()
                bits, group_size, cb_type = params
                lloyd = self.options
                q, sse, norm2, under = _quantize(W, bits, group_size, method, cb_type,
                                                 options.seed, name, lloyd.lloyd_restarts,
                                                 lloyd.lloyd_max_iter, lloyd.lloyd_tol)
                dt = time.perf_counter() - t0
                totals["sse"] += sse
                totals["norm2"] += norm2
                report["tensors"][name] = {"encoding": "codebook", "bits": bits,
                                           "group_size": group_size,
                                           "rule": rules[name]["rule"],
                                           "rel_error": q.rel_error,
                                           "sse": sse, "norm2": norm2, "seconds": dt}
                if under is not None:
                    report["tensors"][name]["codebook_underflow"] = {
                        **under, "codebook_type": cb_type,
                        "reason": f"centroids below {cb_type} precision, stored rounded"}
                report["quantized_weights"] += W.size
                report["seconds"] += dt
                report["total_rel_error"] = (totals["sse"] / totals["norm2"]
                                             if totals["norm2"] > 0 else 0.0)
                del W  # not held while the packer encodes q and the next tensor loads
                yield name, q

        return QuantizedModel(config=checkpoint.config, tokenizer=checkpoint.tokenizer,
                              plan=plan, shapes=dict(checkpoint.shapes), tensors=tensors,
                              report=report)
