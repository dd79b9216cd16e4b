"""``ditto run DIR …``: run a build directory's executable on its model file.

A build directory (written by ``ditto build``, docs/BUILD.md) holds ``build.json``, the
executable named there (``ditto-run``) and ``model.ditto``. Every argument after DIR is passed
to the executable verbatim (``-p "def fib(n):" -n 64 --temp 0 --threads 2``) after ``-m
DIR/model.ditto``, which comes first: a prompt or file name that is literally ``-m`` stays an
argument, and a ``-m FILE`` of the user's own overrides it (the executable's last ``-m`` wins).
SIGINT, SIGTERM and SIGHUP sent to ``ditto run`` are passed on to the executable, and ``ditto
run`` exits with the executable's status (``128 + N`` when a signal N ended it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Sequence

import click

from ditto_core.base.errors import DittoError
from ditto_core.base.signals import stop_child

MODEL_NAME = "model.ditto"
EXE_NAME = "ditto-run"


def find_build(build_dir: Path) -> tuple[Path, Path, dict]:
    """(executable, model file, build.json contents) of a build directory.

    Raises DittoError naming the directory when it, its build.json, the executable or the
    model file is missing."""
    d = Path(build_dir)
    if d.is_file() and (d.parent / "build.json").is_file():  # a build's file, not the build
        raise DittoError(f"{d}: a file inside a build; give the build directory {d.parent}")
    if d.exists() and not d.is_dir():  # e.g. an exported model file
        raise DittoError(f"{d}: a file, not a build directory (a build is the directory "
                         f"`ditto build MODEL --quantizer kmeans --blas openblas -o DIR` "
                         f"writes)")
    if not d.is_dir():
        raise DittoError(f"{d}: not a build directory (build one first: `ditto build MODEL "
                         f"--quantizer kmeans --blas openblas -o {d}`)")
    meta_path = d / "build.json"
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise DittoError(f"{meta_path}: missing; {d} is not a complete Ditto build") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise DittoError(f"{meta_path}: not valid JSON: {exc}") from None
    except OSError as exc:
        raise DittoError(f"{meta_path}: cannot read it: {exc.strerror or exc}") from None
    if not isinstance(meta, dict):
        raise DittoError(f"{meta_path}: not a build record (a JSON object is expected, found "
                         f"{type(meta).__name__})")
    names = {}
    for key, default in (("executable", EXE_NAME), ("model_file", MODEL_NAME)):
        v = meta.get(key, default)
        if not isinstance(v, str) or not v or v in (".", "..") or "/" in v or "\0" in v:
            raise DittoError(f"{meta_path}: {key!r} must be a file name in {d}, found {v!r}")
        names[key] = v
    exe = d / names["executable"]
    model = d / names["model_file"]
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise DittoError(f"{exe}: the build's executable is missing or not executable")
    if not model.is_file():
        if model.exists():  # a directory, FIFO or device: as ditto-run refuses it
            raise DittoError(f"{model}: the build's model file is not a regular file")
        raise DittoError(f"{model}: the build's model file is missing")
    return exe, model, meta


def run_command(build_dir: Path, args: Sequence[str]) -> list[str]:
    """The command line ``ditto run`` executes (see the module docstring)."""
    exe, model, _ = find_build(build_dir)
    if len(exe.parts) == 1:  # DIR is ".": "./ditto-run", so it is never looked up on $PATH
        exe = os.path.join(os.curdir, exe)
    return [str(exe), "-m", str(model), *args]


def run_build(build_dir: Path, args: Sequence[str] = (), *, input=None,  # noqa: A002
              capture_output: bool = False, timeout: float | None = None,
              check: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """Run the build's executable with ``args``, as subprocess.run does (its keyword
    arguments pass through, e.g. ``capture_output=True, text=True``). Returns the
    CompletedProcess. Past ``timeout`` seconds the executable is stopped with SIGTERM (it
    cleans up and exits; SIGKILL 5 s later if it has not), not killed outright as
    subprocess.run kills it, and subprocess.TimeoutExpired is raised."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with subprocess.Popen(run_command(build_dir, args), **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except BaseException:  # the timeout, or Ctrl-C here: the executable stops too
            stop_child(proc, 5)
            raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def run_stats(build_dir: Path, args: Sequence[str], timeout: float = 1200) -> dict:
    """Run the build's executable with ``args`` and return its ``stats`` JSON line (stderr):
    ``tok_per_s`` (decode tok/s), ``ttft_ms``, ``load_ms``, ``peak_rss_kib``, ... (native/README.md).
    Raises DittoError naming the build if it fails or prints no stats line."""
    try:
        proc = run_build(build_dir, args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DittoError(f"{build_dir}: did not finish within {timeout:g} s; stopped") from None
    if proc.returncode != 0:
        raise DittoError(f"{build_dir}: exit {proc.returncode}: {proc.stderr.strip()}")
    for line in proc.stderr.splitlines():
        if line.startswith("stats "):
            return json.loads(line[len("stats "):])
    raise DittoError(f"{build_dir}: no stats line on stderr:\n{proc.stderr}")


@click.command("run", context_settings={"ignore_unknown_options": True,
                                        "allow_interspersed_args": False})
@click.argument("build_dir", type=str)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run_command_cli(build_dir, args):
    """Run the executable of BUILD_DIR on its model; ARGS go to the executable
    (e.g. -p "def fib(n):" -n 64 --temp 0; `ditto run DIR --help` shows its flags)."""
    try:
        if not build_dir:  # Path("") would be the current directory
            raise DittoError("BUILD_DIR is an empty path")
        if build_dir.startswith("-") and not Path(build_dir).is_dir():
            raise DittoError(f"{build_dir}: not a build directory; the build directory comes "
                             f"first: `ditto run DIR {build_dir} ...`")
        cmd = run_command(Path(build_dir), args)
    except DittoError as exc:  # same form as the rest of the ditto CLI
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None
    try:
        code = run_forwarding_signals(cmd)
    except OSError as exc:
        click.echo(f"error: {cmd[0]}: cannot run it: {exc.strerror or exc}", err=True)
        raise SystemExit(1) from None
    raise SystemExit(exit_status(code))


def run_forwarding_signals(cmd: Sequence[str]) -> int:
    """Run ``cmd`` and return its returncode (``-N`` for death by signal N), passing SIGINT,
    SIGTERM and SIGHUP that reach this process on to the child, so that `kill`, `timeout` or a
    closed terminal stop the executable and not just this wrapper. Raises OSError if ``cmd``
    cannot be started."""
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    proc: list[subprocess.Popen] = []
    pending: list[int] = []

    def forward(signum, frame):  # noqa: ARG001
        if proc:
            with contextlib.suppress(ProcessLookupError):
                proc[0].send_signal(signum)
        else:
            pending.append(signum)

    old = {s: signal.signal(s, forward) for s in forwarded
           if signal.getsignal(s) != signal.SIG_IGN}
    try:
        proc.append(subprocess.Popen(cmd))
        for s in pending:
            proc[0].send_signal(s)
        return proc[0].wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def exit_status(returncode: int) -> int:
    """A child's exit status as a POSIX shell reports it: the exit code 0-255 itself, and
    128 + N for death by signal N (subprocess returns -N; e.g. SIGPIPE 13 → 141, SIGINT → 130).
    """
    return 128 - returncode if returncode < 0 else returncode


def register(group: click.Group) -> None:
    """Add ``ditto run`` to the click group ``group``."""
    group.add_command(run_command_cli)
