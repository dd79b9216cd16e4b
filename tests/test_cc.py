"""`ditto cc` / compile_c: a C program with GEMV nests gives the numpy reference's results with
and without the IR rewrite; bad inputs fail clearly and leave nothing behind."""

import json
import subprocess
import sys

import numpy as np
import pytest

from ditto_core.base.errors import DittoError, PluginError
from ditto_core.stages.cc import compile_c

from .fixtures_compile import GEMV_FORMS, run_gemv

SHAPES = [(0, 5), (5, 0), (1, 1), (7, 5), (33, 129), (300, 257)]


def _close(form, got, ref, A_scale):
    assert got.shape == ref.shape, form
    tol = (1e-12 if form == "d" else 2e-5) * A_scale + 1e-6
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol, err_msg=form)


@pytest.mark.parametrize("label", ["rewrite", "naive"])
@pytest.mark.parametrize("m,n", SHAPES)
def test_gemv_program_matches_numpy(gemv_builds, tmp_path, label, m, n):
    exe, _ = gemv_builds[label]
    out, ref = run_gemv(exe, tmp_path, m, n, seed=m * 1000 + n)
    assert set(out) == set(GEMV_FORMS)
    scale = max(m, n, 1) * 4.0  # |A||x| of standard normals grows like the length
    for form in GEMV_FORMS:
        _close(form, out[form], ref[form], np.sqrt(scale) * 4)


def test_reports(gemv_builds):
    naive = json.loads(gemv_builds["naive"][1].read_text())
    assert naive["rewrite"] is False and naive["passes"] == []
    assert naive["summary"] == ["rewrite: disabled (--no-rewrite), naive loops kept"]
    rep = json.loads(gemv_builds["rewrite"][1].read_text())
    assert rep["rewrite"] is True and rep["blas"] == "openblas" and rep["openmp"] is True
    # the default pass list is gemv-blas alone
    assert [p["name"] for p in rep["passes"]] == ["gemv-blas"]
    assert rep["components"]["passes"] == [
        {"name": "gemv-blas", "options": {"omp_threads": "single", "strict": False}}]
    gemv = rep["passes"][0]
    # the six nests of GEMV_C are all GEMVs in forms the pass supports
    assert gemv["rewritten"] == gemv["total"] >= 6, gemv["candidates"]
    nm = subprocess.run(["nm", str(gemv_builds["rewrite"][0])], capture_output=True,
                        text=True).stdout
    assert "scipy_cblas_sgemv" in nm and "scipy_cblas_dgemv" in nm


def test_unknown_blas_lists_choices(gemv_source, tmp_path):
    with pytest.raises(PluginError, match="unknown BLAS target 'atlas'; available: "
                                          "accelerate, mkl, openblas"):
        compile_c(gemv_source, blas="atlas", out=tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


def test_accelerate_on_linux(gemv_source, tmp_path):
    with pytest.raises(DittoError, match="'accelerate' is not available: needs macOS"):
        compile_c(gemv_source, blas="accelerate", out=tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


def test_compile_error_names_file_and_leaves_nothing(tmp_path):
    src = tmp_path / "broken.c"
    src.write_text("int main(void) { return undefined_name; }\n")
    out = tmp_path / "out" / "broken"
    with pytest.raises(DittoError) as ei:
        compile_c(src, blas="openblas", out=out)
    msg = str(ei.value)
    assert str(src) in msg and "undefined_name" in msg
    assert not out.exists() and not (tmp_path / "out").exists()


def test_missing_source(tmp_path):
    with pytest.raises(DittoError, match="nosuch.c: no such C source file"):
        compile_c(tmp_path / "nosuch.c", blas="openblas", out=tmp_path / "x")


def test_cli_cc(tmp_path):
    """The click command end to end: -I, -D, --report, exit codes."""
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "scale.h").write_text("#define SCALE 3\n")
    src = tmp_path / "p.c"
    src.write_text('#include <stdio.h>\n#include "scale.h"\n'
                   "int main(void){ printf(\"%d\\n\", SCALE * OFFSET); return 0; }\n")
    exe, rep = tmp_path / "p", tmp_path / "r.json"
    cmd = [sys.executable, "-m", "ditto_core.cli.cc", str(src), f"-I{inc}", "-D", "OFFSET=7",
           "--blas", "openblas", "-o", str(exe), "--report", str(rep)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert subprocess.run([str(exe)], capture_output=True, text=True).stdout == "21\n"
    assert json.loads(rep.read_text())["sources"] == [str(src)]
    bad = subprocess.run(cmd[:-4] + ["--blas", "nope", "-o", str(tmp_path / "q")],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert "unknown BLAS target 'nope'; available: accelerate, mkl, openblas" in bad.stderr
    assert not (tmp_path / "q").exists()


def test_summary_lines():
    from ditto_core.stages.cc import summary_lines

    cands = [{"status": "rewritten", "kind": "gemv"}, {"status": "rejected", "kind": "gemv"},
             {"status": "rejected", "kind": "other"}]
    assert summary_lines([{"name": "gemv-blas", "candidates": cands}]) == [
        "gemv-blas: rewrote 1/2 GEMV nests (1 other loop nests left alone)"]
    assert summary_lines([{"name": "p", "candidates": [{"status": "rewritten"}]}]) == [
        "p: rewrote 1/1 candidate nests"]
    assert summary_lines([], rewrite=False) == [
        "rewrite: disabled (--no-rewrite), naive loops kept"]
    assert summary_lines([]) == ["rewrite: no IR pass selected, module left unchanged"]
