"""Emit the guarded BLAS call for a matched GEMV nest, as edits of the module's IR text.

For a nest entered from block P (its preheader) into header H and left to block E:

    P:            br ... label %gemvN.guard ...          (was: label %H)
    gemvN.guard:  evaluate m, n, ld, pointers; ok = m>0 & n>0 & ld>=cols & no overlap & ...
                  br i1 ok, label %gemvN.call, label %H  (H's phis now come from gemvN.guard)
    gemvN.call:   load the scalars, alpha, beta; nz = alpha != 0 [& beta != 0]
                  br i1 nz, label %gemvN.go, label %H   (and from gemvN.call)
    gemvN.go:     call void @<cblas_[sd]gemv>(101, 111|112, M, N, alpha, A, ld, x, 1, beta, y, 1)
                  br label %E                           (E's phis get an incoming from here)

The original nest stays as the fallback, so a failed guard runs the C semantics unchanged.
alpha = 0 and beta = 0 go to the fallback too: BLAS returns early for alpha = 0 (A·x unread)
and does not read y for beta = 0 (BLAS Technical Forum §2.8.3), where the C loop computes
0·Inf or 0·NaN = NaN; NaN and Inf keep their meaning (docs/PASS.md "Floating-point policy").
A beta that the store form does not have (``y[i] = alpha·acc``) is not checked: y is not read.
CBLAS interface: BLAS Technical Forum Standard (2001), Annex B (``CblasRowMajor`` = 101,
``CblasNoTrans`` = 111, ``CblasTrans`` = 112).
"""

from __future__ import annotations

import re

from . import affine as P
from .match import IV_I, IV_K, INT32_MAX, Gemv

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


class Emitter:
    """Accumulates instructions of the guard block with unique names ``%gemvN.tJ``."""

    def __init__(self, tag: str, atom_types: dict):
        self.tag, self.lines, self.n = tag, [], 0
        self.atom_types = atom_types
        self.cache: dict = {}
        self.subst: dict = {}

    def tmp(self) -> str:
        self.n += 1
        return f"%{self.tag}.t{self.n}"

    def emit(self, text: str) -> str:
        name = self.tmp()
        self.lines.append(f"  {name} = {text}")
        return name

    def atom64(self, a: str) -> str:
        if a in self.cache:
            return self.cache[a]
        ty = self.atom_types.get(a, "i64")
        ext, _, ty = ty.rpartition(":")
        v = a if ty == "i64" else self.emit(f"{ext or 'sext'} {ty} {a} to i64")
        self.cache[a] = v
        return v

    def poly(self, p: dict) -> str:
        """i64 value of an invariant polynomial (no IV atoms)."""
        acc = None
        for mono, c in sorted(p.items()):
            if not mono:
                term = str(c)
            else:
                term = self.atom64(mono[0])
                for a in mono[1:]:
                    term = self.emit(f"mul i64 {term}, {self.atom64(a)}")
                if c != 1:
                    term = self.emit(f"mul i64 {term}, {c}")
            acc = term if acc is None else self.emit(f"add i64 {acc}, {term}")
        return "0" if acc is None else acc

    def icmp(self, pred: str, a: str, b: str) -> str:
        return self.emit(f"icmp {pred} i64 {a}, {b}")

    def scalar(self, coef: tuple | None, ty: str) -> str:
        if coef is None:
            return "0.000000e+00"
        sign, factors = coef
        v = None
        for f in factors:
            f = self.subst.get(f, f)
            v = f if v is None else self.emit(f"fmul {ty} {v}, {f}")
        if v is None:
            v = "1.000000e+00"
        if sign < 0:
            v = self.emit(f"fneg {ty} {v}")
        return v


def nonzero_scalars(e: Emitter, alpha: str, beta: str | None, ty: str) -> str:
    """i1 value: alpha != 0 and (when the C code reads y_old, ``beta`` given) beta != 0. The
    BLAS call is equivalent to the C loop only then (NaN alpha/beta count as nonzero: both
    sides give NaN)."""
    ok = e.emit(f"fcmp une {ty} {alpha}, 0.000000e+00")
    if beta is not None:
        ok = e.emit(f"and i1 {ok}, {e.emit(f'fcmp une {ty} {beta}, 0.000000e+00')}")
    return ok


def call_blocks(e: Emitter, tag: str, nz: str, header: str, thread: dict | None) -> list[str]:
    """Lines of ``{tag}.call`` (``e.lines``: the scalars and call arguments, then a branch to
    the original nest at ``header`` unless ``nz``), of ``{tag}.go`` and, inside an OpenMP
    region (``thread`` as in ``build``), of the blocks that make BLAS single-threaded once,
    ending in ``{tag}.blas``. The caller appends the BLAS call and the branch out to the
    returned list (``last_block_of`` names the block they end up in)."""
    call = [f"{tag}.call:", *e.lines, f"  br i1 {nz}, label %{tag}.go, label {header}",
            f"{tag}.go:"]
    e.lines = []
    if thread is not None:
        # exactly one thread (the first to flip the flag 0 -> 1) sets BLAS to one thread
        flag = thread["flag"]
        seen = e.emit(f"load atomic i32, ptr {flag} monotonic, align 4")
        unset = e.emit(f"icmp eq i32 {seen}, 0")
        call += e.lines
        e.lines = []
        call += [f"  br i1 {unset}, label %{tag}.claim, label %{tag}.blas",
                 f"{tag}.claim:",
                 f"  %{tag}.cx = cmpxchg ptr {flag}, i32 0, i32 1 monotonic monotonic",
                 f"  %{tag}.won = extractvalue {{ i32, i1 }} %{tag}.cx, 1",
                 f"  br i1 %{tag}.won, label %{tag}.threads, label %{tag}.blas",
                 f"{tag}.threads:",
                 f"  call void @{thread['set']}(i32 1)",
                 f"  br label %{tag}.blas",
                 f"{tag}.blas:"]
    return call


def last_block_of(tag: str, thread: dict | None) -> str:
    """The block of ``call_blocks`` that holds the BLAS call and branches to the exit."""
    return f"%{tag}.blas" if thread is not None else f"%{tag}.go"


def scalar_load_ranges(e: Emitter, scalar_loads: dict, ptr, elt: int
                       ) -> tuple[dict, list[tuple[str, str]]]:
    """For each loop-invariant scalar load of the nest (value → (base, byte offset)): its
    address (``ptr(base, offset)``) and the byte range ``[lo, lo + elt)`` it reads, as i64
    values emitted into ``e``. Returns ({value: address}, [(lo, hi), ...])."""
    addrs, ranges = {}, []
    for v, (base, off) in scalar_loads.items():
        sp = ptr(base, off)
        addrs[v] = sp
        lo = e.emit(f"ptrtoint ptr {sp} to i64")
        ranges.append((lo, e.emit(f"add i64 {lo}, {elt}")))
    return addrs, ranges


def disjoint_guard(e: Emitter, out_lo: str, out_hi: str, ranges, conds: list[str]) -> str:
    """The i1 value that is true when every condition of ``conds`` holds and no byte range
    ``[lo, hi)`` of ``ranges`` overlaps the output's ``[out_lo, out_hi)`` (the BLAS call may
    then write the output while reading the others: docs/PASS.md "Why the rewrite is legal")."""
    for lo, hi in ranges:
        before = e.emit(f"icmp ule i64 {out_hi}, {lo}")
        after = e.emit(f"icmp ule i64 {hi}, {out_lo}")
        conds.append(e.emit(f"or i1 {before}, {after}"))
    ok = conds[0]
    for c in conds[1:]:
        ok = e.emit(f"and i1 {ok}, {c}")
    return ok


def _at(p: dict, i: dict, k: dict) -> dict:
    return P.subst(P.subst(p, IV_I, i), IV_K, k)


def build(g: Gemv, tag: str, symbol: str, thread: dict | None,
          next_guard: str | None = None) -> tuple[list[str], dict]:
    """Text of the guard and call blocks for ``g``; returns (lines, facts for the report).

    ``thread``: for a nest inside an OpenMP outlined function, {"set": symbol of
    ``void set_num_threads(int)``, "flag": name of a module global i32} to make BLAS
    single-threaded once (see docs/PASS.md, "OpenMP"); None leaves BLAS threading alone.
    ``next_guard``: label of the guard block of a rewritten nest that directly follows this
    one (its header is this nest's exit); the call block then branches there."""
    e = Emitter(tag, g.atom_types)
    ty = g.dtype
    i0, i1 = g.i_range.start, g.i_range.end
    k0, k1 = g.k_range.start, g.k_range.end
    m = e.poly(P.add(i1, i0, -1))
    n = e.poly(P.add(k1, k0, -1))
    ld = e.poly(g.ld)
    rows, cols = (m, n) if g.layout == "row" else (n, m)
    conds = []
    for val, want in g.forced:
        conds.append(val if want else e.emit(f"xor i1 {val}, true"))
    conds += [e.icmp("sgt", m, "0"), e.icmp("sgt", n, "0"),
              e.icmp("sle", m, str(INT32_MAX)), e.icmp("sle", n, str(INT32_MAX)),
              e.icmp("sge", ld, cols), e.icmp("sle", ld, str(INT32_MAX))]
    one = P.const(1)
    i_last, k_last = P.add(i1, one, -1), P.add(k1, one, -1)
    if g.narrow:
        # index arithmetic may wrap in 32 bits: require every index in [0, INT32_MAX]
        for p_ in (g.a_off, g.x_off, g.y_off):
            lo = e.poly(_at(p_, i0, k0))
            hi = e.poly(_at(p_, i_last, k_last))
            conds += [e.icmp("sge", lo, "0"), e.icmp("sle", hi, str(INT32_MAX * g.elt))]
        for r0, r1 in ((i0, i1), (k0, k1)):
            conds += [e.icmp("sge", e.poly(r0), "0"), e.icmp("sle", e.poly(r1), str(INT32_MAX))]

    def ptr(base: str, off: dict) -> str:
        o = e.poly(off)
        return base if o == "0" else e.emit(f"getelementptr i8, ptr {base}, i64 {o}")

    a_ptr = ptr(g.a_base, _at(g.a_off, i0, k0))
    x_ptr = ptr(g.x_base, _at(g.x_off, i0, k0))
    y_ptr = ptr(g.y_base, _at(g.y_off, i0, k0))
    # byte extents: A touches (rows-1)*ld + cols elements from a_ptr
    a_n = e.emit(f"mul i64 {e.emit(f'sub i64 {rows}, 1')}, {ld}")
    a_n = e.emit(f"add i64 {a_n}, {cols}")
    a_lo = e.emit(f"ptrtoint ptr {a_ptr} to i64")
    x_lo = e.emit(f"ptrtoint ptr {x_ptr} to i64")
    y_lo = e.emit(f"ptrtoint ptr {y_ptr} to i64")
    a_hi = e.emit(f"add i64 {a_lo}, {e.emit(f'mul i64 {a_n}, {g.elt}')}")
    x_hi = e.emit(f"add i64 {x_lo}, {e.emit(f'mul i64 {n}, {g.elt}')}")
    y_hi = e.emit(f"add i64 {y_lo}, {e.emit(f'mul i64 {m}, {g.elt}')}")
    scalar_ptrs, scalar_ranges = scalar_load_ranges(e, g.scalar_loads, ptr, g.elt)
    ok = disjoint_guard(e, y_lo, y_hi, [(a_lo, a_hi), (x_lo, x_hi), *scalar_ranges], conds)
    guard = [f"{tag}.guard:", *e.lines,
             f"  br i1 {ok}, label %{tag}.call, label {g.outer.header}"]
    e.lines = []
    m32 = e.emit(f"trunc i64 {rows} to i32")
    n32 = e.emit(f"trunc i64 {cols} to i32")
    ld32 = e.emit(f"trunc i64 {ld} to i32")
    for v, sp in scalar_ptrs.items():
        e.subst[v] = e.emit(f"load {ty}, ptr {sp}")
    alpha = e.scalar(g.alpha, ty)
    beta = e.scalar(g.beta, ty)
    nz = nonzero_scalars(e, alpha, beta if g.beta is not None else None, ty)
    trans = NO_TRANS if g.layout == "row" else TRANS
    call = call_blocks(e, tag, nz, g.outer.header, thread)
    call += [f"  call void @{symbol}(i32 {ROW_MAJOR}, i32 {trans}, i32 {m32}, i32 {n32}, "
             f"{ty} {alpha}, ptr {a_ptr}, i32 {ld32}, ptr {x_ptr}, i32 1, {ty} {beta}, "
             f"ptr {y_ptr}, i32 1)",
             f"  br label {next_guard or g.exit}"]
    return guard + call, {"last_block": last_block_of(tag, thread)}


def _relabel(line: str, old: str, new: str) -> str:
    return re.sub(rf"label {re.escape(old)}(?![-\w.$])", f"label {new}", line)


def text_edits(fn_blocks: dict, g: Gemv, tag: str, last_block: str,
               exit_phis: bool = True) -> dict:
    """Line edits (line index → function(str) → str) that splice the new blocks in."""
    edits: dict = {}
    guard = f"%{tag}.guard"
    pre = fn_blocks[g.preheader]
    term_line = pre.term.line

    def add(line, f):
        prev = edits.get(line)
        edits[line] = f if prev is None else (lambda s, p=prev, f=f: f(p(s)))

    add(term_line, lambda s: _relabel(s, g.outer.header, guard))
    call = f"%{tag}.call"  # enters the header too when alpha or beta is 0
    for ins in fn_blocks[g.outer.header].instrs:
        if ins.op == "phi":
            v = [v for v, b in ins.extra["incoming"] if b == g.preheader][0]
            add(ins.line, lambda s, v=v: re.sub(rf",\s*{re.escape(g.preheader)}\s*\]",
                                                f", {guard} ], [ {v}, {call} ]", s))
    latch = g.outer.latches[0]
    for ins in (fn_blocks[g.exit].instrs if exit_phis else ()):
        if ins.op == "phi":
            vals = [v for v, b in ins.extra["incoming"] if b == latch]
            if vals:
                v = vals[0]

                def f(s, v=v):
                    j = s.rindex("]")
                    return s[: j + 1] + f", [ {v}, {last_block} ]" + s[j + 1:]

                add(ins.line, f)
    return edits
