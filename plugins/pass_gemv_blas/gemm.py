"""Recognise a GEMM loop nest and emit its guarded ``cblas_sgemm``/``cblas_dgemm`` call.

A GEMM nest is three loops J ⊃ I ⊃ K (J's only child is I, I's only child the one-block
reduction loop K) whose inner two loops are a GEMV in the relaxed sense of ``NestMatcher(...,
gemm=True)``: per (j, i) one sum ``S = Σ_k P[addr_p(i, k)] · Q[addr_q(j, k)]`` stored as
``C[addr_c(j, i)] = alpha·S + beta·C_old``. The outer loop J must do nothing but run I: every
branch in it tests a value computed before the nest, it stores nothing, calls nothing impure,
carries no value but its IV, and its only loads are of pointers from always-dereferenceable
addresses (OpenMP's captured variables), which the guard re-loads once. With the row index u
and column index v of C chosen so that C's columns are contiguous, the nest is

    C[u][v] = alpha · Σ_k L[u][k] · R[k][v] + beta · C[u][v]

i.e. ``C ← alpha·op(L)·op(R) + beta·C`` of the BLAS standard (BLAS Technical Forum, §2.8.4
"Matrix-Matrix Operations"; CBLAS row-major, Annex B), with op = NoTrans where the K index has
unit stride in L (the v index in R) and Trans where the other one has. The guard checks what
BLAS needs and what makes the reordering legal: M, N, K > 0 and ≤ INT32_MAX, leading
dimensions ≥ the stored row lengths, C's byte range disjoint from L's, R's, every scalar loaded
and every re-loaded pointer slot, and with narrow index arithmetic every index in [0, INT32_MAX].
"""

from __future__ import annotations

import re

import attrs

from . import affine as P
from .match import INT32_MAX, IV_I, IV_K, Gemv, NestMatcher, PURE_CALLS, Reject, SIDE_EFFECT_OPS
from .rewrite import (NO_TRANS, ROW_MAJOR, TRANS, Emitter, call_blocks, disjoint_guard,
                      last_block_of, nonzero_scalars, scalar_load_ranges)

IV_J = "@j"


@attrs.define
class Operand:
    """One BLAS matrix operand: base pointer, byte offset polynomial over IVs and invariants,
    transpose flag, leading dimension (elements), stored rows × cols (element polynomials)."""

    base: str
    off: dict
    trans: bool
    ld: dict
    rows: dict
    cols: dict


@attrs.define
class Gemm:
    fn: str
    outer: object  # Loop J (the preheader/exit/latch edges the rewrite splices in)
    preheader: str
    exit: str
    dtype: str
    elt: int
    ranges: dict  # IV -> (start poly, end poly)
    m: dict
    n: dict
    k: dict
    lhs: Operand  # op(L): M x K
    rhs: Operand  # op(R): K x N
    c: Operand  # C: M x N, NoTrans
    alpha: tuple
    beta: tuple | None
    form: str
    forced: list
    narrow: bool
    atom_types: dict
    scalar_loads: dict
    ptr_loads: dict  # value defined in J -> (type, address) re-loaded in the guard
    reassoc: bool

    @property
    def layout(self) -> str:
        t = lambda o: "T" if o.trans else "N"  # noqa: E731
        return f"C = op{t(self.lhs)}(A)·op{t(self.rhs)}(B)"


def _deref_arg(text: str, fn: str, arg: str, size: int) -> bool:
    """True if ``arg`` of function ``fn`` is declared ``dereferenceable(N)`` with N >= size."""
    m = re.search(rf"^define\b[^\n]*@{re.escape(fn)}\(([^\n]*)$", text, re.M)
    if not m:
        return False
    d = re.search(rf"dereferenceable\((\d+)\)\s+{re.escape(arg)}\b", m.group(1))
    return d is not None and int(d.group(1)) >= size


class _OuterMatcher(NestMatcher):
    """NestMatcher of the (J, I) pair whose re-loaded pointers count as invariant."""

    def __init__(self, *args, hoisted: dict):
        super().__init__(*args)
        self.hoisted = hoisted

    def invariant(self, v: str) -> bool:
        return v in self.hoisted or super().invariant(v)


class GemmLift:
    """Lift a GEMV-shaped match ``g2`` of loops (I, K) to a GEMM over the parent loop J."""

    def __init__(self, fn, cfg, text: str, outer, g2: Gemv, m2: NestMatcher):
        self.fn, self.cfg, self.text, self.J, self.g2, self.m2 = fn, cfg, text, outer, g2, m2
        self.I = g2.outer
        self.ptr_loads: dict = {}
        self.m1 = _OuterMatcher(fn, cfg, outer, self.I, hoisted=self.ptr_loads)

    def in_j(self, v: str) -> bool:
        d = self.fn.defs.get(v)
        return d is not None and d.block in self.J.blocks

    # ---- J's own body ---------------------------------------------------------------------
    def walk(self) -> list:
        """Blocks of J outside I on the path through I; forced branch conditions."""
        i_exits = self.I.exits(self.cfg)
        if len(i_exits) != 1:
            raise Reject(f"loop {self.I.header} has {len(i_exits)} exits")
        return self.m1.walk_path(self.J.latches[0], exit_edge=i_exits[0], inner="inner loops")

    def check_body(self, path: list) -> None:
        fn = self.fn
        for b in path:
            if b in self.I.blocks:
                continue
            for ins in fn.blocks[b].instrs:
                if ins.op in ("call", "invoke"):
                    callee = ins.extra.get("callee", "")
                    if not PURE_CALLS.match(callee):
                        raise Reject(f"call to {callee or 'a function pointer'} in the outer "
                                     f"loop")
                elif ins.op in SIDE_EFFECT_OPS:
                    raise Reject(f"{ins.op} in the outer loop")
                elif ins.op == "load":
                    self.hoistable_load(ins)
        for ins in fn.blocks[self.J.header].instrs:
            if ins.op == "phi" and ins.name != self.m1.i_phi:
                raise Reject(f"outer loop carries another value ({ins.name})")
        for b in fn.blocks.values():
            if b.name in self.J.blocks:
                continue
            for ins in b.instrs:
                for o in ins.ops:
                    if o.startswith("%") and self.in_j(o):
                        raise Reject(f"value {o} computed in the nest is used after it")

    def hoistable_load(self, ins) -> None:
        """A load in J outside I: allowed for a pointer read from a loop-invariant, always
        dereferenceable address (a global, an alloca, a dereferenceable argument: OpenMP's
        captured variables); recorded to be re-loaded once in the guard (C must not overlap
        the slot)."""
        if "volatile" in ins.flags or "atomic" in ins.flags:
            raise Reject("volatile/atomic load in the outer loop")
        addr = ins.ops[0]
        size = 8
        d = self.fn.defs.get(addr)
        ok = ins.ty == "ptr" and not self.in_j(addr) and (
            addr.startswith("@") or (d is not None and d.op == "alloca")
            or (d is None and _deref_arg(self.text, self.fn.name, addr, size)))
        if not ok:
            raise Reject(f"load of {ins.ty} from {addr} in the outer loop")
        self.ptr_loads[ins.name] = (ins.ty, addr, size)

    # ---- polynomials over J ---------------------------------------------------------------
    def expand_int(self, p: dict) -> dict:
        """Replace atoms defined in J by their polynomial over @j and invariants."""
        for mono in list(p):
            for a in mono:
                if a.startswith("%") and self.in_j(a) and a not in self.ptr_loads:
                    q = self.m1.int_poly(a)
                    if P.uses(q, IV_K):
                        raise Reject(f"{a} depends on the middle loop")
                    q = P.subst(q, IV_I, P.atom(IV_J))
                    return self.expand_int(P.subst(p, a, q))
        return p

    def expand_ptr(self, base: str, off: dict) -> tuple[str, dict]:
        off = self.expand_int(off)
        if self.in_j(base) and base not in self.ptr_loads:
            b2, o2 = self.m1.ptr_poly(base)
            o2 = P.subst(o2, IV_I, P.atom(IV_J))
            if P.uses(o2, IV_K):
                raise Reject(f"pointer {base} depends on the middle loop")
            return self.expand_ptr(b2, P.add(off, o2))
        return base, off

    # ---- the lift -------------------------------------------------------------------------
    def lift(self) -> Gemm:
        g2, m1, J, fn = self.g2, self.m1, self.J, self.fn
        if len(J.children) != 1:
            raise Reject(f"outer loop contains {len(J.children)} loops")
        outside = [p for p in self.cfg.preds[J.header] if p not in J.blocks]
        if len(outside) != 1:
            raise Reject(f"outer loop has {len(outside)} entry edges")
        m1.i_phi, m1.i_next, j_init, j_latch = m1.iv_of(J)
        m1.k_phi, m1.k_next, _, _ = m1.iv_of(self.I)
        if fn.defs[m1.i_phi].ty != "i64":
            m1.narrow = True
        exits = J.exits(self.cfg)
        if len(exits) != 1 or exits[0][0] != j_latch:
            raise Reject(f"outer loop has {len(exits)} exit edges")
        path, forced = self.walk()
        self.check_body(path)
        j_range = m1.range_of(J, m1.i_phi, m1.i_next, j_init, j_latch)
        for p_ in (j_range.start, j_range.end):
            if P.uses(p_, IV_I) or P.uses(p_, IV_K):
                raise Reject("outer loop bounds depend on an induction variable")
        ranges = {IV_J: (j_range.start, j_range.end),
                  IV_I: (self.expand_int(g2.i_range.start), self.expand_int(g2.i_range.end)),
                  IV_K: (self.expand_int(g2.k_range.start), self.expand_int(g2.k_range.end))}
        for iv in (IV_I, IV_K):
            if any(P.uses(p_, IV_J) for p_ in ranges[iv]):
                raise Reject("inner loop bounds depend on the outer index (triangular)")
        for cond, _ in g2.forced:
            if self.in_j(cond):
                raise Reject(f"branch condition {cond} is computed in the outer loop")
        for _, fs in [g2.alpha] + ([g2.beta] if g2.beta else []):
            for f in fs:
                if f.startswith("%") and self.in_j(f) and f not in g2.scalar_loads:
                    raise Reject(f"coefficient {f} is computed in the outer loop")
        scalar_loads = {}
        for v, (base, off) in g2.scalar_loads.items():
            base, off = self.expand_ptr(base, off)
            if P.uses(off, IV_J):
                raise Reject("scalar factor read from an address that depends on the outer "
                             "index")
            scalar_loads[v] = (base, off)
        p_base, p_off = self.expand_ptr(g2.a_base, g2.a_off)  # depends on (i, k)
        q_base, q_off = self.expand_ptr(g2.x_base, g2.x_off)  # depends on (j?, k)
        c_base, c_off = self.expand_ptr(g2.y_base, g2.y_off)  # depends on (j, i)
        ivs = (IV_J, IV_I, IV_K)
        sp, sq, sc = (P.split_linear(o, ivs) for o in (p_off, q_off, c_off))
        if sp is None or sq is None or sc is None:
            raise Reject("non-affine index (product of induction variables)")
        for s_ in (sp, sq, sc):
            for iv in ivs:
                if any(P.uses(s_[iv], x) for x in ivs) or any(
                        a.startswith("%") and self.in_j(a) and a not in self.ptr_loads
                        for mono in s_[iv] for a in mono):
                    raise Reject("stride depends on a loop")
        if sp[IV_J]:
            raise Reject("the matrix read with the middle index also depends on the outer one")
        if not sq[IV_J]:
            raise Reject("x does not depend on the outer index (not a GEMM)")
        if not sc[IV_J] or not sc[IV_I] or sc[IV_K]:
            raise Reject("C is not indexed by both outer indices")
        elt = g2.elt
        if P.is_const(sc[IV_I], elt) and not P.is_const(sc[IV_J], elt):
            u, v = IV_J, IV_I  # C[j][i]: rows j, L = the x-side load, R = the matrix
            (l_base, l_off, sl), (r_base, r_off, sr) = (q_base, q_off, sq), (p_base, p_off, sp)
            ldc = sc[IV_J]
        elif P.is_const(sc[IV_J], elt):
            u, v = IV_I, IV_J  # C[i][j]
            (l_base, l_off, sl), (r_base, r_off, sr) = (p_base, p_off, sp), (q_base, q_off, sq)
            ldc = sc[IV_I]
        else:
            raise Reject("C has no unit-stride index (neither C[u*ld + v] nor C[v*ld + u])")
        ext = lambda iv: P.add(ranges[iv][1], ranges[iv][0], -1)  # noqa: E731
        M, N, K = ext(u), ext(v), ext(IV_K)

        def operand(base, off, s_, row_iv, col_iv, rows, cols) -> Operand:
            """BLAS operand of logical shape rows × cols indexed (row_iv, col_iv)."""
            if P.is_const(s_[col_iv], elt):
                ld, trans, st_rows, st_cols = P.exact_div(s_[row_iv], elt), False, rows, cols
            elif P.is_const(s_[row_iv], elt):
                ld, trans, st_rows, st_cols = P.exact_div(s_[col_iv], elt), True, cols, rows
            else:
                raise Reject("a matrix operand has no unit-stride index")
            if ld is None:
                raise Reject("leading dimension is not a whole number of elements")
            return Operand(base, off, trans, ld, st_rows, st_cols)

        lhs = operand(l_base, l_off, sl, u, IV_K, M, K)
        rhs = operand(r_base, r_off, sr, IV_K, v, K, N)
        ldc_e = P.exact_div(ldc, elt)
        if ldc_e is None:
            raise Reject("leading dimension of C is not a whole number of elements")
        c = Operand(c_base, c_off, False, ldc_e, M, N)
        atom_types = dict(self.m2.atom_types)
        atom_types.update(m1.atom_types)
        return Gemm(fn.name, J, outside[0], exits[0][1], g2.dtype, elt, ranges, M, N, K,
                    lhs, rhs, c, g2.alpha, g2.beta, g2.form, list(g2.forced) + forced,
                    g2.narrow or m1.narrow, atom_types, scalar_loads, dict(self.ptr_loads),
                    g2.reassoc)


def _at(p: dict, corner: dict) -> dict:
    for iv, val in corner.items():
        p = P.subst(p, iv, val)
    return p


def build(g: Gemm, tag: str, symbol: str, thread: dict | None) -> tuple[list[str], dict]:
    """Text of the guard and call blocks for ``g`` (as rewrite.build for a GEMV); returns
    (lines, {"last_block": label of the block that branches to the exit})."""
    e = Emitter(tag, g.atom_types)
    ty = g.dtype
    lines_pre = []
    hoisted = {}
    for v, (lty, addr, _) in g.ptr_loads.items():  # re-load J's invariant pointers once
        nv = f"%{tag}.h{len(lines_pre)}"
        lines_pre.append(f"  {nv} = load {lty}, ptr {addr}")
        hoisted[v] = nv
    val = e.poly

    def base(b: str) -> str:
        return hoisted.get(b, b)

    lo = {iv: r[0] for iv, r in g.ranges.items()}
    hi = {iv: P.add(r[1], P.const(1), -1) for iv, r in g.ranges.items()}
    m, n, k = val(g.m), val(g.n), val(g.k)
    conds = []
    for c_, want in g.forced:
        conds.append(c_ if want else e.emit(f"xor i1 {c_}, true"))
    for x in (m, n, k):
        conds += [e.icmp("sgt", x, "0"), e.icmp("sle", x, str(INT32_MAX))]
    lds = {}
    for name, op in (("a", g.lhs), ("b", g.rhs), ("c", g.c)):
        ld = val(op.ld)
        lds[name] = ld
        conds += [e.icmp("sge", ld, val(op.cols)), e.icmp("sle", ld, str(INT32_MAX))]
    if g.narrow:
        for op in (g.lhs, g.rhs, g.c):
            conds += [e.icmp("sge", val(_at(op.off, lo)), "0"),
                      e.icmp("sle", val(_at(op.off, hi)), str(INT32_MAX * g.elt))]
        for iv in g.ranges:
            conds += [e.icmp("sge", val(g.ranges[iv][0]), "0"),
                      e.icmp("sle", val(g.ranges[iv][1]), str(INT32_MAX))]

    def ptr(b: str, off: dict) -> str:
        o = val(off)
        b = base(b)
        return b if o == "0" else e.emit(f"getelementptr i8, ptr {b}, i64 {o}")

    ptrs, ranges = {}, []
    for name, op in (("a", g.lhs), ("b", g.rhs), ("c", g.c)):
        p_ = ptr(op.base, _at(op.off, lo))
        ptrs[name] = p_
        rows_m1 = e.emit(f"sub i64 {val(op.rows)}, 1")
        count = e.emit(f"mul i64 {rows_m1}, {lds[name]}")
        count = e.emit(f"add i64 {count}, {val(op.cols)}")
        p_lo = e.emit(f"ptrtoint ptr {p_} to i64")
        nbytes = e.emit(f"mul i64 {count}, {g.elt}")
        ranges.append((p_lo, e.emit(f"add i64 {p_lo}, {nbytes}")))
    c_lo, c_hi = ranges.pop()
    scalar_ptrs, scalar_ranges = scalar_load_ranges(e, g.scalar_loads, ptr, g.elt)
    ranges += scalar_ranges
    for v, (_, addr, size) in g.ptr_loads.items():
        s_lo = e.emit(f"ptrtoint ptr {addr} to i64")
        ranges.append((s_lo, e.emit(f"add i64 {s_lo}, {size}")))
    ok = disjoint_guard(e, c_lo, c_hi, ranges, conds)
    guard = [f"{tag}.guard:", *lines_pre, *e.lines,
             f"  br i1 {ok}, label %{tag}.call, label {g.outer.header}"]
    e.lines = []
    m32, n32, k32 = (e.emit(f"trunc i64 {x} to i32") for x in (m, n, k))
    ld32 = {name: e.emit(f"trunc i64 {lds[name]} to i32") for name in lds}
    for v, sp in scalar_ptrs.items():
        e.subst[v] = e.emit(f"load {ty}, ptr {sp}")
    alpha = e.scalar(g.alpha, ty)
    beta = e.scalar(g.beta, ty)
    # alpha = 0 or (C read) beta = 0: the original nest, as for GEMV (rewrite.nonzero_scalars)
    nz = nonzero_scalars(e, alpha, beta if g.beta is not None else None, ty)
    call = call_blocks(e, tag, nz, g.outer.header, thread)
    ta = TRANS if g.lhs.trans else NO_TRANS
    tb = TRANS if g.rhs.trans else NO_TRANS
    call += [f"  call void @{symbol}(i32 {ROW_MAJOR}, i32 {ta}, i32 {tb}, i32 {m32}, "
             f"i32 {n32}, i32 {k32}, {ty} {alpha}, ptr {ptrs['a']}, i32 {ld32['a']}, "
             f"ptr {ptrs['b']}, i32 {ld32['b']}, {ty} {beta}, ptr {ptrs['c']}, "
             f"i32 {ld32['c']})",
             f"  br label {g.exit}"]
    return guard + call, {"last_block": last_block_of(tag, thread)}
