"""`ditto compare`: configuration strings, a resumable sweep, and the Ray executor."""

import csv
import json
import re
import os
import subprocess
import sys

import pytest

from ditto_core.base.errors import DittoError
from ditto_core.eval import builds, compare

SETTINGS = {"eval": True, "chunks": 1, "bench": True, "threads": [1], "repeat": 1, "tokens": 4,
            "humaneval": False, "limit": None}


def test_parse_config():
    o = builds.parse_config("kmeans:bits=3,group_size=64,method=lloyd,keep_fp32=output.*|x,"
                            "rewrite=false")
    assert (o.quantizer, o.blas, o.rewrite) == ("kmeans", "openblas", False)
    assert (o.quant.bits, o.quant.group_size, o.quant.method, o.quant.keep_fp32) == \
        (3, 64, "lloyd", ("output.*", "x"))
    assert builds.parse_config("none").quantizer == "none"
    # what the string leaves out is ditto build's default: int8 codebooks for kmeans only
    assert builds.parse_config("kmeans:bits=4").quant.codebook_type == "int8"
    assert builds.parse_config("kmeans:codebook_type=f16").quant.codebook_type == "f16"
    assert builds.parse_config("rtn:bits=4").quant.codebook_type == "f16"
    assert builds.config_label("kmeans:bits=4,group_size=256") == "kmeans_bits=4_group_size=256"
    # COMPONENT.KEY items are component options, as ditto build -O takes them
    assert builds.parse_config("kmeans:bits=3,kmeans.lloyd-restarts=2").options == \
        {"kmeans": {"lloyd_restarts": "2"}}
    with pytest.raises(DittoError, match=r"^config 'kmeans:bits=4,bits=2': 'bits' is given "
                                         r"twice$"):
        builds.parse_config("kmeans:bits=4,bits=2")
    with pytest.raises(DittoError, match=r"config 'kmeans:bitz=4': unknown key 'bitz'"):
        builds.parse_config("kmeans:bitz=4")
    with pytest.raises(DittoError, match=r"config 'kmeans:bits=four': bits=four is not a valid"):
        builds.parse_config("kmeans:bits=four")
    with pytest.raises(DittoError, match=r"'bits' is not key=value"):
        builds.parse_config("kmeans:bits")
    with pytest.raises(DittoError, match="rewrite=maybe: expected true or false"):
        builds.parse_config("none:rewrite=maybe")


@pytest.fixture
def cache_env(build_cache_root, monkeypatch):
    monkeypatch.setenv("DITTO_CACHE_DIR", str(build_cache_root))


def test_sweep_writes_tables_and_resumes(tmp_path, cache_env):
    specs = ["none", "kmeans:bits=2,group_size=32"]
    rows = compare.compare("tinycoder", specs, tmp_path, SETTINGS)
    assert [r["config"] for r in rows] == specs
    none, km = rows
    assert none["mean_kld"] == 0.0 and none["same_top1"] == 1.0
    assert km["mean_kld"] > 0 and km["bpw"] < none["bpw"]
    # both against the same fp32 weights (the baseline's cached logits may come from a run
    # with another thread count: equal up to float summation order)
    assert km["ppl_baseline"] == pytest.approx(none["ppl"], rel=1e-5)
    assert km["decode_tok_per_s"] > 0 and km["threads"] == 1
    with open(tmp_path / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["config"] for r in table] == specs
    assert float(table[1]["mean_kld"]) == km["mean_kld"]
    assert json.loads((tmp_path / "results.json").read_text()) == rows
    for png in ("bpw_vs_kld.png", "bpw_vs_tok_s.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a rerun redoes nothing; after an "interruption" (one result missing) only that one
    saved = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "results").iterdir()}
    assert compare.compare("tinycoder", specs, tmp_path, SETTINGS) == rows
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "results").iterdir()} == saved
    (tmp_path / "results" / "none.json").unlink()
    calls = []
    compare.compare("tinycoder", specs, tmp_path, SETTINGS,
                    progress=lambda d, t, s: calls.append((d, t, s)))
    assert calls == [(1, 2, ""), (2, 2, "none")]
    assert (tmp_path / "results" / "kmeans_bits=2_group_size=32.json").stat().st_mtime_ns == \
        saved["kmeans_bits=2_group_size=32.json"]
    # other settings are another experiment: redone
    assert compare.finished(tmp_path, "none", {**SETTINGS, "chunks": 2}) is None
    # so is a result made under other build options than the spec gives now (e.g. an
    # earlier default codebook type)
    path = tmp_path / "results" / "kmeans_bits=2_group_size=32.json"
    saved_km = json.loads(path.read_text())
    assert saved_km["build_options"]["options"]["codebook_type"] == "int8"
    saved_km["build_options"]["options"]["codebook_type"] = "f16"
    path.write_text(json.dumps(saved_km))
    assert compare.finished(tmp_path, "kmeans:bits=2,group_size=32", SETTINGS) is None
    assert compare.finished(tmp_path, "none", SETTINGS) is not None
    # and a result made by other component code or component defaults (a plugin changed)
    assert compare.finished(tmp_path, "none", SETTINGS, "tinycoder") is not None
    path = tmp_path / "results" / "none.json"
    saved_none = json.loads(path.read_text())
    assert saved_none["components"]["quantizer"] == {"name": "none", "options": {}}
    assert len(saved_none["components_code"]) >= 5
    saved_none["components_code"][0] = "0" * 64
    path.write_text(json.dumps(saved_none))
    assert compare.finished(tmp_path, "none", SETTINGS, "tinycoder") is None
    meta = json.loads((tmp_path / "builds" / "none" / "build.json").read_text())
    assert builds.build_matches(tmp_path / "builds" / "none", builds.parse_config("none"),
                                "tinycoder")
    meta["components"]["linker"]["options"]["opt_level"] = 2
    (tmp_path / "builds" / "none" / "build.json").write_text(json.dumps(meta))
    assert not builds.build_matches(tmp_path / "builds" / "none", builds.parse_config("none"),
                                    "tinycoder")
    assert builds.build_matches(tmp_path / "builds" / "none", builds.parse_config("none"))


@pytest.mark.parametrize("spec,message", [
    ("kmeans:bits=99", "bit width b must be an integer in 1..8, got 99"),
    ("kmeans:kmeans.lloyd_restarts=0", "kmeans.lloyd_restarts: 'lloyd_restarts' must be >= 1: 0"),
    ("kmeans:nope.x=1", "nope.x: no component is named 'nope'"),
])
def test_bad_config_values_fail_before_any_work(tmp_path, spec, message):
    with pytest.raises(DittoError, match=re.escape(f"config {spec!r}: {message}")):
        compare.compare("tinycoder", [spec], tmp_path / "o", SETTINGS)
    assert not (tmp_path / "o").exists()


def test_bad_config_fails_before_any_work(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ditto_core.cli.main", "compare", "tinycoder",
                           "--config", "none", "--config", "kmeans:bitz=3", "-o", tmp_path / "o"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "error: config 'kmeans:bitz=3': unknown key 'bitz'" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_sweep_on_a_local_ray_instance(tmp_path, build_cache_root):
    pytest.importorskip("ray", reason="ray is a dependency of ditto compare --executor ray")
    env = {**os.environ, "DITTO_CACHE_DIR": str(build_cache_root)}
    proc = subprocess.run([sys.executable, "-m", "ditto_core.cli.main", "compare", "tinycoder",
                           "--config", "kmeans:bits=3,group_size=32", "--config",
                           "kmeans:bits=4,group_size=32", "-o", tmp_path, "--chunks", "1",
                           "--no-bench", "--executor", "ray", "--jobs", "2", "-q"],
                          capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [r["config"] for r in rows] == ["kmeans:bits=3,group_size=32",
                                           "kmeans:bits=4,group_size=32"]
    assert rows[0]["bpw"] < rows[1]["bpw"]
    assert all(r["mean_kld"] > 0 and r["decode_tok_per_s"] is None for r in rows)
    assert "kmeans:bits=3,group_size=32" in proc.stdout


def test_sweep_with_humaneval_compares_seeds_against_fp32(tmp_path, cache_env):
    settings = {**SETTINGS, "bench": False, "humaneval": True, "limit": 1}
    rows = compare.compare("tinycoder", ["none", "kmeans:bits=2,group_size=32"], tmp_path,
                           settings)
    none, km = rows
    assert none["pass@1"] == 0.0 and km["pass@5_sampled"] == 0.0  # a random model
    assert none.get("humaneval_p_vs_fp32") is None
    assert km["humaneval_p_vs_fp32"] == 1.0  # identical per-seed rates (all 0)
    saved = json.loads((tmp_path / "results" / "kmeans_bits=2_group_size=32.json").read_text())
    assert len(saved["humaneval"]["humaneval"]["per_seed"]) == 5


def test_a_third_party_quantizer_is_a_config_like_any_other(rtn_registry, tmp_path,
                                                            build_cache_root):
    env = {**os.environ, "DITTO_CACHE_DIR": str(build_cache_root)}
    proc = subprocess.run([sys.executable, "-m", "ditto_core.cli.main", "compare", "tinycoder",
                           "--config", "rtn:bits=4,group_size=32", "-o", tmp_path, "--chunks",
                           "1", "--no-bench", "-q"],
                          capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads((tmp_path / "results.json").read_text())
    assert row["quantizer"] == "rtn" and row["bits"] == 4 and row["mean_kld"] > 0
    meta = json.loads((tmp_path / "builds" / "rtn_bits=4_group_size=32" / "build.json")
                      .read_text())
    assert meta["quantizer"] == "rtn"
