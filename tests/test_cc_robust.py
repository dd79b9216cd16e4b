"""`ditto cc` on bad destinations and non-C input: `error: <path>: <problem>`, exit 1, and
nothing written (no executable, no report, no temp file), outputs all or nothing; Ctrl-C → 130."""

import json
import os

import pytest
from click.testing import CliRunner

from ditto_core.cli.cc import cc_command
from ditto_core.stages import cc as cc_mod

PROGRAM = '#include <stdio.h>\nint main(void) { puts("ok"); return 0; }\n'


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.c").write_text(PROGRAM)
    return tmp_path


def _cc(*args):
    return CliRunner().invoke(cc_command, ["p.c", "--blas", "openblas", *args])


def _tree(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


@pytest.mark.parametrize("args,message", [
    (["-o", "d"], "error: d: is a directory (the executable must be a file path)\n"),
    (["-o", "/proc/x/a"], "error: /proc/x/a: "),
    (["-o", "exe", "--report", "/proc/x.json"], "error: /proc/x.json: "),
    (["-o", "exe", "--emit-ir", "/proc/x.ll"], "error: /proc/x.ll: "),
    (["-o", "exe", "--report", "file/r.json"], "error: file/r.json: file is not a directory\n"),
    (["-o", "p.c"], "error: p.c: the executable would overwrite p.c\n"),
    (["-o", "exe", "--report", "exe"], "error: exe: the report would overwrite exe\n"),
])
def test_bad_destination_leaves_nothing(work, args, message):
    (work / "d").mkdir()
    (work / "file").write_text("a regular file")
    before = _tree(work)
    r = _cc(*args)
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith(message) and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.output
    assert _tree(work) == before  # no exe, no report, no .d.tmp-*, no .exe.*.tmp
    assert (work / "p.c").read_text() == PROGRAM
    assert not os.path.exists("/proc/x.json") and not os.path.exists("/proc/x")


def test_not_a_c_source(work):
    (work / "rand.gguf").write_bytes(os.urandom(256))
    r = CliRunner().invoke(cc_command, ["rand.gguf", "--blas", "openblas", "-o", "a"])
    assert r.exit_code == 1
    assert r.stderr == "error: rand.gguf: not a C source file (expected a .c or .i file)\n"
    r = CliRunner().invoke(cc_command, [".", "--blas", "openblas", "-o", "a"])
    assert r.exit_code == 1 and r.stderr == "error: .: is a directory, not a C source file\n"
    assert sorted(p.name for p in work.iterdir()) == ["p.c", "rand.gguf"]


def test_all_outputs_written_together(work):
    """The good path still writes every output, creating missing parent directories, with a
    plain file's permissions (not mkstemp's 0600)."""
    r = _cc("-o", "bin/deep/exe", "--report", "rep/r.json", "--emit-ir", "ir/final.ll")
    assert r.exit_code == 0, r.output
    assert r.stdout == "bin/deep/exe\n"
    assert json.loads((work / "rep" / "r.json").read_text())["executable"] == "bin/deep/exe"
    assert "define" in (work / "ir" / "final.ll").read_text()
    assert os.access(work / "bin" / "deep" / "exe", os.X_OK)
    umask = os.umask(0)
    os.umask(umask)
    assert (work / "rep" / "r.json").stat().st_mode & 0o777 == 0o666 & ~umask
    assert not [p for p in work.rglob(".*")]


@pytest.mark.parametrize("earlier", [False, True])
def test_publish_failure_removes_everything(work, monkeypatch, earlier):
    """A destination that fails only when written (after the compile) leaves no executable,
    no temp and no directory created for it; an earlier file at ``-o`` is restored."""
    if earlier:
        (work / "new").mkdir()
        (work / "new" / "exe").write_text("the old program")
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(dst).endswith("r.json"):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(cc_mod.os, "replace", failing_replace)
    r = _cc("-o", "new/exe", "--report", "r.json")
    assert r.exit_code == 1
    assert r.stderr == "error: r.json: cannot write it: No space left on device\n"
    if earlier:
        assert _tree(work) == ["new", "new/exe", "p.c"]
        assert (work / "new" / "exe").read_text() == "the old program"
    else:
        assert _tree(work) == ["p.c"]


def test_ctrl_c_exits_130(work, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cc_mod, "compile_c", interrupted)
    r = _cc("-o", "exe")
    assert r.exit_code == 130 and r.stderr == "interrupted\n"
    assert "Aborted" not in r.output
