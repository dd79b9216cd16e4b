"""Unit tests of the gemv-blas pass's pieces: IR reader, dominators and natural loops, integer
polynomials, the pass's report and floating-point policy, the OpenMP threading option, and
bad input."""

from __future__ import annotations

import json
import subprocess

import pytest

from ditto_blas_openblas import OpenBlasTarget
from ditto_core.errors import DittoError
from ditto_core.types import IRModule
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
