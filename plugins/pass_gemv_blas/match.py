"""Recognise a GEMV loop nest in one function: y[i] (op)= Σ_k A[addr(i,k)] · x[k].

The analysis works on a pair of natural loops (outer ``i``, inner ``k``, the inner one a single
self-looping block, as clang -O1 emits it) and produces a ``Gemv`` description: index ranges,
base pointers and polynomial offsets of A, x and y, the layout (row-major ``i*ld + k`` →
NoTrans; ``k*ld + i`` → Trans), alpha/beta as products of loop-invariant scalars, and the
loop-invariant branch conditions the nest's single execution path depends on. Anything that
does not fit raises ``Reject`` with a human-readable reason.

GEMV definition: BLAS Technical Forum Standard (2001), §2.8.3 "Matrix-Vector Operations",
``y ← alpha·op(A)·x + beta·y``; CBLAS row-major convention of its Annex B.
"""

from __future__ import annotations

import re

import attrs

from . import affine as P
from .ir_text import Function, Instr
from .loops import CFG, Loop

IV_I, IV_K = "@i", "@k"
REASSOC = {"fast", "reassoc"}
PURE_CALLS = re.compile(r"^@llvm\.(fmuladd|fma|smin|smax|umin|umax|abs|fabs|lifetime|"
                        r"assume|experimental\.noalias|dbg)\b")
SIDE_EFFECT_OPS = {"store", "call", "invoke", "atomicrmw", "cmpxchg", "fence", "va_arg",
                   "callbr", "resume", "landingpad"}
INT32_MAX = 2**31 - 1


class Reject(Exception):
    """The nest is not a GEMV the pass can rewrite; ``args[0]`` is the reason."""


@attrs.define
class Range:
    start: dict  # poly
    end: dict  # poly (exclusive)
    trunc: bool = False  # exit test compares a truncated IV


@attrs.define
class Gemv:
    """A matched GEMV nest; polynomials are over atoms defined before the nest."""

    fn: str
    outer: Loop
    inner: Loop
    preheader: str
    exit: str
    dtype: str  # "float" | "double"
    elt: int
    i_range: Range
    k_range: Range
    a_base: str
    a_off: dict  # bytes, over @i/@k and invariants
    x_base: str
    x_off: dict
    y_base: str
    y_off: dict
    layout: str  # "row" (i*ld + k, NoTrans) | "col" (k*ld + i, Trans)
    ld: dict  # elements
    alpha: tuple  # (sign, factors) factors: invariant scalar value strings
    beta: tuple | None
    form: str
    forced: list  # [(i1 value, required bool)]
    narrow: bool  # index arithmetic in < 64 bits without no-wrap flags: guard index ranges
    reassoc: bool
    atom_types: dict
    scalar_loads: dict = attrs.field(factory=dict)  # value -> (base, byte offset poly)


def sizeof(ty: str) -> int | None:
    """Byte size of an IR type (x86-64 data layout), None for structs and unknowns."""
    ty = ty.strip()
    base = {"float": 4, "double": 8, "half": 2, "bfloat": 2, "i1": 1, "i8": 1, "i16": 2,
            "i32": 4, "i64": 8, "ptr": 8, "x86_fp80": 16, "fp128": 16}
    if ty in base:
        return base[ty]
    m = re.fullmatch(r"[\[<]\s*(\d+)\s+x\s+(.*)[\]>]", ty)
    if m:
        inner = sizeof(m.group(2))
        return None if inner is None else int(m.group(1)) * inner
    return None


def int_literal(v: str) -> int | None:
    """Value of an integer literal operand ("-3", "true"), else None."""
    if re.fullmatch(r"-?\d+", v):
        return int(v)
    if v in ("true", "false"):
        return int(v == "true")
    return None


def is_fp_literal(v: str) -> bool:
    """True for a floating-point literal operand (``1.500000e+00``, ``0x3FF8000000000000``)."""
    return bool(re.fullmatch(r"-?\d+\.\d+e[+-]\d+|0x[0-9A-Fa-f]+|-?\d+\.\d*", v))


def fp_zero(v: str) -> bool:
    """True for a literal +0.0 or -0.0."""
    if re.fullmatch(r"-?0\.0+e[+-]00", v) or v in ("0.0", "-0.0"):
        return True
    return v in ("0x0000000000000000", "0x8000000000000000")


class NestMatcher:
    """Match one (outer, inner) loop pair of ``fn``. Call ``match()`` → Gemv or Reject."""

    def __init__(self, fn: Function, cfg: CFG, outer: Loop, inner: Loop, gemm: bool = False):
        self.fn, self.cfg, self.O, self.I = fn, cfg, outer, inner
        #: the inner two loops of a GEMM candidate (gemm.py): x and y may have any loop-invariant
        #: stride and the matrix any layout; gemm.py checks what BLAS can express
        self.gemm = gemm
        self.atom_types: dict = {}
        self.atom_ext: dict = {}
        self.narrow = False
        self.trunc = False
        self.path_pred: dict = {}
        self.scalar_loads: dict = {}
        #: "gemv" once a dot-product reduction acc += a*b over two loads is found in the inner
        #: loop (so a rejection after that point is a GEMV-shaped nest the pass could not take)
        self.kind = "other"

    # ---- helpers ------------------------------------------------------------------------
    def in_nest(self, v: str) -> bool:
        d = self.fn.defs.get(v)
        return d is not None and d.block in self.O.blocks

    def invariant(self, v: str) -> bool:
        """Constant, global, argument or value defined outside the nest."""
        return not v.startswith("%") or not self.in_nest(v)

    def type_of(self, v: str) -> str:
        d = self.fn.defs.get(v)
        if d is not None:
            return d.ty
        for ty, nm in self.fn.args:
            if nm == v:
                return ty
        return ""

    def resolve(self, v: str) -> str:
        """Follow phis of path blocks to the value on the nest's execution path."""
        seen = 0
        while v.startswith("%") and seen < 50:
            d = self.fn.defs.get(v)
            if (d is None or d.op != "phi" or d.block not in self.path_pred
                    or d.block in (self.O.header, self.I.header)):
                return v
            pred = self.path_pred[d.block]
            vals = [x for x, b in d.extra["incoming"] if b == pred]
            if not vals:
                raise Reject(f"phi {v} has no value for the nest's path")
            v = vals[0]
            seen += 1
        return v

    # ---- integer polynomials --------------------------------------------------------------
    def int_poly(self, v: str, depth: int = 0, ext: str = "sext") -> dict:
        """Polynomial of integer value ``v``; ``ext``: how a narrow (< 64-bit) invariant atom
        reached here is widened to i64 ("sext", or "zext" under a zext without nneg)."""
        if depth > 40:
            raise Reject("index expression too deep")
        lit = int_literal(v)
        if lit is not None:
            return P.const(lit)
        v = self.resolve(v)
        if v == self.i_phi:
            return P.atom(IV_I)
        if v == self.k_phi:
            return P.atom(IV_K)
        if v == self.i_next:
            return P.add(P.atom(IV_I), P.const(1))
        if v == self.k_next:
            return P.add(P.atom(IV_K), P.const(1))
        if self.invariant(v):
            ty = self.type_of(v)
            if not re.fullmatch(r"i(8|16|32|64)", ty):
                raise Reject(f"index uses {v} of type {ty or '?'}")
            if ty != "i64":
                if self.atom_ext.setdefault(v, ext) != ext:
                    raise Reject(f"{v} is used both sign- and zero-extended")
                self.atom_types[v] = f"{ext}:{ty}"
            else:
                self.atom_types[v] = ty
            return P.atom(v)
        d = self.fn.defs[v]
        op = d.op
        narrow = d.ty in ("i8", "i16", "i32")
        if op in ("add", "sub", "mul", "shl", "or"):
            a = self.int_poly(d.ops[0], depth + 1, ext)
            b = self.int_poly(d.ops[1], depth + 1, ext)
            if narrow and not ({"nsw", "nuw"} & d.flags):
                self.narrow = True
            if op == "add" or (op == "or" and "disjoint" in d.flags):
                return P.add(a, b)
            if op == "sub":
                return P.add(a, b, -1)
            if op == "mul":
                return P.mul(a, b)
            if op == "shl":
                c = int_literal(d.ops[1])
                if c is None:
                    raise Reject(f"non-affine index: shift by {d.ops[1]}")
                return P.scale(a, 1 << c)
            raise Reject(f"non-affine index: {d.text}")
        if op == "sext":
            return self.int_poly(d.ops[0], depth + 1, "sext")
        if op == "zext":
            if "nneg" in d.flags:  # operand known non-negative: zext == sext
                return self.int_poly(d.ops[0], depth + 1, ext)
            self.narrow = True
            return self.int_poly(d.ops[0], depth + 1, "zext")
        if op == "trunc":
            self.narrow = True
            return self.int_poly(d.ops[0], depth + 1, ext)
        raise Reject(f"non-affine index: {v} = {op} ({d.text[:60]})")

    def ptr_poly(self, v: str, depth: int = 0) -> tuple[str, dict]:
        """(base pointer, byte offset polynomial) of pointer ``v``."""
        v = self.resolve(v)
        if self.invariant(v):
            return v, {}
        d = self.fn.defs[v]
        if d.op != "getelementptr":
            raise Reject(f"pointer {v} computed by {d.op} inside the nest")
        base, off = self.ptr_poly(d.ops[0], depth + 1)
        ty = d.ty
        for j, idx in enumerate(d.ops[1:]):
            size = sizeof(ty)
            if size is None:
                raise Reject(f"address steps through type {ty}")
            off = P.add(off, P.scale(self.int_poly(idx), size))
            if j + 1 < len(d.ops) - 1:
                m = re.fullmatch(r"\[\s*\d+\s+x\s+(.*)\]", ty)
                if not m:
                    raise Reject(f"address indexes into non-array type {ty}")
                ty = m.group(1)
        return base, off

    # ---- loops ----------------------------------------------------------------------------
    def iv_of(self, loop: Loop) -> tuple[str, str, str, str]:
        """(phi, next, start value, latch) of the unit-step induction variable of ``loop``."""
        if len(loop.latches) != 1:
            raise Reject(f"loop {loop.header} has {len(loop.latches)} latches")
        latch = loop.latches[0]
        term = self.fn.blocks[latch].term
        cond = term.extra.get("cond")
        if cond is None:
            raise Reject(f"loop {loop.header} is not bottom-tested")
        c = self.fn.defs.get(cond)
        if c is None or c.op != "icmp":
            raise Reject(f"loop {loop.header} exit test is not an integer compare")
        hdr = self.fn.blocks[loop.header]
        for ins in hdr.instrs:
            if ins.op != "phi" or not re.fullmatch(r"i(32|64)", ins.ty):
                continue
            nxt = [v for v, b in ins.extra["incoming"] if b == latch]
            init = [v for v, b in ins.extra["incoming"] if b != latch]
            if len(nxt) != 1 or len(init) != 1:
                continue
            nd = self.fn.defs.get(nxt[0])
            if nd is None or nd.op != "add" or ins.name not in nd.ops:
                continue
            other = nd.ops[1] if nd.ops[0] == ins.name else nd.ops[0]
            if int_literal(other) != 1:
                continue
            cmp_ops = [self._strip_trunc(o) for o in c.ops]
            if ins.name in cmp_ops or nd.name in cmp_ops:
                return ins.name, nd.name, init[0], latch
        raise Reject(f"loop {loop.header}: no unit-step induction variable tested at the latch")

    def _strip_trunc(self, v: str) -> str:
        d = self.fn.defs.get(v)
        if d is not None and d.op == "trunc":
            return d.ops[0]
        return v

    def range_of(self, loop: Loop, phi: str, nxt: str, init: str, latch: str) -> Range:
        term = self.fn.blocks[latch].term
        c = self.fn.defs[term.extra["cond"]]
        succs = term.extra["succs"]  # [true, false]
        continue_on_true = succs[0] == loop.header
        pred = c.extra["pred"]
        a, b = c.ops
        sa, sb = self._strip_trunc(a), self._strip_trunc(b)
        trunc = sa != a or sb != b
        if sa in (phi, nxt):
            iv, bound = sa, b
        else:
            iv, bound = sb, a
            pred = {"slt": "sgt", "sgt": "slt", "sle": "sge", "sge": "sle", "ult": "ugt",
                    "ugt": "ult", "ule": "uge", "uge": "ule"}.get(pred, pred)
        if not continue_on_true:
            pred = {"eq": "ne", "ne": "eq", "slt": "sge", "sge": "slt", "sgt": "sle",
                    "sle": "sgt", "ult": "uge", "uge": "ult", "ugt": "ule",
                    "ule": "ugt"}[pred]
        # continue while IV pred B, IV counting up by one
        if pred in ("ne", "slt", "ult"):
            end = self.int_poly(bound)
        elif pred in ("sle", "ule"):
            end = P.add(self.int_poly(bound), P.const(1))
        else:
            raise Reject(f"loop {loop.header}: exit test '{pred}' does not count up")
        if iv == phi:
            end = P.add(end, P.const(1))
        if trunc:
            self.narrow = True
        return Range(self.int_poly(init), end, trunc)

    # ---- the nest's execution path ----------------------------------------------------------
    def reaches(self, src: str, dst: str, avoid: set) -> bool:
        seen, work = set(), [src]
        while work:
            b = work.pop()
            if b == dst:
                return True
            if b in seen or b in avoid or b not in self.O.blocks:
                continue
            seen.add(b)
            work.extend(self.cfg.succs[b])
        return False

    def walk_path(self, latch: str, exit_edge: tuple[str, str] | None = None,
                  inner: str = "inner loop") -> tuple[list, list]:
        """Blocks executed by one outer iteration when every loop-invariant branch takes the
        side that leads through the inner loop; returns (path, forced conditions).

        The walk goes from the outer header to ``latch``; at the inner loop's header it
        continues after the inner loop: along ``exit_edge`` (the (from, to) edge leaving a
        multi-block inner loop, e.g. the middle loop of a GEMM nest), else to the header's
        successor other than itself (an innermost single-block loop). ``inner`` names the
        inner loop(s) in messages. Raises Reject for a cycle, a block not ending in ``br``,
        a branch on a value of the loop, or a branch both of whose sides reach the target."""
        path, forced = [], []
        cur, prev, passed = self.O.header, None, False
        ih = self.I.header
        while True:
            if cur in path:
                raise Reject(f"control flow in the nest cycles through {cur}")
            path.append(cur)
            if prev is not None:
                self.path_pred[cur] = prev
            if cur == latch:
                if not passed:
                    raise Reject(f"{inner} not on the outer loop's path")
                return path, forced
            if cur == ih:
                passed = True
                if exit_edge is not None:
                    prev, cur = exit_edge
                else:
                    prev, cur = cur, [s for s in self.cfg.succs[cur] if s != ih][0]
                continue
            term = self.fn.blocks[cur].term
            succs = term.extra.get("succs", [])
            if term.op != "br" or not succs:
                raise Reject(f"block {cur} ends with {term.op}")
            if len(succs) == 1 or succs[0] == succs[1]:
                prev, cur = cur, succs[0]
                continue
            cond = term.extra["cond"]
            if not self.invariant(cond):
                raise Reject(f"branch in {cur} depends on the loop ({cond})")
            target = ih if not passed else latch
            ok = [s for s in succs if self.reaches(s, target, {self.O.header})]
            if len(ok) != 1:
                raise Reject(f"branch in {cur}: both sides reach the "
                             f"{inner if not passed else 'latch'}")
            forced.append((cond, ok[0] == succs[0]))
            prev, cur = cur, ok[0]

    # ---- floating-point dataflow ------------------------------------------------------------
    def scalar_factor(self, v: str) -> str:
        if is_fp_literal(v) or self.invariant(v) or v in self.scalar_loads:
            return v
        raise Reject(f"coefficient {v} is computed inside the nest")

    def lin(self, v: str, terms: dict, depth: int = 0) -> dict:
        """Write fp value ``v`` as Σ coef·key with key in {"S", "y"} (S = the reduction's sum,
        y = the original y[i]); coef = (sign, factors)."""
        if depth > 20:
            raise Reject("stored value too deep")
        v = self.resolve(v)
        if v in terms:
            return dict(terms[v])
        d = self.fn.defs.get(v)
        if d is None or not self.in_nest(v):
            raise Reject(f"stored value depends on {v} (not alpha*acc + beta*y)")
        op = d.op
        if op in ("fadd", "fsub"):
            a = self.lin(d.ops[0], terms, depth + 1)
            b = self.lin(d.ops[1], terms, depth + 1)
            if op == "fsub":
                b = {k: (-s, f) for k, (s, f) in b.items()}
            if set(a) & set(b):
                raise Reject("stored value adds the same term twice")
            return {**a, **b}
        if op == "fneg":
            return {k: (-s, f) for k, (s, f) in self.lin(d.ops[0], terms, depth + 1).items()}
        if op == "fmul":
            return self._lin_mul(d.ops[0], d.ops[1], terms, depth)
        if op == "call" and re.match(r"@llvm\.(fmuladd|fma)\.f(32|64)$", d.extra["callee"]):
            a = self._lin_mul(d.ops[0], d.ops[1], terms, depth)
            b = self.lin(d.ops[2], terms, depth + 1)
            if set(a) & set(b):
                raise Reject("stored value adds the same term twice")
            return {**a, **b}
        raise Reject(f"stored value uses {op} (not alpha*acc + beta*y)")

    def invariant_load(self, v: str) -> bool:
        """A load inside the nest from a loop-invariant address (e.g. alpha read through a
        pointer captured by an OpenMP region): usable as a scalar once the guard proves y does
        not overlap it; recorded in ``scalar_loads``."""
        d = self.fn.defs.get(v)
        if d is None or d.op != "load" or "volatile" in d.flags or d.ty not in (
                "float", "double") or d.block not in self.path_pred and \
                d.block != self.O.header:
            return False
        try:
            base, off = self.ptr_poly(d.ops[0])
        except Reject:
            return False
        if P.uses(off, IV_I) or P.uses(off, IV_K):
            return False
        self.scalar_loads[v] = (base, off)
        return True

    def _is_scalar(self, v: str) -> bool:
        return is_fp_literal(v) or self.invariant(v) or self.invariant_load(v)

    def _lin_mul(self, a: str, b: str, terms: dict, depth: int) -> dict:
        ra, rb = self.resolve(a), self.resolve(b)
        if ra not in terms and self._is_scalar(ra):
            f, other = ra, rb
        elif rb not in terms and self._is_scalar(rb):
            f, other = rb, ra
        else:
            raise Reject("stored value multiplies two loop-variant values")
        inner = self.lin(other, terms, depth + 1)
        return {k: (s, fs + (f,)) for k, (s, fs) in inner.items()}

    # ---- the match ------------------------------------------------------------------------
    def match(self) -> Gemv:
        fn, O, I = self.fn, self.O, self.I
        if I.blocks != {I.header}:
            raise Reject("inner loop body has control flow (not one block)")
        outside_preds = [p for p in self.cfg.preds[O.header] if p not in O.blocks]
        if len(outside_preds) != 1:
            raise Reject(f"outer loop has {len(outside_preds)} entry edges")
        pre = outside_preds[0]
        self.i_phi, self.i_next, i_init, o_latch = self.iv_of(O)
        self.k_phi, self.k_next, k_init, _ = self.iv_of(I)
        if fn.defs[self.i_phi].ty != "i64" or fn.defs[self.k_phi].ty != "i64":
            self.narrow = True  # 32-bit IVs: keep every index within [0, INT32_MAX]
        try:  # early, so a triangular nest is reported as such
            k_range = self.range_of(I, self.k_phi, self.k_next, k_init, I.header)
            if P.uses(k_range.start, IV_I) or P.uses(k_range.end, IV_I):
                raise Reject("inner loop bounds depend on the outer index (triangular)")
        except Reject as exc:
            if "triangular" in str(exc):
                raise
        exits = O.exits(self.cfg)
        if len(exits) != 1 or exits[0][0] != o_latch:
            raise Reject(f"outer loop has {len(exits)} exit edges (break/return in the nest?)")
        exit_block = exits[0][1]
        path, forced = self.walk_path(o_latch)
        # every phi of the two headers must be an IV or the reduction
        for ins in fn.blocks[O.header].instrs:
            if ins.op == "phi" and ins.name != self.i_phi:
                raise Reject(f"outer loop carries another value ({ins.name})")
        ih = fn.blocks[I.header]
        accs = [x for x in ih.instrs if x.op == "phi" and x.name != self.k_phi]
        if len(accs) != 1:
            raise Reject(f"inner loop carries {len(accs)} values besides k (want 1 accumulator)")
        acc = accs[0]
        if acc.ty not in ("float", "double"):
            raise Reject(f"reduction element type {acc.ty} is not float/double")
        dtype, elt = acc.ty, sizeof(acc.ty)
        acc_init = [v for v, b in acc.extra["incoming"] if b != I.header][0]
        acc_next = [v for v, b in acc.extra["incoming"] if b == I.header][0]
        # bounds
        i_range = self.range_of(O, self.i_phi, self.i_next, i_init, o_latch)
        self.path_pred[I.header] = [b for b in self.cfg.preds[I.header] if b != I.header][0]
        # again, now that phis on the path resolve
        k_range = self.range_of(I, self.k_phi, self.k_next, k_init, I.header)
        for p_ in (i_range.start, i_range.end, k_range.start, k_range.end):
            if P.uses(p_, IV_K) or P.uses(p_, IV_I):
                raise Reject("loop bounds depend on an induction variable (triangular)")
        # the reduction step
        nd = fn.defs.get(acc_next)
        if nd is None or nd.block != I.header:
            raise Reject("accumulator not updated in the inner loop")
        if nd.op == "fadd":
            if acc.name not in nd.ops:
                raise Reject("reduction does not add to the accumulator")
            prod = nd.ops[1] if nd.ops[0] == acc.name else nd.ops[0]
            pd = fn.defs.get(prod)
            if pd is None or pd.op != "fmul" or pd.block != I.header:
                raise Reject("reduction term is not a product")
            fa, fb = pd.ops
            reassoc = bool(REASSOC & nd.flags)
        elif nd.op == "call" and re.match(r"@llvm\.(fmuladd|fma)\.f(32|64)$",
                                          nd.extra["callee"]):
            if nd.ops[2] != acc.name:
                raise Reject("fmuladd does not accumulate into the accumulator")
            fa, fb = nd.ops[0], nd.ops[1]
            reassoc = bool(REASSOC & nd.flags)
        else:
            raise Reject(f"accumulator updated by {nd.op} (not acc += a*b)")
        # the term may be scaled: acc += s * A * x (PolyBench gemver); flatten the fmul tree
        leaves, scal = [], []

        def flatten(v: str, depth: int = 0) -> None:
            d = fn.defs.get(v)
            if d is not None and d.op == "fmul" and d.block == I.header and depth < 8:
                if not REASSOC & d.flags:
                    raise Reject("scaled reduction term without reassoc flags")
                flatten(d.ops[0], depth + 1)
                flatten(d.ops[1], depth + 1)
            elif (is_fp_literal(v) or self.invariant(v)) and depth > 0:
                scal.append(v)
            else:
                leaves.append(v)

        if len({fa, fb}) == 2 and any(
                (fn.defs.get(f) is not None and fn.defs[f].op == "fmul") for f in (fa, fb)):
            flatten(fa, 1)
            flatten(fb, 1)
            if len(leaves) != 2:
                raise Reject("reduction term is not a product of two loads and scalars")
            fa, fb = leaves
        inner_factors = tuple(scal)
        loads = []
        for f in (fa, fb):
            ld = fn.defs.get(f)
            if ld is None or ld.op != "load" or ld.ty != dtype:
                raise Reject(f"reduction factor {f} is not a {dtype} load")
            if "volatile" in ld.flags:
                raise Reject("volatile load in the reduction")
            loads.append(self.ptr_poly(ld.ops[0]))
        self.kind = "gemv"
        a_idx = [j for j, (_, off) in enumerate(loads) if P.uses(off, IV_I)]
        if len(a_idx) != 1:
            raise Reject("cannot tell the matrix from the vector (index of both or neither "
                         "depends on i)")
        (a_base, a_off), (x_base, x_off) = loads[a_idx[0]], loads[1 - a_idx[0]]
        ivs = (IV_I, IV_K)
        sa = P.split_linear(a_off, ivs)
        sx = P.split_linear(x_off, ivs)
        if sa is None or sx is None:
            raise Reject("non-affine index (product of induction variables)")
        if sx[IV_I] or not (self.gemm or P.is_const(sx[IV_K], elt)):
            raise Reject("x is not read as x[k] with unit stride")
        ci, ck = sa[IV_I], sa[IV_K]
        if P.is_const(ck, elt):
            layout, ld = "row", P.exact_div(ci, elt)
        elif P.is_const(ci, elt):
            layout, ld = "col", P.exact_div(ck, elt)
        elif self.gemm:
            layout, ld = "row", P.const(0)  # not used: gemm.py reads the strides itself
        else:
            raise Reject("matrix index is neither i*ld + k nor k*ld + i")
        if ld is None or P.uses(ld, IV_I) or P.uses(ld, IV_K):
            raise Reject("leading dimension is not a loop-invariant element count")
        # side effects and stores along the path
        stores = {"pre": [], "inner": [], "post": []}
        y_loads = []
        seen_inner = False
        for b in path:
            if b == I.header:
                seen_inner = True
            where = "inner" if b == I.header else ("post" if seen_inner else "pre")
            for ins in fn.blocks[b].instrs:
                if ins.op in ("load",) and "volatile" in ins.flags:
                    raise Reject(f"volatile load in the nest ({b})")
                if ins.op == "store":
                    if "volatile" in ins.flags or "atomic" in ins.flags:
                        raise Reject("volatile/atomic store in the nest")
                    stores[where].append(ins)
                elif ins.op in ("call", "invoke"):
                    callee = ins.extra.get("callee", "")
                    if not PURE_CALLS.match(callee):
                        raise Reject(f"call to {callee or 'a function pointer'} in the nest")
                elif ins.op in SIDE_EFFECT_OPS:
                    raise Reject(f"{ins.op} in the nest")
                elif ins.op == "load":
                    y_loads.append((where, ins))
        total = sum(len(v) for v in stores.values())
        if total == 0:
            raise Reject("no store in the nest")

        def y_addr(st: Instr) -> tuple[str, dict]:
            base, off = self.ptr_poly(st.ops[1])
            s = P.split_linear(off, ivs)
            if s is None or s[IV_K] or not (self.gemm or P.is_const(s[IV_I], elt)):
                raise Reject("extra store in the nest (not to y[i])")
            return base, off

        all_stores = stores["pre"] + stores["inner"] + stores["post"]
        y = y_addr(all_stores[0])
        for st in all_stores[1:]:
            if y_addr(st) != y:
                raise Reject("extra store in the nest (two different addresses)")
        if any(st.ty != dtype for st in all_stores):
            raise Reject("store of another type in the nest")
        y_base, y_off = y

        def is_y_load(v: str) -> bool:
            d = fn.defs.get(self.resolve(v))
            return d is not None and d.op == "load" and d.block in O.blocks and \
                self.ptr_poly(d.ops[0]) == y

        if len(stores["pre"]) > 1 or len(stores["inner"]) > 1 or len(stores["post"]) > 1:
            raise Reject("extra store in the nest")
        pre_zero = False
        if stores["pre"]:
            if not fp_zero(stores["pre"][0].ops[0]):
                raise Reject("extra store in the nest (y[i] set to a non-zero value first)")
            pre_zero = True
        init = self.resolve(acc_init)
        s_term = (1, inner_factors)
        if fp_zero(init):
            acc_terms = {"S": s_term}
        elif is_y_load(init):
            ld_ins = fn.defs[self.resolve(init)]
            after_pre = bool(stores["pre"]) and (
                stores["pre"][0].block != ld_ins.block or stores["pre"][0].line < ld_ins.line)
            acc_terms = {"S": s_term} if after_pre else {"S": s_term, "y": (1, ())}
        else:
            raise Reject(f"accumulator starts at {init} (neither 0 nor y[i])")
        if stores["inner"]:
            st = stores["inner"][0]
            if self.resolve(st.ops[0]) != acc_next:
                raise Reject("inner loop stores something other than the accumulator")
            if stores["post"]:
                raise Reject("extra store after the inner loop")
            coef = acc_terms
        else:
            if not stores["post"]:
                raise Reject("no store of the result")
            if pre_zero:
                raise Reject("extra store in the nest (y[i] written twice)")
            terms = {acc_next: acc_terms}
            for where, ld_ins in y_loads:
                if ld_ins.name and ld_ins.block != I.header and \
                        self.ptr_poly(ld_ins.ops[0]) == y:
                    terms[ld_ins.name] = {"y": (1, ())}
            coef = self.lin(stores["post"][0].ops[0], terms)
        if set(coef) - {"S", "y"} or "S" not in coef:
            raise Reject("stored value is not alpha*acc + beta*y[i]")
        alpha = coef["S"]
        beta = coef.get("y")
        for _, fs in [alpha] + ([beta] if beta else []):
            for f in fs:
                self.scalar_factor(f)
        if beta is None:
            form = "y=acc" if alpha == (1, ()) else "y=alpha*acc"
        elif beta == (1, ()) and alpha == (1, ()):
            form = "y+=acc"
        else:
            form = "y=alpha*acc+beta*y"
        # nothing defined in the nest may be used after it
        for b in fn.blocks.values():
            if b.name in O.blocks:
                continue
            for ins in b.instrs:
                for o in ins.ops:
                    if o.startswith("%") and self.in_nest(o):
                        raise Reject(f"value {o} computed in the nest is used after it "
                                     f"(in {b.name})")
        return Gemv(fn.name, O, I, pre, exit_block, dtype, elt, i_range, k_range,
                    a_base, a_off, x_base, x_off, y_base, y_off, layout, ld, alpha, beta,
                    form, forced, self.narrow, reassoc, dict(self.atom_types),
                    dict(self.scalar_loads))
