"""The compile half of ``ditto build``: Ditto's C runtime (native/**/*.c) → emit IR →
rewrite → link, with per-stage timings and a content-hash cache (docs/BUILD.md).

The runtime is compiled as C11 with ``-D_POSIX_C_SOURCE=200809L`` and OpenMP, exactly the
flags of ``native/Makefile``; the executable reads any model file given with ``-m``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import attrs

from ditto_core.base.cache import Cache, file_hash, make_key, tree_hash
from ditto_core.base.errors import DittoError
from ditto_core.base.signals import deferred, pid_tag, sweep_stale
from ditto_core.base.types import IRModule, PassReport
from .cc import COMPILE_STAGES, Compiled, compile_program, run_passes, summary_lines
from .link_worker import DITTO_ERROR, link_library
from .plugins import Registry, get_registry
from .selection import CompileStages, choose_compile

#: C flags of the runtime (mirrors native/Makefile's STD and OMP).
RUNTIME_FLAGS = ("-std=c11", "-D_POSIX_C_SOURCE=200809L")

#: Extra C flags and link flags of the runtime as a shared library (``libditto.so``, the C API
#: of native/runtime/ditto.h; native/Makefile's ``lib`` target): position-independent code, only the
#: ``DITTO_API`` functions exported.
LIBRARY_FLAGS = ("-fPIC", "-fvisibility=hidden")
LIBRARY_LINK_FLAGS = ("-shared", "-Wl,-soname,libditto.so")

#: The source of the command line, left out of the shared library.
MAIN_SOURCE = "main.c"


def native_dir() -> Path:
    """Directory of the C runtime sources (the ``ditto_native`` package)."""
    import ditto_native
    return Path(ditto_native.SOURCE_DIR)


def runtime_sources(src_dir: Path | None = None) -> list[Path]:
    """The C files that make up the runtime executable: every ``.c`` under the runtime's
    folders (``ditto_native.RUNTIME_DIRS``: ``native/app/main.c``, ``native/kernels/**/*.c``,
    ...), folder by folder; the libFuzzer targets of ``native/fuzz`` are not among them.
    Raises DittoError when the directory holds no C file or no ``main.c``."""
    from ditto_native import RUNTIME_DIRS

    d = Path(src_dir) if src_dir is not None else native_dir()
    files = [f for sub in RUNTIME_DIRS for f in sorted((d / sub).rglob("*.c"))]
    if not files or not any(f.name == "main.c" for f in files):
        raise DittoError(f"{d}: no C runtime sources (main.c missing)")
    return files


def source_root(sources) -> Path:
    """The directory the runtime's includes are spelled from (``-I``; ``native/``): the
    deepest directory holding every source."""
    return Path(os.path.commonpath([Path(s).resolve().parent for s in sources]))


@attrs.frozen
class CompileResult:
    """What ``build_runtime`` produced: the executable, one PassReport per pass in run order,
    seconds per stage (``cc.COMPILE_STAGES``; zeros on a cache hit), whether the cache served
    it, the cache key, the summary lines, and the shared library (``library``; None when none
    was asked for)."""

    executable: Path
    reports: tuple[PassReport, ...]
    seconds: dict
    cached: bool
    key: str
    summary: tuple
    library: Path | None = None

    @property
    def passes(self) -> list[dict]:
        """The reports as build.json holds them (``PassReport.to_json``)."""
        return [r.to_json() for r in self.reports]


#: The files of a package that are its code: Python, and C/C++/Cython a plugin may compile.
SOURCE_SUFFIXES = frozenset({".py", ".c", ".h", ".cc", ".cpp", ".pyx", ".pxd"})
#: A package tree with more code files than this is hashed by its defining module only (a
#: large third-party base class, not a plugin).
MAX_TREE_FILES = 2000


def _code_files(module_name: str) -> dict[str, Path]:
    """The code files that define module ``module_name``'s behaviour, by a name that does not
    depend on where the package is installed (``package/relative/path``): every source file
    under its top-level package (for ``ditto_core``, under its subpackage such as
    ``ditto_core.kit``), or the module's own file when that package is a single module or too
    large."""
    parts = module_name.split(".")
    root = ".".join(parts[:2]) if parts[0] == "ditto_core" and len(parts) > 1 else parts[0]
    f = getattr(sys.modules.get(root), "__file__", None)
    g = getattr(sys.modules.get(module_name), "__file__", None)
    own = {f"{module_name}:{Path(g).name}": Path(g)} if g else {}
    if f is None or Path(f).name != "__init__.py":
        return own if f is None else {f"{root}:{Path(f).name}": Path(f)}
    base = Path(f).parent
    files = {f"{root}:{p.relative_to(base).as_posix()}": p for p in base.rglob("*")
             if p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts and p.is_file()}
    return own if len(files) > MAX_TREE_FILES else files


def plugin_fingerprint(component) -> str:
    """Hash of the code of ``component``: the source files (``SOURCE_SUFFIXES``, in every
    subfolder) of the package defining its class and of the packages of its base classes
    (stdlib ones aside), by package-relative path and content, so editing any module of a
    plugin, or a base class it inherits its work from, invalidates cached stage outputs. "?"
    when no file is found (a class defined interactively)."""
    files: dict[str, Path] = {}
    for cls in type(component).__mro__:
        name = getattr(cls, "__module__", None) or "builtins"
        if name.split(".")[0] not in sys.stdlib_module_names:
            files.update(_code_files(name))
    if not files:
        return "?"
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + file_hash(files[rel]).encode() + b"\n")
    return h.hexdigest()


def library_sources(sources) -> list[Path]:
    """The runtime sources of the shared library: ``sources`` without ``main.c``. Raises
    DittoError when nothing is left."""
    lib = [Path(s) for s in sources if Path(s).name != MAIN_SOURCE]
    if not lib:
        raise DittoError(f"{Path(sources[0]).parent}: no C runtime sources besides "
                         f"{MAIN_SOURCE} for the shared library")
    return lib


def compile_key(sources, stages: CompileStages, openmp: bool, extra_flags=(),
                library: bool = False) -> str:
    """Cache key of the compile stages: runtime sources and headers, flags, every compile
    component's name, resolved options and code (emitter, passes in order, linker, BLAS target
    with its flags), the host CPU, the llvmlite version, and whether the shared library is
    built too (its flags)."""
    import llvmlite
    import llvmlite.binding as llvm

    headers = sorted(source_root(sources).rglob("*.h"))
    blas = stages.blas.component if stages.blas is not None else None
    parts = {
        "sources": tree_hash(list(sources) + headers),
        "flags": list(RUNTIME_FLAGS) + list(extra_flags), "openmp": openmp,
        "components": stages.record(),
        "code": [plugin_fingerprint(c.component) for c in stages.all()],
        "blas_flags": None if blas is None else [blas.compile_flags(), blas.link_flags()],
        "host": [llvm.get_host_cpu_name(), platform.machine()],
        "llvmlite": llvmlite.__version__,
    }
    if library:  # keys of builds without the library stay as they were
        # the executable is linked from the library's IR (compile_with_library)
        parts["library"] = [list(LIBRARY_FLAGS), list(LIBRARY_LINK_FLAGS), "one emit"]
    return make_key(parts)


def pass_reports_problem(meta: dict, rewrite: bool) -> str | None:
    """Why a compile cache entry's meta dict cannot give the pass reports of the build, or
    None: ``passes`` must be a list of report objects whose summary lines can be made."""
    passes = meta.get("passes", [])
    if not isinstance(passes, list) or not all(
            isinstance(p, dict) and isinstance(p.get("candidates", []), list)
            and all(isinstance(c, dict) for c in p.get("candidates", [])) for p in passes):
        return "meta.json 'passes' is not a list of pass reports"
    try:
        summary_lines([PassReport.from_json(p) for p in passes], rewrite)
    except Exception as exc:  # any malformed field: the entry is rebuilt
        return f"meta.json 'passes' cannot be read ({type(exc).__name__}: {exc})"
    return None


def link_ir(texts) -> str:
    """LLVM IR modules (text) merged into one, the first as the base (llvmlite's
    ``Module.link_in``). Raises DittoError when one does not parse or the symbols clash."""
    import llvmlite.binding as llvm

    try:
        mods = [llvm.parse_assembly(t) for t in texts]
        for m in mods[1:]:
            mods[0].link_in(m)
    except RuntimeError as exc:
        raise DittoError(f"linking the runtime's IR modules: {exc}") from None
    return str(mods[0])


#: seconds a stopped link worker gets to unwind (it answers a signal only between LLVM
#: calls) before its process group is killed; the caller then removes what it left
LINK_WORKER_GRACE = 5.0


def _job(workdir: Path) -> Path:
    return Path(workdir) / "library-link.pickle"


def start_library_link(stages: CompileStages, lib_ir: IRModule, blas, library: Path,
                       workdir: Path) -> subprocess.Popen | None:
    """Start ``link_worker.link_library`` in a worker process (``python -P -m
    ditto_core.stages.link_worker``; a session of its own, so that a terminal's Ctrl-C reaches
    only this process, which then stops the worker; this process's ``sys.path``): the job is
    pickled to ``workdir``/library-link.pickle, the worker's output goes to
    ``workdir``/library-link.log. Returns None when a component cannot be pickled, this is not
    a plain Python (``sys.executable`` unknown or a frozen application), or the process cannot
    start: the caller links the library itself. Call it with stop signals deferred
    (``signals.deferred``), so that the worker is never started without the caller holding
    it."""
    if not sys.executable or getattr(sys, "frozen", False):
        return None
    try:
        data = pickle.dumps((stages, lib_ir, blas, Path(library), LIBRARY_LINK_FLAGS))
    except Exception:  # pickle raises PicklingError, TypeError, AttributeError, ...
        return None
    path = [os.getcwd() if p == "" else p for p in sys.path if isinstance(p, str)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    try:
        _job(workdir).write_bytes(data)
        log = open(Path(workdir) / "library-link.log", "wb")
    except OSError:
        return None
    with log:
        try:
            return subprocess.Popen([sys.executable, "-P", "-m", "ditto_core.stages.link_worker",
                                     str(_job(workdir)), str(os.getpid())],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                    start_new_session=True)
        except OSError:
            return None


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:  # a real-time signal has no name
        return f"signal {n}"


def _clean_up_worker(proc: subprocess.Popen, library: Path) -> None:
    """After the worker ``proc`` exited: kill what is left of its process group (a linker it
    started, which a worker killed mid-link leaves running) and remove its temporary output
    beside ``library``."""
    if proc.returncode != 0:  # a worker that linked has nothing left
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    Path(library).with_name(f".{Path(library).name}.tmp-{proc.pid}").unlink(missing_ok=True)


def stop_library_link(proc: subprocess.Popen, library: Path) -> None:
    """Stop the worker ``proc``: SIGTERM to its process group (the worker unwinds its link),
    SIGKILL when it has not exited ``LINK_WORKER_GRACE`` seconds later (or when a second stop
    arrives meanwhile), then ``_clean_up_worker``."""
    try:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=LINK_WORKER_GRACE)
            except subprocess.TimeoutExpired:
                pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _clean_up_worker(proc, library)


def finish_library_link(proc: subprocess.Popen, library: Path, workdir: Path) -> bool:
    """Wait for the worker of ``start_library_link``. True when it linked ``library``; False
    when it never began the link (no ``JOB.started``: it could not load the job or import
    Ditto; the caller links the library itself). Raises DittoError with the worker's message
    when its link failed, and naming the signal or exit status when it died."""
    rc = proc.wait()
    if rc == 0:
        return True
    _clean_up_worker(proc, library)
    job = _job(workdir)
    if not job.with_name(job.name + ".started").exists():
        return False
    error = job.with_name(job.name + ".error")
    if rc == DITTO_ERROR and error.exists():
        raise DittoError(error.read_text())
    log = (Path(workdir) / "library-link.log").read_text(errors="replace").strip()
    how = (f"was killed by {_signal_name(-rc)}" if rc < 0 else
           f"was stopped by {_signal_name(rc - 128)}" if rc > 128 else
           f"exited with status {rc}")
    raise DittoError(f"{library}: the library's link worker {how}"
                     + (f":\n{log[-4000:]}" if log else ""))


def compile_with_library(sources, stages: CompileStages, out: Path, library: Path, *,
                         workdir: Path, include_dirs=(), flags=(),
                         on_stage: Callable[[str], None] | None = None) -> Compiled:
    """The executable ``out`` and the shared library ``library`` from one emit of the runtime:
    the library's sources (every one but ``main.c``) are emitted once with ``LIBRARY_FLAGS``
    (position-independent, hidden visibility: the code an executable gets, as clang builds
    executables position-independent by default), ``main.c`` with the same flags, and the
    executable's module is the two merged (``link_ir``). Each module then goes through the
    passes and is linked on its own (the library with ``LIBRARY_LINK_FLAGS``), the library in
    a worker process at the same time as the executable (``start_library_link``; in this
    process after the executable when the worker cannot take the job). Returns the
    executable's Compiled; its ``link`` seconds run until both are linked. Raises DittoError
    as ``cc.compile_program``, or when the worker dies; on any failure or stop the worker is
    stopped first (``stop_library_link``) and nothing is left at ``out`` or ``library``. A
    library linked in this process may differ in its code bytes from one the worker links
    (LLVM's choices in a process that optimised the executable before), not in behaviour."""
    blas = stages.blas.component if stages.blas is not None else None
    emitter = stages.emitter.component
    main_src = [Path(s) for s in sources if Path(s).name == MAIN_SOURCE]
    fl = list(flags) + list(LIBRARY_FLAGS)
    inc = [Path(d) for d in include_dirs]
    out, library = Path(out), Path(library)
    seconds = {}

    def start(name):
        if on_stage is not None:
            on_stage(name)
        return time.perf_counter()

    t = start("emit IR")
    main_ir = (emitter.emit(main_src, include_dirs=inc, defines=[], flags=fl,
                            workdir=Path(workdir) / "main") if main_src else None)
    lib_ir = emitter.emit(library_sources(sources), include_dirs=inc, defines=[], flags=fl,
                          workdir=Path(workdir) / "library")
    exe_ir = IRModule(lib_ir.text if main_ir is None else link_ir([main_ir.text, lib_ir.text]),
                      source=",".join(str(s) for s in sources))
    seconds["emit IR"] = time.perf_counter() - t
    proc = None
    try:
        with deferred():
            proc = start_library_link(stages, lib_ir, blas, library, workdir)
        t = start("rewrite")
        exe_mod, exe_reports = run_passes(exe_ir, stages.passes, blas)
        seconds["rewrite"] = time.perf_counter() - t if stages.passes else 0.0
        t = start("link")
        stages.linker.component.link(exe_mod, blas, out)
        if proc is None or not finish_library_link(proc, library, workdir):
            link_library(stages, lib_ir, blas, library, LIBRARY_LINK_FLAGS)
        seconds["link"] = time.perf_counter() - t
    except BaseException:
        out.unlink(missing_ok=True)
        try:
            if proc is not None:
                stop_library_link(proc, library)
        finally:
            library.unlink(missing_ok=True)
        raise
    return Compiled(exe_mod, exe_reports, seconds)


def build_runtime(out: Path, *, stages: CompileStages | None = None, blas="openblas",
                  rewrite: bool = True, openmp: bool = True, src_dir: Path | None = None,
                  cache: Cache | None = None, extra_flags=(),
                  on_stage: Callable[[str], None] | None = None,
                  ir_out: Path | None = None, registry: Registry | None = None,
                  library: Path | None = None) -> CompileResult:
    """Compile the C runtime into the executable ``out`` with ``cc.compile_program``.

    ``stages``: the chosen emitter, passes, linker and BLAS target (``selection``); default:
    ``choose_compile(registry, blas=blas, rewrite=rewrite)`` (clang, the default passes,
    llvm). Stages (timed, in seconds): ``emit IR`` of ``runtime_sources``, ``rewrite`` (the
    passes; 0 when there are none), ``link``. With a ``cache``, an unchanged input set
    (``compile_key``) reuses the cached executable and pass reports (``CompileResult.cached``).
    ``on_stage(name)`` is called as each stage starts (progress display). ``library``: also
    compile the runtime without ``main.c`` into this shared library (the C API of
    native/runtime/ditto.h) through the same stages, with ``LIBRARY_FLAGS`` at emit and
    ``LIBRARY_LINK_FLAGS`` at link, beside the executable (``compile_with_library``: one emit
    for both, the two links at once; the ``link`` seconds last until both are done), and
    cached with it. Raises DittoError
    (compile/link failure, unknown or unavailable component); nothing is written at ``out``
    (or ``library``) then.
    """
    out = Path(out)
    if stages is None:
        stages = choose_compile(registry or get_registry(), blas=blas, rewrite=rewrite)
    rewrite = bool(stages.passes)
    sources = runtime_sources(src_dir)
    cache = cache if cache is not None else Cache(enabled=False)
    key = compile_key(sources, stages, openmp, extra_flags, library=library is not None)
    files = {"executable": out}
    if library is not None:
        library = Path(library)
        files["library"] = library
    meta = cache.fetch("compile", key, files,
                       validate=lambda m: pass_reports_problem(m, rewrite))
    if meta is not None:
        reports = tuple(PassReport.from_json(p) for p in meta.get("passes", ()))
        return CompileResult(out, reports, {s: 0.0 for s in COMPILE_STAGES}, True, key,
                             tuple(summary_lines(reports, rewrite)), library)
    cflags = list(RUNTIME_FLAGS) + (["-fopenmp"] if openmp else []) + list(extra_flags)
    sweep_stale(Path(tempfile.gettempdir()), "ditto-compile-")  # left by killed builds
    with tempfile.TemporaryDirectory(prefix=f"ditto-compile-{pid_tag()}") as tmp:
        if library is None:
            done = compile_program(sources, stages, out, workdir=Path(tmp),
                                   include_dirs=[source_root(sources)], flags=cflags,
                                   on_stage=on_stage)
        else:
            done = compile_with_library(sources, stages, out, library, workdir=Path(tmp),
                                        include_dirs=[source_root(sources)], flags=cflags,
                                        on_stage=on_stage)
    if ir_out is not None:
        Path(ir_out).write_text(done.module.text)
    cache.put("compile", key, files,
              {"passes": [r.to_json() for r in done.reports], "components": stages.record(),
               "openmp": openmp, "seconds": done.seconds,
               "sources": [s.name for s in sources], "source_hashes":
               {s.name: file_hash(s) for s in sources}})
    return CompileResult(out, done.reports, done.seconds, False, key,
                         tuple(summary_lines(done.reports, rewrite)), library)
