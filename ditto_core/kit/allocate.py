"""Bit allocation under a file-size budget (``--target-bpw B`` / ``--max-size-of FILE``;
docs/QUANT.md "Bit allocation").

Every matrix the default policy would quantize (not one an explicit ``--tensor-type`` rule or
``--keep-fp32`` glob decided) gets one candidate (b, G) from ``candidates``. Its sensitivity
under a candidate is the *relative output error* the candidate causes, measured by quantizing a
sample of its rows: ``Σ a_c (W − Ŵ)² / Σ a_c W²`` with the importances a of the calibration
(the expected ‖ΔW x‖² / ‖W x‖² under a diagonal activation covariance; all a = 1 without
calibration, i.e. the relative weight error). The plan minimises the sum of these over the
tensors subject to the exact model-file size (``modelfile.plan_layout``) being at most the
budget: per tensor the lower convex hull of (bytes, error), then the steepest hull steps first
(the greedy solution of the Lagrangian relaxation of this multiple-choice knapsack, Sinha &
Zoltners 1979), starting from every tensor's smallest candidate.

Speed-aware (``QuantOptions.speed_table``): every candidate also has a modelled GEMV time
on the named kernel table (``modelled_time``: the larger of its compute cost and its bytes,
both relative to b = 4, G = 256), and the plan's total is held to at most ``1 +
SPEED_SLACK`` times the default plan's (the layouts the tensors had before allocation: b = 4,
G = 256 and the default embedding rule), so the budgeted file decodes about as fast as the
default build on that table. The two constraints are met by the
Lagrangian relaxation of the time one: the greedy below runs on the errors plus ``mu`` times
the normalised times, with ``mu`` the smallest (by bisection) whose plan meets the time
budget. ``resolve_speed_table("auto")`` names this CPU's table (none on ``generic``, where
every layout runs through one loop).
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Sequence

import attrs
import numpy as np

from ditto_core.base.errors import DittoError
from ditto_core.model import codebook as CB
from ditto_core.model.modelfile import TensorInfo, plan_layout
from ditto_core.model import kernel_paths as KP
from .importance import tensor_importance

#: (b, G) candidates of an ordinary matrix, and the bit widths of the embedding/classifier
#: (one codebook per row, as the default policy)
MATRIX_CANDIDATES = ((3, 256), (4, 512), (4, 256), (4, 128), (5, 256), (5, 128), (6, 256))
EMBEDDING_BITS = (5, 6, 7, 8)
#: rows quantized per tensor and candidate to measure its error (evenly spaced)
SAMPLE_ROWS = 64
#: how much more modelled GEMV time than the default plan a speed-aware plan may take: none.
#: Plans given 3 % decoded 3-6 % slower than the default build (the modelled time leaves out
#: part of a decode step's cost), plans given 0 within 2 % of it (docs/RESULTS.md)
SPEED_SLACK = 0.0


@attrs.frozen
class Choice:
    """One candidate of one tensor: b, G, its payload bytes and measured relative error."""

    bits: int
    group_size: int
    nbytes: int
    error: float
    #: modelled GEMV time (``modelled_time``; 0 without a speed table)
    time: float = 0.0


def hull(choices: Sequence[Choice]) -> list[Choice]:
    """The lower convex hull of ``choices`` in (bytes, error), by increasing bytes: the
    candidates that are optimal for some price per byte (dominated and concave ones go)."""
    pts = sorted(choices, key=lambda c: (c.nbytes, c.error))
    out: list[Choice] = []
    for c in pts:
        if out and c.error >= out[-1].error:
            continue  # more bytes, no less error
        while len(out) >= 2:
            a, b = out[-2], out[-1]
            # drop b if it lies on or above the segment a → c
            if (b.error - a.error) * (c.nbytes - a.nbytes) >= (c.error - a.error) * (b.nbytes - a.nbytes):
                out.pop()
            else:
                break
        out.append(c)
    return out


def greedy(options: dict[str, Sequence[Choice]], budget: int) -> dict[str, Choice]:
    """Choose one candidate per tensor minimising the summed error with the summed bytes at
    most ``budget``: every tensor starts at its cheapest hull point, then hull steps are taken
    in decreasing error saved per byte while they fit (a step that does not fit is skipped;
    later, smaller ones may still fit). Raises DittoError when even the cheapest choices
    exceed the budget."""
    hulls = {n: hull(c) for n, c in options.items()}
    pick = {n: 0 for n in hulls}
    used = sum(h[0].nbytes for h in hulls.values())
    if used > budget:
        raise DittoError(f"the size budget of {budget:,} bytes for the allocated tensors is "
                         f"below their smallest plan ({used:,} bytes)")
    steps = []
    for n, h in hulls.items():
        for i in range(1, len(h)):
            db = h[i].nbytes - h[i - 1].nbytes
            steps.append(((h[i - 1].error - h[i].error) / db, n, i))
    # within a tensor the hull's slopes decrease, so steps come out in order per tensor
    steps.sort(key=lambda s: (-s[0], s[1], s[2]))
    for _, n, i in steps:
        if pick[n] != i - 1:
            continue  # an earlier step of this tensor did not fit
        db = hulls[n][i].nbytes - hulls[n][i - 1].nbytes
        if used + db <= budget:
            pick[n] = i
            used += db
    return {n: hulls[n][pick[n]] for n in hulls}


def sample_rows(rows: int, n: int = SAMPLE_ROWS) -> np.ndarray:
    """Evenly spaced row indices (all rows when there are at most ``n``)."""
    if rows <= n:
        return np.arange(rows)
    return np.unique(np.linspace(0, rows - 1, n).round().astype(np.int64))


def measure(W: np.ndarray, candidates, quantize: Callable, importance=None) -> list[Choice]:
    """Relative output error of ``W`` (float32 [rows, cols]) at each (b, G) of ``candidates``
    on ``sample_rows`` of it: ``quantize(Wsample, b, G)`` returns Ŵ of the sample (float);
    ``importance`` float [cols] (None: ones). ``nbytes`` is the whole tensor's payload at the
    caller's codebook type (filled in by the caller: here 0)."""
    rows, cols = W.shape
    S = W[sample_rows(rows)]
    a = np.ones(cols) if importance is None else np.asarray(importance, np.float64)
    den = float(((S.astype(np.float64) ** 2) * a).sum()) or 1.0
    out = []
    for b, g in candidates:
        err = S.astype(np.float64) - np.asarray(quantize(S, b, g), np.float64)
        out.append(Choice(b, g, 0, float(((err * err) * a).sum()) / den))
    return out


def n_weights(checkpoint) -> int:
    """Weights of every tensor of ``checkpoint`` (the denominator of the file's bpw)."""
    return sum(math.prod(int(x) for x in s) for s in checkpoint.shapes.values())


def file_bytes(config, tokenizer, shapes: dict, plan: dict) -> int:
    """Exact size of the model file of ``plan`` (name → ("f32", None) or ("codebook", (b, G,
    codebook_type))) via ``modelfile.plan_layout``."""
    infos = [TensorInfo(n, "f32", shapes[n]) if enc == "f32" else
             TensorInfo(n, "codebook", shapes[n], *p[:3]) for n, (enc, p) in plan.items()]
    return plan_layout(config, tokenizer, infos)[3]


def budget_bytes(target_bpw: float | None, max_size_of: str | None, n_weights: int) -> int:
    """The file-size budget in bytes: ``target_bpw · weights / 8`` (rounded down) or the size
    of the file ``max_size_of``. Raises DittoError when neither or both are given, for a
    non-positive bpw, or an unreadable file."""
    import os

    if (target_bpw is None) == (max_size_of is None):
        raise DittoError("give exactly one of --target-bpw and --max-size-of")
    if target_bpw is not None:
        if not (isinstance(target_bpw, (int, float)) and math.isfinite(target_bpw)
                and target_bpw > 0):
            raise DittoError(f"--target-bpw must be a positive number, got {target_bpw!r}")
        return int(target_bpw * n_weights / 8)
    try:
        return os.stat(max_size_of).st_size
    except OSError as exc:
        raise DittoError(f"{max_size_of}: cannot read its size for --max-size-of: "
                         f"{exc.strerror or exc}") from None


def resolve_speed_table(choice: str | None, table: KP.Table | None = None) -> str | None:
    """The ``speed_table`` of ``--speed-aware CHOICE``: None for None or ``"off"``; for
    ``"auto"``, ``table`` (default: this CPU's, ``kernel_paths.active_table``, as ditto-run
    picks it, ``DITTO_KERNEL`` included) unless it is ``generic`` (every layout equally
    slow there: None); otherwise ``choice`` as a table name. Raises DittoError for an unknown
    name."""
    if choice is None or choice == "off":
        return None
    if choice == "auto":
        t = table or KP.active_table()
        return None if t.name == "generic" else t.name
    try:
        return KP.table(choice).name
    except KeyError as exc:
        raise DittoError(f"--speed-aware: {exc.args[0]}") from None


def modelled_time(t: KP.Table, rows: int, cols: int, bits: int, group_size: int,
                  classifier: bool) -> float:
    """Modelled GEMV time of a rows x cols int8 codebook tensor of ``bits``, ``group_size`` on
    table ``t``, in b = 4, G = 256 weight-times: the weights times the larger of the layout's
    compute cost (``kernel_paths.gemv_cost``, rows in L2) and its payload bytes over those of
    b = 4, G = 256 (the cost when the weights stream from L3 or memory, where bytes rule).
    The classifier decoded at load reads the same int8 weights whatever its b: its
    compute cost alone."""
    cost = KP.gemv_cost(t, bits, group_size, cols, classifier)
    if KP.kernel_path(t, bits, group_size, cols, classifier) != "decoded-int8":
        cost = max(cost, CB.payload_bytes(rows, cols, bits, group_size, "int8")
                   / CB.payload_bytes(rows, cols, 4, 256, "int8"))
    return rows * cols * cost


def tensor_time(t: KP.Table, name: str, classifier_name: str, rows: int, cols: int, bits: int,
                group_size: int) -> float:
    """``modelled_time`` of tensor ``name`` of the model file, or 0 for the token embedding
    of a model with an untied classifier: the runtime reads one row of it per token (a
    lookup, ``kernel_paths.tensor_path``), so its layout costs no GEMV time and shrinking it
    must not buy time for the matrices."""
    if name == "token_embd.weight" and name != classifier_name:
        return 0.0
    return modelled_time(t, rows, cols, bits, group_size, name == classifier_name)


def speed_limited(options: dict[str, Sequence[Choice]], budget: int, time_budget: float,
                  iters: int = 40) -> tuple[dict[str, Choice], float]:
    """``greedy(options, budget)`` with the summed ``time`` of the plan also at most
    ``time_budget``: the greedy on errors ``error + mu * time / time_budget`` for the smallest
    ``mu`` (bisection over ``iters`` steps once a feasible one is found by doubling) whose
    plan meets it. Returns (plan, mu), the plan's candidates those of ``options`` (their
    measured errors); when no ``mu`` up to 2^40 meets it, the plan of the largest (the
    fastest the greedy finds within the byte budget)."""
    def plan(mu):
        if mu == 0:
            return greedy(options, budget)
        scored = {n: [attrs.evolve(c, error=c.error + mu * c.time / time_budget) for c in ch]
                  for n, ch in options.items()}
        original = {id(e): c for n in options for e, c in zip(scored[n], options[n])}
        # the chosen candidates as given (their measured errors, not the priced ones)
        return {n: original[id(c)] for n, c in greedy(scored, budget).items()}

    def t(p):
        return sum(c.time for c in p.values())

    best = plan(0.0)
    if t(best) <= time_budget:
        return best, 0.0
    lo, hi = 0.0, 2.0 ** -20
    while True:
        p = plan(hi)
        if t(p) <= time_budget:
            break
        if hi >= 2.0 ** 40:
            return p, hi
        lo, hi = hi, hi * 2
    best = p
    for _ in range(iters):
        mid = (lo + hi) / 2
        p = plan(mid)
        if t(p) <= time_budget:
            hi, best = mid, p
        else:
            lo = mid
    return best, hi


def allocate(checkpoint, plan: dict, reasons: dict, budget: int, codebook_type: str,
             quantize: Callable, importance: Callable[[str, int], np.ndarray | None],
             embedding_names: Sequence[str], progress: Callable[[str], None] | None = None,
             speed_table: str | None = None) -> tuple[dict, dict]:
    """Re-plan the tensors of ``plan`` whose ``reasons[name]["rule"]`` is ``"default"``, the
    attn_v rule or an embedding rule under the file-size ``budget`` (bytes, whole file).

    ``quantize(W, b, G)`` → Ŵ (the quantizer's own method, weighted by the importance);
    ``importance(name, cols)`` → the tensor's k-means weights or None. Returns (new plan,
    allocation record: ``budget_bytes``, ``planned_bytes``, per tensor ``{bits, group_size,
    error, bytes}``, the candidates measured, and with a speed table ``speed`` {table,
    default_time, time_budget, planned_time, mu, time_budget_met}: modelled GEMV times in
    weights x relative cost). ``speed_table``: a kernel table name; the plan's modelled GEMV
    time on it is held to ``1 + SPEED_SLACK`` times the default plan's (``speed_limited``;
    int8 codebooks only); when no plan within the byte budget meets that, the fastest found
    is taken, ``time_budget_met`` is False and a warning says how much slower it is modelled.
    Raises DittoError when the budget cannot hold the smallest candidates plus the fixed
    tensors."""
    free = [n for n, (enc, _) in plan.items() if enc == "codebook"
            and (reasons[n]["rule"] == "default"
                 # quantkit's default embedding and attn_v rules (it is the layer above)
                 or reasons[n]["rule"].startswith(("embedding", "attn_v under GQA")))]
    # the file of the current plan; the free tensors' aligned payloads are swapped out below
    base = file_bytes(checkpoint.config, checkpoint.tokenizer, checkpoint.shapes, plan)
    options, measured = {}, {}
    kt = KP.table(speed_table) if speed_table and codebook_type == "int8" else None
    cls = KP.classifier_name(checkpoint.config)
    for name in free:
        rows, cols = (int(x) for x in checkpoint.shapes[name])
        if name in embedding_names:
            cands = [(b, max(cols, plan[name][1][1])) for b in EMBEDDING_BITS]
        else:
            cands = sorted({(b, min(g, cols)) for b, g in MATRIX_CANDIDATES})
        cands = [c for c in cands if CB.saves_space(rows, cols, *c, codebook_type)]
        if not cands:  # nothing smaller than f32: the tensor keeps its plan
            continue
        if progress:
            progress(name)
        W = np.ascontiguousarray(checkpoint.tensors[name](), np.float32)
        imp = importance(name, cols)
        ch = measure(W, cands, lambda S, b, g, n=name: quantize(S, b, g, n, imp), imp)
        ch = [attrs.evolve(c, nbytes=-(-CB.payload_bytes(rows, cols, c.bits, c.group_size,
                                                        codebook_type) // 64) * 64,
                           time=0.0 if kt is None else
                           tensor_time(kt, name, cls, rows, cols, c.bits, c.group_size))
              for c in ch]
        options[name] = ch
        measured[name] = [attrs.asdict(c) for c in ch]
        del W
    free_now = sum(-(-CB.payload_bytes(*checkpoint.shapes[n], *plan[n][1][:3]) // 64) * 64
                   for n in options)
    fixed = base - free_now
    smallest = fixed + sum(min(c.nbytes for c in ch) for ch in options.values())
    if smallest > budget:
        raise DittoError(f"size budget {budget:,} bytes ({8 * budget / n_weights(checkpoint):.3f} "
                         f"bpw) is below the smallest file the bit allocation can plan: "
                         f"{smallest:,} bytes ({8 * smallest / n_weights(checkpoint):.3f} bpw)")
    speed = None
    if kt is None:
        chosen = greedy(options, budget - fixed)
    else:
        default_time = 0.0
        for n in options:
            rows, cols = (int(x) for x in checkpoint.shapes[n])
            b, g = plan[n][1][:2]
            default_time += tensor_time(kt, n, cls, rows, cols, b, g)
        limit = default_time * (1 + SPEED_SLACK)
        chosen, mu = speed_limited(options, budget - fixed, limit)
        planned_time = sum(c.time for c in chosen.values())
        speed = {"table": kt.name, "default_time": default_time, "time_budget": limit,
                 "planned_time": planned_time, "mu": mu,
                 "time_budget_met": planned_time <= limit}
        if planned_time > limit:
            warnings.warn(
                f"ditto: no plan within the size budget is modelled as fast as the default "
                f"layouts on kernel table {kt.name}: the fastest found is "
                f"{100 * (planned_time / default_time - 1):.1f} % slower "
                f"(--speed-aware off plans for the size budget alone)", stacklevel=2)
    new = {n: ("codebook", (chosen[n].bits, chosen[n].group_size, codebook_type))
           if n in chosen else p for n, p in plan.items()}
    planned = file_bytes(checkpoint.config, checkpoint.tokenizer, checkpoint.shapes, new)
    if planned > budget:  # the alignment estimate is exact, so this is a bug guard
        raise DittoError(f"bit allocation planned {planned:,} bytes over the budget {budget:,}")
    record = {"budget_bytes": budget, "planned_bytes": planned, "speed_table": speed_table,
              **({"speed": speed} if speed else {}),
              "tensors": {n: {"bits": c.bits, "group_size": c.group_size, "error": c.error,
                              "bytes": c.nbytes} for n, c in chosen.items()},
              "candidates": measured}
    return new, record


def apply_budget(checkpoint, options, plan: dict, reasons: dict, quantize: Callable,
                 embedding_names: Sequence[str]) -> tuple[dict, dict, dict | None]:
    """``allocate`` when ``options`` (QuantOptions) has ``target_bpw`` or ``max_size_of``,
    else nothing: returns (plan, reasons, allocation record or None). Allocated tensors get
    the rule ``"allocated bB,GG"`` in ``reasons``."""
    if options.target_bpw is None and options.max_size_of is None:
        return plan, reasons, None
    budget = budget_bytes(options.target_bpw, options.max_size_of, n_weights(checkpoint))
    new, rec = allocate(checkpoint, plan, reasons, budget, options.codebook_type, quantize,
                        lambda name, cols: tensor_importance(options, name, cols),
                        embedding_names, speed_table=getattr(options, "speed_table", None))
    reasons = dict(reasons)
    for n, c in rec["tensors"].items():
        reasons[n] = {**reasons[n], "rule": f"allocated b{c['bits']},G{c['group_size']}"}
    rec = {"target_bpw": options.target_bpw, "max_size_of": options.max_size_of, **rec}
    return new, reasons, rec
