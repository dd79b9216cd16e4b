"""What every ``ditto`` command module shares (``cli.main``, ``cli.cc``, ``cli.eval``,
``cli.serve``): the output console, the error/stop-signal wrapper, and the compile-stage flags of ``ditto build`` and
``ditto cc``. The bottom of the command-line layer: it imports no other command module."""

from __future__ import annotations

import functools
import sys

import click
from rich.console import Console

from ditto_core.base import signals
from ditto_core.base.errors import DittoError


def _stdout() -> Console:
    """The console for tables and summaries: markup off, so file names, tensor names and other
    text read from files or arguments print literally (styles are set with ``rich.text.Text``)."""
    return Console(highlight=False, markup=False, soft_wrap=False,
                   width=max(120, Console().width))


def reports_errors(func):
    """Turn DittoError into ``error: ...`` on stderr and exit code 1; a stop signal into one
    line ``interrupted`` / ``terminated`` and exit ``128 + N`` (130 for Ctrl-C, 143 for
    SIGTERM; ditto_core.base.signals)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except DittoError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt as exc:
            click.echo(signals.stop_message(exc), err=True)
            sys.exit(signals.exit_code(exc))

    return wrapper


def check_kernel_env() -> None:
    """Refuse a ``DITTO_KERNEL`` or ``DITTO_TILES`` the build's ditto-run would refuse (an
    unknown table, one this CPU cannot run, a tiles value but 0 or 1), with ditto-run's own
    message, before any work: commands that run a build several times (eval, bench, compare)
    would otherwise report it as the failure of their first step. Raises DittoError."""
    from ditto_core.model import kernel_paths

    kernel_paths.active_table()
    kernel_paths.tiles_enabled()


def compile_stage_options(func):
    """``--emitter``, ``--pass`` (repeatable, ordered), ``--linker`` and ``-O
    COMPONENT.KEY=VALUE``: shared by ``ditto build`` and ``ditto cc``."""
    for decl in reversed([
        click.option("--emitter", default=None, help="IR emitter (default: clang)."),
        click.option("--pass", "passes", multiple=True, metavar="NAME",
                     help="IR pass to run (repeatable, run in the given order; default: the "
                          "passes that declare themselves default-on, `ditto plugins` marks "
                          "them: gemv-blas)."),
        click.option("--linker", default=None, help="Linker (default: llvm)."),
        click.option("-O", "--option", "component_options", multiple=True,
                     metavar="COMPONENT.KEY=VALUE",
                     help="Set a component option (repeatable), e.g. -O "
                          "gemv-blas.omp_threads=region; `ditto plugins --options` lists "
                          "them."),
    ]):
        func = decl(func)
    return func
