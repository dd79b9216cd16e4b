"""ditto-run's outputs and endings (reliability issue, "Data loss" and "signals"):

- --dump-logits follows the project's output rule (native/io/output.h): an input, a directory, a
  FIFO or a device node is refused and left as it was; a symlink is written through; nothing
  is left half-written (reliability/dump-logits-replaces-special-files).
- Every stdout write error reaches the exit code 4: a full disk, a closed stdout, a pipe whose
  reader went away (reliability/run-stdout-write-error-exit0).
- SIGINT / SIGTERM / SIGHUP end the run through its cleanup, then by the signal itself, and no
  libomp registration file is left in /dev/shm; neither is one after EPIPE
  (reliability/ditto-run-signal-death-leaks-dev-shm).
"""

import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures_native import EXIT_IO, EXIT_OK, run_native, token_file
from tests.modelfile_edit import ModelImage

IDS = [1, 40, 41, 42]


def _dump(exe, model, out, tmp_path, ids_path=None):
    ids_path = ids_path or token_file(tmp_path / "ids.json", IDS)
    return run_native(exe, "-m", model, "--ids", ids_path, "--dump-logits", out)


def _no_temp_files(d: Path):
    left = [p.name for p in d.iterdir() if ".tmp" in p.name or p.name.startswith(".")]
    assert left == [], left


# ------------------------------------------------------------------------------ --dump-logits

def test_dump_logits_regular_file_and_symlink_written_through(native_build, native_synth,
                                                              tmp_path):
    exe, model = native_build.asan, native_synth.quant.path
    out = tmp_path / "out" / "logits.f32"
    out.parent.mkdir()
    p = _dump(exe, model, out, tmp_path)
    assert p.returncode == EXIT_OK, p.stderr.decode()
    want = np.fromfile(out, dtype="<f4")
    assert want.size == len(IDS) * 259
    target = tmp_path / "out" / "target"
    target.write_text("keep")
    link = tmp_path / "out" / "link"
    link.symlink_to("target")
    dangling = tmp_path / "out" / "dangling"
    dangling.symlink_to("created-by-run")
    for path in (link, dangling):
        p = _dump(exe, model, path, tmp_path)
        assert p.returncode == EXIT_OK, p.stderr.decode()
        assert path.is_symlink()
    np.testing.assert_array_equal(np.fromfile(target, dtype="<f4"), want)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "out" / "created-by-run",
                                              dtype="<f4"), want)
    assert sorted(p.name for p in out.parent.iterdir()) == ["created-by-run", "dangling",
                                                            "link", "logits.f32", "target"]


def test_dump_logits_refuses_special_files_and_inputs(native_build, native_synth, tmp_path):
    exe = native_build.asan
    model = tmp_path / "m.ditto"
    model.write_bytes(native_synth.quant.path.read_bytes())
    model_bytes = model.read_bytes()
    ids_path = token_file(tmp_path / "ids.json", IDS)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    (tmp_path / "link-to-fifo").symlink_to("fifo")
    (tmp_path / "link-to-model").symlink_to("m.ditto")
    os.link(model, tmp_path / "hardlink-to-model")
    cases = [(fifo, "is a FIFO; the output must be a regular file, refusing to replace it"),
             (tmp_path / "dir", "is a directory; the output must be a regular file"),
             (Path("/dev/null"), "is a character device; the output must be a regular file"),
             (tmp_path / "link-to-fifo", "is a FIFO (the symbolic link's target)"),
             (model, f"is an input of this run ({model})"),
             (tmp_path / "link-to-model", f"is an input of this run ({model})"),
             (tmp_path / "hardlink-to-model", f"is an input of this run ({model})"),
             (ids_path, f"is an input of this run ({ids_path})")]
    before = {p: p.lstat() for p, _ in cases}
    for path, msg in cases:
        p = _dump(exe, model, path, tmp_path, ids_path)
        err = p.stderr.decode()
        assert p.returncode == EXIT_IO, (path, err)
        assert f"ditto-run: error: {path}: {msg}" in err, err
        st = path.lstat()
        assert (st.st_ino, stat.S_IFMT(st.st_mode)) == (before[path].st_ino,
                                                         stat.S_IFMT(before[path].st_mode))
    assert model.read_bytes() == model_bytes
    assert ids_path.read_text() == "[1, 40, 41, 42]"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["m.ditto", "ids.json", "fifo", "dir", "link-to-fifo", "link-to-model",
         "hardlink-to-model"])


# ------------------------------------------------------------------------------ stdout errors

@pytest.mark.parametrize("mode", [["-p", "hi", "-n", "5", "--temp", "0"],
                                  ["-p", "hi", "-n", "5", "--temp", "0", "--print-ids"],
                                  ["-p", "hi", "--tokens"], ["--score", "IDS"]])
def test_stdout_to_full_disk_or_closed_exits_4(native_build, native_synth, tmp_path, mode):
    ids = str(token_file(tmp_path / "ids.json", IDS))
    args = [native_build.asan, "-m", native_synth.quant.path] + [ids if a == "IDS" else a
                                                                 for a in mode]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:exitcode=99")
    with open("/dev/full", "wb") as full:
        p = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, env=env)
    assert p.returncode == EXIT_IO, p.stderr.decode()
    assert "ditto-run: error: cannot write to stdout: No space left on device" in \
        p.stderr.decode()
    p = subprocess.run(args, stderr=subprocess.PIPE, env=env,
                       preexec_fn=lambda: os.close(1))
    assert p.returncode == EXIT_IO, p.stderr.decode()
    assert "ditto-run: error: cannot write to stdout: Bad file descriptor" in p.stderr.decode()


@pytest.fixture(scope="module")
def long_context_model(native_synth, tmp_path_factory):
    """native_synth.quant with max_seq_len 100000: generation that runs until stopped."""
    img = ModelImage(native_synth.quant.path).set_config(max_seq_len=100000)
    return img.save(tmp_path_factory.mktemp("longctx") / "long.ditto")


def _kmp_files(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"__KMP_REGISTERED_LIB_{pid}_")]


def _start_generating(exe, model, **kw):
    p = subprocess.Popen([str(exe), "-m", str(model), "-p", "hi", "-n", "90000", "--ignore-eos",
                          "--temp", "0", "--threads", "2"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, **kw)
    assert len(p.stdout.read(5)) == 5  # generating (and the OpenMP runtime is up)
    return p


def test_reader_gone_is_exit_4_and_leaks_nothing(native_build, long_context_model):
    p = _start_generating(native_build.run, long_context_model)
    assert _kmp_files(p.pid), "the check below needs libomp's registration file"
    p.stdout.close()  # like `| head -c 5`
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == EXIT_IO, err
    assert "cannot write to stdout: Broken pipe" in err
    assert _kmp_files(p.pid) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_stop_signals_end_by_the_signal_and_leak_nothing(native_build, long_context_model,
                                                          sig):
    p = _start_generating(native_build.run, long_context_model)
    assert _kmp_files(p.pid)
    time.sleep(0.2)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == -sig, err.decode()
    assert f"ditto-run: interrupted ({signal.Signals(sig).name})" in err.decode()
    assert _kmp_files(p.pid) == []
