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
    """Show a bar ``label [####    ] done/total unit`` while the body runs."""
    if not enabled:
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
