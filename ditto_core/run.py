"""``ditto run DIR …``: run a build directory's executable on its model file.

A build directory (written by ``ditto build``, docs/BUILD.md) holds ``build.json``, the
executable named there (``ditto-run``) and ``model.ditto``. Every argument after DIR is passed
to the executable unchanged (``-p "def fib(n):" -n 64 --temp 0 --threads 2``); ``-m
DIR/model.ditto`` is added first unless the arguments already give ``-m``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Sequence

import click

from .errors import DittoError

MODEL_NAME = "model.ditto"
EXE_NAME = "ditto-run"


def find_build(build_dir: Path) -> tuple[Path, Path, dict]:
    """(executable, model file, build.json contents) of a build directory.

    Raises DittoError naming the directory when it, its build.json, the executable or the
    model file is missing."""
    d = Path(build_dir)
    if not d.is_dir():
        raise DittoError(f"{d}: not a build directory (build one first: `ditto build MODEL "
                         f"--quantizer kmeans --blas openblas -o {d}`)")
    meta_path = d / "build.json"
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise DittoError(f"{meta_path}: missing; {d} is not a complete Ditto build") from None
    except json.JSONDecodeError as exc:
        raise DittoError(f"{meta_path}: not valid JSON: {exc}") from None
    exe = d / meta.get("executable", EXE_NAME)
    model = d / meta.get("model_file", MODEL_NAME)
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise DittoError(f"{exe}: the build's executable is missing or not executable")
    if not model.is_file():
        raise DittoError(f"{model}: the build's model file is missing")
    return exe, model, meta


def run_command(build_dir: Path, args: Sequence[str]) -> list[str]:
    """The command line ``ditto run`` executes (see the module docstring)."""
    exe, model, _ = find_build(build_dir)
    if len(exe.parts) == 1:  # DIR is ".": "./ditto-run", so it is never looked up on $PATH
        exe = os.path.join(os.curdir, exe)
    args = list(args)
    if "-m" in args:
        return [str(exe), *args]
    return [str(exe), "-m", str(model), *args]


def run_build(build_dir: Path, args: Sequence[str] = (), **kwargs) -> subprocess.CompletedProcess:
    """Run the build's executable with ``args`` (subprocess.run keyword arguments pass
    through, e.g. ``capture_output=True, text=True``). Returns the CompletedProcess."""
    return subprocess.run(run_command(build_dir, args), **kwargs)


def run_stats(build_dir: Path, args: Sequence[str], timeout: float = 1200) -> dict:
    """Run the build's executable with ``args`` and return its ``stats`` JSON line (stderr):
    ``tok_per_s`` (decode tok/s), ``ttft_ms``, ``load_ms``, ``peak_rss_kib``, ... (native/README.md).
    Raises DittoError naming the build if it fails or prints no stats line."""
    proc = run_build(build_dir, args, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise DittoError(f"{build_dir}: exit {proc.returncode}: {proc.stderr.strip()}")
    for line in proc.stderr.splitlines():
        if line.startswith("stats "):
            return json.loads(line[len("stats "):])
    raise DittoError(f"{build_dir}: no stats line on stderr:\n{proc.stderr}")


@click.command("run", context_settings={"ignore_unknown_options": True,
                                        "allow_interspersed_args": False})
@click.argument("build_dir", type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run_command_cli(build_dir, args):
    """Run the executable of BUILD_DIR on its model; ARGS go to the executable
    (e.g. -p "def fib(n):" -n 64 --temp 0; `ditto run DIR --help` shows its flags)."""
    try:
        cmd = run_command(build_dir, args)
    except DittoError as exc:  # same form as the rest of the ditto CLI
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None
    try:
        code = subprocess.run(cmd).returncode
    except KeyboardInterrupt:  # the child got the SIGINT too and has ended
        click.echo("interrupted", err=True)
        raise SystemExit(130) from None
    except OSError as exc:
        click.echo(f"error: {cmd[0]}: cannot run it: {exc.strerror or exc}", err=True)
        raise SystemExit(1) from None
    raise SystemExit(exit_status(code))


def exit_status(returncode: int) -> int:
    """A child's exit status as a POSIX shell reports it: the exit code 0-255 itself, and
    128 + N for death by signal N (subprocess returns -N; e.g. SIGPIPE 13 → 141, SIGINT → 130).
    """
    return 128 - returncode if returncode < 0 else returncode


def register(group: click.Group) -> None:
    """Add ``ditto run`` to the click group ``group``."""
    group.add_command(run_command_cli)
