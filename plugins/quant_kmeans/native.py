"""The C kernels of the kmeans quantizer: compiled on first use, cached.

``optimal_dp.c`` (the ``optimal`` method) computes the same bytes as the numba reference
``kmeans1d._optimal_ws`` ~2.7× faster; ``assign_nearest.c`` (each weight's nearest stored
centroid) the same bytes as the numba ``kmeans1d.assign_nearest`` ~4.5× faster (docs/QUANT.md,
"Speed"). Both are compiled into one library with clang-22 (Ditto's own compiler, which
``ditto build`` needs anyway) at ``-O3 -march=native -ffp-contract=off`` — no fused
multiply-add and no fast-math, so every value is rounded exactly as in the reference — into
``$DITTO_CACHE_DIR/kernels/`` (default ``~/.cache/ditto``) under a name hashing the sources,
the flags, the compiler and the host CPU, and loaded with ``ctypes``.

When it cannot be had (no clang-22, a failed compile, an unwritable cache: a ``warning:`` line
on stderr says why, once per process; or ``DITTO_KMEANS_KERNEL=numba``), ``load()`` returns
None and the quantizer runs the numba references instead, with the same output.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ditto_core.base.cache import default_root, warn

SOURCE = Path(__file__).with_name("optimal_dp.c")
SOURCES = (SOURCE, Path(__file__).with_name("assign_nearest.c"))
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-std=c11",
         "-fPIC", "-shared", "-pthread")
ENV = "DITTO_KMEANS_KERNEL"  # "numba" forces the reference kernel

_STATE: dict = {}


def find_clang() -> str | None:
    """clang-22 on PATH, else ``/usr/lib/llvm-22/bin/clang``, else None."""
    found = shutil.which("clang-22")
    if found:
        return found
    alt = Path("/usr/lib/llvm-22/bin/clang")
    return str(alt) if alt.exists() else None


def _host_id() -> str:
    """The CPU model and feature flags (``-march=native`` code runs only on such a CPU)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine() + platform.processor()
    keep = [ln for ln in text.splitlines()
            if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    return platform.machine() + "\n" + "\n".join(sorted(set(keep)))


def _cache_dir() -> Path:
    return default_root() / "kernels"


def flags_for(march: str) -> tuple[str, ...]:
    """``FLAGS`` with ``-march=native`` replaced by ``-march=MARCH`` (e.g. ``x86-64-v3``: AVX2 +
    FMA, no AVX-512)."""
    return tuple(f"-march={march}" if f.startswith("-march=") else f for f in FLAGS)


def library_path(clang: str, flags=FLAGS) -> Path:
    """Where the compiled kernel for this source, ``flags``, ``clang`` and this CPU lives."""
    h = hashlib.sha256()
    for src in SOURCES:
        h.update(src.read_bytes())
    h.update("\0".join(flags).encode())
    h.update(str(Path(clang).resolve()).encode())
    h.update(_host_id().encode())
    return _cache_dir() / f"optimal_dp-{h.hexdigest()[:20]}.so"


def compile_kernel(clang: str, out: Path, flags=FLAGS) -> None:
    """Compile ``SOURCES`` (``optimal_dp.c``, ``assign_nearest.c``) with ``flags`` to ``out`` (written to a temp file, then
    renamed). Raises OSError or subprocess.CalledProcessError."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([clang, *flags, "-o", tmp, *map(str, SOURCES)], check=True,
                       capture_output=True, text=True)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_library(path: Path):
    """``ditto_kmeans_optimal_matrix`` of the compiled kernels at ``path`` (ctypes). Raises
    OSError when it cannot be loaded."""
    fn = ctypes.CDLL(str(path)).ditto_kmeans_optimal_matrix
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return fn


def load_assign_library(path: Path):
    """``ditto_kmeans_assign_nearest`` of the compiled kernels at ``path`` (ctypes). Raises
    OSError when it cannot be loaded."""
    fn = ctypes.CDLL(str(path)).ditto_kmeans_assign_nearest
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_int64]
    return fn


def use_march(march: str) -> Path:
    """Use the kernels built for ``-march=MARCH`` (compiled once into the cache) instead of the
    host's for the rest of this process, and return the library's path: what a CPU with only
    those extensions runs, timed on this one (``bench/bench_scale.py --isa avx2``). The bytes
    are the same either way. Raises OSError when clang-22 is missing or the library cannot be
    loaded, subprocess.CalledProcessError when it does not compile."""
    clang = find_clang()
    if clang is None:
        raise OSError("clang-22 not found on PATH")
    flags = flags_for(march)
    path = library_path(clang, flags)
    if not path.exists():
        compile_kernel(clang, path, flags)
    fn, assign = load_library(path), load_assign_library(path)
    _STATE.update(fn=fn, assign=assign)
    return path


def load():
    """The kernel's ``ditto_kmeans_optimal_matrix`` (a ctypes function), or None when the C
    kernel is unavailable or disabled (``DITTO_KMEANS_KERNEL=numba``). Compiles it on the
    first call of a process if the cache does not hold it."""
    if os.environ.get(ENV, "").lower() == "numba":
        return None
    if "fn" in _STATE:
        return _STATE["fn"]
    fn, why = None, "clang-22 not found on PATH"
    clang = find_clang()
    if clang is not None:
        try:
            path = library_path(clang)
            if not path.exists():
                compile_kernel(clang, path)
            fn = load_library(path)
            _STATE["assign"] = load_assign_library(path)
        except subprocess.CalledProcessError as exc:
            why = (f"{SOURCE.parent}/{{{','.join(src.name for src in SOURCES)}}}: clang-22 "
                   f"failed: {(exc.stderr or '').strip()[:500]}")
        except (OSError, AttributeError) as exc:
            why = f"{exc}"
    if fn is None:
        warn(f"kmeans: the C kernels (optimal DP, assignment) are unavailable ({why}); using "
             f"the numba kernels (same results, ~2.7x slower)")
    _STATE["fn"] = fn
    return fn


def load_assign():
    """The kernels' ``ditto_kmeans_assign_nearest`` (a ctypes function), or None when the C
    kernels are unavailable or disabled (as ``load()``, which it calls)."""
    if load() is None:
        return None
    return _STATE.get("assign")


def optimal_matrix(fn, Ws: np.ndarray, group_size: int, k: int, cent: np.ndarray,
                   threads: int) -> np.ndarray:
    """Run the C kernel ``fn`` (from ``load()``) on ``Ws`` (float32 [rows, cols], C order,
    sub-blocks sorted) into ``cent`` (float64 [rows, S, k], C order); returns the SSE per
    sub-block (float64 [rows, S]). Raises MemoryError when the kernel cannot allocate."""
    rows, cols = Ws.shape
    assert Ws.dtype == np.float32 and Ws.flags.c_contiguous
    assert cent.dtype == np.float64 and cent.flags.c_contiguous
    assert cent.shape == (rows, -(-cols // group_size), k)
    sse = np.empty(cent.shape[:2], np.float64)
    rc = fn(Ws.ctypes.data, rows, cols, group_size, k, cent.ctypes.data, sse.ctypes.data,
            max(1, int(threads)))
    if rc != 0:
        raise MemoryError("kmeans optimal kernel: out of memory")
    return sse


def assign_nearest(fn, W: np.ndarray, group_size: int, cb: np.ndarray, indices: np.ndarray,
                   threads: int) -> tuple[np.ndarray, np.ndarray]:
    """Run the C kernel ``fn`` (from ``load_assign()``) on ``W`` (float32 [rows, cols], C
    order, finite) and the codebooks ``cb`` (float32 [rows, S, k], C order, ascending, finite;
    k = 2^b) into ``indices`` (uint8 [rows, cols], C order); returns (SSE per row, ‖row‖² per
    row), float64 [rows] — the bytes of ``kmeans1d.assign_nearest``. Raises MemoryError when
    the kernel cannot allocate."""
    rows, cols = W.shape
    k = cb.shape[2]
    assert W.dtype == np.float32 and W.flags.c_contiguous
    assert cb.dtype == np.float32 and cb.flags.c_contiguous
    assert cb.shape == (rows, -(-cols // group_size), k) and k >= 2 and k & (k - 1) == 0
    assert indices.dtype == np.uint8 and indices.flags.c_contiguous
    assert indices.shape == (rows, cols)
    sse = np.empty(rows, np.float64)
    norm2 = np.empty(rows, np.float64)
    rc = fn(W.ctypes.data, rows, cols, group_size, k, cb.ctypes.data, indices.ctypes.data,
            sse.ctypes.data, norm2.ctypes.data, max(1, int(threads)))
    if rc != 0:
        raise MemoryError("kmeans assignment kernel: out of memory")
    return sse, norm2
