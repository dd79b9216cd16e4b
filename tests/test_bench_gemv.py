"""bench/bench_gemv.py: a bad argument is a usage error naming its flag, before anything is built."""

from pathlib import Path

import pytest

from tests.script_module import load_script

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bg():
    return load_script(ROOT / "bench" / "bench_gemv.py")


@pytest.mark.parametrize("args,message", [
    (["--shapes", "5x"], "--shapes: '' is not an integer"),
    (["--shapes", "4x4x4"], "--shapes: '4x4x4' is not ROWSxCOLS"),
    (["--shapes", "0x64"], "--shapes: 0 is outside 1..16777216"),
    (["--bits", "9"], "--bits: 9 is outside 1..8"),
    (["--bits", "4,"], "--bits: '' is not an integer"),
    (["--group-size", "1"], "--group-size: 1 is outside 2..16777216"),
    (["--threads", "0"], "--threads: 0 is outside 1..1024"),
    (["--threads", "x"], "--threads: 'x' is not an integer"),
    (["--formats", "int8,bogus"], "--formats: unknown bogus (known: f32, int8, int8-tiled, f16)"),
    (["--rounds", "0"], "--rounds: 0 is below 1"),
    (["--stream-mib", "0"], "--stream-mib: 0 is below 1"),
    (["--burst-s", "-1"], "--burst-s: -1.0 is not a positive number of seconds"),
    (["--shapes", "16777216x16777216"],
     "--shapes: 16777216x16777216 has 281,474,976,710,656 weights, more than 2^32"),
    (["--formats", "int8, f32,"], None),
    (["--kernels", ", "], "--kernels: empty list (best, or one of this program's: avx512vbmi, "
                          "avx512vnni, avxvnni, avx2, generic)"),
    (["--kernels", "best,nosuch"], "--kernels: unknown kernel table 'nosuch' (best, or one of "
                                   "this program's: avx512vbmi, avx512vnni, avxvnni, avx2, "
                                   "generic)")])
def test_bad_arguments_are_usage_errors(bg, monkeypatch, capsys, args, message):
    """Each bad value: exit 2 with argparse's usage error naming the flag and the value."""
    monkeypatch.setattr(bg.KP, "tables", lambda machine=None: bg.KP.X86_TABLES)
    built = []
    monkeypatch.setattr(bg, "build", lambda *a: built.append(a))
    if message is None:  # spaces and an empty item in a list are fine: the work starts
        def started(*a):
            raise RuntimeError("built")

        monkeypatch.setattr(bg, "build", started)
        with pytest.raises(RuntimeError, match="built"):
            bg.main(args)
        return
    with pytest.raises(SystemExit) as exc:
        bg.main(args)
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f": error: {message}")
    assert built == []


def test_a_table_the_cpu_cannot_run_is_refused_with_what_it_lacks(bg, monkeypatch, capsys):
    """A table this program has but this CPU cannot run (here an AVX2-only CPU): exit 2 with
    the features it lacks, in the table's order (as ditto-run lists them)."""
    monkeypatch.setattr(bg.KP, "tables", lambda machine=None: bg.KP.X86_TABLES)
    monkeypatch.setattr(bg.KP, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c", "bmi2"}))
    with pytest.raises(SystemExit) as exc:
        bg.main(["--kernels", "avx2,avx512vbmi"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        ": error: --kernels: kernel table 'avx512vbmi' needs CPU features this CPU "
        "lacks: avx512f, avx512bw, avx512vl, avx512_vnni, avx512vbmi")
