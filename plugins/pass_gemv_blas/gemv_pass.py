"""The IR pass ``gemv-blas``: naive GEMV loop nests → guarded ``cblas_sgemv``/``cblas_dgemv``.

Pipeline per function: parse the IR text (``ir_text``), build the CFG, dominators and natural
loops (``loops``), match every two-level nest whose inner loop is innermost (``match``), and
splice a guarded BLAS call in front of each match (``rewrite``). The result is re-parsed and
verified with llvmlite; a nest whose rewrite does not verify is left alone and reported.
What is recognised, why it is legal and the floating-point policy: docs/PASS.md.
"""

from __future__ import annotations

import re
from typing import Literal

import attrs

from ditto_core.base.errors import DittoError
from ditto_core.base.options import option
from ditto_core.base.types import IRModule, PassReport

from . import gemm, rewrite
from .ir_text import parse_functions, split_top
from .loops import build_cfg, find_loops
from .match import NestMatcher, Reject

THREAD_FLAG = "@ditto.gemv.blas_single_threaded"
#: calls an outlined OpenMP function may make and still be run serialized as one region
REGION_OK_CALLS = re.compile(r"^@(__kmpc_for_static_init_4u?|__kmpc_for_static_init_8u?|"
                             r"__kmpc_for_static_fini|__kmpc_barrier|llvm\.[-\w.]+)$")


def region_serializable(fn, nest_blocks: set) -> bool:
    """True if the outlined OpenMP function ``fn`` does nothing but the GEMV nest (blocks
    ``nest_blocks``) and the static-schedule bookkeeping: running its region on one thread
    (as ``#pragma omp parallel if(0)`` would) then computes the same thing."""
    allocas = {i.name for b in fn.blocks.values() for i in b.instrs if i.op == "alloca"}
    for b in fn.blocks.values():
        if b.name in nest_blocks:
            continue
        for ins in b.instrs:
            if ins.op == "store" and ins.ops[1] not in allocas:
                return False
            if ins.op in ("call", "invoke") and not REGION_OK_CALLS.match(
                    ins.extra.get("callee", "")):
                return False
            if ins.op in ("atomicrmw", "cmpxchg", "fence"):
                return False
    return True
STRICT_HINT = ("reduction has no reassoc flag (strict FP order); compile with "
               "-fassociative-math/-ffast-math or put '#pragma clang fp reassociate(on)' "
               "in the loop's block")


def _verify(text: str) -> str | None:
    """None if ``text`` parses and verifies in llvmlite, else the error message."""
    import llvmlite.binding as llvm

    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as exc:
        return str(exc).strip()
    return None


class GemvBlasPass:
    """IR pass ``gemv-blas`` (stage 5, rewrite).

    ``allow_strict``: also rewrite reductions without ``reassoc`` (the report then says
    ``"reassociates": true``); default False, see docs/PASS.md "Floating-point policy".
    ``omp_threads``: ``"single"`` makes BLAS single-threaded (once, process-wide) before the
    first call from an OpenMP outlined function; ``"region"`` runs a parallel region that holds
    nothing but the rewritten nest serialized (``__kmpc_serialized_parallel``), so its one
    chunk is the whole range and BLAS uses its own threads; ``"blas"`` leaves BLAS threading
    alone (oversubscribed). Measurements: docs/PASS.md "OpenMP".
    """

    name = "gemv-blas"
    #: on by default (``selection.default_passes``): the only default pass
    default_order = 0

    @attrs.frozen
    class Options:
        """``-O gemv-blas.KEY=VALUE`` (docs/PASS.md "OpenMP", "Floating-point policy")."""

        omp_threads: Literal["single", "region", "blas"] = option(
            "single", "BLAS threads for a GEMV inside an OpenMP region: single (BLAS set to 1 "
            "thread), region (region serialized, BLAS threads), blas (left alone)",
            env="DITTO_GEMV_OMP")
        strict: bool = option(
            False, "also rewrite reductions without the reassoc flag (reorders their sums)",
            env="DITTO_GEMV_STRICT", env_value=lambda text: text.strip() == "1")

    def with_options(self, options: "GemvBlasPass.Options") -> "GemvBlasPass":
        """A copy of this pass configured with ``options``."""
        return GemvBlasPass(allow_strict=options.strict, omp_threads=options.omp_threads)

    def __init__(self, allow_strict: bool = False, omp_threads: str = "single"):
        if omp_threads not in ("single", "region", "blas"):
            raise DittoError(f"gemv-blas: omp_threads must be single|region|blas, "
                             f"not {omp_threads!r}")
        self.allow_strict = allow_strict
        self.omp_threads = omp_threads

    # -------------------------------------------------------------------------------------
    def analyse(self, text: str) -> list[tuple[dict, object]]:
        """Every candidate nest of the module: (report dict, Gemv or None)."""
        out = []
        for fn in parse_functions(text):
            cfg = build_cfg(fn)
            for loop in find_loops(cfg):
                if not loop.children or any(c.children for c in loop.children):
                    continue
                cand = {"function": fn.name, "loop": loop.header.lstrip("%"),
                        "depth": 2, "omp": ".omp_outlined" in fn.name}
                if len(loop.children) != 1:
                    cand.update(status="rejected", kind="other",
                                reason=f"outer loop contains {len(loop.children)} inner loops")
                    out.append((cand, None))
                    continue
                inner = loop.children[0]
                cand["inner_loop"] = inner.header.lstrip("%")
                gm, gemm_reason = self._gemm(text, fn, cfg, loop, inner)
                if gm is not None:
                    cand.update(loop=gm.outer.header.lstrip("%"),
                                middle_loop=loop.header.lstrip("%"), depth=3, kind="gemm",
                                dtype=gm.dtype, form=gm.form, layout=gm.layout,
                                reassociates=not gm.reassoc)
                    if not gm.reassoc and not self.allow_strict:
                        cand.update(status="rejected", reason=STRICT_HINT)
                        out.append((cand, None))
                    else:
                        cand.update(status="rewritten", reason="")
                        out.append((cand, (fn, gm)))
                    continue
                if gemm_reason:
                    cand["gemm_reason"] = gemm_reason
                matcher = NestMatcher(fn, cfg, loop, inner)
                try:
                    g = matcher.match()
                except Reject as exc:
                    cand.update(status="rejected", reason=str(exc), kind=matcher.kind)
                    out.append((cand, None))
                    continue
                cand.update(kind="gemv", dtype=g.dtype, form=g.form,
                            layout="row-major NoTrans (i*ld+k)" if g.layout == "row"
                            else "transposed (k*ld+i)",
                            reassociates=not g.reassoc)
                if not g.reassoc and not self.allow_strict:
                    cand.update(status="rejected", reason=STRICT_HINT)
                    out.append((cand, None))
                    continue
                cand.update(status="rewritten", reason="")
                out.append((cand, (fn, g)))
        return out

    @staticmethod
    def _gemm(text, fn, cfg, loop, inner) -> tuple:
        """(Gemm, "") when ``loop``/``inner`` are the inner two loops of a GEMM nest
        (docs/PASS.md "GEMM"); (None, reason) when they are GEMV-shaped inside a single-child
        parent loop that is not one; (None, "") otherwise."""
        parent = loop.parent
        if parent is None or len(parent.children) != 1:
            return None, ""
        m2 = NestMatcher(fn, cfg, loop, inner, gemm=True)
        try:
            g2 = m2.match()
        except Reject:
            return None, ""
        try:
            return gemm.GemmLift(fn, cfg, text, parent, g2, m2).lift(), ""
        except Reject as exc:
            return None, f"not a GEMM: {exc}"

    def _apply(self, text: str, chosen: list, blas) -> str:
        lines = text.split("\n")
        edits: dict = {}
        inserts: dict = {}  # end line of function -> new lines
        decls = set()
        need_flag = False
        serialized: set = set()
        tc = getattr(blas, "thread_control", None)
        set_threads = (tc() or {}).get("set_num_threads") if callable(tc) else None
        # nest headers -> (tag, preheader), to chain a nest that exits into the next one
        heads = {(fn.name, g.outer.header): (f"gemv{n}", g.preheader)
                 for n, (_, (fn, g)) in enumerate(chosen)}
        for n, (cand, (fn, g)) in enumerate(chosen):
            tag = f"gemv{n}"
            nxt = heads.get((fn.name, g.exit))
            next_guard = (f"%{nxt[0]}.guard" if nxt is not None
                          and nxt[1] == g.outer.latches[0] else None)
            is_gemm = isinstance(g, gemm.Gemm)
            routine = ("cblas_s" if g.dtype == "float" else "cblas_d") + (
                "gemm" if is_gemm else "gemv")
            symbol = blas.symbol(routine) if blas is not None else routine
            thread = None
            if cand["omp"] and self.omp_threads == "region" and region_serializable(
                    fn, g.outer.blocks) and fn.name not in serialized:
                n_forks = self._serialize_region(text, lines, fn.name, tag, edits, inserts,
                                                 decls)
                if n_forks:
                    serialized.add(fn.name)
            if cand["omp"] and fn.name in serialized:
                cand["blas_threads"] = "library default (parallel region serialized)"
            elif cand["omp"] and self.omp_threads in ("single", "region") and set_threads:
                thread = {"set": set_threads, "flag": THREAD_FLAG}
                need_flag = True
                decls.add(f"declare void @{set_threads}(i32)")
            cand["routine"] = symbol
            cand.setdefault("blas_threads", "1 (set once)" if thread else "library default")
            if is_gemm:
                body, facts = gemm.build(g, tag, symbol, thread)
                next_guard = None
            else:
                body, facts = rewrite.build(g, tag, symbol, thread, next_guard)
            inserts.setdefault(fn.end_line, []).extend(body)
            for ln, f in rewrite.text_edits(fn.blocks, g, tag, facts["last_block"],
                                            exit_phis=next_guard is None).items():
                prev = edits.get(ln)
                edits[ln] = f if prev is None else (lambda s, p=prev, f=f: f(p(s)))
            ty = g.dtype
            if is_gemm:
                decls.add(f"declare void @{symbol}(i32, i32, i32, i32, i32, i32, {ty}, ptr, i32, "
                          f"ptr, i32, {ty}, ptr, i32)")
            else:
                decls.add(f"declare void @{symbol}(i32, i32, i32, i32, {ty}, ptr, i32, ptr, "
                          f"i32, {ty}, ptr, i32)")
        out = []
        for j, line in enumerate(lines):
            if j in edits:
                line = edits[j](line)
            if j in inserts:
                out.extend(inserts[j])
            out.append(line)
        for d in sorted(decls):
            sym = re.search(r"@([-\w.$]+)\(", d).group(1)
            if not re.search(rf"^(declare|define)\b[^\n]*@{re.escape(sym)}\(", text, re.M):
                out.append(d)
        if need_flag and THREAD_FLAG + " =" not in text:
            out.append(f"{THREAD_FLAG} = internal global i32 0, align 4")
        return "\n".join(out)

    @staticmethod
    def _serialize_region(text, lines, outlined, tag, edits, inserts, decls) -> int:
        """Replace every ``__kmpc_fork_call(loc, n, @outlined, args...)`` by a serialized
        region on the calling thread: ``__kmpc_serialized_parallel``; ``outlined(&gtid,
        &zero, args...)``; ``__kmpc_end_serialized_parallel`` (what clang emits for
        ``parallel if(0)``). Returns the number of call sites changed."""
        fork = re.compile(r"^(\s*)call void \(ptr, i32, ptr, \.\.\.\) @__kmpc_fork_call\("
                          r"(.*)\)\s*(;.*)?$")
        count = 0
        for fn in parse_functions(text):
            entry_first = fn.blocks[fn.entry].instrs[0].line
            for b in fn.blocks.values():
                for ins in b.instrs:
                    m = fork.match(lines[ins.line])
                    if not m or ins.extra.get("callee") != "@__kmpc_fork_call":
                        continue
                    args = [a.strip() for a in split_top(m.group(2))]
                    if len(args) < 3 or args[2].split()[-1] != "@" + outlined:
                        continue
                    loc = args[0].split()[-1]
                    t = f"%{tag}.r{count}"
                    inserts.setdefault(entry_first, []).extend(
                        [f"  {t}.gtid.addr = alloca i32, align 4",
                         f"  {t}.zero.addr = alloca i32, align 4"])
                    rest = ", ".join(a.replace("nonnull ", "") for a in args[3:])
                    body = [f"  {t}.gtid = call i32 @__kmpc_global_thread_num(ptr {loc})",
                            f"  store i32 {t}.gtid, ptr {t}.gtid.addr, align 4",
                            f"  store i32 0, ptr {t}.zero.addr, align 4",
                            f"  call void @__kmpc_serialized_parallel(ptr {loc}, i32 {t}.gtid)",
                            f"  call void @{outlined}(ptr {t}.gtid.addr, ptr {t}.zero.addr"
                            + (f", {rest}" if rest else "") + ")",
                            f"  call void @__kmpc_end_serialized_parallel(ptr {loc}, "
                            f"i32 {t}.gtid)"]
                    edits[ins.line] = (lambda s_, body=body: "\n".join(body))
                    count += 1
        if count:
            decls.update({"declare i32 @__kmpc_global_thread_num(ptr)",
                          "declare void @__kmpc_serialized_parallel(ptr, i32)",
                          "declare void @__kmpc_end_serialized_parallel(ptr, i32)"})
        return count

    def run(self, module: IRModule, blas) -> tuple[IRModule, PassReport]:
        """Rewrite every recognised GEMV nest of ``module``; see the module docstring.

        Returns the new module (parses and verifies in llvmlite) and a PassReport with one
        dict per candidate: function, loop, inner_loop, status ("rewritten"/"rejected"),
        reason, kind ("gemv": a dot-product reduction nest; "other": any other two-level
        nest), omp, and for matched nests dtype, form, layout, reassociates, routine.
        Raises DittoError if the input module itself does not parse."""
        text = module.text
        err = _verify(text)
        if err is not None:
            raise DittoError(f"{module.source or 'IR module'}: input IR does not verify: "
                             f"{err[:300]}")
        found = self.analyse(text)
        if blas is None:  # nothing to call: report what would have been rewritten
            for c, m in found:
                if m is not None:
                    c.update(status="rejected", reason="no BLAS target given")
            return IRModule(text, module.source), PassReport(tuple(c for c, _ in found))
        chosen = [(c, m) for c, m in found if m is not None]
        new = self._apply(text, chosen, blas) if chosen else text
        if chosen and _verify(new) is not None:
            # isolate the nests whose rewrite breaks the module; keep the others
            good = []
            for item in chosen:
                trial = self._apply(text, good + [item], blas)
                why = _verify(trial)
                if why is None:
                    good.append(item)
                else:
                    item[0].update(status="rejected",
                                   reason=f"rewrite did not verify: {why.splitlines()[0][:160]}")
            new = self._apply(text, good, blas) if good else text
        return IRModule(new, module.source), PassReport(tuple(c for c, _ in found))
