"""``ditto cc``: run Ditto's compile stages (emit IR → rewrite → link) on any C program.

``register(group)`` adds the command to a click group (the ``ditto`` CLI calls it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ditto_core.base import signals
from ditto_core.base.errors import DittoError
from .common import compile_stage_options


@click.command("cc", context_settings={"ignore_unknown_options": False})
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-I", "include_dirs", multiple=True, type=click.Path(path_type=Path),
              help="Add an include directory (as clang's -I).")
@click.option("-D", "defines", multiple=True, help="Define a macro NAME or NAME=VALUE.")
@click.option("-fopenmp", "openmp", is_flag=True, help="Compile with OpenMP (libomp).")
@click.option("--blas", default="openblas", show_default=True,
              help="BLAS target to link (see `ditto plugins`).")
@click.option("-o", "out", required=True, type=click.Path(path_type=Path),
              help="Executable to write.")
@click.option("--report", type=click.Path(path_type=Path), default=None,
              help="Write the pass report (every candidate loop nest) as JSON here.")
@click.option("--rewrite/--no-rewrite", default=True, show_default=True,
              help="Run the IR passes (--no-rewrite: none, the naive loops stay).")
@compile_stage_options
@click.option("--emit-ir", "ir_out", type=click.Path(path_type=Path), default=None,
              help="Also save the final LLVM IR (after the rewrite) here.")
@click.option("-X", "flags", multiple=True,
              help="Extra clang flag for the emit stage (repeatable), e.g. -X -Wall.")
def cc_command(sources, include_dirs, defines, openmp, blas, out, report, rewrite, emitter,
               passes, linker, component_options, ir_out, flags):
    """Compile C SOURCES to an executable: clang-22 -O1 → IR passes → O3 host + BLAS."""
    if passes and not rewrite:
        raise click.UsageError("give --pass or --no-rewrite, not both (--no-rewrite runs no "
                               "pass)")
    from ditto_core.base.options import parse_assignments
    from ditto_core.stages.cc import compile_c, split_report, summary_lines
    from ditto_core.stages.plugins import get_registry
    from ditto_core.stages.selection import default_passes

    try:
        exe, merged = compile_c(list(sources), blas=blas, out=out, include_dirs=include_dirs,
                                defines=defines, openmp=openmp, rewrite=rewrite, report=report,
                                flags=flags, passes=list(passes) or None, ir_out=ir_out,
                                emitter=emitter, linker=linker,
                                options=parse_assignments(component_options))
    except DittoError as exc:  # same form as the rest of the ditto CLI
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt as exc:  # like `ditto build`: nothing written, exit 128 + N
        click.echo(signals.stop_message(exc), err=True)
        raise SystemExit(signals.exit_code(exc)) from None
    ran = (list(passes) or list(default_passes(get_registry()))) if rewrite else []
    for line in summary_lines(split_report(merged, ran), rewrite):
        click.echo(line, err=True)
    click.echo(str(exe))


def register(group: click.Group) -> None:
    """Add ``ditto cc`` to the click group ``group``."""
    group.add_command(cc_command)


if __name__ == "__main__":  # python -m ditto_core.cli.cc FILE.c ...
    sys.exit(cc_command())
