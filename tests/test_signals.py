"""Stopping Ditto with signals, and what it leaves behind (issue: reliability).

SIGTERM / SIGHUP stop a command like Ctrl-C does (cleanup, one line, exit 128 + N); signals
arriving while numba kernels run wait for the tensor to finish; temp names carry the pid and
later runs sweep those of dead processes; `ditto run` passes its arguments verbatim after its
own `-m` and forwards SIGINT/SIGTERM/SIGHUP to the executable, exiting with its status."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ditto_core.base import signals
from ditto_core.runtime import run as run_mod

from .test_build_robust import _ditto_cmd, _fake_build


def _ditto(*args):
    return _ditto_cmd(*args)


def _wait_for(path: Path, timeout=30.0):
    t0 = time.monotonic()
    while not path.exists():
        assert time.monotonic() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.02)


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


# --- ditto run: arguments -----------------------------------------------------------------
@pytest.mark.parametrize("args", [["-p", "-m"], ["-p", "x", "--score", "-m"], ["-m"]])
def test_run_passes_arguments_verbatim_after_its_own_model(tmp_path, args):
    d = _fake_build(tmp_path / "b", 'for a in "$@"; do printf "<%s>" "$a"; done')
    assert run_mod.run_command(d, args)[1:] == ["-m", str(d / "model.ditto"), *args]
    p = subprocess.run(_ditto("run", str(d), *args), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "".join(f"<{a}>" for a in ["-m", str(d / "model.ditto"), *args])


@pytest.mark.parametrize("record,message", [
    ("[1, 2]", "not a build record (a JSON object is expected, found list)"),
    ('{"executable": 5}', "'executable' must be a file name in"),
    ('{"model_file": "../x"}', "'model_file' must be a file name in"),
    ("\"\\udcff\"", "not a build record"),
])
def test_run_rejects_a_malformed_build_record(tmp_path, record, message):
    d = _fake_build(tmp_path / "b", "exit 0")
    (d / "build.json").write_text(record)
    r = CliRunner().invoke(run_mod.run_command_cli, [str(d), "-p", "hi"])
    assert r.exit_code == 1
    assert r.stderr.startswith(f"error: {d / 'build.json'}: ") and message in r.stderr, r.stderr


# --- ditto run: signals are forwarded -----------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_run_forwards_signals_to_the_executable(tmp_path, sig):
    started, got = tmp_path / "started", tmp_path / "got"
    d = _fake_build(tmp_path / "b", f"trap 'echo {sig.name} > \"{got}\"; exit 7' {sig.name[3:]}\n"
                                    f"touch '{started}'\nwhile :; do sleep 0.05; done")
    p = subprocess.Popen(_ditto("run", str(d)), stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    _wait_for(started)
    p.send_signal(sig)  # to the wrapper only, as `kill PID` / `timeout` do
    _, err = p.communicate(timeout=30)
    assert p.returncode == 7, err
    assert got.read_text() == f"{sig.name}\n"
    assert "Traceback" not in err


def test_run_sigterm_stops_the_executable(tmp_path):
    started, pidf = tmp_path / "started", tmp_path / "pid"
    d = _fake_build(tmp_path / "b", f"echo $$ > '{pidf}'; touch '{started}'; exec sleep 60")
    p = subprocess.Popen(_ditto("run", str(d)), start_new_session=True)
    _wait_for(started)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    child = int(pidf.read_text())
    t0 = time.monotonic()
    while True:  # the child was reaped by the wrapper's wait(): it is gone
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() - t0 < 10, "ditto-run still running after ditto run ended"
        time.sleep(0.05)


# --- the signal module --------------------------------------------------------------------
@pytest.fixture
def installed():
    old = {s: signal.getsignal(s) for s in signals.STOP_SIGNALS}
    signals.install()
    yield
    for s, h in old.items():
        signal.signal(s, h)


@pytest.mark.parametrize("sig,exc", [(signal.SIGTERM, signals.Terminated),
                                     (signal.SIGINT, KeyboardInterrupt)])
def test_deferred_holds_signals_until_the_block_ends(installed, sig, exc):
    reached = False
    with pytest.raises(exc) as info:
        with signals.deferred():
            os.kill(os.getpid(), sig)
            time.sleep(0.05)
            reached = True
    assert reached
    assert signals.exit_code(info.value) == 128 + sig
    assert signals.stop_message(info.value) == ("terminated" if sig == signal.SIGTERM
                                                else "interrupted")
    with pytest.raises(signals.Terminated):  # outside deferred(): at once
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(1)


def test_install_keeps_ignored_signals_ignored():
    """A signal the parent left ignored (SIGHUP under nohup) stays ignored after install(),
    so `nohup ditto build ...` survives the terminal closing."""
    old = {s: signal.getsignal(s) for s in signals.STOP_SIGNALS}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signals.install()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is signals._handler
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def test_sweep_removes_only_dead_processes_entries(tmp_path):
    dead = _dead_pid()
    (tmp_path / f"out.tmp-{dead}-abc").mkdir()
    (tmp_path / f"out.tmp-{dead}-abc" / "model.ditto").write_text("x")
    (tmp_path / f"out.tmp-{os.getpid()}-def").mkdir()
    (tmp_path / "out.tmp-notapid").mkdir()
    (tmp_path / f"other.tmp-{dead}-x").write_text("x")
    removed = signals.sweep_stale(tmp_path, "out.tmp-")
    assert removed == [tmp_path / f"out.tmp-{dead}-abc"]
    assert sorted(os.listdir(tmp_path)) == sorted([f"out.tmp-{os.getpid()}-def",
                                                   "out.tmp-notapid", f"other.tmp-{dead}-x"])


# --- ditto build under signals ------------------------------------------------------------
def _build_and_signal(tmp_path, stage, sig, quantizer="none", delay=0.3, extra=()):
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "DITTO_CACHE_DIR": str(tmp_path / "c")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    p = subprocess.Popen(_ditto("build", "tinycoder", "--quantizer", quantizer, "--blas",
                                "openblas", "-o", str(tmp_path / "out"), *extra),
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    seen = []
    for line in p.stderr:
        seen.append(line)
        if line.startswith(f"[{stage}/6]"):
            break
    time.sleep(delay)
    os.killpg(p.pid, sig)
    err = "".join(seen) + p.stderr.read()
    return p.wait(timeout=120), err


def test_build_sigterm_cleans_up_and_exits_143(tmp_path):
    rc, err = _build_and_signal(tmp_path, 4, signal.SIGTERM, extra=["--no-cache"])
    assert rc == 143, err
    assert err.strip().splitlines()[-1] == "terminated"
    assert "Traceback" not in err
    assert [f for f in os.listdir(tmp_path) if f.startswith("out")] == []
    assert os.listdir(tmp_path / "tmp") == []


@pytest.mark.parametrize("delay", [0.05, 0.4])
def test_build_ctrl_c_during_kmeans_quantization(tmp_path, delay):
    rc, err = _build_and_signal(tmp_path, 2, signal.SIGINT, quantizer="kmeans", delay=delay)
    assert rc == 130, err
    assert err.strip().splitlines()[-1] == "interrupted"
    assert "Traceback" not in err and "SystemError" not in err
    assert [f for f in os.listdir(tmp_path) if f.startswith("out")] == []


def test_build_sweeps_temp_dirs_of_killed_builds(tmp_path):
    dead = _dead_pid()
    stale = [tmp_path / f"out.tmp-{dead}-x1", tmp_path / "tmp" / f"ditto-compile-{dead}-x2"]
    for s in stale:
        s.mkdir(parents=True)
        (s / "junk").write_text("x")
    alive = tmp_path / "tmp" / f"ditto-compile-{os.getpid()}-x3"
    alive.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "DITTO_CACHE_DIR": str(tmp_path / "c")}
    # the sweep runs when the runtime is compiled (an empty cache); -O0 code generation
    # keeps that compile short
    p = subprocess.run(_ditto("build", "tinycoder", "--quantizer", "none", "--blas", "openblas",
                              "-O", "llvm.opt_level=0", "-o", str(tmp_path / "out"), "-q"),
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert not any(s.exists() for s in stale)
    assert alive.is_dir()
