"""Unit tests of the gemv-blas pass's pieces: IR reader, dominators and natural loops, integer
polynomials, the pass's report and floating-point policy, the OpenMP threading option, and
bad input."""

from __future__ import annotations

import json
import subprocess

import pytest

from ditto_blas_openblas import OpenBlasTarget
from ditto_core.base.errors import DittoError
from ditto_core.base.types import IRModule
from ditto_pass_gemv_blas import GemvBlasPass
from ditto_pass_gemv_blas import affine as P
from ditto_pass_gemv_blas.ir_text import parse_functions
from ditto_pass_gemv_blas.loops import build_cfg, find_loops

MV = r"""
void mv(float *y, const float *A, const float *x, int m, int n) {
  for (int i = 0; i < m; i++) {
    float acc = 0.0f;
    for (int k = 0; k < n; k++) acc += A[i * n + k] * x[k];
    y[i] = acc;
  }
}
"""

THREE_DEEP = r"""
void batched(float *Y, const float *A, const float *X, int b, int m, int n) {
  for (int t = 0; t < b; t++)
    for (int i = 0; i < m; i++) {
      float acc = 0.0f;
      for (int k = 0; k < n; k++) acc += A[i * n + k] * X[t * n + k];
      Y[t * m + i] = acc;
    }
}
"""


def clang_ir(tmp_path, src: str, *flags: str, name: str = "k.c") -> str:
    c = tmp_path / name
    c.write_text(src)
    out = tmp_path / (name + ".ll")
    subprocess.run(["clang-22", "-O1", "-S", "-emit-llvm", *flags, str(c), "-o", str(out)],
                   check=True)
    return out.read_text()


def test_loops_and_dominators(tmp_path):
    text = clang_ir(tmp_path, MV, "-ffast-math")
    (fn,) = parse_functions(text)
    assert fn.name == "mv" and [t for t, _ in fn.args] == ["ptr", "ptr", "ptr", "i32", "i32"]
    cfg = build_cfg(fn)
    loops = find_loops(cfg)
    assert len(loops) == 2
    outer, inner = loops
    assert inner.parent is outer and outer.children == [inner]
    assert (outer.depth, inner.depth) == (1, 2)
    assert inner.blocks == {inner.header} and inner.latches == [inner.header]
    assert inner.blocks < outer.blocks
    # the entry dominates everything; the inner header does not dominate the outer header
    for b in fn.blocks:
        assert cfg.dominates(fn.entry, b)
    assert cfg.dominates(outer.header, inner.header)
    assert not cfg.dominates(inner.header, outer.header)
    # single exit edge of the outer loop, from its latch
    (exit_edge,) = outer.exits(cfg)
    assert exit_edge[0] == outer.latches[0]


def test_polynomials():
    a = P.add(P.mul(P.atom("@i"), P.atom("%n")), P.atom("@k"))
    parts = P.split_linear(a, ("@i", "@k"))
    assert parts["@i"] == {("%n",): 1} and parts["@k"] == {(): 1} and parts[None] == {}
    assert P.split_linear(P.mul(P.atom("@i"), P.atom("@k")), ("@i", "@k")) is None
    assert P.subst(a, "@i", P.const(3)) == {("%n",): 3, ("@k",): 1}
    assert P.exact_div({("%n",): 8}, 4) == {("%n",): 2}
    assert P.exact_div({("%n",): 6}, 4) is None
    assert P.add(a, a, -1) == {}


def test_report_and_rewrite_of_a_plain_gemv(tmp_path):
    mod = IRModule(clang_ir(tmp_path, MV, "-ffast-math"), "mv.c")
    new, report = GemvBlasPass().run(mod, OpenBlasTarget())
    (c,) = report.candidates
    assert c["status"] == "rewritten" and c["function"] == "mv"
    assert (c["dtype"], c["form"], c["routine"]) == ("float", "y=acc", "scipy_cblas_sgemv")
    json.dumps(list(report.candidates))  # JSON-serialisable
    assert "declare void @scipy_cblas_sgemv(i32, i32, i32, i32, float, ptr, i32, ptr, i32, " \
           "float, ptr, i32)" in new.text
    assert "call void @scipy_cblas_sgemv(i32 101, i32 111," in new.text
    # the original loops stay as the fallback: the fmul/fadd reduction is still there
    assert new.text.count("fadd fast float") == mod.text.count("fadd fast float")


def test_three_deep_nest_rewrites_the_inner_pair(tmp_path):
    mod = IRModule(clang_ir(tmp_path, THREE_DEEP, "-ffast-math"), "b.c")
    _, report = GemvBlasPass().run(mod, OpenBlasTarget())
    assert [c["status"] for c in report.candidates] == ["rewritten"]


def test_strict_fp_policy(tmp_path):
    """Without reassoc flags the nest is rejected, with a hint; allow_strict rewrites it and
    says it reassociates."""
    mod = IRModule(clang_ir(tmp_path, MV), "mv.c")
    assert "llvm.fmuladd.f32" in mod.text
    _, report = GemvBlasPass().run(mod, OpenBlasTarget())
    (c,) = report.candidates
    assert c["status"] == "rejected" and "reassoc" in c["reason"]
    assert c["reassociates"] is True
    new, report = GemvBlasPass(allow_strict=True).run(mod, OpenBlasTarget())
    (c,) = report.candidates
    assert c["status"] == "rewritten" and c["reassociates"] is True
    assert "@scipy_cblas_sgemv(" in new.text


def test_pragma_reassociate_is_enough(tmp_path):
    src = MV.replace("  for (int i = 0; i < m; i++) {\n",
                     "  for (int i = 0; i < m; i++) {\n#pragma clang fp reassociate(on)\n")
    mod = IRModule(clang_ir(tmp_path, src), "mv.c")
    assert "call reassoc float @llvm.fmuladd.f32" in mod.text
    _, report = GemvBlasPass().run(mod, OpenBlasTarget())
    assert report.candidates[0]["status"] == "rewritten"


def test_openmp_thread_option(tmp_path):
    src = MV.replace("  for (int i", "  #pragma omp parallel for\n  for (int i")
    mod = IRModule(clang_ir(tmp_path, src, "-ffast-math", "-fopenmp"), "omp.c")
    new, report = GemvBlasPass(omp_threads="single").run(mod, OpenBlasTarget())
    (c,) = report.candidates
    assert c["omp"] and c["status"] == "rewritten" and c["blas_threads"] == "1 (set once)"
    assert "call void @scipy_openblas_set_num_threads(i32 1)" in new.text
    new2, report2 = GemvBlasPass(omp_threads="blas").run(mod, OpenBlasTarget())
    assert "set_num_threads" not in new2.text
    assert report2.candidates[0]["blas_threads"] == "library default"


def test_no_candidates_leaves_module_unchanged(tmp_path):
    text = clang_ir(tmp_path, "int f(int a) { return a + 1; }\n")
    new, report = GemvBlasPass().run(IRModule(text, "f.c"), OpenBlasTarget())
    assert new.text == text and report.candidates == ()


def test_bad_ir_is_a_ditto_error():
    with pytest.raises(DittoError, match="broken.ll"):
        GemvBlasPass().run(IRModule("define void @f( {", "broken.ll"), OpenBlasTarget())


def test_without_blas_target_nothing_is_rewritten(tmp_path):
    mod = IRModule(clang_ir(tmp_path, MV, "-ffast-math"), "mv.c")
    new, report = GemvBlasPass().run(mod, None)
    assert new.text == mod.text
    assert [(c["status"], c["reason"]) for c in report.candidates] == [
        ("rejected", "no BLAS target given")]


def test_bad_omp_option():
    with pytest.raises(DittoError, match="omp_threads"):
        GemvBlasPass(omp_threads="many")


#: Hand-written IR (not clang output): 32-bit induction variables, i32 index arithmetic with
#: nsw, sext'ed indices, `slt` exit tests — the form other front ends (or clang without
#: IndVarSimplify's widening) produce.
MV32_IR = r"""
target datalayout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128"
target triple = "x86_64-pc-linux-gnu"

define void @mv32(ptr %y, ptr %A, ptr %x, i32 %m, i32 %n) {
entry:
  %cm = icmp sgt i32 %m, 0
  br i1 %cm, label %ph, label %exit
ph:
  %cn = icmp sgt i32 %n, 0
  br label %outer
outer:
  %i = phi i32 [ 0, %ph ], [ %i.next, %latch ]
  br i1 %cn, label %inner.ph, label %latch
inner.ph:
  %row = mul nsw i32 %i, %n
  br label %inner
inner:
  %k = phi i32 [ 0, %inner.ph ], [ %k.next, %inner ]
  %acc = phi float [ 0.0, %inner.ph ], [ %acc.next, %inner ]
  %idx = add nsw i32 %row, %k
  %idx64 = sext i32 %idx to i64
  %pa = getelementptr inbounds float, ptr %A, i64 %idx64
  %a = load float, ptr %pa, align 4
  %k64 = zext nneg i32 %k to i64
  %px = getelementptr inbounds float, ptr %x, i64 %k64
  %xv = load float, ptr %px, align 4
  %p = fmul reassoc float %a, %xv
  %acc.next = fadd reassoc float %acc, %p
  %k.next = add nsw i32 %k, 1
  %kc = icmp slt i32 %k.next, %n
  br i1 %kc, label %inner, label %latch
latch:
  %r = phi float [ 0.0, %outer ], [ %acc.next, %inner ]
  %i64 = sext i32 %i to i64
  %py = getelementptr inbounds float, ptr %y, i64 %i64
  store float %r, ptr %py, align 4
  %i.next = add nsw i32 %i, 1
  %ic = icmp slt i32 %i.next, %m
  br i1 %ic, label %outer, label %exit
exit:
  ret void
}
"""

MAIN32 = r"""
#include <stdio.h>
void mv32(float *y, const float *A, const float *x, int m, int n);
int main(void) {
    enum { M = 23, N = 37 };
    static float A[M * N], x[N], y[M];
    for (int i = 0; i < M * N; i++) A[i] = (float)((i * 7) % 13) - 6.0f;
    for (int k = 0; k < N; k++) x[k] = (float)(k % 5) - 2.0f;
    mv32(y, A, x, M, N);
    for (int i = 0; i < M; i++) printf("%.9g\n", y[i]);
    return 0;
}
"""


def test_hand_written_i32_induction_variables(tmp_path):
    import llvmlite.binding as llvm
    import numpy as np

    from ditto_core.stages.cc import link

    new, report = GemvBlasPass().run(IRModule(MV32_IR, "mv32.ll"), OpenBlasTarget())
    (c,) = report.candidates
    assert c["status"] == "rewritten", c
    main = llvm.parse_assembly(clang_ir(tmp_path, MAIN32, name="main.c"))
    main.link_in(llvm.parse_assembly(new.text))
    exe = link(IRModule(str(main), "mv32+main"), OpenBlasTarget(), tmp_path / "mv32")
    got = np.array(subprocess.run([str(exe)], capture_output=True, text=True,
                                  check=True).stdout.split(), dtype=np.float64)
    A = ((np.arange(23 * 37) * 7) % 13 - 6.0).reshape(23, 37)
    x = np.arange(37) % 5 - 2.0
    np.testing.assert_array_equal(got, A @ x)  # small integers: exact in fp32
