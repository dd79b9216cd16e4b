"""Signals and leftover temp files: how Ditto stops when asked to, and cleans up after others.

* SIGINT (Ctrl-C) raises KeyboardInterrupt as Python does; ``install()`` makes SIGTERM and
  SIGHUP raise ``Terminated`` (a KeyboardInterrupt), so every ``except BaseException`` cleanup
  (temp build directories, temp files) runs for them too, and the CLI exits ``128 + N``
  (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP) after one line ``interrupted`` /
  ``terminated`` on stderr.
* ``deferred()`` holds these signals back while native code that must not be unwound runs
  (numba kernels: an exception raised by a Python signal handler in the middle of a numba
  dispatch ends in a SystemError or a crash); the signal is raised as soon as the block ends.
* Temp names carry the creating process id (``pid_tag()``), and ``sweep_stale()`` removes the
  ones whose process is gone (killed by SIGKILL or a power cut), so they never pile up.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Iterator

#: Signals that stop a Ditto command, and the word printed for them.
STOP_SIGNALS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated",
                signal.SIGHUP: "terminated"}


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: stop like Ctrl-C does (``signum`` says which)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code(exc: BaseException) -> int:
    """The exit status for a stop by ``exc``: ``128 + signal number`` (130 for Ctrl-C)."""
    return 128 + getattr(exc, "signum", signal.SIGINT)


def stop_message(exc: BaseException) -> str:
    """``interrupted`` for SIGINT, ``terminated`` for SIGTERM / SIGHUP."""
    return STOP_SIGNALS.get(getattr(exc, "signum", signal.SIGINT), "interrupted")


_pending: list[int] = []
_depth = 0


def _raise_for(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def _handler(signum, frame):  # noqa: ARG001 - the signal module's signature
    if _depth:
        _pending.append(signum)
        return
    _raise_for(signum)


def install() -> None:
    """Route SIGINT, SIGTERM and SIGHUP through Ditto's handler (main thread only; signals
    left ignored by the parent, e.g. SIGHUP under nohup, stay ignored)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in STOP_SIGNALS:
        if signal.getsignal(s) == signal.SIG_IGN:
            continue
        signal.signal(s, _handler)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold stop signals back for the duration of the block and raise the first one that
    arrived when it ends (only when ``install()`` is in effect; else a plain block)."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth and _pending:
            signum = _pending[0]
            _pending.clear()
            _raise_for(signum)


def pid_tag() -> str:
    """``<pid>-``: the prefix part that marks a temp name as this process's."""
    return f"{os.getpid()}-"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def sweep_stale(directory: Path, prefix: str) -> list[Path]:
    """Remove entries of ``directory`` named ``<prefix><pid>-...`` whose process ``pid`` no
    longer runs (files or directory trees); return what was removed. Errors are ignored: a
    sweep never stops a command."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)-")
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for e in entries:
        m = pattern.match(e.name)
        if not m or _alive(int(m.group(1))):
            continue
        p = Path(e.path)
        try:
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError:
            continue
        removed.append(p)
    return removed


def stop_child(proc: subprocess.Popen, grace: float) -> None:
    """Stop a child this process is waiting on after a timeout or an interrupt: SIGTERM, so it
    cleans up as on Ctrl-C (temporary files, libomp's /dev/shm entry), and SIGKILL when it has
    not exited ``grace`` seconds later; its pipes, if any, are drained and it is reaped."""
    proc.terminate()
    try:
        proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
