"""GEMV micro-benchmark: GB/s of packed weight bytes against a STREAM read figure measured in
the same run (docs/KERNELS.md "Integer kernels"). Prints one JSON object (and a table on stderr).

    python bench/bench_gemv.py [--shapes 576x576,...] [--threads 1,2] [--rounds 5]
        [--formats int8,f16] [--kernels best,generic] [--bits 4,5] [--group-size 128,256,576]
        [--compare-native DIR] [--stream-mib 256] [-o out.json]

Every GEMV goes through the runtime's own dispatcher ``gemv()`` (native/kernels/matmul.c) with the
kernel table forced by name (``kernels_select``), so an int8 figure includes quantizing x once
per call, as in decode. Formats: ``int8`` (int8 centroids + f16 scale per sub-block: 4.5625
bpw at b = 4, G = 256), ``f16`` (f16 centroids: 5 bpw at b = 4, G = 256, the float-lookup
kernels), ``f32`` (the naive loop nest, not BLAS), ``int8-tiled`` (``int8`` rearranged into
row tiles as the runtime does at load, ``kernels_tile_tensor``: docs/KERNELS.md "Row tiles";
on a table without tiled kernels, or a layout that does not fit them, the case is left out
with a note; ``--compare-native``'s tree tiles its own copy, so it must have row tiles too). The codebook formats run
every layout of ``--bits`` x ``--group-size`` (default 4 x 256; G above the row length is the
whole row, as the runtime clamps it); each result names its layout and the kernel path of the
table (ditto_core.model.kernel_paths). Payloads are random (the speed does not depend on the
values) and live in NumPy-owned arrays, which NumPy places in 2 MiB pages from 4 MiB up, as
ditto-run does with a model it loads; from memory, a payload in 4 KiB pages read 5-30 % slower
at 1 thread on a Zen 4 (docs/KERNELS.md "Where a decode token goes").
Kernel ``best`` is the table this CPU selects by default. ``--compare-native DIR`` also builds
the kernels of another source tree (e.g. ``git archive`` of an older commit's native/) and
runs every int8 case through it too, interleaved in the same rounds (labels ending ``@DIR``'s
name), so before/after ratios see the same machine load.

STREAM read: a sum over a ``--stream-mib`` float32 array (several vector accumulators, OpenMP
over the threads of the row), timed like the GEMVs; its GB/s is the bandwidth the GEMV can
at best reach when its weights come from memory (the target in issue 9: quantized GEMV on
4096 x 11008 at >= 80 % of it). Each figure is the median over ``--rounds`` rounds of the mean
time of a burst of calls lasting ``--burst-s``; kernels and the STREAM read alternate within a
round so machine noise hits all alike. Weights larger than the last-level cache stream from
memory; small ones (576 x 576: 0.19 MB) stay cached, so their GB/s can exceed STREAM.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ditto_core.base.types import CodebookTensor  # noqa: E402
from ditto_core.model import codebook  # noqa: E402
from ditto_core.model import format as F  # noqa: E402
from ditto_core.model.codebook import codebook_payload  # noqa: E402
from ditto_core.model import kernel_paths as KP  # noqa: E402
from ditto_native import KERNEL_SOURCES  # noqa: E402
from ditto_quant_kmeans.quantizer import int8_codebooks  # noqa: E402

NATIVE = ROOT / "native"
KERNEL_FILES = KERNEL_SOURCES
SHAPES = "576x576,1536x576,576x1536,49152x576,4096x4096,11008x4096,4096x11008"
#: format name -> (encoding id, codebook type id) of the tensor table
ENC = {"f32": F.ENC_F32, "int8": F.ENC_CODEBOOK, "int8-tiled": F.ENC_CODEBOOK,
       "f16": F.ENC_CODEBOOK}
CBT = {"f32": 0, **codebook.TYPE_IDS, "int8-tiled": codebook.TYPE_IDS["int8"]}

#: timing harness: gemv() on a Tensor built from plain arguments, and the STREAM read sum
HARNESS = r"""
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include <time.h>
#include "kernels/kernels.h"
#include "kernels/matmul.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static Tensor tensor(unsigned enc, unsigned cbt, int bits, int G, int rows, int cols,
                     const unsigned char *payload, unsigned long long nbytes, int tiled) {
    Tensor W;
    memset(&W, 0, sizeof W);
    W.name = "bench";
    W.encoding = enc;
    W.codebook_type = cbt;
    W.bits = (unsigned)bits;
    W.group_size = (unsigned)G;
    W.rows = (unsigned long long)rows;
    W.cols = (unsigned long long)cols;
    W.data = payload;
    W.nbytes = nbytes;
    W.tiled = tiled;
    return W;
}

/* The payload (the caller's own copy) rearranged in place into row tiles by the table named
 * kernel, as the runtime does at load: 1 when tiled, 0 when this table or layout has none (or
 * DITTO_TILES=0), -1 out of memory, -2 if the kernel is refused. */
int bench_tile(const char *kernel, unsigned enc, unsigned cbt, int bits, int G, int rows,
               int cols, unsigned char *payload, unsigned long long nbytes) {
    char err[256];
    if (kernels_select(kernel, err, sizeof err)) return -2;
    Tensor W = tensor(enc, cbt, bits, G, rows, cols, payload, nbytes, 0);
    return kernels_tile_tensor(&W);
}

/* mean seconds per gemv() over a burst of about burst_s seconds, -1 if the kernel is refused;
 * tiled: the payload is in row tiles (bench_tile) */
double bench_gemv(const char *kernel, unsigned enc, unsigned cbt, int bits, int G, int rows,
                  int cols, const unsigned char *payload, unsigned long long nbytes,
                  const float *x, float *y, double burst_s, int tiled) {
    char err[256];
    if (kernels_select(kernel, err, sizeof err)) return -1.0;
    Tensor W = tensor(enc, cbt, bits, G, rows, cols, payload, nbytes, tiled);
    gemv(y, x, &W);
    double t0 = now();
    gemv(y, x, &W);
    double one = now() - t0;
    long n = one > 0 ? (long)(burst_s / one) : 1000;
    if (n < 3) n = 3;
    t0 = now();
    for (long i = 0; i < n; i++) gemv(y, x, &W);
    return (now() - t0) / (double)n;
}

/* STREAM-style read: sum of n floats (n a multiple of 64) in four independent 8-float vector
 * accumulators per thread. GCC/clang vector types make the loop vector loads and adds on every
 * ISA without relying on the vectorizer, which keeps an array of float accumulators in an
 * OpenMP-outlined loop on the stack (a scalar load-add-store per element, about half the
 * memory bandwidth). */
typedef float v8f __attribute__((vector_size(32)));
static float stream_sum(const float *a, long n) {
    float total = 0.0f;
#pragma omp parallel reduction(+ : total)
    {
        v8f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
#pragma omp for schedule(static)
        for (long i = 0; i < n; i += 64) {
            for (int j = 0; j < 64; j += 32) {
                v8f v0, v1, v2, v3;
                memcpy(&v0, a + i + j, sizeof v0);
                memcpy(&v1, a + i + j + 8, sizeof v1);
                memcpy(&v2, a + i + j + 16, sizeof v2);
                memcpy(&v3, a + i + j + 24, sizeof v3);
                s0 += v0;
                s1 += v1;
                s2 += v2;
                s3 += v3;
            }
        }
        v8f s = s0 + s1 + s2 + s3;
        for (int j = 0; j < 8; j++) total += s[j];
    }
    return total;
}

volatile float stream_sink;

double bench_stream(const float *a, long n, double burst_s) {
    stream_sink = stream_sum(a, n);
    double t0 = now();
    stream_sink = stream_sum(a, n);
    double one = now() - t0;
    long reps = one > 0 ? (long)(burst_s / one) : 10;
    if (reps < 3) reps = 3;
    t0 = now();
    for (long i = 0; i < reps; i++) stream_sink = stream_sum(a, n);
    return (now() - t0) / (double)reps;
}
"""


def build(tmp: Path, native: Path = NATIVE) -> ctypes.CDLL:
    """The kernels of ``native`` (clang-22 -O3 -fopenmp, the runtime's flags) and the harness
    (the same plus -fassociative-math, so the STREAM sum is vectorised) as one shared
    library in ``tmp``."""
    src = tmp / "harness.c"
    src.write_text(HARNESS)
    obj = tmp / "harness.o"
    std = ["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-O3", "-fopenmp", "-fPIC"]
    subprocess.run(["nice", "clang-22", *std, "-fassociative-math", "-fno-signed-zeros",
                    "-fno-trapping-math", f"-I{native}", "-c", "-o", str(obj), str(src)],
                   check=True)
    out = tmp / "libbench_gemv.so"
    files = [f for f in KERNEL_FILES if (native / f).is_file()]
    subprocess.run(["nice", "clang-22", *std, "-shared", "-o", str(out), str(obj),
                    *(str(native / f) for f in files), "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    P = ctypes.c_void_p
    lib.bench_gemv.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_int,
                               ctypes.c_int, ctypes.c_int, ctypes.c_int, P, ctypes.c_ulonglong,
                               P, P, ctypes.c_double, ctypes.c_int]
    lib.bench_gemv.restype = ctypes.c_double
    lib.bench_tile.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_int,
                               ctypes.c_int, ctypes.c_int, ctypes.c_int, P, ctypes.c_ulonglong]
    lib.bench_tile.restype = ctypes.c_int
    lib.bench_stream.argtypes = [P, ctypes.c_long, ctypes.c_double]
    lib.bench_stream.restype = ctypes.c_double
    lib.omp_set_num_threads.argtypes = [ctypes.c_int]
    lib.kernel_active_name.restype = ctypes.c_char_p
    return lib


def payload_for(fmt: str, rows: int, cols: int, rng, b: int = 4, G: int = 256) -> np.ndarray:
    """A random payload of the format (b-bit indices, sub-blocks of G for the codebook
    formats), as uint8 bytes."""
    if fmt == "f32":
        return rng.normal(size=(rows, cols)).astype(np.float32).view(np.uint8).reshape(-1)
    S, K = codebook.n_sub_blocks(cols, G), codebook.n_centroids(b)
    cent = rng.normal(size=(rows, S, K)).astype(np.float32)
    idx = rng.integers(0, K, size=(rows, cols), dtype=np.uint8)
    if fmt in ("int8", "int8-tiled"):
        cb, sc = int8_codebooks(cent)
        ct = CodebookTensor(bits=b, group_size=G, codebooks=cb, indices=idx,
                            codebook_type="int8", scales=sc)
    else:
        ct = CodebookTensor(bits=b, group_size=G, codebooks=cent.astype(np.float16)
                            .astype(np.float32), indices=idx, codebook_type="f16")
    # a NumPy-owned copy (NumPy marks arrays of 4 MiB and more MADV_HUGEPAGE, as it does the
    # STREAM array); the bytes object itself sits in 4 KiB pages
    return np.frombuffer(codebook_payload(ct), np.uint8).copy()


def _ints(ap, flag: str, text: str, lo: int, hi: int) -> list[int]:
    """The comma-separated integers of ``text``, each in [lo, hi]; else ``ap.error`` (exit 2)
    naming ``flag``."""
    out = []
    for v in text.split(","):
        try:
            n = int(v.strip())
        except ValueError:
            ap.error(f"{flag}: {v!r} is not an integer")
        if not lo <= n <= hi:
            ap.error(f"{flag}: {n} is outside {lo}..{hi}")
        out.append(n)
    return out


def checked_args(ap, args) -> tuple[list, list, list, list]:
    """(threads, shapes, formats, layouts) of the parsed ``args``, each value checked: a bad
    one is a usage error (``ap.error``, exit 2) naming its flag, before anything is built."""
    threads = _ints(ap, "--threads", args.threads, 1, 1024)
    if args.rounds < 1:
        ap.error(f"--rounds: {args.rounds} is below 1")
    if not args.burst_s > 0:
        ap.error(f"--burst-s: {args.burst_s} is not a positive number of seconds")
    if args.stream_mib < 1:
        ap.error(f"--stream-mib: {args.stream_mib} is below 1")
    shapes = []
    for sh in args.shapes.split(","):
        parts = sh.split("x")
        if len(parts) != 2:
            ap.error(f"--shapes: {sh!r} is not ROWSxCOLS")
        rows, cols = _ints(ap, "--shapes", ",".join(parts), 1, 1 << 24)
        if rows * cols > 1 << 32:  # the f32 format alone would be 16 GiB
            ap.error(f"--shapes: {sh} has {rows * cols:,} weights, more than 2^32")
        shapes.append((rows, cols))
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = [f for f in formats if f not in ENC]
    if unknown or not formats:
        ap.error(f"--formats: unknown {', '.join(unknown) or 'empty list'} "
                 f"(known: {', '.join(ENC)})")
    layouts = [(b, g) for b in _ints(ap, "--bits", args.bits, 1, 8)
               for g in _ints(ap, "--group-size", args.group_size, F.MIN_GROUP_SIZE,
                              F.MAX_GROUP_SIZE)]
    names = ", ".join(t.name for t in KP.tables())
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    if not kernels:
        ap.error(f"--kernels: empty list (best, or one of this program's: {names})")
    for k in (k for k in kernels if k != "best"):
        t = KP.named_table(k)
        if t is None:
            ap.error(f"--kernels: unknown kernel table {k!r} (best, or one of this program's: "
                     f"{names})")
        if KP.missing_features(t):
            ap.error(f"--kernels: kernel table {k!r} needs CPU features this CPU lacks: "
                     f"{', '.join(KP.missing_features(t))}")
    args.kernels = ",".join(kernels)
    return threads, shapes, formats, layouts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--shapes", default=SHAPES, help="rows x cols list (default: %(default)s)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--burst-s", type=float, default=0.2)
    ap.add_argument("--formats", default="int8,f16")
    ap.add_argument("--kernels", default="best,generic",
                    help="kernel tables for int8 (best = this CPU's default)")
    ap.add_argument("--bits", default="4", help="bit widths of the codebook formats (list)")
    ap.add_argument("--group-size", default="256", help="group sizes G of the codebook formats")
    ap.add_argument("--compare-native", type=Path, default=None, metavar="DIR",
                    help="also run the int8 cases through the kernels of this native/ tree")
    ap.add_argument("--stream-mib", type=int, default=256)
    ap.add_argument("-o", "--output", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    threads, shapes, formats, layouts = checked_args(ap, args)
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-gemv-") as tmp:
        lib = build(Path(tmp))
        libs = {"": lib}
        if args.compare_native:
            (Path(tmp) / "cmp").mkdir()
            libs["@" + args.compare_native.resolve().name] = build(Path(tmp) / "cmp",
                                                                   args.compare_native.resolve())
        best = lib.kernel_active_name().decode()
        kernels = [best if k == "best" else k for k in args.kernels.split(",") if k]
        kernels = list(dict.fromkeys(kernels))
        stream = np.ones(args.stream_mib * 2**20 // 4 // 64 * 64, np.float32)
        results = []
        for rows, cols in shapes:
            x = rng.normal(size=cols).astype(np.float32)
            y = np.zeros(rows, np.float32)
            cases = []  # (label, fmt, kernel, payload, b, G, lib suffix)
            for fmt in formats:
                for b, G in (layouts if fmt != "f32" else [(4, 256)]):
                    p = payload_for(fmt, rows, cols, rng, b, G)
                    lay = f"/b{b}G{G}" if fmt != "f32" and layouts != [(4, 256)] else ""
                    if fmt == "int8-tiled":  # each kernel table tiles its own copy, once
                        for k, suffix in ((k, s) for k in kernels for s in libs):
                            pt = p.copy()
                            rc = libs[suffix].bench_tile(k.encode(), ENC[fmt], CBT[fmt], b, G,
                                                         rows, cols, pt.ctypes.data, pt.size)
                            if rc == 1:
                                cases.append((f"{fmt}/{k}{lay}{suffix}", fmt, k, pt, b, G,
                                              suffix))
                            elif rc == 0:
                                print(f"{rows}x{cols} {fmt}/{k}{lay}{suffix}: no row tiles "
                                      "for this table or layout (or DITTO_TILES=0); left out",
                                      file=sys.stderr)
                            else:
                                raise SystemExit(f"{fmt}/{k}: " + (
                                    "out of memory tiling" if rc == -1 else
                                    f"kernel {k} is not available on this CPU"))
                        continue
                    for k in (kernels if fmt == "int8" else [best]):
                        for suffix in (libs if fmt == "int8" else [""]):
                            cases.append((f"{fmt}/{k}{lay}{suffix}", fmt, k, p, b, G, suffix))
            for t in threads:
                lib.omp_set_num_threads(t)
                samples = {c[0]: [] for c in cases}
                samples["stream_read"] = []
                for _ in range(args.rounds):
                    samples["stream_read"].append(
                        lib.bench_stream(stream.ctypes.data, stream.size, args.burst_s))
                    for label, fmt, k, p, b, G, suffix in cases:
                        libs[suffix].omp_set_num_threads(t)
                        s = libs[suffix].bench_gemv(k.encode(), ENC[fmt], CBT[fmt], b, G, rows,
                                                    cols, p.ctypes.data, p.size, x.ctypes.data,
                                                    y.ctypes.data, args.burst_s,
                                                    int(fmt == "int8-tiled"))
                        if s < 0:
                            raise SystemExit(f"kernel {k} is not available on this CPU")
                        samples[label].append(s)
                stream_gbs = stream.nbytes / statistics.median(samples["stream_read"]) / 1e9
                row = {"rows": rows, "cols": cols, "threads": t,
                       "stream_read_GB_s": round(stream_gbs, 2), "kernels": {}}
                for label, fmt, k, p, b, G, suffix in cases:
                    med = statistics.median(samples[label])
                    gbs = p.size / med / 1e9
                    path = (KP.kernel_path(KP.table(k), b, G, cols)
                            if fmt.startswith("int8") else None)
                    if fmt == "int8-tiled":  # only the cases bench_tile tiled are here
                        path += "-tiled"
                    row["kernels"][label] = {
                        "format": fmt, "kernel": k, "bits": b, "group_size": G,
                        "path": (f"{k}:{path}" if path != "generic" else path)
                        if path and not suffix else None,
                        "source": args.compare_native.name if suffix else "native",
                        "packed_bytes": int(p.size),
                        "bpw": round(8.0 * p.size / (rows * cols), 4),
                        "us": round(med * 1e6, 2), "us_min": round(min(samples[label]) * 1e6, 2),
                        "GB_s": round(gbs, 3), "fraction_of_stream": round(gbs / stream_gbs, 3)}
                results.append(row)
                for label, r in row["kernels"].items():
                    print(f"{rows:>6}x{cols:<6} t={t} {label:<28} {r['us']:>10.1f} us "
                          f"{r['GB_s']:>7.2f} GB/s ({100 * r['fraction_of_stream']:.0f}% of "
                          f"STREAM read {stream_gbs:.1f} GB/s)", file=sys.stderr)
    out = {"bench": "bench_gemv", "default_kernel": best, "kernels": kernels,
           "formats": formats, "layouts": [list(x) for x in layouts],
           "compare_native": str(args.compare_native) if args.compare_native else None, "rounds": args.rounds, "burst_s": args.burst_s,
           "stream_mib": args.stream_mib, "cpu_count": os.cpu_count(),
           "load_average_before": load_before, "results": results}
    text = json.dumps(out, indent=1)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
