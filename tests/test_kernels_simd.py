"""The SIMD codebook GEMVs (native/kernels/arch/x86/codebook_avx2.c,
native/kernels/arch/x86/codebook_avx512.c) against the scalar reference ``codebook_gemv_ref``
(native/kernels/codebook_ref.c) and a float64 NumPy dequantize-then-dot, on payloads written by the project's packer (ditto_pack_bits.codebook_payload): every bit width b = 1..8,
group sizes G that are and are not multiples of 8, cols with tails, f16 and f32 codebooks.
Also: the CPU check against /proc/cpuinfo, thread-count independence, padding indices
ignored, warning-free builds, and tests/codebook_simd_driver.c under ASan+UBSan and through
Ditto's own IR pipeline (clang-22 -O1 -> llvmlite O3 host -> link)."""

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ditto_core.base.types import CodebookTensor
from ditto_native import KERNEL_SOURCES
from ditto_pack_bits import codebook_payload
from tests.fixtures_native import (CB_F16, CB_F32, cc_parallel, dequantize_codebook,
                                   random_codebook_tensor)

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native"
DRIVER = ROOT / "tests" / "codebook_simd_driver.c"
KERNEL_SRC = [NATIVE / f for f in KERNEL_SOURCES]
SIMD = ["codebook_gemv_avx2", "codebook_gemv_avx512"]
STD = ["-std=c11", "-D_POSIX_C_SOURCE=200809L"]
WARN = ["-Wall", "-Wextra", "-Werror"]
F32P = ctypes.POINTER(ctypes.c_float)

GROUP_SIZES = [8, 16, 32, 64, 256, 7, 100]
COLS = [1, 7, 8, 9, 63, 64, 100, 257, 576, 1000]


@pytest.fixture(scope="module")
def simd_lib(tmp_path_factory):
    """The kernel sources (ditto_native.KERNEL_SOURCES) as a shared library (clang-22 -O2
    -fopenmp)."""
    out = tmp_path_factory.mktemp("simd") / "libcodebook_simd.so"
    p = subprocess.run(["nice", "clang-22", *STD, "-O2", *WARN, "-fopenmp", "-fPIC", "-shared",
                        "-o", str(out), *map(str, KERNEL_SRC)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    lib = ctypes.CDLL(str(out))
    for f in (lib.codebook_gemv_ref, lib.codebook_gemv_avx2, lib.codebook_gemv_avx512):
        f.argtypes = [F32P, F32P, ctypes.c_char_p, ctypes.c_uint32] + [ctypes.c_int] * 4
        f.restype = None
    lib.omp_set_num_threads.argtypes = [ctypes.c_int]
    return lib


def gemv(fn, ct: CodebookTensor, x: np.ndarray, payload: bytes | None = None) -> np.ndarray:
    rows, cols = ct.indices.shape
    y = np.full(rows, np.nan, dtype=np.float32)
    payload = codebook_payload(ct) if payload is None else payload
    fn(y.ctypes.data_as(F32P), x.ctypes.data_as(F32P), payload,
       CB_F16 if ct.codebook_type == "f16" else CB_F32, ct.bits, ct.group_size, rows, cols)
    return y


def test_supported_matches_proc_cpuinfo(simd_lib):
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    assert flags, "no flags line in /proc/cpuinfo"
    assert simd_lib.codebook_avx2_supported() == int({"avx2", "fma", "f16c"} <= flags)
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512vbmi", "fma", "f16c"}
    assert simd_lib.codebook_avx512_supported() == int(avx512 <= flags)


@pytest.mark.parametrize("kernel", SIMD)
@pytest.mark.parametrize("cb_type", ["f16", "f32"])
@pytest.mark.parametrize("bits", range(1, 9))
def test_simd_equals_reference(simd_lib, bits, cb_type, kernel):
    """Relative error of each output y[r] <= 1e-5, measured against the magnitude of its terms
    (|avx2 - ref| <= 1e-5 * sum_c |W[r, c] x[c]|: a reordered float32 sum stays inside that
    bound, while |y[r]| itself can be tiny by cancellation), both against the scalar reference
    and against the float64 dequantize-then-dot."""
    rng = np.random.default_rng(100 * bits + (cb_type == "f16"))
    for G in GROUP_SIZES + ([48, 16] if bits == 4 else []):
        for cols in COLS:
            rows = int(rng.integers(1, 20))
            ct = random_codebook_tensor(rng, rows, cols, bits, G, cb_type, scale=1.0)
            x = rng.normal(size=cols).astype(np.float32)
            payload = codebook_payload(ct)
            ref = gemv(simd_lib.codebook_gemv_ref, ct, x, payload)
            got = gemv(getattr(simd_lib, kernel), ct, x, payload)
            where = f"{kernel} b={bits} G={G} rows={rows} cols={cols} {cb_type}"
            W = dequantize_codebook(ct)
            want = W @ x.astype(np.float64)
            bound = np.abs(W) @ np.abs(x.astype(np.float64))
            assert np.all(np.abs(got - ref) <= 1e-5 * bound), where
            assert np.all(np.abs(got - want) <= 1e-5 * bound), where


@pytest.mark.parametrize("kernel", SIMD)
def test_thread_count_does_not_change_result(simd_lib, kernel):
    """Rows are split across threads whole, so 1 and 2 threads give the same bits."""
    rng = np.random.default_rng(7)
    ct = random_codebook_tensor(rng, 1536, 576, 4, 256, "f16")
    x = rng.normal(size=576).astype(np.float32)
    payload = codebook_payload(ct)
    try:
        simd_lib.omp_set_num_threads(1)
        one = gemv(getattr(simd_lib, kernel), ct, x, payload)
        simd_lib.omp_set_num_threads(2)
        two = gemv(getattr(simd_lib, kernel), ct, x, payload)
    finally:
        simd_lib.omp_set_num_threads(2)
    np.testing.assert_array_equal(one, two)
    W = dequantize_codebook(ct)
    np.testing.assert_allclose(one, W @ x.astype(np.float64), rtol=0,
                               atol=1e-5 * (np.abs(W) @ np.abs(x)).max())


@pytest.mark.parametrize("kernel", SIMD)
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_padding_indices_and_unused_centroids_ignored(simd_lib, bits, kernel):
    """Centroid 0 of every sub-block is +inf and no real index is 0: only the zero padding of
    a row's last group points at it, so y must stay finite (and equal the reference)."""
    rng = np.random.default_rng(bits)
    for cols, G in [(13, 8), (100, 16), (577, 256), (1001, 100), (45, 32)]:
        rows, K = 5, 1 << bits
        cb = rng.normal(size=(rows, -(-cols // G), K)).astype(np.float16).astype(np.float32)
        cb[:, :, 0] = np.inf
        idx = rng.integers(1, K, size=(rows, cols), dtype=np.uint8)
        ct = CodebookTensor(bits=bits, group_size=G, codebooks=cb, indices=idx,
                            codebook_type="f16")
        x = rng.normal(size=cols).astype(np.float32)
        got = gemv(getattr(simd_lib, kernel), ct, x)
        assert np.isfinite(got).all(), (cols, G)
        ref = gemv(simd_lib.codebook_gemv_ref, ct, x)
        bound = np.abs(dequantize_codebook(ct)) @ np.abs(x.astype(np.float64))
        assert np.all(np.abs(got - ref) <= 1e-5 * bound), (cols, G)


@pytest.mark.parametrize("src", ["kernels/arch/x86/codebook_avx2.c",
                                 "kernels/arch/x86/codebook_avx512.c"])
@pytest.mark.parametrize("cc", ["gcc", "clang-22"])
def test_kernel_builds_warning_free(tmp_path, cc, src):
    p = subprocess.run(["nice", cc, *STD, "-O3", *WARN, "-fopenmp", "-c", str(NATIVE / src),
                        "-o", str(tmp_path / "k.o")], capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == "", p.stderr


def _run_driver(exe: Path) -> str:
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300,
                       env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=99",
                            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=98",
                            "OMP_WAIT_POLICY": "passive", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1].startswith("cases 1920 "), p.stdout
    return p.stdout


def test_driver_under_asan_ubsan(tmp_path):
    """Exact-size payloads and x under AddressSanitizer + UBSan: no read past the indices."""
    exe = tmp_path / "driver_asan"
    p = cc_parallel("clang-22", [*STD, "-O1", "-g", "-fno-omit-frame-pointer",
                                 "-fsanitize=address,undefined",
                                 "-fno-sanitize-recover=undefined", *WARN, "-fopenmp",
                                 f"-I{NATIVE}"], [DRIVER, *KERNEL_SRC], exe)
    assert p.returncode == 0, p.stderr
    _run_driver(exe)


def test_driver_through_ditto_ir_pipeline(tmp_path):
    """The kernel built as the runtime is (clang-22 -O1 IR, baseline target attributes
    stripped, the AVX2 functions' kept, llvmlite O3 for the host) agrees with the reference."""
    from ditto_core.stages.cc import compile_c

    exe, _ = compile_c([DRIVER, *KERNEL_SRC], blas=None, out=tmp_path / "driver_ir",
                       include_dirs=[NATIVE], openmp=True)
    _run_driver(exe)
