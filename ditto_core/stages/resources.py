"""Memory and disk accounting for ``ditto build``: per-stage peak RSS and the pre-flight check.

Peak RSS is the kernel's high-water mark of the process's resident set (``VmHWM`` in
``/proc/self/status``, proc(5)); writing ``5`` to ``/proc/self/clear_refs`` resets it to the
current RSS (Linux ≥ 4.0), which gives one peak per stage. Where that is not possible (not
Linux, or a restricted /proc) the process-lifetime ``ru_maxrss`` of getrusage(2) is recorded
instead and ``per_stage`` is false. Child processes (clang, the linker) are not included: a
child's ``ru_maxrss`` starts from the image of the Python process it was forked from, so it
would say little about clang itself.
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
import tempfile
from pathlib import Path

import attrs

from ditto_core.base.errors import DittoError

GiB = 1 << 30


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _maxrss_bytes(who=resource.RUSAGE_SELF) -> int:
    """ru_maxrss in bytes (kilobytes on Linux, bytes on macOS)."""
    v = resource.getrusage(who).ru_maxrss
    return v if sys.platform == "darwin" else v * 1024


def peak_rss_bytes() -> int:
    """The process's peak resident set since start or the last ``reset_peak_rss``, bytes."""
    kib = _status_kib("VmHWM")
    return kib * 1024 if kib is not None else _maxrss_bytes()


def current_rss_bytes() -> int | None:
    """The process's resident set now (``VmRSS``), bytes; None where /proc is unavailable."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (``/proc/self/clear_refs`` ← 5); False if not
    possible here."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class StagePeaks:
    """Peak RSS per stage: ``start(name)`` closes the running stage (records its peak) and
    resets the high-water mark; ``stop()`` closes the last one. ``record()`` is what build.json
    stores under ``peak_rss``: ``{"per_stage": bool, "stages": {name: bytes}, "process":
    bytes}``."""

    def __init__(self):
        self.stages: dict[str, int] = {}
        self.per_stage = reset_peak_rss()
        self._current: str | None = None

    def start(self, name: str) -> None:
        self.stop()
        if self.per_stage:
            self.per_stage = reset_peak_rss()
        self._current = name

    def stop(self) -> None:
        if self._current is not None:
            self.stages[self._current] = max(self.stages.get(self._current, 0),
                                             peak_rss_bytes())
            self._current = None

    def record(self) -> dict:
        self.stop()
        # the resets also lower ru_maxrss, so the process peak is the largest stage peak
        return {"per_stage": self.per_stage, "stages": dict(self.stages),
                "process": max([_maxrss_bytes(), *self.stages.values()])}


# --------------------------------------------------------------------------------------------
# pre-flight check
# --------------------------------------------------------------------------------------------

#: what the compile stages write besides the model file: the executable in the build directory
#: (and its copy in the cache), IR and objects in the temp directory (measured: ~10 MB)
EXECUTABLE_BYTES = 64 << 20
TEMP_BYTES = 256 << 20
#: resident memory of the Python process before the first tensor (interpreter, numpy, numba,
#: llvmlite: measured ~300 MB) plus headroom
BASE_MEMORY_BYTES = 768 << 20
#: transient bytes per weight of the largest tensor while it is quantized: the float32 tensor,
#: its sorted copy and NumPy's sort buffer (3 × 4), the bool NaN mask, the uint8 indices and
#: the packed payload (~1 each), the loader's widening buffer (~4); measured ~14 on the
#: synthetic 7B's 131 M-weight embedding (bench/results/scale_streaming_L2.json)
QUANT_BYTES_PER_WEIGHT = 19


def fmt_bytes(n: float) -> str:
    """``n`` bytes as GiB with two decimals (MiB below 1 GiB)."""
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / (1 << 20):.0f} MiB"


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (None where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@attrs.frozen
class Need:
    """Bytes a build needs on one directory's filesystem, and what for."""

    path: Path
    role: str
    nbytes: int
    parts: tuple[str, ...]


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing ancestor (what shutil.disk_usage can measure)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def disk_needs(out_dir: Path, model_bytes: int, cache_dir: Path | None) -> list[Need]:
    """The disk space a build of a ``model_bytes`` model file needs, per directory: the
    output directory (model file + executable, written beside it first), the cache directory
    (a copy of both, when the cache is on) and the temp directory (IR and objects)."""
    needs = [Need(Path(out_dir), "output directory", model_bytes + EXECUTABLE_BYTES,
                  (f"model file {fmt_bytes(model_bytes)}",
                   f"executable {fmt_bytes(EXECUTABLE_BYTES)}"))]
    if cache_dir is not None:
        needs.append(Need(Path(cache_dir), "cache directory", model_bytes + EXECUTABLE_BYTES,
                          (f"cached model file {fmt_bytes(model_bytes)}",
                           f"cached executable {fmt_bytes(EXECUTABLE_BYTES)}")))
    needs.append(Need(Path(tempfile.gettempdir()), "temp directory", TEMP_BYTES,
                      (f"IR and objects {fmt_bytes(TEMP_BYTES)}",)))
    return needs


def memory_need(largest_weights: int) -> int:
    """Peak memory a build needs when its largest tensor has ``largest_weights`` weights."""
    return BASE_MEMORY_BYTES + QUANT_BYTES_PER_WEIGHT * largest_weights


def check_resources(out_dir: Path, model_bytes: int, largest_weights: int,
                    cache_dir: Path | None) -> dict:
    """Check free disk space (``shutil.disk_usage``, directories on one filesystem summed) and
    available memory against what the build needs; return the plan as a dict for build.json.

    Raises DittoError listing every shortfall: the directory, its role, free vs needed bytes
    and what the bytes are for; memory as needed vs ``MemAvailable``."""
    needs = disk_needs(out_dir, model_bytes, cache_dir)
    by_dev: dict[int, list[Need]] = {}
    free: dict[int, int] = {}
    for n in needs:
        where = _existing(n.path)
        try:
            dev = os.stat(where).st_dev
            usage = shutil.disk_usage(where)
        except OSError:
            continue  # unreadable: the stage that writes there reports the real error
        by_dev.setdefault(dev, []).append(n)
        free[dev] = usage.free
    problems = []
    plan = {"model_file_bytes": model_bytes, "disk": [], "memory": {}}
    for dev, group in by_dev.items():
        total = sum(n.nbytes for n in group)
        for n in group:
            plan["disk"].append({"path": str(n.path), "role": n.role, "bytes": n.nbytes,
                                 "free_bytes": free[dev]})
        if total > free[dev]:
            what = "; ".join(f"{n.role} {n.path}: {', '.join(n.parts)}" for n in group)
            problems.append(f"not enough free disk space on the filesystem of "
                            f"{group[0].path}: {fmt_bytes(free[dev])} free, the build needs "
                            f"{fmt_bytes(total)} ({what})")
    mem = memory_need(largest_weights)
    avail = available_memory_bytes()
    plan["memory"] = {"needed_bytes": mem, "available_bytes": avail,
                      "largest_tensor_weights": largest_weights}
    if avail is not None and mem > avail:
        problems.append(f"not enough memory: the build needs about {fmt_bytes(mem)} (largest "
                        f"tensor {largest_weights:,} weights), {fmt_bytes(avail)} is available")
    if problems:
        raise DittoError("ditto build cannot start: " + "; ".join(problems)
                         + " (free some space, choose another -o, set DITTO_CACHE_DIR or use "
                         "--no-cache)")
    return plan
