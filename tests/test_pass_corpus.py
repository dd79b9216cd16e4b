"""Differential tests of the ``gemv-blas`` pass on the generated C corpus (issue 5):
every positive variant is rewritten and gives the unrewritten program's results within
floating-point tolerance; every negative case is rejected with its reason, or guarded so that
its results stay exact."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fixtures_pass import corpus_builds, corpus_sources, gen_corpus  # noqa: F401
from tests.fixtures_pass import split_calls

POSITIVE = [("float", False), ("double", False), ("float", True), ("double", True)]
TOL = {"float": 2e-5, "double": 1e-12}


def _by_function(report) -> dict:
    out = {}
    for c in report.candidates:
        out.setdefault(c["function"].split(".omp_outlined")[0], []).append(c)
    return out


@pytest.mark.parametrize("key,omp", POSITIVE, ids=lambda v: str(v))
def test_every_variant_is_rewritten(corpus_builds, key, omp):
    cands = _by_function(corpus_builds[(key, omp)]["report"])
    names = list(gen_corpus.KERNELS) + list(gen_corpus.POLY_KERNELS)
    for name in names:
        assert name in cands, f"{name}: no candidate nest found"
        statuses = [(c["status"], c["reason"]) for c in cands[name]]
        assert all(s == "rewritten" for s, _ in statuses), f"{name}: {statuses}"
    routine = "scipy_cblas_sgemv" if key == "float" else "scipy_cblas_dgemv"
    assert f"call void @{routine}(" in corpus_builds[(key, omp)]["ir"]
    if omp:
        outlined = [c for c in corpus_builds[(key, omp)]["report"].candidates
                    if c["function"].endswith(".omp_outlined")]
        assert len(outlined) == 4 and all(c["omp"] for c in outlined)


def test_report_fields(corpus_builds):
    cands = _by_function(corpus_builds[("double", False)]["report"])
    c = cands["col_alpha_beta_i64"][0]
    assert (c["dtype"], c["form"], c["layout"]) == (
        "double", "y=alpha*acc+beta*y", "transposed (k*ld+i)")
    assert cands["row_acc_inplace"][0]["form"] == "y+=acc"
    assert cands["row_alpha_only"][0]["form"] == "y=alpha*acc"
    assert cands["row_set_i32"][0]["layout"] == "row-major NoTrans (i*ld+k)"
    assert cands["row_set_i32"][0]["reassociates"] is False


@pytest.mark.parametrize("key,omp", POSITIVE, ids=lambda v: str(v))
def test_rewritten_results_match_naive(corpus_builds, key, omp):
    b = corpus_builds[(key, omp)]
    (plain, plain_calls), (blas, calls) = split_calls(b["plain"]), split_calls(b["blas"])
    assert plain.keys() == blas.keys()
    assert set(plain_calls.values()) == {0}  # the naive build never calls BLAS
    # the rewritten build calls BLAS exactly when the nest has work (the guard passes)
    for (name, m, n), c in calls.items():
        rows = m - m // 3 if name == "row_lower_bound" else m
        cols = n - 1 if name == "row_k_from_one" else n
        if name.startswith("poly_"):
            rows = cols = gen_corpus.POLY_N
        if rows <= 0 or cols <= 0:
            assert c == 0, (name, m, n, c)
        elif omp and name == "omp_row_dynamic":
            assert 1 <= c <= -(-rows // 16), (name, m, n, c)  # one call per dynamic chunk
        elif omp and name.startswith("omp_"):
            assert 1 <= c <= 2, (name, m, n, c)  # one call per OpenMP thread with rows
        else:
            assert c == 1, (name, m, n, c)
    expected = len(gen_corpus.KERNELS) * len(gen_corpus.SHAPES) + len(gen_corpus.POLY_KERNELS)
    assert len(plain) == expected
    for k in plain:
        ref, got = plain[k], blas[k]
        assert ref.shape == got.shape
        scale = max(1.0, float(np.abs(ref).max(initial=0.0)))
        np.testing.assert_allclose(got, ref, rtol=0, atol=TOL[key] * scale * 10,
                                   err_msg=str(k))


def test_results_match_numpy_reference(corpus_builds):
    """The naive program itself against numpy for one kernel: the corpus driver computes what
    the test believes (guards against two builds agreeing on garbage)."""
    out = corpus_builds[("double", False)]["blas"]
    # rebuild the driver's LCG stream up to shape (17, 33)
    state = 12345

    def rnd():
        nonlocal state
        state = (state * 1664525 + 1013904223) % 2**32
        return (state >> 8) / 8388608.0 - 1.0

    names = list(gen_corpus.KERNELS)
    for (m, n) in gen_corpus.SHAPES:
        big = max(m, n) + 4
        for name in names:
            A = np.array([rnd() for _ in range(big * big)])
            x = np.array([rnd() for _ in range(big)])
            y = np.array([rnd() for _ in range(2 * big)])
            if name == "row_set_i32" and (m, n) == (17, 33):
                ref = y.copy()
                ref[:m] = A[: m * n].reshape(m, n) @ x[:n]
                np.testing.assert_allclose(out[(name, m, n)], ref, rtol=1e-12, atol=1e-12)
            if name == "col_alpha_beta_i64" and (m, n) == (17, 33):
                lda = big - 1
                At = A[: n * lda].reshape(n, lda)[:, :m]
                ref = y.copy()
                ref[:m] = 1.5 * (At.T @ x[:n]) - 0.75 * y[:m]
                np.testing.assert_allclose(out[(name, m, n)], ref, rtol=1e-12, atol=1e-12)
                return
        for _ in gen_corpus.POLY_KERNELS:  # the driver's PolyBench block draws P, x, y
            for _ in range(gen_corpus.POLY_N * gen_corpus.POLY_N + 2 * gen_corpus.POLY_N):
                rnd()
    raise AssertionError("reference kernel not reached")


def test_negatives_rejected_with_reason(corpus_builds):
    cands = _by_function(corpus_builds[("negatives", False)]["report"])
    for name, why in gen_corpus.expected_negatives().items():
        assert name in cands, f"{name}: not reported"
        c = cands[name][0]
        if why == "guard":
            assert c["status"] == "rewritten", (name, c)
        else:
            assert c["status"] == "rejected" and why in c["reason"], (name, c)


def test_negatives_results_unchanged(corpus_builds):
    """Rejected nests are untouched and the aliasing calls fall back through the guard: the
    outputs are bit-identical to the unrewritten program."""
    b = corpus_builds[("negatives", False)]
    (plain, _), (blas, calls) = split_calls(b["plain"]), split_calls(b["blas"])
    assert plain.keys() == blas.keys() and plain
    for k in plain:
        np.testing.assert_array_equal(blas[k], plain[k], err_msg=str(k))
    # the aliasing calls really took the fallback: no BLAS call anywhere
    assert calls and set(calls.values()) == {0}, calls


def test_openmp_region_serialized_matches_naive(corpus_sources, corpus_builds, tmp_path):
    """omp_threads="region": the parallel regions holding only a GEMV run serialized, one
    BLAS call per region; results equal the unrewritten OpenMP build."""
    from ditto_core.stages.cc import emit_ir, link, resolve_blas
    from ditto_pass_gemv_blas import GemvBlasPass

    from tests.fixtures_pass import run_exe

    blas = resolve_blas("openblas")
    mod = emit_ir([corpus_sources["float"]], workdir=tmp_path,
                  flags=blas.compile_flags() + ["-fopenmp"])
    new, report = GemvBlasPass(omp_threads="region").run(mod, blas)
    omp = [c for c in report.candidates if c["omp"]]
    assert len(omp) == 4 and all(c["status"] == "rewritten" for c in omp)
    # the static-schedule regions are serialized; the dynamic one (dispatch calls) is not
    serial = [c for c in omp if "serialized" in c["blas_threads"]]
    assert len(serial) == 3 and "dynamic" not in str([c["function"] for c in serial])
    assert new.text.count("call void @__kmpc_serialized_parallel(") == 3
    exe = link(new, blas, tmp_path / "region")
    (got, calls), (ref, _) = split_calls(run_exe(exe)), split_calls(
        corpus_builds[("float", True)]["plain"])
    for (name, m, n), c in calls.items():  # one call per serialized region
        if name.startswith("omp_") and name != "omp_row_dynamic":
            assert c == (1 if m > 0 and n > 0 else 0), (name, m, n, c)
    assert got.keys() == ref.keys()
    for k in ref:
        scale = max(1.0, float(np.abs(ref[k]).max(initial=0.0)))
        np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=2e-4 * scale, err_msg=str(k))


def test_polybench_style_kernels(corpus_builds):
    """GEMVs among look-alikes (atax, bicg, gesummv, gemver): the GEMVs are rewritten, the
    others rejected, and every output equals the unrewritten build."""
    b = corpus_builds[("polybench", False)]
    cands = _by_function(b["report"])
    (plain, _), (blas, calls) = split_calls(b["plain"]), split_calls(b["blas"])
    for name, (_, expected) in gen_corpus.POLYBENCH.items():
        assert [c["status"] for c in cands[name]] == expected, (name, cands[name])
        n = gen_corpus.PB_N
        assert calls[(name, n, n)] == expected.count("rewritten"), (name, calls)
    assert plain.keys() == blas.keys() and len(plain) == len(gen_corpus.POLYBENCH)
    for k in plain:
        ref = plain[k]
        scale = max(1.0, float(np.abs(ref).max()))
        np.testing.assert_allclose(blas[k], ref, rtol=0, atol=2e-5 * scale * 10,
                                   err_msg=str(k))


def test_committed_corpus_is_generated(corpus_sources):
    """tests/corpus/*.c are exactly what gen_corpus.py writes (no hand edits)."""
    for path in corpus_sources.values():
        committed = gen_corpus.Path(gen_corpus.__file__).parent / path.name
        assert committed.read_text() == path.read_text(), path.name


def test_strict_fp_corpus_with_allow_strict(corpus_sources, corpus_builds, tmp_path):
    """Compiled without reassociation (-fno-associative-math: llvm.fmuladd without reassoc),
    the default pass rejects every nest; allow_strict=True rewrites them all, reports
    "reassociates": true, and the results stay within fp tolerance of the naive build."""
    from ditto_core.stages.cc import emit_ir, link, resolve_blas
    from ditto_pass_gemv_blas import GemvBlasPass

    from tests.fixtures_pass import run_exe

    blas = resolve_blas("openblas")
    mod = emit_ir([corpus_sources["float"]], workdir=tmp_path,
                  flags=blas.compile_flags() + ["-fno-associative-math", "-ffp-contract=on"])
    _, strict = GemvBlasPass().run(mod, blas)
    gemv = [c for c in strict.candidates if c["kind"] == "gemv"]
    assert gemv and all(c["status"] == "rejected" and "reassoc" in c["reason"] for c in gemv)
    new, report = GemvBlasPass(allow_strict=True).run(mod, blas)
    gemv = [c for c in report.candidates if c["kind"] == "gemv"]
    assert len(gemv) == len(gen_corpus.KERNELS) + len(gen_corpus.POLY_KERNELS)
    assert all(c["status"] == "rewritten" and c["reassociates"] for c in gemv)
    (got, calls), (ref, _) = split_calls(run_exe(link(new, blas, tmp_path / "strict"))), \
        split_calls(corpus_builds[("float", False)]["plain"])
    assert sum(calls.values()) > 0
    for k in ref:
        scale = max(1.0, float(np.abs(ref[k]).max(initial=0.0)))
        np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=2e-4 * scale, err_msg=str(k))


def test_random_feature_combinations(corpus_builds):
    """48 kernels combining index type, layout, constant offsets of A/x/y, loop bounds,
    operand order and store form at random (fixed seed): all rewritten, BLAS called when the
    loops have work, results equal to the naive build."""
    b = corpus_builds[("random", False)]
    kernels = gen_corpus.random_kernels()
    cands = _by_function(b["report"])
    for name in kernels:
        assert [c["status"] for c in cands[name]] == ["rewritten"], cands[name]
    (plain, _), (blas, calls) = split_calls(b["plain"]), split_calls(b["blas"])
    assert plain.keys() == blas.keys() and len(plain) == len(kernels) * len(gen_corpus.SHAPES)
    for (name, m, n), c in calls.items():
        if m < 2 or n < 2:
            assert c == 0, (name, m, n, c)
        elif m >= 17 and n >= 17:
            assert c == 1, (name, m, n, c)
    for k in plain:
        scale = max(1.0, float(np.abs(plain[k]).max(initial=0.0)))
        np.testing.assert_allclose(blas[k], plain[k], rtol=0, atol=2e-4 * scale, err_msg=str(k))
