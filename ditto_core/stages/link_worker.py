"""``python -m ditto_core.stages.link_worker JOB PARENT_PID``: the shared library's passes and
link (``link_library``) in a process of its own, while the build's process links the
executable (``compile.compile_with_library``). llvmlite runs one LLVM call at a time per
process, so the two O3 pipelines only overlap in two processes.

``JOB`` is a pickle of ``link_library``'s arguments. Once it is loaded the worker writes
``JOB.started``; a worker that exits without it never began the link, and the caller links
the library itself. A DittoError's message goes to ``JOB.error``. Stop signals are Ditto's
(``signals.install``): SIGTERM unwinds the link as Ctrl-C does once the LLVM call running
returns (the linker child is killed, the temporary files go). When ``PARENT_PID`` is no
longer its parent (the build was killed), the worker sends itself SIGTERM.

Exit status: 0 linked; ``DITTO_ERROR`` a DittoError; ``CANNOT_LOAD`` the job could not be
unpickled (a component this interpreter cannot import, e.g. one defined in a script's
``__main__``); ``128 + N`` stopped by signal N; anything else is a crash (traceback in the
output).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from ditto_core.base import signals
from ditto_core.base.errors import DittoError
from ditto_core.base.types import IRModule
from .cc import run_passes

#: exit status: the job's components cannot be loaded in this interpreter
CANNOT_LOAD = 3
#: exit status: the link failed with a DittoError (its message in ``JOB.error``)
DITTO_ERROR = 4
#: seconds between two checks that the parent still runs
PARENT_POLL = 0.5


def link_library(stages, module: IRModule, blas, out: Path, extra_flags: Sequence[str]) -> None:
    """``module`` through ``stages.passes``, then linked by ``stages.linker`` (with ``blas``
    and ``extra_flags``) into ``out``: the shared library's half of the build
    (``compile.compile_with_library``). Raises DittoError as ``cc.compile_program``."""
    mod, _ = run_passes(module, stages.passes, blas)
    stages.linker.component.link(mod, blas, Path(out), extra_flags=list(extra_flags))


def _stop_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL)
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    """Run the link job ``argv`` = [JOB, PARENT_PID]; returns the exit status (module
    docstring)."""
    signals.install()
    job, parent = sys.argv[1:] if argv is None else argv
    threading.Thread(target=_stop_when_orphaned, args=(int(parent),), daemon=True).start()
    try:
        try:
            with open(job, "rb") as f:
                args = pickle.load(f)
        except Exception as exc:  # unpickling raises AttributeError, ImportError, ...
            print(f"{job}: cannot load the link job: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            return CANNOT_LOAD
        Path(f"{job}.started").touch()
        try:
            link_library(*args)
        except DittoError as exc:
            Path(f"{job}.error").write_text(str(exc))
            return DITTO_ERROR
    except KeyboardInterrupt as exc:  # Ctrl-C or Terminated: cleanup has run on the way out
        return signals.exit_code(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
