"""Compile any C program through Ditto's compile stages: emit IR → rewrite → link.

This is ``ditto cc`` (and the compile half of ``ditto build``): clang-22 -O1 to LLVM IR, every
registered IR pass (default: ``gemv-blas``, naive GEMV loop nests → ``cblas_sgemv``), then O3 for
the host CPU and a link against the chosen BLAS target (docs/BUILD.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from .errors import DittoError
from .outputs import output_target
from .plugins import get_registry
from .types import IRModule, PassReport

DEFAULT_EMITTER = "clang"
DEFAULT_LINKER = "llvm"


def resolve_blas(blas):
    """A BlasTarget from a name (``"openblas"``) or a component; None stays None.

    Raises PluginError listing the registered targets for an unknown name, DittoError with the
    target's own "how to get it" message when it is not usable on this machine."""
    if blas is None:
        return None
    target = get_registry().get("blas", blas) if isinstance(blas, str) else blas
    ok, why = target.available()
    if not ok:
        raise DittoError(f"BLAS target {target.name!r} is not available: {why}")
    return target


def run_passes(module: IRModule, blas, names: Sequence[str] | None = None
               ) -> tuple[IRModule, list[dict]]:
    """Run IR passes in registration order (all registered ones, or those in ``names``).

    Returns the rewritten module and one entry per pass: ``{"name", "candidates",
    "rewritten", "total"}``. With no pass registered the module is returned unchanged and the
    list is empty (callers say so). Raises PluginError for an unknown pass name."""
    reg = get_registry()
    if names is None:
        passes = reg.all("ir_pass")
    else:
        passes = [reg.get("ir_pass", n) for n in names]
    results = []
    for p in passes:
        module, report = p.run(module, blas)
        if not isinstance(report, PassReport):
            raise DittoError(f"IR pass {p.name!r} returned {type(report).__name__}, "
                             "not a PassReport")
        results.append({"name": p.name, "candidates": [dict(c) for c in report.candidates],
                        "rewritten": report.rewritten, "total": len(report.candidates)})
    return module, results


def merge_reports(results: list[dict]) -> PassReport:
    """One PassReport holding every pass's candidates, each tagged with ``"pass"``."""
    cands = []
    for r in results:
        for c in r["candidates"]:
            cands.append({"pass": r["name"], **c})
    return PassReport(tuple(cands))


def summary_lines(results: list[dict], rewrite: bool = True) -> list[str]:
    """Human summary, one line per pass, e.g. ``"gemv-blas: rewrote N/M GEMV nests (K other
    loop nests left alone)"``. A candidate counts as a GEMV nest when its report says
    ``"kind": "gemv"`` (the pass found a GEMV reduction in it, whether or not it could be
    rewritten); a pass that does not classify its candidates is summarised as
    ``rewrote N/M candidate nests``."""
    if not rewrite:
        return ["rewrite: disabled (--no-rewrite), naive loops kept"]
    if not results:
        return ["rewrite: no IR pass registered, module left unchanged"]
    lines = []
    for r in results:
        cands = r.get("candidates", [])
        n_rw = sum(1 for c in cands if c.get("status") == "rewritten")
        if cands and all("kind" in c for c in cands):
            n_gemv = sum(1 for c in cands
                         if c["kind"] == "gemv" or c.get("status") == "rewritten")
            line = f"{r['name']}: rewrote {n_rw}/{n_gemv} GEMV nests"
            if len(cands) > n_gemv:
                line += f" ({len(cands) - n_gemv} other loop nests left alone)"
        else:
            line = f"{r['name']}: rewrote {n_rw}/{len(cands)} candidate nests"
        lines.append(line)
    return lines


def emit_ir(sources: Sequence[Path], *, workdir: Path, include_dirs=(), defines=(),
            flags=(), emitter: str = DEFAULT_EMITTER) -> IRModule:
    """Stage 4: the registered IR emitter ``emitter`` on ``sources``."""
    em = get_registry().get("ir_emitter", emitter)
    return em.emit([Path(s) for s in sources], include_dirs=[Path(d) for d in include_dirs],
                   defines=list(defines), flags=list(flags), workdir=Path(workdir))


def link(module: IRModule, blas, out: Path, *, extra_flags=(),
         linker: str = DEFAULT_LINKER) -> Path:
    """Stage 6: the registered linker ``linker``."""
    return get_registry().get("linker", linker).link(module, blas, Path(out),
                                                     extra_flags=list(extra_flags))


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
              link_flags=()) -> tuple[Path, PassReport]:
    """Compile C ``sources`` (a path or a list of paths) into the executable ``out``.

    Stages: clang-22 -O1 → LLVM IR (``include_dirs`` as -I, ``defines`` as -D, ``-fopenmp``
    when ``openmp``, extra clang ``flags``) → every registered IR pass (or those named in
    ``passes``; skipped when ``rewrite`` is false) → O3 for the host CPU, linked against the
    BLAS target ``blas`` (a name such as ``"openblas"``, a BlasTarget, or None).

    ``report``: path of a JSON report (passes, candidates with status/reason, options);
    ``ir_out``: path to save the final (rewritten) IR text. Returns (executable path, the merged
    PassReport). Raises DittoError for a missing or non-C source, an output path that cannot be
    written (a directory, an unwritable or impossible parent), a compile or link failure (with
    the tool's stderr), an unknown or unavailable BLAS target. Outputs are all or nothing: the
    executable, report and IR are staged in a temp directory and published together at the
    end, so on any failure none of them is written or changed.
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
    target = resolve_blas(blas)
    cflags = list(flags)
    if openmp:
        cflags.append("-fopenmp")
    if target is not None:
        cflags = target.compile_flags() + cflags
    with tempfile.TemporaryDirectory(prefix="ditto-cc-") as tmp:
        tmp = Path(tmp)
        module = emit_ir(sources, workdir=tmp / "ir", include_dirs=include_dirs,
                         defines=defines, flags=cflags)
        results: list[dict] = []
        if rewrite:
            module, results = run_passes(module, target, passes)
        staged = [(link(module, target, tmp / "out" / "exe", extra_flags=link_flags), out)]
        if report is not None:
            staged.append((tmp / "out" / "report.json", Path(report)))
            staged[-1][0].write_text(json.dumps({
                "sources": [str(s) for s in sources], "executable": str(out),
                "blas": target.name if target is not None else None, "rewrite": rewrite,
                "openmp": openmp, "passes": results,
                "summary": summary_lines(results, rewrite)}, indent=2, default=str) + "\n")
        if ir_out is not None:
            staged.append((tmp / "out" / "final.ll", Path(ir_out)))
            staged[-1][0].write_text(module.text)
        publish_outputs([(st, targets[d]) for st, d in staged])
    return out, merge_reports(results)
