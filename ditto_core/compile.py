"""The compile half of ``ditto build``: Ditto's C runtime (native/*.c) → emit IR → rewrite →
link, with per-stage timings and a content-hash cache (docs/BUILD.md).

The runtime is compiled as C11 with ``-D_POSIX_C_SOURCE=200809L`` and OpenMP, exactly the
flags of ``native/Makefile``; the executable reads any model file given with ``-m``.
"""

from __future__ import annotations

import inspect
import platform
import tempfile
import time
from pathlib import Path
from typing import Callable

import attrs

from .cache import Cache, file_hash, make_key, tree_hash
from .cc import emit_ir, link, resolve_blas, run_passes, summary_lines
from .errors import DittoError
from .plugins import get_registry

#: C flags of the runtime (mirrors native/Makefile's STD and OMP).
RUNTIME_FLAGS = ("-std=c11", "-D_POSIX_C_SOURCE=200809L")


def native_dir() -> Path:
    """Directory of the C runtime sources (the ``ditto_native`` package)."""
    import ditto_native
    return Path(ditto_native.SOURCE_DIR)


def runtime_sources(src_dir: Path | None = None) -> list[Path]:
    """The C files that make up the runtime executable: every ``native/*.c``, except the
    temporary tokenizer stub once the real ``tokenizer.c`` exists (native/Makefile's rule).
    Raises DittoError when the directory holds no C file or no ``main.c``."""
    d = Path(src_dir) if src_dir is not None else native_dir()
    files = sorted(d.glob("*.c"))
    if (d / "tokenizer.c").exists():
        files = [f for f in files if "stub" not in f.name]
    if not files or not any(f.name == "main.c" for f in files):
        raise DittoError(f"{d}: no C runtime sources (main.c missing)")
    return files


@attrs.frozen
class CompileResult:
    """What ``build_runtime`` produced: the executable, per-pass results (see
    ``cc.run_passes``), seconds per stage (``emit_ir``, ``rewrite``, ``link``; zeros on a cache
    hit), whether the cache served it, and the cache key."""

    executable: Path
    passes: tuple
    seconds: dict
    cached: bool
    key: str
    summary: tuple


def plugin_fingerprint(component) -> str:
    """Hash of the source files of the package defining ``component`` (so editing a pass or
    the linker invalidates cached executables)."""
    try:
        mod_file = Path(inspect.getfile(type(component)))
    except TypeError:
        return "?"
    return tree_hash(sorted(mod_file.parent.glob("*.py")))


def compile_key(sources, blas, rewrite: bool, openmp: bool, extra_flags=()) -> str:
    """Cache key of the compile stages: runtime sources and headers, flags, BLAS target and
    its flags, the emitter/passes/linker code, the host CPU and the llvmlite version."""
    import llvmlite
    import llvmlite.binding as llvm

    reg = get_registry()
    d = Path(sources[0]).parent
    headers = sorted(d.glob("*.h"))
    parts = {
        "sources": tree_hash(list(sources) + headers),
        "flags": list(RUNTIME_FLAGS) + list(extra_flags), "openmp": openmp, "rewrite": rewrite,
        "blas": None if blas is None else [blas.name, blas.compile_flags(), blas.link_flags()],
        "emitter": plugin_fingerprint(reg.get("ir_emitter", "clang")),
        "linker": plugin_fingerprint(reg.get("linker", "llvm")),
        "passes": [(p.name, plugin_fingerprint(p)) for p in reg.all("ir_pass")] if rewrite else [],
        "host": [llvm.get_host_cpu_name(), platform.machine()],
        "llvmlite": llvmlite.__version__,
    }
    return make_key(parts)


def build_runtime(out: Path, *, blas="openblas", rewrite: bool = True, openmp: bool = True,
                  src_dir: Path | None = None, cache: Cache | None = None,
                  extra_flags=(), on_stage: Callable[[str], None] | None = None,
                  ir_out: Path | None = None) -> CompileResult:
    """Compile the C runtime into the executable ``out``.

    Stages (timed, in seconds): ``emit_ir`` (clang-22 -O1 of ``runtime_sources``),
    ``rewrite`` (every registered IR pass; skipped when ``rewrite`` is false), ``link`` (O3 for
    the host CPU + BLAS). With a ``cache``, an unchanged input set reuses the cached executable
    and pass report (``CompileResult.cached``). ``on_stage(name)`` is called as each stage
    starts (progress display). Raises DittoError (compile/link failure, unknown or unavailable
    BLAS); nothing is written at ``out`` then.
    """
    out = Path(out)
    target = resolve_blas(blas)
    sources = runtime_sources(src_dir)
    cache = cache if cache is not None else Cache(enabled=False)
    key = compile_key(sources, target, rewrite, openmp, extra_flags)
    meta = cache.fetch("compile", key, {"executable": out})
    if meta is not None:
        passes = tuple(meta.get("passes", ()))
        return CompileResult(out, passes, {"emit_ir": 0.0, "rewrite": 0.0, "link": 0.0},
                             True, key, tuple(summary_lines(list(passes), rewrite)))
    cflags = list(RUNTIME_FLAGS) + (["-fopenmp"] if openmp else []) + list(extra_flags)
    seconds = {}
    with tempfile.TemporaryDirectory(prefix="ditto-compile-") as tmp:
        if on_stage:
            on_stage("emit_ir")
        t = time.perf_counter()
        module = emit_ir(sources, workdir=Path(tmp), include_dirs=[sources[0].parent],
                         flags=cflags)
        seconds["emit_ir"] = time.perf_counter() - t
        if on_stage:
            on_stage("rewrite")
        t = time.perf_counter()
        results: list[dict] = []
        if rewrite:
            module, results = run_passes(module, target)
        seconds["rewrite"] = time.perf_counter() - t if rewrite else 0.0
        if ir_out is not None:
            Path(ir_out).write_text(module.text)
        if on_stage:
            on_stage("link")
        t = time.perf_counter()
        link(module, target, out)
        seconds["link"] = time.perf_counter() - t
    cache.put("compile", key, {"executable": out},
              {"passes": results, "blas": None if target is None else target.name,
               "rewrite": rewrite, "openmp": openmp, "seconds": seconds,
               "sources": [s.name for s in sources], "source_hashes":
               {s.name: file_hash(s) for s in sources}})
    return CompileResult(out, tuple(results), seconds, False, key,
                         tuple(summary_lines(results, rewrite)))
