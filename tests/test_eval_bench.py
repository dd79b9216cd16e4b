"""`ditto bench`: RAPL energy reading and a real (tiny) benchmark run."""

import json
import os
import re
import subprocess
import sys

import click
import pytest

from ditto_core.eval import bench


def fake_rapl(root, energy, max_range=1000_000_000):
    d = root / "intel-rapl:0"
    d.mkdir(parents=True, exist_ok=True)
    (d / "energy_uj").write_text(f"{energy}\n")
    (d / "max_energy_range_uj").write_text(f"{max_range}\n")
    sub = root / "intel-rapl:0:0"  # the core sub-domain is part of the package: not added
    sub.mkdir(exist_ok=True)
    (sub / "energy_uj").write_text("5\n")
    return d


def test_rapl_energy_with_wraparound(tmp_path):
    d = fake_rapl(tmp_path, 999_000_000)
    assert bench.rapl_domains(tmp_path) == [d]
    before = bench.read_energy_uj([d])
    (d / "energy_uj").write_text("2000000\n")  # wrapped past max_energy_range_uj
    assert bench.energy_joules(before, bench.read_energy_uj([d])) == pytest.approx(3.0)
    assert bench.rapl_domains(tmp_path / "missing") == []
    (d / "energy_uj").write_text("not a number\n")
    assert bench.rapl_domains(tmp_path) == []


def test_spread():
    s = bench.spread([10.0, 12.0, 11.0])
    assert s == {"median": 11.0, "min": 10.0, "max": 12.0, "spread": 2 / 11,
                 "samples": [10.0, 12.0, 11.0]}


def test_bench_tinycoder(eval_builds, tmp_path):
    b = eval_builds["kmeans"]
    r = bench.bench_build(b, threads=[1], repeat=2, tokens=8, prompt_tokens=64,
                          powercap=tmp_path / "none")
    assert r["energy"].startswith("not available")
    t = r["threads"]["1"]
    assert t["joules_per_token"] is None
    assert len(t["decode_tok_per_s"]["samples"]) == 2
    assert t["decode_tok_per_s"]["min"] <= t["decode_tok_per_s"]["median"] > 0
    assert t["prompt_tok_per_s"]["median"] > 0 and t["peak_rss_mib"] > 0
    assert r["prompt_tokens"] == 64 and r["tokens"] == 8
    assert r["file_bytes"] == (b / "model.ditto").stat().st_size
    assert r["bpw"] == pytest.approx(8 * r["file_bytes"] / r["n_weights"])
    # with a readable (fake) RAPL counter the energy is measured around the decode runs
    fake_rapl(tmp_path / "rapl", 1000)
    r = bench.bench_build(b, threads=[1], repeat=1, tokens=4, prompt_tokens=16,
                          powercap=tmp_path / "rapl")
    assert r["energy"] == "RAPL: intel-rapl:0 (whole package)"
    assert r["threads"]["1"]["joules_per_token"]["median"] == 0.0  # the fake counter stood still


def test_bench_cli(eval_builds):
    proc = subprocess.run([sys.executable, "-m", "ditto_core.cli.main", "bench",
                           eval_builds["none"], "--threads", "1", "--repeat", "1", "-n", "4", "--prompt-tokens", "16",
                           "--json", "-q"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert list(r["threads"]) == ["1"] and r["quantizer"] == "none"
    assert (r["cache_type_k"], r["cache_type_v"]) == ("f32", "f32")
    proc = subprocess.run([sys.executable, "-m", "ditto_core.cli.main", "bench",
                           eval_builds["none"], "--threads", "1", "--repeat", "1", "-n", "4",
                           "--prompt-tokens", "16", "-ctk", "f16", "-ctv", "f16", "--json", "-q"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert (r["cache_type_k"], r["cache_type_v"]) == ("f16", "f16")
    assert r["threads"]["1"]["decode_tok_per_s"]["median"] > 0
    proc = subprocess.run([sys.executable, "-m", "ditto_core.cli.main", "bench",
                           eval_builds["none"], "-ctv", "q8_0"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 2 and ("Invalid value for '-ctv' / '--cache-type-v': 'q8_0' is "
                                     "not one of 'f32', 'f16'.") in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "ditto_core.cli.main", "bench",
                           eval_builds["none"], "--threads", "0,x"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and ("Invalid value for '--threads': '0,x': expected thread "
                                     "counts like 1,2") in proc.stderr


def test_bench_and_eval_refuse_a_bad_ditto_kernel_first(eval_builds):
    """A DITTO_KERNEL (or DITTO_TILES) ditto-run would refuse stops `ditto bench` and `ditto
    eval` before any run, with ditto-run's own message (not as the failure of their first
    step)."""
    from ditto_core.model import kernel_paths as KP

    names = ", ".join(t.name for t in KP.tables())
    env = {**os.environ, "DITTO_KERNEL": "sse9"}
    for cmd in (["bench", "--repeat", "1"], ["eval", "--chunks", "1"]):
        proc = subprocess.run([sys.executable, "-m", "ditto_core.cli.main", cmd[0],
                               eval_builds["none"], *cmd[1:], "-q"], capture_output=True,
                              text=True, timeout=600, env=env)
        assert (proc.returncode, proc.stderr) == (
            1, f"error: DITTO_KERNEL: unknown kernel 'sse9' (this program has: {names})\n")
    proc = subprocess.run([sys.executable, "-m", "ditto_core.cli.main", "bench",
                           eval_builds["none"], "--repeat", "1", "-q"], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "DITTO_TILES": "2"})
    assert (proc.returncode, proc.stderr) == (
        1, "error: DITTO_TILES must be 1 (b = 4 weight matrices in row tiles where the kernel "
           "table reads them) or 0 (file order), got '2'\n")


def test_parse_threads_takes_only_positive_integers():
    from ditto_core.cli.eval import parse_threads

    assert parse_threads("1,2") == [1, 2] and parse_threads(" 4 ") == [4]
    for bad in ("1,,2", "1,", "", "0", "-1", "2,x"):
        with pytest.raises(click.BadParameter, match=f"^{re.escape(repr(bad))}: expected thread "
                                                     "counts like 1,2$"):
            parse_threads(bad)
