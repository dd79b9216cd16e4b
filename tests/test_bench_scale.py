"""bench/bench_scale.py's command line: what --isa refuses, before anything runs."""

import importlib
from pathlib import Path

import pytest

from tests.script_module import load_script

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bs():
    return load_script(ROOT / "bench" / "bench_scale.py")


def _error_line(capsys) -> str:
    return capsys.readouterr().err.splitlines()[-1]


def test_isa_needs_rate_only(bs, tmp_path, capsys):
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as exc:
        bs.main(["--isa", "avx2", "--workdir", str(tmp_path / "w"), "-o", str(out)])
    assert exc.value.code == 2
    assert _error_line(capsys).endswith(
        ": error: --isa applies to --rate-only (builds compile their runtime for this CPU)")
    assert not out.exists() and not (tmp_path / "w").exists()


def test_isa_refused_on_a_cpu_without_x86_64_v3(bs, tmp_path, monkeypatch, capsys):
    bl = importlib.import_module("bench_llamacpp")  # bench/ is on sys.path once bs loads
    monkeypatch.setattr(bl, "cpu_flags", lambda: {"sse2", "avx", "fma", "f16c"})
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as exc:
        bs.main(["--rate-only", "--isa", "avx2", "-o", str(out)])
    assert exc.value.code == 2
    assert _error_line(capsys).endswith(
        ": error: --isa avx2: this CPU does not list abm, avx2, bmi1, bmi2, movbe")
    assert not out.exists()


def test_isa_refused_without_the_compiler(bs, tmp_path, monkeypatch, capsys):
    """--isa avx2 where clang-22 cannot be found: exit 2 naming why, no work directory or
    JSON, and the host's kernels left in place."""
    from ditto_quant_kmeans import native
    bl = importlib.import_module("bench_llamacpp")
    monkeypatch.setattr(bl, "cpu_flags", lambda: set(bs.X86_64_V3))
    monkeypatch.setattr(native, "find_clang", lambda: None)
    monkeypatch.setattr(native, "_STATE", {})
    out, work = tmp_path / "r.json", tmp_path / "w"
    with pytest.raises(SystemExit) as exc:
        bs.main(["--rate-only", "--isa", "avx2", "--workdir", str(work), "-o", str(out)])
    assert exc.value.code == 2
    assert _error_line(capsys).endswith(": error: --isa avx2: the kmeans kernels for x86-64-v3 "
                                        "are unavailable (clang-22 not found on PATH)")
    assert not out.exists() and not work.exists()
    assert native._STATE == {}
