"""Benchmark: codebook GEMV (docs/FORMAT.md "encoding = 1"), scalar reference
(native/kernels/codebook_ref.c ``codebook_gemv_ref``) vs AVX2
(native/kernels/arch/x86/codebook_avx2.c ``codebook_gemv_avx2``) vs AVX-512
(native/kernels/arch/x86/codebook_avx512.c ``codebook_gemv_avx512``, b = 4 only; it is the AVX2
kernel on a CPU without AVX-512 VBMI) on the SmolLM2-135M matrix shapes. Prints one JSON
object.

    python bench/bench_kernels.py [--bits 4] [--group-size 256] [--threads 1,2] [--rounds 5]

All kernels are compiled into one shared library with clang-22 -O3 -fopenmp (the runtime's
flags; the AVX2 functions carry their own target attribute). The scalar reference is also
built with ``-march=native`` (``scalar_native``), as the IR pipeline links baseline functions
for the host CPU, so the speed-up is not flattered by a baseline-only reference. Each figure
is the median (``us_min``: the minimum) over ``--rounds`` rounds of the mean time of a burst of
calls; the kernels alternate within each round so machine noise hits all alike. GB/s = payload
bytes (codebooks + packed indices) read per second; us = microseconds per GEMV. Threads are
set with omp_set_num_threads; the OpenMP wait policy is the environment's (libomp's default
spins briefly between parallel regions; OMP_WAIT_POLICY=passive adds a wake-up per GEMV).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ditto_core.base.types import CodebookTensor  # noqa: E402
from ditto_core.model import codebook  # noqa: E402
from ditto_core.model.codebook import codebook_payload  # noqa: E402
from ditto_native import KERNEL_SOURCES  # noqa: E402

NATIVE = ROOT / "native"
KERNEL_FILES = KERNEL_SOURCES
CB_F16 = codebook.TYPE_IDS["f16"]
# SmolLM2-135M: q/o (576x576), gate/up (1536x576), down (576x1536), classifier (49152x576)
SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576)]
F32P = ctypes.POINTER(ctypes.c_float)
GEMV_ARGS = [F32P, F32P, ctypes.c_char_p, ctypes.c_uint32] + [ctypes.c_int] * 4


def build(out: Path, extra: list[str]) -> ctypes.CDLL:
    """The float codebook kernels and what matmul.c links against (KERNEL_FILES) as a shared
    library (clang-22 -O3 -fopenmp + extra)."""
    cmd = ["nice", "clang-22", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-O3", "-fopenmp",
           "-fPIC", "-shared", *extra, "-o", str(out),
           *(str(NATIVE / f) for f in KERNEL_FILES)]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(str(out))
    for f in (lib.codebook_gemv_ref, lib.codebook_gemv_avx2, lib.codebook_gemv_avx512):
        f.argtypes = GEMV_ARGS
    lib.omp_set_num_threads.argtypes = [ctypes.c_int]
    return lib


def time_gemv(fn, args, payload_bytes: int) -> float:
    """Mean seconds per call over a burst of calls lasting ~0.2 s (after one warm-up call)."""
    fn(*args)
    t0 = time.perf_counter()
    fn(*args)
    one = max(time.perf_counter() - t0, 1e-6)
    n = max(3, int(0.2 / one))
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*args)
    return (time.perf_counter() - t0) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=256)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    b, G = args.bits, args.group_size

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bench-kernels-") as tmp:
        base = build(Path(tmp) / "base.so", [])
        native = build(Path(tmp) / "native.so", ["-march=native"])
        kernels = {"scalar": base.codebook_gemv_ref, "scalar_native": native.codebook_gemv_ref,
                   "avx2": base.codebook_gemv_avx2, "avx512": base.codebook_gemv_avx512}
        results = []
        for rows, cols in SHAPES:
            S, K = codebook.n_sub_blocks(cols, G), codebook.n_centroids(b)
            cb = rng.normal(0, cols ** -0.5, size=(rows, S, K)).astype(np.float16)
            idx = rng.integers(0, K, size=(rows, cols), dtype=np.uint8)
            ct = CodebookTensor(bits=b, group_size=G, codebooks=cb.astype(np.float32),
                                indices=idx, codebook_type="f16")
            payload = codebook_payload(ct)
            x = rng.normal(size=cols).astype(np.float32)
            y = np.zeros(rows, np.float32)
            call = (y.ctypes.data_as(F32P), x.ctypes.data_as(F32P), payload, CB_F16, b, G,
                    rows, cols)
            for t in threads:
                samples = {k: [] for k in kernels}
                for _ in range(args.rounds):
                    for name, fn in kernels.items():
                        (native if name == "scalar_native" else base).omp_set_num_threads(t)
                        samples[name].append(time_gemv(fn, call, len(payload)))
                med = {k: statistics.median(v) for k, v in samples.items()}
                results.append({
                    "rows": rows, "cols": cols, "threads": t, "payload_bytes": len(payload),
                    "us": {k: round(v * 1e6, 2) for k, v in med.items()},
                    "us_min": {k: round(min(v) * 1e6, 2) for k, v in samples.items()},
                    "GB_s": {k: round(len(payload) / v / 1e9, 3) for k, v in med.items()},
                    "speedup_avx2_vs_scalar": round(med["scalar"] / med["avx2"], 2),
                    "speedup_avx2_vs_scalar_native": round(med["scalar_native"] / med["avx2"],
                                                           2),
                    "speedup_avx512_vs_avx2": round(med["avx2"] / med["avx512"], 2),
                })
    print(json.dumps({"bench": "bench_kernels", "bits": b, "group_size": G,
                      "avx2": bool(base.codebook_avx2_supported()),
                      "avx512": bool(base.codebook_avx512_supported()),
                      "codebook_type": "f16", "rounds": args.rounds, "results": results},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
