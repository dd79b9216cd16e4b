"""Compile any C program through Ditto's compile stages: emit IR → rewrite → link.

This is ``ditto cc`` (and the compile half of ``ditto build``): clang-22 -O1 to LLVM IR, every
registered IR pass (default: ``gemv-blas``, naive GEMV loop nests → ``cblas_sgemv``), then O3 for
the host CPU and a link against the chosen BLAS target (docs/BUILD.md).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Sequence

from .errors import DittoError
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
    """Human summary, one line per pass, e.g. ``"gemv-blas: rewrote 1/1 GEMV nests (21 other
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


def write_json_atomic(path: Path, obj) -> None:
    """Write ``obj`` as indented JSON to ``path`` via a temp file in the same directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    PassReport). Raises DittoError for a missing source, a compile or link failure (with the
    tool's stderr), an unknown or unavailable BLAS target; nothing is left at ``out`` then.
    """
    if isinstance(sources, (str, Path)):
        sources = [sources]
    sources = [Path(s) for s in sources]
    out = Path(out)
    target = resolve_blas(blas)
    cflags = list(flags)
    if openmp:
        cflags.append("-fopenmp")
    if target is not None:
        cflags = target.compile_flags() + cflags
    with tempfile.TemporaryDirectory(prefix="ditto-cc-") as tmp:
        module = emit_ir(sources, workdir=Path(tmp), include_dirs=include_dirs,
                         defines=defines, flags=cflags)
        results: list[dict] = []
        if rewrite:
            module, results = run_passes(module, target, passes)
        if ir_out is not None:
            Path(ir_out).write_text(module.text)
        link(module, target, out, extra_flags=link_flags)
    merged = merge_reports(results)
    if report is not None:
        write_json_atomic(Path(report), {
            "sources": [str(s) for s in sources], "executable": str(out),
            "blas": target.name if target is not None else None, "rewrite": rewrite,
            "openmp": openmp, "passes": results, "summary": summary_lines(results, rewrite)})
    return out, merged
