"""``ditto cc``: run Ditto's compile stages (emit IR → rewrite → link) on any C program.

``register(group)`` adds the command to a click group (the ``ditto`` CLI calls it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .errors import DittoError


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
              help="Run the IR passes (gemv-blas); --no-rewrite keeps the naive loops.")
@click.option("--pass", "passes", multiple=True,
              help="Run only this IR pass (repeatable); default: every registered pass.")
@click.option("--emit-ir", "ir_out", type=click.Path(path_type=Path), default=None,
              help="Also save the final LLVM IR (after the rewrite) here.")
@click.option("-X", "flags", multiple=True,
              help="Extra clang flag for the emit stage (repeatable), e.g. -X -Wall.")
def cc_command(sources, include_dirs, defines, openmp, blas, out, report, rewrite, passes,
               ir_out, flags):
    """Compile C SOURCES to an executable: clang-22 -O1 → IR passes → O3 host + BLAS."""
    from .cc import compile_c, summary_lines

    try:
        exe, merged = compile_c(list(sources), blas=blas, out=out, include_dirs=include_dirs,
                                defines=defines, openmp=openmp, rewrite=rewrite, report=report,
                                flags=flags, passes=list(passes) or None, ir_out=ir_out)
    except DittoError as exc:  # same form as the rest of the ditto CLI
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # like `ditto build`: nothing written, exit 130
        click.echo("interrupted", err=True)
        raise SystemExit(130) from None
    for line in summary_lines(_results_from(merged, list(passes) or None), rewrite):
        click.echo(line, err=True)
    click.echo(str(exe))


def _results_from(merged, names=None) -> list[dict]:
    """Per-pass candidate lists from a merged PassReport (for the summary line); ``names``:
    the passes that ran (default: every registered one)."""
    from .plugins import get_registry

    if names is None:
        names = [p.name for p in get_registry().all("ir_pass")]
    by = {name: {"name": name, "candidates": []} for name in names}
    for c in merged.candidates:
        name = c.get("pass", "?")
        by.setdefault(name, {"name": name, "candidates": []})["candidates"].append(c)
    return list(by.values())


def register(group: click.Group) -> None:
    """Add ``ditto cc`` to the click group ``group``."""
    group.add_command(cc_command)


if __name__ == "__main__":  # python -m ditto_core.cli_cc FILE.c ...
    sys.exit(cc_command())
