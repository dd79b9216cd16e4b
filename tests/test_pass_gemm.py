"""The gemv-blas pass on GEMM nests (tests/corpus/gemm.c): naive triple loop nests become
guarded cblas_[sd]gemm calls (serial and OpenMP), results equal the unrewritten build's, the
guards fall back to the C loop when BLAS cannot express the call or memory overlaps, and
GEMV-shaped nests inside loops that are not GEMMs keep their GEMV rewrite with the reason."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ditto_core.stages.cc import compile_c

SRC = Path(__file__).parent / "corpus" / "gemm.c"
GEMMS = {"gemm_prefill": "C = opN(A)·opT(B)", "gemm_nn": "C = opN(A)·opN(B)",
         "gemm_tt_acc": "C = opT(A)·opT(B)", "gemm_alpha_beta_jouter": "C = opN(A)·opN(B)",
         "dgemm_nn": "C = opN(A)·opN(B)"}
NOT_GEMM = {"neg_triangular": "not a GEMM: inner loop bounds depend on the outer index "
                              "(triangular)",
            "neg_outer_store": "not a GEMM: store in the outer loop",
            "neg_repeat": "not a GEMM: x does not depend on the outer index (not a GEMM)"}


def _run(exe: Path) -> tuple[dict, dict]:
    env = dict(os.environ, OMP_NUM_THREADS="2")
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    vals, calls = {}, {}
    for line in p.stdout.splitlines():
        parts = line.split()
        if parts[0] == "calls":
            calls[(parts[1], int(parts[2]), int(parts[3]))] = (int(parts[4]), int(parts[5]))
        else:
            vals[(parts[0], int(parts[1]), int(parts[2]))] = np.array(parts[3:], np.float64)
    return vals, calls


@pytest.fixture(scope="module", params=[False, True], ids=["serial", "omp"])
def gemm_build(request, tmp_path_factory):
    omp = request.param
    work = tmp_path_factory.mktemp("gemm_corpus")
    plain, _ = compile_c([SRC], blas="openblas", out=work / "plain", openmp=omp, rewrite=False)
    ir = work / "blas.ll"
    blas, report = compile_c([SRC], blas="openblas", out=work / "blas", openmp=omp,
                             passes=["gemv-blas"], ir_out=ir)
    return {"omp": omp, "plain": _run(plain), "blas": _run(blas), "report": report,
            "ir": ir.read_text()}


def test_gemm_nests_rewritten_and_others_keep_gemv(gemm_build):
    by = {}
    for c in gemm_build["report"].candidates:
        by.setdefault(c["function"].split(".omp_outlined")[0], []).append(c)
    for name, layout in GEMMS.items():
        (c,) = by[name]
        assert (c["status"], c["kind"], c["depth"], c["layout"]) == (
            "rewritten", "gemm", 3, layout), c
        assert c["routine"] == ("scipy_cblas_dgemm" if name[0] == "d" else "scipy_cblas_sgemm")
        assert c["reassociates"] is False
    assert by["gemm_alpha_beta_jouter"][0]["form"] == "y=alpha*acc+beta*y"
    assert by["gemm_tt_acc"][0]["form"] == "y+=acc"
    assert by["gemm_prefill"][0]["omp"] is gemm_build["omp"]
    for name, why in NOT_GEMM.items():
        (c,) = by[name]
        assert (c["status"], c["kind"], c["gemm_reason"]) == ("rewritten", "gemv", why), c
    assert "call void @scipy_cblas_sgemm(i32 101, i32 111, i32 112," in gemm_build["ir"]


def test_gemm_results_equal_naive_build(gemm_build):
    (plain, plain_calls), (blas, calls) = gemm_build["plain"], gemm_build["blas"]
    assert plain.keys() == blas.keys() and plain_calls.keys() == calls.keys()
    assert set(plain_calls.values()) == {(0, 0)}
    for key, want in plain.items():
        tol = 1e-12 if key[0].startswith("d") else 2e-5
        scale = max(1.0, np.abs(want).max(initial=0.0))
        np.testing.assert_allclose(blas[key], want, rtol=0, atol=tol * scale * 100,
                                   err_msg=str(key))
        if key[0].startswith(("guard_", "neg_outer_store_mark")):
            np.testing.assert_array_equal(blas[key], want)  # the C loop ran


def test_blas_called_exactly_when_the_guard_holds(gemm_build):
    omp = gemm_build["omp"]
    _, calls = gemm_build["blas"]
    for (name, m, n), (n_gemm, n_gemv) in calls.items():
        if name in GEMMS:
            k_empty = (name, m, n) in {(g, 4, 5) for g in GEMMS}  # the K = 0 shape
            work = m > 0 and n > 0 and not k_empty
            want = (min(n, 2) if omp and name == "gemm_prefill" else 1) if work else 0
            assert (n_gemm, n_gemv) == (want, 0), (name, m, n)
        elif name.startswith("guard_"):
            assert (n_gemm, n_gemv) == (0, 0), name  # overlap, ldc < N, lda < K
    # GEMV rewrites of the nests that are not GEMMs: one sgemv per outer iteration
    assert calls[("neg_triangular", 9, 8)] == (0, 8)  # i = 0 has no work (k < 0)
    assert calls[("neg_outer_store", 9, 8)] == (0, 9)
    assert calls[("neg_repeat", 9, 8)] == (0, 3)
