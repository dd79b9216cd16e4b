"""The Python API: ditto_core.build(...) -> Build with .run(), .logits(), .inspect(); the same
build as the CLI's, and logits that agree with the executable's own greedy choice."""

import json
import subprocess

import numpy as np
import pytest

import ditto_core
from ditto_core.base.errors import DittoError, PluginError
from ditto_core.base.options import OptionError
from ditto_core.runtime.run import run_build


@pytest.fixture(scope="module")
def api_build(tiny_builds, build_cache_root, tmp_path_factory, monkeypatch_module):
    """tinycoder fp32 built through the API (served by the session cache of tiny_builds)."""
    monkeypatch_module.setenv("DITTO_CACHE_DIR", str(build_cache_root))
    out = tmp_path_factory.mktemp("api") / "tiny"
    return ditto_core.build("tinycoder", quantizer="none", blas="openblas", out=out,
                            options={"gemv-blas": {"omp_threads": "single"}})


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_build_record_and_open(api_build, tiny_builds):
    rec = api_build.record
    assert rec["status"] == "complete" and rec["cached"] == {"model": True, "compile": True}
    assert rec["compile_key"] == tiny_builds["rewrite"][1]["compile_key"]
    assert api_build.executable.read_bytes() == (tiny_builds["rewrite"][0] /
                                                 "ditto-run").read_bytes()
    again = ditto_core.Build.open(api_build.path)
    assert again == api_build and again.record == json.loads(
        (api_build.path / "build.json").read_text())


def test_run_is_the_executables_greedy_text(api_build):
    text = api_build.run("def fib(n):", n=12, threads=1)
    proc = run_build(api_build.path, ["-p", "def fib(n):", "-n", "12", "--temp", "0",
                                      "--threads", "1"], capture_output=True, text=True)
    # ditto-run ends its output with a newline that is not generated text
    assert proc.returncode == 0 and proc.stdout == text + "\n"
    assert text


def test_logits_shape_causality_and_greedy_choice(api_build, tmp_path):
    ids = [1, 450, 2, 31999, 77]
    logits = api_build.logits(ids, threads=1)
    assert logits.shape == (5, 32000) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    # causal: the first rows do not depend on later tokens (up to the float rounding of a
    # prefill batch of another size)
    np.testing.assert_allclose(api_build.logits(ids[:2], threads=1), logits[:2], rtol=1e-4,
                               atol=1e-6)
    # the executable's greedy next token after ids is the argmax of the last row
    f = tmp_path / "ids.json"
    f.write_text(json.dumps(ids))
    proc = run_build(api_build.path, ["--ids", str(f), "-n", "1", "--temp", "0",
                                      "--print-ids", "--threads", "1"],
                     capture_output=True, text=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [int(logits[-1].argmax())]
    with pytest.raises(DittoError, match="token_ids is empty"):
        api_build.logits([])
    with pytest.raises(DittoError, match="exit 3"):
        api_build.logits([32000])


def test_inspect_is_ditto_inspect_json(api_build):
    cli = subprocess.run(["ditto", "inspect", "--json", str(api_build.model_file)],
                         check=True, capture_output=True, text=True).stdout
    assert api_build.inspect() == json.loads(cli)


def test_bad_names_and_options_fail_before_work(tmp_path):
    with pytest.raises(OptionError, match=r"^gemv-blas\.nope: unknown option of gemv-blas"):
        ditto_core.build("tinycoder", quantizer="none", out=tmp_path / "x",
                         options={"gemv-blas.nope": 1})
    with pytest.raises(PluginError, match="unknown linker 'ld'; available: .*llvm"):
        ditto_core.build("tinycoder", quantizer="none", out=tmp_path / "x", linker="ld")
    assert not (tmp_path / "x").exists()


def test_errors_are_ditto_errors(api_build, tmp_path):
    """Every failure of the API is a ditto_core.DittoError naming what failed: a budget file
    that does not exist (before any work), a run past its timeout (the executable stopped)."""
    assert ditto_core.DittoError is DittoError
    with pytest.raises(DittoError, match=r"^nofile: max_size_of must name an existing file"):
        ditto_core.build("tinycoder", max_size_of="nofile", out=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(DittoError, match=r"ditto-run: did not finish within 0.001 s; stopped$"):
        api_build.run("def fib(n):", n=4000, threads=1, timeout=0.001)
    with pytest.raises(PluginError, match="unknown pass .nope.; available"):  # not n, o, p, e
        ditto_core.build("tinycoder", quantizer="none", out=tmp_path / "y", passes="nope")
