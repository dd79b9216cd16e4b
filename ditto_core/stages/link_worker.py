"""``python -m ditto_core.stages.link_worker JOB``: the shared library's passes and link
(``link_library``) in a process of its own, while the build's process links the
executable (``compile.compile_with_library``). llvmlite runs one LLVM call at a time per
process, so the two O3 pipelines only overlap in two processes.

``JOB`` is a pickle of ``link_library``'s arguments. Stop signals are Ditto's
(``signals.install``): SIGTERM unwinds the link as Ctrl-C does, so the linker child is killed
and the temporary files go. Exit status: 0 linked; ``DITTO_ERROR`` a DittoError (its message
on stderr); ``CANNOT_LOAD`` the job could not be unpickled (a component this interpreter
cannot import, e.g. one defined in a script's ``__main__``: the caller then links in its own
process); ``128 + N`` stopped by signal N; anything else is a crash (traceback on stderr).
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Sequence

from ditto_core.base import signals
from ditto_core.base.errors import DittoError
from ditto_core.base.types import IRModule
from .cc import run_passes

#: exit status: the job's components cannot be loaded in this interpreter
CANNOT_LOAD = 3
#: exit status: the link failed with a DittoError, whose message is all of stderr (Python
#: itself exits 1 on an uncaught exception)
DITTO_ERROR = 4


def link_library(stages, module: IRModule, blas, out: Path, extra_flags: Sequence[str]) -> None:
    """``module`` through ``stages.passes``, then linked by ``stages.linker`` (with ``blas``
    and ``extra_flags``) into ``out``: the shared library's half of the build
    (``compile.compile_with_library``). Raises DittoError as ``cc.compile_program``."""
    mod, _ = run_passes(module, stages.passes, blas)
    stages.linker.component.link(mod, blas, Path(out), extra_flags=list(extra_flags))


def main(argv: list[str] | None = None) -> int:
    """Run the link job named by ``argv[0]``; returns the exit status (module docstring)."""
    signals.install()
    (job,) = sys.argv[1:] if argv is None else argv
    try:
        with open(job, "rb") as f:
            args = pickle.load(f)
    except Exception as exc:  # unpickling raises AttributeError, ImportError, ...
        print(f"{job}: cannot load the link job: {type(exc).__name__}: {exc}", file=sys.stderr)
        return CANNOT_LOAD
    try:
        link_library(*args)
    except DittoError as exc:
        print(exc, file=sys.stderr)
        return DITTO_ERROR
    except KeyboardInterrupt as exc:  # Ctrl-C or Terminated: cleanup has run on the way out
        return signals.exit_code(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
