"""`ditto build` / `ditto run` / `ditto inspect` on hostile input: a cache whose files were
edited through a build directory or by hand, an unusable cache directory, `-o .`, a build
directory holding the user's own files, a child killed by a signal, Ctrl-C, `-q`, the hints.

Every build here uses a private cache under tmp_path seeded from the session cache of
``tiny_builds`` (tinycoder fp32), so each one is a cache hit (or one quick re-pack)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from ditto_core.base import cache as cache_mod
from ditto_core.cli.main import cli
from ditto_core.runtime import run as run_mod

from .fixtures_compile import build_model

BUILD_ARGS = ["build", "tinycoder", "--quantizer", "none", "--blas", "openblas"]


@pytest.fixture
def cache_dir(tiny_builds, build_cache_root, tmp_path):
    """A private copy of the session cache's tinycoder entries (model + compile)."""
    dst = tmp_path / "cache"
    key = tiny_builds["rewrite"][1]["compile_key"]
    shutil.copytree(build_cache_root / "compile" / key, dst / "compile" / key)
    want = cache_mod.file_hash(tiny_builds["rewrite"][0] / "model.ditto")
    for entry in (build_cache_root / "model").iterdir():  # the tinycoder fp32 entry only
        try:
            files = json.loads((entry / "meta.json").read_text())["files"]
        except (OSError, ValueError, KeyError):
            continue
        if files.get("model.ditto", {}).get("sha256") == want:
            shutil.copytree(entry, dst / "model" / entry.name)
    assert len(list((dst / "model").iterdir())) == 1
    return dst


def _build(args, cache_dir, **env):
    env = {"DITTO_CACHE_DIR": str(cache_dir), "DITTO_NO_CACHE": None, **env}
    return CliRunner().invoke(cli, BUILD_ARGS + list(args), env=env)


def _model_entry(cache_dir):
    (entry,) = [e for e in (cache_dir / "model").iterdir() if not e.name.startswith(".")]
    return entry


def test_build_dir_files_are_not_the_cache_inodes(tiny_builds, cache_dir, tmp_path):
    """Bug 1: overwriting DIR/model.ditto (cp other DIR/model.ditto) must not reach the cache."""
    ref = (tiny_builds["rewrite"][0] / "model.ditto").read_bytes()
    a = tmp_path / "a"
    r = _build(["-o", str(a), "-q"], cache_dir)
    assert r.exit_code == 0, r.output
    entry = _model_entry(cache_dir)
    for name in ("model.ditto", "ditto-run"):
        assert (a / name).stat().st_nlink == 1
    assert (a / "model.ditto").stat().st_ino != (entry / "model.ditto").stat().st_ino
    # overwrite in place, as `cp other.ditto a/model.ditto` does (same inode, truncated)
    with open(a / "model.ditto", "r+b") as f:
        f.write(b"POISONED")
    with open(a / "ditto-run", "r+b") as f:
        f.write(b"POISONED")
    assert (entry / "model.ditto").read_bytes() == ref
    b = tmp_path / "b"
    r = _build(["-o", str(b), "-q"], cache_dir)
    assert r.exit_code == 0, r.output
    assert json.loads((b / "build.json").read_text())["cached"] == {"model": True,
                                                                     "compile": True}
    assert (b / "model.ditto").read_bytes() == ref
    assert (b / "ditto-run").read_bytes() == (tiny_builds["rewrite"][0] / "ditto-run").read_bytes()
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["files"]["model.ditto"]["size"] == len(ref)


@pytest.mark.parametrize("damage", ["garbage", "same_size"])
def test_damaged_cache_entry_is_rebuilt(tiny_builds, cache_dir, tmp_path, damage):
    """Bug 2: `echo garbage > cache/model/<key>/model.ditto` (or a same-size edit that only the
    SHA-256 catches) is a miss: warned once, rebuilt, and the entry replaced."""
    ref = (tiny_builds["rewrite"][0] / "model.ditto").read_bytes()
    entry = _model_entry(cache_dir)
    f = entry / "model.ditto"
    if damage == "garbage":
        f.write_text("garbage\n")
    else:
        data = bytearray(ref)
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    out = tmp_path / "out"
    r = _build(["-o", str(out), "-q"], cache_dir)
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1, r.stderr
    assert str(entry) in warnings[0] and "model.ditto" in warnings[0]
    assert ("8 bytes" in warnings[0]) if damage == "garbage" else ("SHA-256" in warnings[0])
    rec = json.loads((out / "build.json").read_text())
    assert rec["cached"] == {"model": False, "compile": True}
    assert (out / "model.ditto").read_bytes() == ref  # the rebuilt file, not the damage
    assert f.read_bytes() == ref  # the entry was replaced by the good one
    assert not [p for p in (cache_dir / "model").iterdir() if p.name.startswith(".")]
    # and the next build is a clean hit again
    r = _build(["-o", str(tmp_path / "again"), "-q"], cache_dir)
    assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr
    assert json.loads((tmp_path / "again" / "build.json").read_text())["cached"]["model"]


def test_damaged_compile_entry_is_rebuilt_in_api(tiny_builds, cache_dir, tmp_path, capsys):
    """The executable entry is verified the same way (truncated executable → relinked)."""
    key = tiny_builds["rewrite"][1]["compile_key"]
    exe = cache_dir / "compile" / key / "executable"
    exe.write_bytes(exe.read_bytes()[:1000])
    rec = build_model("tinycoder", tmp_path / "o", cache_dir)
    assert rec["cached"] == {"model": True, "compile": False}
    assert "1000 bytes" in capsys.readouterr().err
    ref = (tiny_builds["rewrite"][0] / "ditto-run").read_bytes()
    assert (tmp_path / "o" / "ditto-run").stat().st_size == len(ref)
    assert exe.stat().st_size == len(ref)


def test_unusable_cache_dir_builds_without_cache(tiny_builds, tmp_path):
    """Bug 3: DITTO_CACHE_DIR=/proc/nocache: one warning, the build still works."""
    cache_mod._WARNED.clear()
    out = tmp_path / "out"
    # without a cache the runtime is compiled: -O0 code generation keeps that short
    r = _build(["-o", str(out), "-q", "-O", "llvm.opt_level=0"], "/proc/nocache")
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: cache disabled: /proc/nocache: ")
    rec = json.loads((out / "build.json").read_text())
    assert rec["cached"] == {"model": False, "compile": False}
    assert (out / "model.ditto").read_bytes() == \
        (tiny_builds["rewrite"][0] / "model.ditto").read_bytes()


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_cache_root_that_is_a_file_disables_cache(tmp_path, capsys, where):
    """Bug 3: a regular file as the cache root (or a path under one): disabled, one warning."""
    regular = tmp_path / "regular"
    regular.write_text("x")
    root = regular if where == "file" else regular / "sub"
    cache_mod._WARNED.clear()
    c = cache_mod.Cache(root=root, enabled=True)
    c2 = cache_mod.Cache(root=root, enabled=True)
    assert not c.enabled and not c2.enabled
    assert c.put("s", "k", {"f": regular}, {}) is None and c.fetch("s", "k", {}) is None
    err = capsys.readouterr().err
    reason = "exists and is not a directory" if where == "file" else "Not a directory"
    assert err == f"warning: cache disabled: {root}: {reason}\n"  # once, not twice
    assert regular.read_text() == "x"


def test_build_into_cwd_is_a_clear_error(cache_dir, tmp_path, monkeypatch):
    """Bug 5: `ditto build … -o .` inside an existing build dir."""
    d = tmp_path / "b"
    assert _build(["-o", str(d), "-q"], cache_dir).exit_code == 0
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    monkeypatch.chdir(d)
    r = _build(["-o", ".", "-q"], cache_dir)
    assert r.exit_code == 1
    assert r.stderr == "error: .: cannot replace the current directory (or one holding it); " \
                       "use another -o\n"
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "cache"]


def test_rebuild_keeps_user_files(cache_dir, tmp_path):
    """Bug 6: a build dir holding the user's own files is not replaced (nor touched)."""
    d = tmp_path / "b"
    assert _build(["-o", str(d), "-q"], cache_dir).exit_code == 0
    (d / "notes.txt").write_text("mine")
    (d / "sub").mkdir()
    (d / "sub" / "x").write_text("also mine")
    before = sorted(p.name for p in d.iterdir())
    r = _build(["-o", str(d), "-q"], cache_dir)
    assert r.exit_code == 1
    assert f"error: {d}: holds files that are not build outputs (notes.txt, sub/)" in r.stderr
    assert sorted(p.name for p in d.iterdir()) == before
    assert (d / "notes.txt").read_text() == "mine" and (d / "sub" / "x").read_text() == "also mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "cache"]
    # with only the build's own outputs there, it is replaced
    shutil.rmtree(d / "sub")
    (d / "notes.txt").unlink()
    (d / "build.json").write_text(json.dumps({"stale": True}))
    assert _build(["-o", str(d), "-q"], cache_dir).exit_code == 0
    assert json.loads((d / "build.json").read_text())["status"] == "complete"


def test_quiet_build_prints_nothing_on_stderr(cache_dir, tmp_path):
    """Bug 8: -q silences the pass summary too; without -q it is still printed."""
    r = _build(["-o", str(tmp_path / "q"), "-q"], cache_dir)
    assert r.exit_code == 0 and r.stderr == "" and r.stdout == f"{tmp_path / 'q'}\n"
    r = _build(["-o", str(tmp_path / "v")], cache_dir)
    assert r.exit_code == 0
    assert "gemv-blas: rewrote " in r.stderr and "(cached: model, compile)" in r.stderr


def _fake_build(d, script):
    """A build directory whose 'executable' is a shell script (run.find_build accepts it)."""
    d.mkdir()
    (d / "build.json").write_text(json.dumps({"executable": "ditto-run",
                                              "model_file": "model.ditto"}))
    (d / "model.ditto").write_bytes(b"")
    exe = d / "ditto-run"
    exe.write_text("#!/bin/sh\n" + script + "\n")
    exe.chmod(0o755)
    return d


def _ditto_cmd(*args):
    return [sys.executable, "-c", "from ditto_core.cli.main import main; main()", *args]


def test_run_signal_death_maps_like_a_shell(tmp_path):
    """Bug 7: a child killed by SIGPIPE (`| head -c 5`) exits 141, not 243."""
    d = _fake_build(tmp_path / "b", "exec yes")
    cmd = " ".join(f"'{c}'" for c in _ditto_cmd("run", str(d)))
    p = subprocess.run(["bash", "-c", cmd + " | head -c 5; echo ${PIPESTATUS[0]}"],
                       capture_output=True, text=True, timeout=60)
    assert p.stdout == "y\ny\ny141\n", (p.stdout, p.stderr)
    d2 = _fake_build(tmp_path / "t", "kill -TERM $$")
    assert subprocess.run(_ditto_cmd("run", str(d2)), timeout=60).returncode == 128 + 15
    assert run_mod.exit_status(-signal.SIGINT) == 130 and run_mod.exit_status(3) == 3


def test_run_ctrl_c_exits_130(tmp_path):
    """Bug 7: Ctrl-C (SIGINT to the foreground group) during `ditto run` → 130, no Aborted!."""
    started = tmp_path / "started"
    d = _fake_build(tmp_path / "b", f"touch '{started}'; exec sleep 30")
    p = subprocess.Popen(_ditto_cmd("run", str(d)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.monotonic()
    while not started.exists() and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "Aborted" not in err and "Traceback" not in err


def test_run_and_inspect_hints(tmp_path, tiny_builds):
    """Bug 9: the `ditto run` hint gives the required options; `inspect DIR` points at
    DIR/model.ditto."""
    r = CliRunner().invoke(run_mod.run_command_cli, [str(tmp_path / "nowhere")])
    assert r.exit_code == 1
    assert r.stderr == (f"error: {tmp_path / 'nowhere'}: not a build directory (build one first:"
                        f" `ditto build MODEL --quantizer kmeans --blas openblas -o "
                        f"{tmp_path / 'nowhere'}`)\n")
    d = tiny_builds["rewrite"][0]
    r = CliRunner().invoke(run_mod.run_command_cli, [str(d / "model.ditto")])
    assert r.exit_code == 1  # the model file, not its build: name the build directory
    assert r.stderr == (f"error: {d / 'model.ditto'}: a file inside a build; give the build "
                        f"directory {d}\n")
    (tmp_path / "m.ditto").write_bytes(b"DITTO")  # a file, as an exported model is
    r = CliRunner().invoke(run_mod.run_command_cli, [str(tmp_path / "m.ditto"), "-p", "x"])
    assert r.exit_code == 1 and r.stderr == (
        f"error: {tmp_path / 'm.ditto'}: a file, not a build directory (a build is the "
        "directory `ditto build MODEL --quantizer kmeans --blas openblas -o DIR` writes)\n")
    r = CliRunner().invoke(run_mod.run_command_cli, ["-p", "x", str(d)])  # flags first
    assert r.exit_code == 1 and r.stderr == (
        "error: -p: not a build directory; the build directory comes first: "
        "`ditto run DIR -p ...`\n")
    r = CliRunner().invoke(run_mod.run_command_cli, ["", "-p", "x"])
    assert r.exit_code == 1 and r.stderr == "error: BUILD_DIR is an empty path\n"
    r = CliRunner().invoke(cli, ["inspect", str(d)])
    assert r.exit_code == 1
    assert r.stderr == (f"error: {d}: is a directory, not a model file; did you mean "
                        f"{d / 'model.ditto'}?\n")
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(cli, ["inspect", str(tmp_path / "empty")])
    assert r.exit_code == 1 and r.stderr == \
        f"error: {tmp_path / 'empty'}: is a directory, not a model file\n"


def test_cache_api_rejects_mismatch(tmp_path):
    """Cache.put records size + SHA-256; fetch copies to a private inode and refuses a
    mismatching entry (removing it); get verifies too."""
    src = tmp_path / "f.bin"
    src.write_bytes(b"abc" * 1000)
    c = cache_mod.Cache(root=tmp_path / "c", enabled=True)
    entry = c.put("s", "k", {"f.bin": src}, {"x": 1})
    assert json.loads((entry / "meta.json").read_text())["files"]["f.bin"] == {
        "size": 3000, "sha256": cache_mod.file_hash(src)}
    dst = tmp_path / "out.bin"
    assert c.fetch("s", "k", {"f.bin": dst})["x"] == 1
    assert dst.read_bytes() == src.read_bytes()
    assert dst.stat().st_ino != (entry / "f.bin").stat().st_ino
    assert c.get("s", "k") is not None
    (entry / "f.bin").write_bytes(b"abd" * 1000)  # same size, other bytes
    dst.unlink()
    assert c.fetch("s", "k", {"f.bin": dst}) is None
    assert not dst.exists() and not entry.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_build_md_summary_line_is_a_template_real_output_matches(tiny_builds):
    """Bug 10: docs/BUILD.md shows the pass summary line as a template (no count that drifts
    from the runtime's real loop nests), and the real line of a build has that shape."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "BUILD.md").read_text()
    assert not re.search(r"rewrote \d+/\d+ GEMV nests \(\d+ other", doc)
    template = "gemv-blas: rewrote N/M GEMV nests (K other loop nests left alone)"
    assert template in doc
    pattern = re.sub(r"\b[NMK]\b", r"(\\d+)", re.escape(template))
    line = tiny_builds["rewrite"][1]["pass_summary"][0]
    m = re.fullmatch(pattern, line)
    assert m, line
    gemv = next(p for p in tiny_builds["rewrite"][1]["passes"] if p["name"] == "gemv-blas")
    assert int(m.group(1)) == gemv["rewritten"]
    assert int(m.group(2)) + int(m.group(3)) == gemv["total"]


def test_a_file_no_exporter_reads_says_what_is_wrong_with_a_gguf(tmp_path):
    from ditto_core.base.errors import DittoError
    from ditto_core.stages.pipeline import choose_exporter

    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "junk.gguf").write_bytes(b"hello world")
    (tmp_path / "junk.bin").write_bytes(b"hello world")
    cases = {"empty.gguf": ": it is empty",
             "junk.gguf": ": it does not start with the GGUF magic (b'GGUF'; it starts with "
                          "b'hell')",
             "junk.bin": ""}
    for name, tail in cases.items():
        with pytest.raises(DittoError) as err:
            choose_exporter(tmp_path / name)
        assert str(err.value) == (f"{tmp_path / name}: not a model file any exporter reads "
                                  f"(gguf, hf){tail}")
