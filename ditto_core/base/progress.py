"""Rich progress bars for Ditto's long steps (export, quantize+pack), on stderr.

``progress_bar`` is a context manager yielding ``advance(n, description=None)``; with
``enabled=False`` (``--quiet``, or not a terminal) it yields a no-op so callers need no branches.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)


@contextlib.contextmanager
def progress_bar(label: str, total: int, enabled: bool = True,
                 unit: str = "weights") -> Iterator[Callable[..., None]]:
    """Show a bar ``label [####    ] done/total unit`` while the body runs (on a terminal:
    redirected, stderr gets nothing, not even the newline a finished bar leaves)."""
    if not enabled or not sys.stderr.isatty():
        yield lambda n, description=None: None
        return
    console = Console(file=sys.stderr)
    with Progress(TextColumn(label, style="bold", markup=False),
                  TextColumn("{task.description}", markup=False), BarColumn(),
                  MofNCompleteColumn(), TextColumn(unit), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task("", total=total)

        def advance(n: int, description: str | None = None) -> None:
            if description is None:
                bar.update(task, advance=n)
            else:
                bar.update(task, advance=n, description=description)

        yield advance


def progress_callback(label: str, quiet: bool):
    """A rich progress callback ``update(done, total)`` on stderr, started at its first call,
    and ``stop()`` to remove the bar; ``(None, no-op)`` when ``quiet``. For steps that report
    their own progress (calibration, ``ditto eval`` / ``bench``); also ``(None, no-op)`` when
    stderr is not a terminal."""
    if quiet or not sys.stderr.isatty():
        return None, lambda: None
    prog = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                    TimeRemainingColumn(), console=Console(stderr=True), transient=True)
    task = None

    def update(done: int, total: int) -> None:
        nonlocal task
        if task is None:
            prog.start()
            task = prog.add_task(label, total=total)
        prog.update(task, completed=done)

    return update, prog.stop
