"""The quantizer kit: everything a sub-block codebook quantizer needs except its own matrix
method, so a new quantizer is one function (docs/PLUGINS.md "Quantizer kit").

A quantizer subclasses ``CodebookQuantizer`` and supplies

    quantize_matrix(weights, bits, group_size, options) -> (indices, codebooks)

with ``weights`` float32 [rows, cols] (finite), ``indices`` uint8 [rows, cols] (each < 2^b,
weight j of a row belongs to sub-block j // G) and ``codebooks`` float [rows · S, 2^b] or
[rows, S, 2^b] (S = ceil(cols / G); sub-block s of row r is row r · S + s). The kit does the
rest, the same way for every quantizer:

- planning: vectors stay f32; ``--tensor-type GLOB=SPEC`` rules (first match wins; ``f32``, or
  ``bN``, ``GN``, ``cb:TYPE`` separated by commas), ``--keep-fp32`` globs, then the default
  embedding rule (``token_embd.weight``/``output.weight``: b + 2 bits, one codebook per row;
  docs/QUANT.md "Default policy") and attn_v rule (b + 1 under GQA >= 4), then (b, G) from
  the options; the size guard keeps f32 any
  matrix whose codebook payload would not be smaller than f32 (``codebook.saves_space``);
- finiteness checks (naming tensor and (row, col)), streaming one tensor at a time as the
  packer pulls (stop signals wait while ``quantize_matrix`` runs: ``signals.deferred``, as
  numba kernels must not be unwound), rounding the codebooks to their storage type
  (``round_codebooks``), checking what the quantizer returned, and the per-tensor report
  (rule, b, G, rel_error, seconds).

A quantizer that rounds its centroids itself (to assign each weight to the nearest *stored*
centroid, as ``kmeans`` does) returns a ``StoredCodebooks`` instead of the pair; it may also
carry the squared error it measured on the way and extra report fields.
"""

from __future__ import annotations

import fnmatch
import re
import sys
import time
from typing import Any, Sequence

import attrs
import numpy as np

from ditto_core.model import codebook as CB
from ditto_core.model import format as F
from ditto_core.model.codebook import check_params  # noqa: F401  (the kit's parameter check)
from ditto_core.base.errors import DittoError
from ditto_core.base.signals import deferred
from ditto_core.base.types import Checkpoint, CodebookTensor, QuantizedModel
from ditto_core.base.untrusted import check_finite
from ditto_core.model.modelfile import REASON_CODEBOOK_LARGER
from .components import QuantOptions
from .importance import IMPORTANCE_FLOOR, importance_weights, tensor_importance

#: The default embedding rule: the embedding and the classifier (tied in SmolLM2) are quantized
#: with this many more bits than the other matrices (capped at 8), with one codebook per row
#: (group size max(G, cols)), same codebook type. docs/QUANT.md "Default policy": on SmolLM2 at
#: b = 4 (rows of 576) this takes the next-token KL divergence from 0.608 (embedding at b = 4,
#: G = 256) to 0.256, against 0.250 with the embedding in f32, at 7.78 bpw; b + 2 at G = 256
#: gave 0.252 at 11.33 bpw (its 64-weight tail sub-block carries 64 centroids), b + 1 at
#: G = 256 0.266 at 7.67 bpw.
EMBEDDING_NAMES = ("token_embd.weight", "output.weight")
EMBEDDING_EXTRA_BITS = 2

#: The default attn_v rule: under grouped-query attention with at least GQA_MIN query heads per
#: KV head, each layer's V projection is quantized with ATTN_V_EXTRA_BITS more bits (capped at
#: 8), as llama.cpp's IQ4_NL/IQ4_XS give attn_v Q5_K when n_gqa >= 4 (src/llama-quant.cpp):
#: every V row feeds a whole group of query heads, and the tensor is small (n_kv_heads x
#: head_dim rows). docs/QUANT.md "Default policy": on Qwen2.5-Coder-0.5B (GQA 7) with attn_v
#: at b = 4 the greedy code ends every line with a space (token " \n" over "\n"); attn_v at
#: b = 5 gives the plain newlines, where G = 128 or 64 at b = 4, or f32 for any other kind of
#: matrix, does not.
ATTN_V_EXTRA_BITS = 1
GQA_MIN = 4
ATTN_V_RULE = f"attn_v under GQA >= {GQA_MIN} (b+{ATTN_V_EXTRA_BITS})"


def gqa_of(name: str, shapes) -> int:
    """Query heads per KV head of the layer of ``name`` when it is a V projection
    (``blk.N.attn_v.weight``): attn_q's rows over attn_v's (both n_heads or n_kv_heads times
    head_dim); 0 for any other tensor, or when the layer has no attn_q of a whole multiple."""
    if not name.endswith(".attn_v.weight"):
        return 0
    q = shapes.get(name[:-len("attn_v.weight")] + "attn_q.weight")
    v = shapes.get(name)
    if q is None or v is None or len(q) != 2 or len(v) != 2 or int(v[0]) <= 0:
        return 0
    ratio, rest = divmod(int(q[0]), int(v[0]))
    return ratio if rest == 0 else 0

_SPEC_TOKEN = re.compile(r"^(?:b(?P<bits>\d+)|G(?P<group>\d+)|cb:(?P<cb>\w+))$")


@attrs.frozen
class TensorRule:
    """One ``--tensor-type GLOB=SPEC`` rule: tensors whose name matches ``glob`` (fnmatch)
    are kept in f32 (``f32``) or quantized with the given b / G / codebook type (each None:
    as the options say)."""

    glob: str
    f32: bool = False
    bits: int | None = None
    group_size: int | None = None
    codebook_type: str | None = None

    @classmethod
    def parse(cls, text: str) -> "TensorRule":
        """``"blk.0.*=f32"``, ``"*.ffn_down.weight=b5"``, ``"token_embd.weight=b6,G576"``,
        ``"*=cb:f32"``. Raises DittoError naming the rule for anything else, b outside 1..8
        or G outside the format's range."""
        glob, eq, spec = text.partition("=")
        glob, spec = glob.strip(), spec.strip()
        if not eq or not glob or not spec:
            raise DittoError(f"--tensor-type {text!r}: expected GLOB=SPEC (e.g. "
                             "'*.ffn_down.weight=b5' or 'blk.0.*=f32')")
        if spec == "f32":
            return cls(glob, f32=True)
        fields: dict[str, Any] = {}
        for tok in spec.split(","):
            m = _SPEC_TOKEN.match(tok.strip())
            if m is None:
                raise DittoError(f"--tensor-type {text!r}: {tok.strip()!r} is not bN, GN, "
                                 "cb:TYPE or f32")
            for field, value in (("bits", m["bits"]), ("group_size", m["group"]),
                                 ("codebook_type", m["cb"])):
                if value is None:
                    continue
                if field in fields:  # b4,b5: which one was meant is not known
                    raise DittoError(f"--tensor-type {text!r}: {tok.strip()!r} sets "
                                     f"{field.replace('_', ' ')} a second time")
                fields[field] = value if field == "codebook_type" else int(value)
        rule = cls(glob, **fields)
        try:
            check_params(4 if rule.bits is None else rule.bits,
                         F.MIN_GROUP_SIZE if rule.group_size is None else rule.group_size,
                         rule.codebook_type or "f16")
        except DittoError as exc:
            raise DittoError(f"--tensor-type {text!r}: {exc}") from None
        return rule

    def __str__(self) -> str:
        if self.f32:
            return f"{self.glob}=f32"
        parts = ([f"b{self.bits}"] if self.bits else []) + (
            [f"G{self.group_size}"] if self.group_size else []) + (
            [f"cb:{self.codebook_type}"] if self.codebook_type is not None else [])
        return f"{self.glob}={','.join(parts)}"


def parse_rules(items: Sequence[str]) -> tuple[TensorRule, ...]:
    """``--tensor-type`` values → rules, in order (first match wins)."""
    return tuple(TensorRule.parse(t) for t in items)


def plan_tensors(shapes, options: QuantOptions, rules: Sequence[TensorRule] = (),
                 embedding_extra_bits: int | None = EMBEDDING_EXTRA_BITS):
    """The quantize plan and, per tensor, why (see the module docstring for the order).

    Returns ``(plan, reasons)``: ``plan[name]`` is ``("f32", None)`` or ``("codebook", (b, G,
    codebook_type))``; ``reasons[name]`` a dict with ``rule`` (the rule that decided:
    ``"vector"``, ``"GLOB=SPEC"``, ``"keep_fp32 GLOB"``, ``"embedding (b+2, one codebook per
    row)"`` or ``"default"``) and, for a matrix kept f32 by the size guard, ``reason``
    (``REASON_CODEBOOK_LARGER``), ``codebook_bytes``, ``f32_bytes``, ``bits``, ``group_size``.
    After the embedding rule comes the attn_v rule (``ATTN_V_RULE``: b + 1 for a V projection
    under GQA >= 4, ``gqa_of``). ``embedding_extra_bits`` None disables both default rules."""
    plan, reasons = {}, {}
    for name, shape in shapes.items():
        if len(shape) != 2:
            plan[name], reasons[name] = ("f32", None), {"rule": "vector", "reason": "vector"}
            continue
        rows, cols = (int(x) for x in shape)
        bits, group, cb = options.bits, options.group_size, options.codebook_type
        rule = next((r for r in rules if fnmatch.fnmatchcase(name, r.glob)), None)
        keep = next((g for g in options.keep_fp32 if fnmatch.fnmatchcase(name, g)), None)
        if rule is not None:
            why = str(rule)
            if rule.f32:
                plan[name], reasons[name] = ("f32", None), {"rule": why, "reason": why}
                continue
            bits = bits if rule.bits is None else rule.bits
            group = group if rule.group_size is None else rule.group_size
            cb = rule.codebook_type or cb
        elif keep is not None:
            why = f"keep_fp32 {keep}"
            plan[name], reasons[name] = ("f32", None), {"rule": why, "reason": why}
            continue
        elif name in EMBEDDING_NAMES and embedding_extra_bits is not None:
            why = f"embedding (b+{embedding_extra_bits}, one codebook per row)"
            bits, group = min(8, bits + embedding_extra_bits), max(group, cols)
        elif embedding_extra_bits is not None and gqa_of(name, shapes) >= GQA_MIN:
            why = ATTN_V_RULE
            bits = min(8, bits + ATTN_V_EXTRA_BITS)
        else:
            why = "default"
        params = (bits, group, cb)
        if not CB.saves_space(rows, cols, *params):
            plan[name] = ("f32", None)
            reasons[name] = {"rule": why, "reason": REASON_CODEBOOK_LARGER,
                             "codebook_bytes": CB.payload_bytes(rows, cols, *params),
                             "f32_bytes": CB.f32_bytes(rows, cols), "bits": bits,
                             "group_size": group}
            continue
        plan[name], reasons[name] = ("codebook", params), {"rule": why}
    return plan, reasons


def unmatched_patterns(names: Sequence[str], rules: Sequence[TensorRule],
                       keep_fp32: Sequence[str]) -> list[str]:
    """The ``--tensor-type`` rules and ``--keep-fp32`` globs that match none of ``names`` (the
    checkpoint's tensor names), as the flag and its argument (``"--tensor-type 'X=b5'"``), in
    the order given. Such a pattern changes nothing: most often a typo or another model's
    naming (HF ``model.layers.0.*`` against GGUF ``blk.0.*``)."""
    def hit(glob):
        return any(fnmatch.fnmatchcase(n, glob) for n in names)
    return ([f"--tensor-type {str(r)!r}" for r in rules if not hit(r.glob)]
            + [f"--keep-fp32 {g!r}" for g in keep_fp32 if not hit(g)])


def unmatched_warning(unmatched: Sequence[str], shapes: dict) -> str:
    """The stderr warning for ``unmatched_patterns``: each pattern, and the name of one of the
    model's matrices (``shapes``: name → shape) to show its naming."""
    example = next((n for n, sh in shapes.items() if len(sh) == 2 and n not in EMBEDDING_NAMES),
                   next(iter(shapes), ""))
    return "\n".join(f"warning: {u} matches no tensor of this model, so it changes nothing "
                     f"(this model's tensors are named like {example!r})" for u in unmatched)


def int8_codebooks(cent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round float centroids onto the int8 grid of their sub-block (FORMAT.md, ``int8``).

    ``cent``: float [..., K] (one sub-block's centroids on the last axis). Per sub-block the
    scale is ``s = f16(max|c| / 127)``, raised to the next f16 when rounding made
    ``max|c| / s > 127``, and each centroid becomes ``q = round(c / s)`` (half to even)
    clipped to −127..127 (−128 is never used, so ``|q| ≤ 127`` for the kernels' sign trick,
    docs/KERNELS.md). An all-zero sub-block has s = 0, q = 0. Returns (stored centroids
    float32 [..., K] = s · q, scales float32 [...] holding f16 values). Raises DittoError if a
    scale overflows f16 (max|c| > 65504 · 127)."""
    cent = np.asarray(cent, np.float64)
    amax = np.abs(cent).max(axis=-1)
    with np.errstate(over="ignore"):
        s16 = (amax / 127.0).astype(np.float16)
        low = (s16.astype(np.float64) * 127.0 < amax)
        s16[low] = np.nextafter(s16[low], np.float16(np.inf))
    if not np.isfinite(s16).all():
        raise DittoError(f"a centroid of magnitude {float(amax.max()):.6g} overflows the f16 "
                         f"scale of an int8 codebook; use --codebook-type f32")
    scale = s16.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale[..., None] > 0, np.rint(cent / scale[..., None]), 0.0)
    q = np.clip(q, -127, 127)
    stored = (q * scale[..., None]).astype(np.float32)
    return stored, s16.astype(np.float32)


def round_codebooks(cent: np.ndarray, codebook_type: str, name: str = "tensor"
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """Centroids (float [..., 2^b]) rounded to what the model file stores (FORMAT.md): float32
    of ``cent``'s shape, and for ``int8`` the per-sub-block scales (float32 [...] holding f16
    values; ``int8_codebooks``), else None. Raises DittoError naming the tensor when a value
    overflows the type."""
    cent = np.asarray(cent, np.float64)
    scales = None
    if codebook_type == "f32":
        stored = cent.astype(np.float32)
    elif codebook_type == "f16":
        with np.errstate(over="ignore"):
            stored = cent.astype(np.float16).astype(np.float32)
    elif codebook_type == "int8":
        try:
            stored, scales = int8_codebooks(cent)
        except DittoError as exc:
            raise DittoError(f"tensor {name!r}: {exc}") from None
    else:
        raise DittoError(f"tensor {name!r}: unknown codebook type {codebook_type!r}")
    if not np.isfinite(stored).all():
        pos = tuple(int(i) for i in np.argwhere(~np.isfinite(stored))[0])
        where = f" of row {pos[0]} sub-block {pos[1]}" if len(pos) == 3 else ""
        raise DittoError(f"tensor {name!r}: centroid {cent[pos]:.6g}{where} overflows "
                         f"{codebook_type}" + ("" if codebook_type == "f32" else
                                               "; use --codebook-type f32"))
    return stored, scales


@attrs.frozen
class MatrixOptions:
    """What ``quantize_matrix`` gets besides the weights, b and G: the tensor's name, the
    codebook type its centroids are stored in, the seed and method of the quantize options,
    and the quantizer's own resolved component options (None if it has none)."""

    tensor: str
    codebook_type: str
    seed: int
    method: str | None
    component: Any = None
    importance: np.ndarray | None = None  # float64 [cols] from importance_weights, or None


@attrs.frozen
class StoredCodebooks:
    """What ``quantize_matrix`` may return instead of ``(indices, codebooks)`` when it rounded
    the centroids to their storage type itself (``round_codebooks``) before assigning indices.

    ``indices``: uint8 [rows, cols]; ``codebooks``: float32 [rows, S, 2^b] holding exactly the
    stored values (``round_codebooks(...)[0]``); ``scales``: for ``int8`` the float32 [rows, S]
    f16 scales ``round_codebooks`` returned, else None. ``sse`` / ``norm2``: ‖W − Ŵ‖² and ‖W‖²
    (float64 sums) if the quantizer measured them (the kit computes them when None).
    ``report``: extra fields for this tensor's entry of the quantize report."""

    indices: np.ndarray
    codebooks: np.ndarray
    scales: np.ndarray | None = None
    sse: float | None = None
    norm2: float | None = None
    report: dict = attrs.field(factory=dict)


def _dequantize(indices: np.ndarray, cb: np.ndarray, group_size: int) -> np.ndarray:
    """Ŵ float64 [rows, cols] from indices [rows, cols] and codebooks [rows, S, K]."""
    rows, cols = indices.shape
    sub = (np.arange(cols) // group_size)[None, :]
    return cb.astype(np.float64)[np.arange(rows)[:, None], sub, indices]


class CodebookQuantizer:
    """Base of a quantizer made with the kit: set ``name`` and implement ``quantize_matrix``
    (module docstring). ``embedding_extra_bits`` (None: no embedding rule) and
    ``codebook_types`` (what ``round_codebooks`` supports) may be overridden."""

    name = "?"
    embedding_extra_bits: int | None = EMBEDDING_EXTRA_BITS
    methods: tuple[str, ...] = ()
    options = None  # the component's resolved Options, for quantizers that declare some

    def quantize_matrix(self, weights: np.ndarray, bits: int, group_size: int,
                        options: MatrixOptions) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def check_options(self, options: QuantOptions) -> str | None:
        """Raise DittoError (prefixed with the quantizer's name) for b, G, codebook type,
        method or ``tensor_types`` rules this quantizer cannot use; called before export.
        Returns the method used (``options.method``, default the first of ``methods``)."""
        try:
            check_params(options.bits, options.group_size, options.codebook_type)
            if options.method is not None and options.method not in self.methods:
                raise DittoError(f"unknown method {options.method!r}; choose one of "
                                 f"{', '.join(self.methods) or '(none: this quantizer has no methods)'}")
            parse_rules(options.tensor_types)
        except DittoError as exc:
            raise DittoError(f"{self.name}: {exc}") from None
        return options.method or (self.methods[0] if self.methods else None)

    def quantize(self, checkpoint: Checkpoint, options: QuantOptions) -> QuantizedModel:
        """Plan every tensor now, quantize lazily one tensor at a time as the packer pulls
        (docs/QUANT.md). ``report``: ``quantizer``, ``bits``, ``group_size``,
        ``codebook_type``, ``rules``, per tensor ``{encoding, rule, ...}`` (f32 ones at once,
        quantized ones with ``bits``, ``group_size``, ``rel_error``, ``sse``, ``norm2``,
        ``seconds`` as produced) and running totals ``total_rel_error``,
        ``quantized_weights``, ``seconds``; ``importance`` (the importance file or None) and
        ``allocation`` (``ditto_core.kit.allocate``: with ``target_bpw`` / ``max_size_of`` the
        default-rule tensors' b and G are chosen under that size budget, each such tensor's
        rule ``"allocated bB,GG"``; else None). Raises DittoError for bad options or a budget
        below the smallest plan (now), a non-finite weight or a bad ``quantize_matrix``
        result (when the tensor is reached)."""
        from . import allocate

        method = self.check_options(options)
        rules = parse_rules(options.tensor_types)
        plan, reasons = plan_tensors(checkpoint.shapes, options, rules,
                                     self.embedding_extra_bits)
        unmatched = unmatched_patterns(list(checkpoint.shapes), rules, options.keep_fp32)
        if unmatched:
            print(unmatched_warning(unmatched, checkpoint.shapes), file=sys.stderr,
                  flush=True)

        def sample_quantize(S, b, g, name, imp):  # Ŵ of sampled rows, for the allocator
            q = self._quantize_tensor(np.ascontiguousarray(S, np.float32), name,
                                      (b, g, options.codebook_type), options, imp)[0]
            return _dequantize(q.indices, q.codebooks, g)

        plan, reasons, allocation = allocate.apply_budget(checkpoint, options, plan, reasons,
                                                          sample_quantize, EMBEDDING_NAMES)
        report = {"quantizer": self.name, "method": method, "bits": options.bits,
                  "group_size": options.group_size, "codebook_type": options.codebook_type,
                  "rules": [str(r) for r in rules], "unmatched_patterns": unmatched,
                  "importance": options.importance, "allocation": allocation,
                  **({} if self.embedding_extra_bits is None else
                     {"embedding_bits": min(8, options.bits + self.embedding_extra_bits)}),
                  "tensors": {n: {"encoding": "f32", **r} for n, r in reasons.items()
                              if plan[n][0] == "f32"},
                  "total_rel_error": 0.0, "quantized_weights": 0, "seconds": 0.0}
        totals = {"sse": 0.0, "norm2": 0.0}

        def tensors():
            for name, (encoding, params) in plan.items():
                W = np.ascontiguousarray(checkpoint.tensors[name](), dtype=np.float32)
                check_finite(W, name)
                if encoding == "f32":
                    yield name, W
                    continue
                t0 = time.perf_counter()
                imp = tensor_importance(options, name, W.shape[1])
                imp_used = imp is not None
                q, sse, norm2, extra = self._quantize_tensor(W, name, params, options, imp)
                del W  # not held while the packer encodes q and the next tensor loads
                dt = time.perf_counter() - t0
                totals["sse"] += sse
                totals["norm2"] += norm2
                report["tensors"][name] = {"encoding": "codebook", "rule": reasons[name]["rule"],
                                           "bits": q.bits, "group_size": q.group_size,
                                           "codebook_type": q.codebook_type,
                                           "rel_error": q.rel_error, "sse": sse,
                                           "norm2": norm2, "seconds": dt,
                                           "importance": imp_used, **extra}
                report["quantized_weights"] += q.indices.size
                report["seconds"] += dt
                report["total_rel_error"] = (totals["sse"] / totals["norm2"]
                                             if totals["norm2"] > 0 else 0.0)
                yield name, q

        return QuantizedModel(config=checkpoint.config, tokenizer=checkpoint.tokenizer,
                              plan=plan, shapes=dict(checkpoint.shapes), tensors=tensors,
                              report=report)

    def _quantize_tensor(self, W, name, params, options, importance=None):
        """``quantize_matrix`` on one tensor (``importance``: its k-means weights or None),
        its result checked and rounded: returns (CodebookTensor, ‖W − Ŵ‖², ‖W‖², extra
        report fields)."""
        bits, group, cb_type = params
        rows, cols = W.shape
        s, k = CB.n_sub_blocks(cols, group), CB.n_centroids(bits)
        mopts = MatrixOptions(name, cb_type, options.seed,
                              options.method or (self.methods[0] if self.methods else None),
                              self.options, importance)
        with deferred():  # native kernels run here: stop signals wait for the tensor
            result = self.quantize_matrix(W, bits, group, mopts)
        stored = isinstance(result, StoredCodebooks)
        what = f"{self.name}: tensor {name!r}: quantize_matrix returned"
        if not stored and not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise DittoError(f"{what} {type(result).__name__}, expected (indices, codebooks) "
                             "or StoredCodebooks")
        indices, codebooks = (result.indices, result.codebooks) if stored else result
        indices = np.asarray(indices)
        codebooks = np.asarray(codebooks)
        if indices.shape != (rows, cols) or indices.dtype != np.uint8:
            raise DittoError(f"{what} indices {indices.dtype}{list(indices.shape)}, expected "
                             f"uint8[{rows}, {cols}]")
        if int(indices.max(initial=0)) >= k:
            raise DittoError(f"{what} an index {int(indices.max())} >= 2^{bits}")
        if codebooks.shape not in ((rows, s, k), (rows * s, k)):
            raise DittoError(f"{what} codebooks of shape {list(codebooks.shape)}, expected "
                             f"[{rows}, {s}, {k}] or [{rows * s}, {k}] (rows, sub-blocks, 2^b)")
        if codebooks.dtype.kind not in "fiu":
            raise DittoError(f"{what} codebooks of dtype {codebooks.dtype}, expected floats")
        if not np.isfinite(codebooks).all():
            bad = np.argwhere(~np.isfinite(codebooks.reshape(rows, s, k)))[0]
            raise DittoError(f"{what} a non-finite centroid "
                             f"{codebooks.reshape(rows, s, k)[tuple(bad)]} (row {bad[0]}, "
                             f"sub-block {bad[1]}, centroid {bad[2]})")
        if not stored:
            cb, scales = round_codebooks(codebooks.reshape(rows, s, k), cb_type, name)
            sse = norm2 = None
        else:
            cb = np.ascontiguousarray(codebooks, np.float32).reshape(rows, s, k)
            scales, sse, norm2 = result.scales, result.sse, result.norm2
            if (scales is None) != (cb_type != "int8") or (
                    scales is not None and np.shape(scales) != (rows, s)):
                raise DittoError(f"{what} scales {None if scales is None else np.shape(scales)}"
                                 f" for {cb_type} codebooks, expected "
                                 f"{[rows, s] if cb_type == 'int8' else None}")
        if sse is None or norm2 is None:
            sse, norm2 = _squared_error(W, indices, cb, group)
        rel = sse / norm2 if norm2 > 0 else 0.0
        return (CodebookTensor(bits=bits, group_size=group, codebooks=cb, indices=indices,
                               codebook_type=cb_type, rel_error=rel, scales=scales),
                sse, norm2, dict(result.report) if stored else {})


def _squared_error(W: np.ndarray, indices: np.ndarray, cb: np.ndarray, group_size: int,
                   chunk_weights: int = 1 << 22) -> tuple[float, float]:
    """(‖W − Ŵ‖², ‖W‖²) as float64 sums, Ŵ from ``indices`` [rows, cols] and codebooks ``cb``
    [rows, S, K]; computed ``chunk_weights`` at a time so the float64 copies stay small."""
    rows, cols = W.shape
    step = max(1, chunk_weights // max(cols, 1))
    sse = norm2 = 0.0
    for a in range(0, rows, step):
        w = W[a:a + step].astype(np.float64)
        err = w - _dequantize(indices[a:a + step], cb[a:a + step], group_size)
        sse += float((err * err).sum())
        norm2 += float((w * w).sum())
    return sse, norm2
