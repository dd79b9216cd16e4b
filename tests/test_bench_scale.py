"""bench/bench_scale.py's command line: what --isa refuses, before anything runs."""

import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bs():
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "bench" / "bench_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
