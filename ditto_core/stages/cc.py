"""Compile any C program through Ditto's compile stages: emit IR → rewrite → link.

This is ``ditto cc`` and, through ``compile_program`` and ``run_passes`` (``stages.compile``
builds the executable and the shared library from one emit), the compile half of ``ditto
build``: an IR
emitter (default ``clang``: clang-22 -O1 to LLVM IR), the IR passes chosen by name (default
``gemv-blas``: naive GEMV loop nests → ``cblas_sgemv``), then a linker (default ``llvm``: O3 for
the host CPU) and a link against the chosen BLAS target (docs/BUILD.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import attrs

from ditto_core.base.errors import DittoError
from ditto_core.base.options import normalize
from ditto_core.base.outputs import output_target
from .plugins import Registry, get_registry
from .selection import (DEFAULT_EMITTER, DEFAULT_LINKER, Chosen, CompileStages, check_all_used,
                        check_blas, choose, choose_compile)
from ditto_core.base.signals import pid_tag, sweep_stale
from ditto_core.base.types import IRModule, PassReport

def resolve_blas(blas, registry: Registry | None = None):
    """A BlasTarget from a name (``"openblas"``) or a component; None stays None.

    Raises PluginError listing the registered targets for an unknown name, DittoError with the
    target's own "how to get it" message when it is not usable on this machine."""
    if blas is None:
        return None
    if isinstance(blas, str):
        chosen = choose(registry or get_registry(), "blas", blas)
    else:
        chosen = Chosen("blas", blas)
    check_blas(chosen)
    return chosen.component


def run_passes(module: IRModule, passes: Sequence[Chosen], blas
               ) -> tuple[IRModule, tuple[PassReport, ...]]:
    """Stage 5: run ``passes`` in order on ``module``. Returns the rewritten module and one
    PassReport per pass (its ``name`` set). Raises DittoError when a pass returns anything but
    a PassReport."""
    reports = []
    for p in passes:
        module, report = p.component.run(module, blas)
        if not isinstance(report, PassReport):
            raise DittoError(f"IR pass {p.name!r} returned {type(report).__name__}, "
                             "not a PassReport")
        reports.append(attrs.evolve(report, name=p.name))
    return module, tuple(reports)


def merge_reports(reports: Sequence[PassReport]) -> PassReport:
    """One PassReport holding every pass's candidates, each tagged with ``"pass"``."""
    return PassReport(tuple({"pass": r.name, **c} for r in reports for c in r.candidates))


def split_report(merged: PassReport, names: Sequence[str]) -> tuple[PassReport, ...]:
    """The per-pass reports of a ``merge_reports`` result, one per name of ``names`` (the
    passes that ran, in order; a pass that found nothing gets an empty report)."""
    by = {n: [] for n in names}
    for c in merged.candidates:
        c = dict(c)
        by.setdefault(c.pop("pass", "?"), []).append(c)
    return tuple(PassReport(tuple(cands), name) for name, cands in by.items())


def summary_lines(reports: Sequence[PassReport | dict], rewrite: bool = True) -> list[str]:
    """Human summary, one line per pass, e.g. ``"gemv-blas: rewrote N/M GEMV nests (K other
    loop nests left alone)"``. A candidate counts as a GEMV nest when its report says
    ``"kind": "gemv"`` (the pass found a GEMV reduction in it, whether or not it could be
    rewritten); a pass that does not classify its candidates is summarised as
    ``rewrote N/M candidate nests``. ``reports``: PassReports, or their ``to_json`` dicts."""
    if not rewrite:
        return ["rewrite: disabled (--no-rewrite), naive loops kept"]
    if not reports:
        return ["rewrite: no IR pass selected, module left unchanged"]
    lines = []
    for r in reports:
        if isinstance(r, dict):
            r = PassReport.from_json(r)
        cands = r.candidates
        n_rw = r.rewritten
        if cands and all("kind" in c for c in cands):
            n_gemv = sum(1 for c in cands
                         if c["kind"] == "gemv" or c.get("status") == "rewritten")
            line = f"{r.name}: rewrote {n_rw}/{n_gemv} GEMV nests"
            if len(cands) > n_gemv:
                line += f" ({len(cands) - n_gemv} other loop nests left alone)"
        else:
            line = f"{r.name}: rewrote {n_rw}/{len(cands)} candidate nests"
        lines.append(line)
    return lines


def emit_ir(sources: Sequence[Path], *, workdir: Path, include_dirs=(), defines=(),
            flags=(), emitter: str = DEFAULT_EMITTER,
            registry: Registry | None = None) -> IRModule:
    """Stage 4 alone: the registered IR emitter ``emitter`` on ``sources``."""
    em = (registry or get_registry()).get("emitter", emitter)
    return em.emit([Path(s) for s in sources], include_dirs=[Path(d) for d in include_dirs],
                   defines=list(defines), flags=list(flags), workdir=Path(workdir))


def link(module: IRModule, blas, out: Path, *, extra_flags=(),
         linker: str = DEFAULT_LINKER, registry: Registry | None = None) -> Path:
    """Stage 6 alone: the registered linker ``linker``."""
    return (registry or get_registry()).get("linker", linker).link(
        module, blas, Path(out), extra_flags=list(extra_flags))


#: Stage names of the compile half, as progress output and build.json show them.
COMPILE_STAGES = ("emit IR", "rewrite", "link")


@attrs.frozen
class Compiled:
    """What ``compile_program`` produced: the final IR (after the passes), one PassReport per
    pass in run order, and wall seconds per stage (``COMPILE_STAGES``)."""

    module: IRModule
    reports: tuple[PassReport, ...]
    seconds: dict


def compile_program(sources: Sequence[Path], stages: CompileStages, out: Path, *,
                    workdir: Path, include_dirs=(), defines=(), flags=(), link_flags=(),
                    on_stage: Callable[[str], None] | None = None) -> Compiled:
    """The compile half, used by ``ditto cc`` and ``ditto build``: emit IR (``stages.emitter``
    on ``sources`` with ``include_dirs``/``defines``/``flags``) → every pass of
    ``stages.passes`` in order → link (``stages.linker`` with ``stages.blas`` and
    ``link_flags``) into the executable ``out``. ``on_stage(name)`` is called as each stage
    starts. Raises DittoError (compile or link failure, a pass not returning a PassReport)."""
    blas = stages.blas.component if stages.blas is not None else None
    seconds = {}

    def start(name):
        if on_stage is not None:
            on_stage(name)
        return time.perf_counter()

    t = start("emit IR")
    module = stages.emitter.component.emit(
        [Path(s) for s in sources], include_dirs=[Path(d) for d in include_dirs],
        defines=list(defines), flags=list(flags), workdir=Path(workdir))
    seconds["emit IR"] = time.perf_counter() - t
    t = start("rewrite")
    module, reports = run_passes(module, stages.passes, blas)
    seconds["rewrite"] = time.perf_counter() - t if stages.passes else 0.0
    t = start("link")
    stages.linker.component.link(module, blas, Path(out), extra_flags=list(link_flags))
    seconds["link"] = time.perf_counter() - t
    return Compiled(module, reports, seconds)


#: File name suffixes ``ditto cc`` accepts as C sources (clang decides the language by it).
C_SUFFIXES = (".c", ".i")


def check_sources(sources: Sequence[Path]) -> None:
    """Raise DittoError naming the first of ``sources`` that is missing, a directory, or not a
    C source file (by its suffix, ``C_SUFFIXES``, as clang decides the language by it)."""
    if not sources:
        raise DittoError("emit IR: no C sources given")
    for s in sources:
        if not s.exists():
            raise DittoError(f"{s}: no such C source file")
        if s.is_dir():
            raise DittoError(f"{s}: is a directory, not a C source file")
        if s.suffix not in C_SUFFIXES:
            raise DittoError(f"{s}: not a C source file (expected a {' or '.join(C_SUFFIXES)}"
                             " file)")


def check_destination(path: Path, what: str) -> None:
    """Raise DittoError (``<path>: <problem>``) when the output file ``path`` (``what``: e.g.
    "executable") cannot be written: it is a directory, or its nearest existing ancestor is not
    a writable directory. Creates nothing."""
    if path.is_dir():
        raise DittoError(f"{path}: is a directory (the {what} must be a file path)")
    anc = path.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise DittoError(f"{path}: {anc} is not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise DittoError(f"{path}: directory {anc} is not writable")


def publish_outputs(pairs: Sequence[tuple[Path, Path]]) -> None:
    """Copy each staged file to its destination (``(staged, dest)`` pairs), all or nothing:
    missing parent directories are created, every file is first copied to a temp name beside
    its destination, and only then are they renamed into place. On failure the temps and the
    directories created here are removed and DittoError (``<dest>: cannot write it: ...``) is
    raised; outputs already renamed into place are removed again (an earlier file at a
    destination is restored)."""
    created: list[Path] = []
    temps: list[tuple[Path, Path]] = []
    done: list[tuple[Path, Path | None]] = []
    dest = None
    try:
        for staged, dest in pairs:
            missing = []
            p = dest.parent
            while not p.exists() and p != p.parent:
                missing.append(p)
                p = p.parent
            for m in reversed(missing):
                try:
                    m.mkdir()
                except OSError as exc:
                    raise DittoError(f"{dest}: cannot create the directory {m}: "
                                     f"{exc.strerror or exc}") from None
                created.append(m)
            fd, t = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
            os.close(fd)
            temps.append((Path(t), dest))
            shutil.copyfile(staged, t)
            shutil.copymode(staged, t)
        for t, dest in temps:
            backup = None
            if dest.exists():  # kept (as a second link) until every output is in place
                backup = dest.parent / f".{dest.name}.bak-{os.getpid()}"
                backup.unlink(missing_ok=True)
                try:
                    os.link(dest, backup)
                except OSError:
                    shutil.copy2(dest, backup)
            done.append((dest, backup))
            os.replace(t, dest)
    except (OSError, DittoError) as exc:
        for t, _ in temps:
            t.unlink(missing_ok=True)
        for d, backup in reversed(done):  # undo the outputs already renamed into place
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, d)
                else:
                    d.unlink()
        for m in reversed(created):
            with contextlib.suppress(OSError):
                m.rmdir()
        if isinstance(exc, DittoError):
            raise
        raise DittoError(f"{dest}: cannot write it: {exc.strerror or exc}") from None
    for _, backup in done:
        if backup is not None:
            backup.unlink(missing_ok=True)


def compile_c(sources, *, blas, out, include_dirs=(), defines=(), openmp: bool = False,
              rewrite: bool = True, report=None, flags=(), passes=None, ir_out=None,
              link_flags=(), emitter: str | None = None, linker: str | None = None,
              options: Mapping[str, Mapping[str, Any]] | None = None,
              registry: Registry | None = None) -> tuple[Path, PassReport]:
    """Compile C ``sources`` (a path or a list of paths) into the executable ``out``.

    Stages (``compile_program``): the IR emitter ``emitter`` (default clang-22 -O1;
    ``include_dirs`` as -I, ``defines`` as -D, ``-fopenmp`` when ``openmp``, extra clang
    ``flags``) → the IR passes named in ``passes``, in that order (default: the registry's
    default passes, ``selection.default_passes``; none when ``rewrite`` is false) → the
    linker ``linker`` (default O3 for the host CPU), linked against the BLAS target ``blas``
    (a name such as ``"openblas"``, or None).
    ``options``: component options, ``{"gemv-blas": {"omp_threads": "region"}}``. Every
    component comes from ``registry`` (default: the installed plugins).

    ``report``: path of a JSON report (passes, candidates with status/reason, options);
    ``ir_out``: path to save the final (rewritten) IR text. Returns (executable path, the merged
    PassReport). Raises DittoError for a missing or non-C source, an output path that cannot be
    written (a directory, an unwritable or impossible parent), a compile or link failure (with
    the tool's stderr), an unknown or unavailable component, an unknown option or a bad value.
    Outputs are all or nothing: the executable, report and IR are staged in a temp directory
    and published together at the end, so on any failure none of them is written or changed.
    """
    if isinstance(sources, (str, Path)):
        sources = [sources]
    sources = [Path(s) for s in sources]
    out = Path(out)
    check_sources(sources)
    dests = [(out, "executable")]
    if report is not None:
        dests.append((Path(report), "report"))
    if ir_out is not None:
        dests.append((Path(ir_out), "IR file"))
    seen: dict[str, Path] = {os.path.realpath(s): s for s in sources}
    targets: dict[Path, Path] = {}  # destination -> the file written (a symlink's target)
    for path, what in dests:
        check_destination(path, what)
        real = os.path.realpath(path)
        if real in seen:
            raise DittoError(f"{path}: the {what} would overwrite {seen[real]}")
        seen[real] = path
        targets[path] = output_target(path, what, sources)
    registry = registry or get_registry()
    given = normalize(options)
    if not isinstance(blas, (str, type(None))):  # a BlasTarget object
        stages = choose_compile(registry, blas=None, emitter=emitter, passes=passes,
                                linker=linker, rewrite=rewrite, options=given)
        stages = attrs.evolve(stages, blas=Chosen("blas", blas))
        check_blas(stages.blas)
    else:
        stages = choose_compile(registry, blas=blas, emitter=emitter, passes=passes,
                                linker=linker, rewrite=rewrite, options=given)
    check_all_used(registry, given, stages.all())
    target = stages.blas.component if stages.blas is not None else None
    cflags = list(flags)
    if openmp:
        cflags.append("-fopenmp")
    if target is not None:
        cflags = target.compile_flags() + cflags
    sweep_stale(Path(tempfile.gettempdir()), "ditto-cc-")  # left by killed runs
    with tempfile.TemporaryDirectory(prefix=f"ditto-cc-{pid_tag()}") as tmp:
        tmp = Path(tmp)
        (tmp / "out").mkdir()
        done = compile_program(sources, stages, tmp / "out" / "exe", workdir=tmp / "ir",
                               include_dirs=include_dirs, defines=defines, flags=cflags,
                               link_flags=link_flags)
        staged = [(tmp / "out" / "exe", out)]
        if report is not None:
            staged.append((tmp / "out" / "report.json", Path(report)))
            staged[-1][0].write_text(json.dumps({
                "sources": [str(s) for s in sources], "executable": str(out),
                "blas": target.name if target is not None else None, "rewrite": rewrite,
                "openmp": openmp, "components": stages.record(),
                "passes": [r.to_json() for r in done.reports],
                "summary": summary_lines(done.reports, rewrite)}, indent=2, default=str) + "\n")
        if ir_out is not None:
            staged.append((tmp / "out" / "final.ll", Path(ir_out)))
            staged[-1][0].write_text(done.module.text)
        publish_outputs([(st, targets[d]) for st, d in staged])
    return out, merge_reports(done.reports)
