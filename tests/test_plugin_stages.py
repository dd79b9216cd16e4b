"""Every stage swappable by name: the example distribution examples/ditto-test-plugin
(pip-installed) replaces each of the seven stages in turn, and the build still runs end to end
and generates the tokens of the default build; the registry handed to ``pipeline.build`` is
the one every stage uses; ``ditto cc`` takes the same flags."""

import json
import subprocess

import pytest

from ditto_core.stages import pipeline
from ditto_core.stages.plugins import build_registry

from .fixtures_compile import greedy_ids

#: stage → (BuildOptions fields replacing it, the build.json "components" entry to check)
CASES = {
    "exporter": {"exporter": "test-ditto"},
    "quantizer": {"quantizer": "test-identity"},
    "packer": {"packer": "test-f32"},
    "emitter": {"emitter": "test-clang"},
    "passes": {"passes": ("count-loops",)},
    "linker": {"linker": "test-clang"},
    "blas": {"blas": "test-openblas"},
}


@pytest.fixture(scope="module")
def exported_f32(tmp_path_factory):
    """tinycoder exported to an all-f32 .ditto file (the input of the test-ditto exporter)."""
    out = tmp_path_factory.mktemp("exported") / "tiny.ditto"
    subprocess.run(["ditto", "export", "tinycoder", "-o", str(out), "-q"], check=True)
    return out


@pytest.mark.parametrize("stage", list(CASES))
def test_each_stage_replaced_builds_and_runs(stage, test_plugin_installed, tiny_builds,
                                             build_cache_root, exported_f32, tmp_path):
    reg = build_registry()  # not the process-wide one: it must be the one every stage uses
    fields = {"quantizer": "none", "blas": "openblas", **CASES[stage]}
    model = exported_f32 if stage == "exporter" else "tinycoder"
    rec = pipeline.build(model, tmp_path / "b", pipeline.BuildOptions(**fields), reg,
                         cache_root=build_cache_root)
    comp = rec["components"][stage]
    if stage == "passes":
        assert [p["name"] for p in comp] == ["count-loops"]
        counted = {c["function"]: c["loops"] for c in rec["passes"][0]["candidates"]}
        assert counted["matmul.omp_outlined"] >= 1 and counted["forward"] > 1
        assert all(n > 0 for n in counted.values())  # with_loops_only (the default)
        assert rec["pass_summary"] == [f"count-loops: rewrote 0/{len(counted)} candidate nests"]
    else:
        assert comp["name"] == next(iter(CASES[stage].values()))
    assert rec["status"] == "complete"
    # the same fp32 weights and runtime: the same greedy tokens as Ditto's default build
    ref = tiny_builds["naive" if stage == "passes" else "rewrite"][0]
    assert greedy_ids(tmp_path / "b", "def fib(n):", 12) == greedy_ids(ref, "def fib(n):", 12)


def test_cc_with_every_compile_stage_replaced(test_plugin_installed, gemv_source, tmp_path):
    out, rep = tmp_path / "gemv", tmp_path / "report.json"
    p = subprocess.run(["ditto", "cc", str(gemv_source), "-fopenmp", "-o", str(out),
                        "--report", str(rep), "--emitter", "test-clang", "--pass", "count-loops",
                        "--pass", "gemv-blas", "--linker", "test-clang", "--blas",
                        "test-openblas", "-O", "count-loops.with_loops_only=false"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    report = json.loads(rep.read_text())
    assert [r["name"] for r in report["passes"]] == ["count-loops", "gemv-blas"]
    assert report["components"]["emitter"] == {"name": "test-clang", "options": {}}
    assert report["components"]["passes"][0] == {"name": "count-loops",
                                                 "options": {"with_loops_only": False}}
    gemv = report["passes"][1]
    assert gemv["rewritten"] == gemv["total"] >= 6
    assert "main" in {c["function"] for c in report["passes"][0]["candidates"]}
    nm = subprocess.run(["nm", str(out)], capture_output=True, text=True).stdout
    assert "scipy_cblas_sgemv" in nm
    lines = p.stderr.splitlines()
    assert lines[0].startswith("count-loops: rewrote 0/") and lines[1].startswith("gemv-blas:")
