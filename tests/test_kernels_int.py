"""The integer GEMV kernels for int8 codebooks (native/qgemv*.c, native/kernels/kernels.c).

- the scalar reference equals a NumPy implementation of the exact definition in
  native/kernels/qgemv.h bit for bit (activation quantization included);
- every SIMD table (AVX2, AVX-VNNI, AVX-512 VNNI, AVX-512 VBMI on x86; NEON cross-compiled for
  aarch64 and run under qemu-aarch64) equals the scalar reference bit for bit, for b = 1..8,
  many G and row lengths with tails, under ASan + UBSan and through Ditto's IR pipeline; a
  table this CPU cannot run is skipped with the missing features named (the only skip);
- the kernel table: names, CPU checks against /proc/cpuinfo, the default choice, DITTO_KERNEL;
- 1 and 2 threads give the same bits.
"""

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ditto_core.base.types import CodebookTensor
from ditto_core.stages.compile import runtime_sources
from ditto_native import KERNEL_SOURCES
from ditto_pack_bits import codebook_payload
from ditto_quant_kmeans.quantizer import int8_codebooks
from tests.fixtures_native import cc_parallel

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native"
DRIVER = ROOT / "tests" / "qgemv_driver.c"
SRC = [NATIVE / f for f in KERNEL_SOURCES]
STD = ["-std=c11", "-D_POSIX_C_SOURCE=200809L"]
WARN = ["-Wall", "-Wextra", "-Werror"]
#: the x86 tables, best first, with the /proc/cpuinfo flags each needs (native/kernels/kernels.c)
X86_FEATURES = {"avx512vbmi": "avx512f avx512bw avx512vl avx512_vnni avx512vbmi avx2 fma f16c "
                              "bmi2",
                "avx512vnni": "avx512f avx512bw avx512vl avx512_vnni avx2 fma f16c bmi2",
                "avxvnni": "avx_vnni avx2 fma f16c bmi2",
                "avx2": "avx2 fma f16c bmi2",
                "generic": ""}
X86_TABLES = {k: set(v.split()) for k, v in X86_FEATURES.items()}
P = ctypes.c_void_p


def cpu_flags() -> set:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    raise AssertionError("no flags line in /proc/cpuinfo")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("qgemv") / "libqgemv.so"
    p = subprocess.run(["nice", "clang-22", *STD, "-O2", *WARN, "-fopenmp", "-fPIC", "-shared",
                        "-o", str(out), *map(str, SRC), "-lm"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    L = ctypes.CDLL(str(out))
    L.i8cb_gemv_with.argtypes = [ctypes.c_char_p, P, P, P] + [ctypes.c_int] * 4
    L.i8cb_gemv_decoded_with.argtypes = [ctypes.c_char_p, P, P, P] + [ctypes.c_int] * 4
    L.kernels_decode_tensor.argtypes = [P]
    L.kernels_free_tensor.argtypes = [P]
    L.kernels_tile_tensor.argtypes = [P]
    L.act_quantize_copy.argtypes = [P, ctypes.c_int, P, P, P]
    L.act_quantize_copy_with.argtypes = [ctypes.c_char_p, P, ctypes.c_int] + [P] * 8
    L.kernel_name_at.restype = ctypes.c_char_p
    L.kernel_active_name.restype = ctypes.c_char_p
    L.kernels_select.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    L.omp_set_num_threads.argtypes = [ctypes.c_int]
    L.gemv.argtypes = [P, P, P]
    L.gemm_i8_float_input.argtypes = [P, P, ctypes.c_int, P]
    return L


# ------------------------------------------------------------------ the definition in NumPy

def act_quantize_np(x: np.ndarray):
    """native/kernels/qgemv.h act_quantize in float32 NumPy: (D, m [n_pad/32], q [n_pad])."""
    x = x.astype(np.float32)
    n = len(x)
    n_pad = -(-max(n, 1) // 64) * 64
    xp = np.zeros(n_pad, np.float32)
    xp[:n] = x
    a = np.abs(xp).reshape(-1, 32).max(axis=1)
    A = np.float32(np.abs(x).max()) if n else np.float32(0)
    D = np.float32(A / np.float32(127 * 255))
    m = np.zeros(len(a), np.int64)
    q = np.zeros(n_pad, np.int64)
    for j, aj in enumerate(a):
        if aj > 0:
            t = np.float32(aj / np.float32(np.float32(127) * D))
            m[j] = 255 if t >= 255 else max(1, int(np.ceil(t)))
            inv = np.float32(np.float32(1) / np.float32(D * np.float32(m[j])))
            q[32 * j:32 * j + 32] = np.clip(np.rint(xp[32 * j:32 * j + 32] * inv), -127, 127)
    return D, m, q


def i8_gemv_np(ct: CodebookTensor, x: np.ndarray) -> np.ndarray:
    """The exact result of native/kernels/qgemv.h: int64 sums per sub-block, combined in float64."""
    rows, cols = ct.indices.shape
    G = ct.group_size
    D, m, q = act_quantize_np(x)
    mq = (m[np.arange(cols) // 32] * q[:cols]).astype(np.int64)
    sc = ct.scales.astype(np.float64)
    cent = np.rint(ct.codebooks / np.where(sc > 0, sc, 1)[..., None]).astype(np.int64)
    y = np.empty(rows, np.float32)
    for r in range(rows):
        acc = 0.0
        for s in range(-(-cols // G)):
            c = np.arange(s * G, min(s * G + G, cols))
            T = int((mq[c] * cent[r, s, ct.indices[r, c]]).sum())
            acc = acc + float(np.float32(sc[r, s])) * float(T)
        y[r] = np.float32(acc * float(D))
    return y


def random_int8_tensor(rng, rows, cols, bits, G) -> CodebookTensor:
    S, K = -(-cols // G), 1 << bits
    cb, sc = int8_codebooks(np.sort(rng.normal(size=(rows, S, K)), axis=-1))
    idx = rng.integers(0, K, size=(rows, cols), dtype=np.uint8)
    return CodebookTensor(bits=bits, group_size=G, codebooks=cb, indices=idx,
                          codebook_type="int8", scales=sc)


def run_kernel(lib, kernel, ct, x, payload=None):
    rows, cols = ct.indices.shape
    payload = np.frombuffer(codebook_payload(ct) if payload is None else payload, np.uint8)
    y = np.full(rows, np.nan, np.float32)
    rc = lib.i8cb_gemv_with(kernel.encode(), y.ctypes.data, x.ctypes.data, payload.ctypes.data,
                            ct.bits, ct.group_size, rows, cols)
    assert rc >= 0, kernel
    return y, rc


def _act_inputs():
    rng = np.random.default_rng(5)
    for n in [1, 7, 8, 31, 32, 33, 100, 576, 1537]:
        x = (rng.normal(size=n) * rng.choice([1e-3, 1, 50], size=n)).astype(np.float32)
        if n > 64:
            x[32:64] = 0  # a zero block (m = 0)
            x[70] = 1e4  # an outlier: most blocks get small multipliers
        yield x
    yield np.zeros(96, np.float32)  # A = 0: D = 0, every q = 0
    ties = np.arange(-300, 300, dtype=np.float32) * np.float32(0.5)  # x * inv at .5 steps
    yield ties


def _act_quantize(lib, kernel, x):
    n = x.size
    n_pad = -(-n // 64) * 64
    D = ctypes.c_float()
    m = np.zeros(n_pad // 32, np.uint8)
    q, qp = np.zeros(n_pad, np.int8), np.zeros(n_pad, np.int8)
    aqp = np.zeros(n_pad, np.uint8)
    assert lib.act_quantize_copy_with(kernel.encode(), x.ctypes.data, n, ctypes.addressof(D),
                                      m.ctypes.data, q.ctypes.data, qp.ctypes.data,
                                      aqp.ctypes.data, None, None, None) == n_pad
    return np.float32(D.value), m, q, qp, aqp


def _act_plain(lib, kernel, x):
    """(D, m, q) of the table's act_quantize of x with no perm arrays made (ACT_PLAIN)."""
    n_pad = -(-x.size // 64) * 64
    D, m, q = ctypes.c_float(), np.zeros(n_pad // 32, np.uint8), np.zeros(n_pad, np.int8)
    assert lib.act_quantize_copy_with(kernel.encode(), x.ctypes.data, x.size, ctypes.addressof(D),
                                      m.ctypes.data, q.ctypes.data, None, None, None, None,
                                      None) == n_pad
    return np.float32(D.value), m, q


def _act_perm64(lib, kernel, x):
    """(qp64, aqp64, m64) of the table's act_quantize of x."""
    n_pad = -(-x.size // 64) * 64
    qp64, aqp64 = np.zeros(n_pad, np.int8), np.zeros(n_pad, np.uint8)
    m64 = np.zeros(n_pad // 4, np.int16)
    D, m, q = ctypes.c_float(), np.zeros(n_pad // 32, np.uint8), np.zeros(n_pad, np.int8)
    assert lib.act_quantize_copy_with(kernel.encode(), x.ctypes.data, x.size, ctypes.addressof(D),
                                      m.ctypes.data, q.ctypes.data, None, None, qp64.ctypes.data,
                                      aqp64.ctypes.data, m64.ctypes.data) == n_pad
    return qp64, aqp64, m64


@pytest.mark.parametrize("kernel", list(X86_TABLES))
def test_activation_quantization_equals_numpy(lib, kernel):
    """Every table's act_quantize (the scalar one and the AVX2 one) gives the definition's bytes,
    and the perm32 and perm64 copies the SIMD kernels read; the same D, m and q when prefill
    asks for them alone (ACT_PLAIN, for the panel GEMMs)."""
    if not X86_TABLES[kernel] <= cpu_flags():
        pytest.skip(f"this CPU lacks {' '.join(sorted(X86_TABLES[kernel] - cpu_flags()))}")
    for x in _act_inputs():
        n = x.size
        D, m, q, qp, aqp = _act_quantize(lib, kernel, x)
        D_np, m_np, q_np = act_quantize_np(x)
        assert D == D_np
        assert m.tolist() == m_np.tolist()
        assert q.tolist() == q_np.tolist()
        D_plain, m_plain, q_plain = _act_plain(lib, kernel, x)
        assert (D_plain, m_plain.tolist(), q_plain.tolist()) == (D, m.tolist(), q.tolist())
        perm = q.reshape(-1, 32)
        assert qp.tolist() == np.concatenate([perm[:, 0::2], perm[:, 1::2]], axis=1).ravel().tolist()
        assert aqp.tolist() == np.abs(qp.astype(int)).tolist()
        # perm64: per 64 columns the evens of both blocks, then their odds; m per 64 columns
        qp64, aqp64, m64 = _act_perm64(lib, kernel, x)
        pair = qp.reshape(-1, 2, 2, 16)  # [group of 64][block A, B][evens, odds][16]
        assert qp64.tolist() == pair.transpose(0, 2, 1, 3).ravel().tolist()
        assert aqp64.tolist() == np.abs(qp64.astype(int)).tolist()
        assert m64.tolist() == np.repeat(m.astype(np.int16), 8).tolist()
        assert (np.abs(q.astype(int)) <= 127).all()
        if D_np > 0:
            # x ~ D m q: the error of each entry is at most half a step of its block
            step = D_np * m_np[np.arange(n) // 32]
            err = np.abs(D_np * m_np[np.arange(n) // 32] * q_np[:n].astype(np.float64) - x)
            assert np.all(err <= 0.5 * step * (1 + 1e-5))
    assert lib.act_quantize_copy(np.ones(4, np.float32).ctypes.data, 4,
                                 ctypes.addressof(ctypes.c_float()),
                                 np.zeros(2, np.uint8).ctypes.data,
                                 np.zeros(64, np.int8).ctypes.data) == 64


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_activation_quantization_of_non_finite_input(lib, bad):
    """A NaN or infinity anywhere (in the SIMD part or the scalar tail): D is NaN, every m and q
    is 0, in every table this CPU runs."""
    for kernel, need in X86_TABLES.items():
        if not need <= cpu_flags():
            continue
        for pos in (3, 37, 99):
            x = np.ones(100, np.float32)
            x[pos] = bad
            D, m, q, _, _ = _act_quantize(lib, kernel, x)
            assert np.isnan(D) and not m.any() and not q.any(), (kernel, pos)


def test_non_finite_input_gives_nan(lib):
    ct = random_int8_tensor(np.random.default_rng(1), 4, 64, 4, 32)
    for bad in (np.nan, np.inf):
        x = np.ones(64, np.float32)
        x[3] = bad
        for kernel in ("generic", "avx2"):
            y, _ = run_kernel(lib, kernel, ct, x)
            assert np.isnan(y).all(), (kernel, bad)


@pytest.mark.parametrize("bits", range(1, 9))
def test_generic_equals_numpy_definition_exactly(lib, bits):
    rng = np.random.default_rng(bits)
    for G in [2, 7, 32, 100, 256]:
        for cols in [1, 33, 100, 300]:
            ct = random_int8_tensor(rng, 5, cols, bits, G)
            x = rng.normal(size=cols).astype(np.float32)
            got, rc = run_kernel(lib, "generic", ct, x)
            assert rc == 0
            np.testing.assert_array_equal(got, i8_gemv_np(ct, x), err_msg=f"b={bits} G={G}")
            # and it approximates the float product: activation quantization error only
            W = ct.codebooks[np.arange(5)[:, None], np.arange(cols)[None, :] // G, ct.indices]
            bound = np.abs(W.astype(np.float64)) @ np.abs(x.astype(np.float64))
            assert np.all(np.abs(got - W @ x.astype(np.float64)) <= 0.01 * bound)


# ------------------------------------------------------------------ the kernel table

def test_kernel_table_matches_cpu(lib):
    names = []
    i = 0
    while (n := lib.kernel_name_at(i)) is not None:
        names.append(n.decode())
        i += 1
    assert names == list(X86_TABLES)
    flags = cpu_flags()
    for i, name in enumerate(names):
        assert lib.kernel_supported_at(i) == int(X86_TABLES[name] <= flags), name
    best = next(n for n in names if X86_TABLES[n] <= flags)
    assert lib.kernel_active_name().decode() == best


def test_ditto_kernel_env_forces_a_table(tmp_path):
    """DITTO_KERNEL picks the table; an unknown or unsupported name is refused by name."""
    src = tmp_path / "which.c"
    src.write_text('#include <stdio.h>\n#include "kernels/kernels.h"\nint main(int c, char **v) {\n'
                   '  char err[256];\n  if (kernels_select(c > 1 ? v[1] : NULL, err, sizeof err))'
                   ' { puts(err); return 1; }\n  puts(kernels_active()->name);\n  return 0;\n}\n')
    exe = tmp_path / "which"
    p = subprocess.run(["clang-22", *STD, "-O1", *WARN, "-fopenmp", f"-I{NATIVE}", "-o", str(exe),
                        str(src), *map(str, SRC), "-lm"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr

    def run(*args, env=None):
        e = {k: v for k, v in os.environ.items() if k != "DITTO_KERNEL"}
        e.update(env or {})
        return subprocess.run([str(exe), *args], capture_output=True, text=True, env=e)

    assert run(env={"DITTO_KERNEL": "generic"}).stdout.strip() == "generic"
    assert run("generic").stdout.strip() == "generic"
    p = run(env={"DITTO_KERNEL": "sse9"})
    assert p.returncode == 1
    assert p.stdout.strip() == ("unknown kernel 'sse9' (this program has: avx512vbmi, "
                                "avx512vnni, avxvnni, avx2, generic)")
    flags = cpu_flags()
    for name, need in X86_TABLES.items():
        p = run(name)
        if need <= flags:
            assert p.returncode == 0 and p.stdout.strip() == name
        else:
            assert p.returncode == 1
            missing = [f for f in X86_FEATURES[name].split() if f not in flags]
            assert p.stdout.strip() == (f"kernel '{name}' needs CPU features this CPU lacks: "
                                        f"{', '.join(missing)}")


# ------------------------------------------------------------------ SIMD == reference, exactly

def _build_driver(tmp_path, *extra, cc="clang-22"):
    exe = tmp_path / "qgemv_driver"
    p = cc_parallel(cc, [*STD, *WARN, *extra, f"-I{NATIVE}"], [DRIVER, *SRC], exe)
    assert p.returncode == 0, p.stderr
    return exe


#: the driver's cases (tests/qgemv_driver.c): b = 1..8 x these G x these row lengths
DRIVER_GROUPS = (32, 64, 128, 256, 576, 4160, 2, 7, 48, 100)
DRIVER_LENGTHS = (1, 7, 31, 32, 33, 63, 64, 65, 100, 257, 576, 700, 1000, 4200)
#: per table: (chunk of its b = 4 kernel, whether it has an any-b kernel for G % 32 == 0)
TABLE_PATHS = {"avx512vbmi": (32, True), "avx512vnni": (32, True), "avxvnni": (32, True),
               "avx2": (32, True), "neon": (32, True), "generic": (None, False)}


def simd_cases(kernel):
    """How many driver cases a table runs through a SIMD kernel (native/kernels/kernels.c
    kernel_pick_i8, with G clamped to the row length)."""
    chunk, any_b = TABLE_PATHS[kernel]
    n = 0
    for b in range(1, 9):
        for G in DRIVER_GROUPS:
            for cols in DRIVER_LENGTHS:
                g = min(G, cols)
                n += bool(chunk and ((b == 4 and g % chunk == 0) or (any_b and g % 32 == 0)))
    return n


#: the tables with a GEMM kernel (KernelTable.i8_gemm, used when G % 32 == 0)
TABLE_GEMM = {"avx512vbmi", "avx512vnni", "avxvnni", "avx2", "neon"}


def gemm_cases(kernel):
    """How many driver cases run the table's GEMM kernel (native/kernels/kernels.c gemm_i8_by)."""
    if kernel not in TABLE_GEMM:
        return 0
    return sum(min(G, cols) % 32 == 0 for _ in range(1, 9) for G in DRIVER_GROUPS
               for cols in DRIVER_LENGTHS)


def tiled_cases(kernel):
    """How many driver cases run through row tiles (qgemv.h i8_tiles_fit, with G clamped to
    the row length, on a table that tiles)."""
    if kernel not in TILING_TABLES:
        return 0
    return sum(cols % 64 == 0 and min(G, cols) % 64 == 0 and min(G, cols) <= 512
               for G in DRIVER_GROUPS for cols in DRIVER_LENGTHS)


def _check_driver_output(p, kernel):
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.splitlines()[-2:] == [
        f"tiled: {tiled_cases(kernel)} cases equal the reference",
        (f"ok {8 * len(DRIVER_GROUPS) * len(DRIVER_LENGTHS)} cases ({simd_cases(kernel)} "
         f"through the SIMD path, {gemm_cases(kernel)} through the GEMM kernel)")], p.stdout


@pytest.fixture(scope="module")
def asan_driver(tmp_path_factory):
    return _build_driver(tmp_path_factory.mktemp("qgemv_asan"), "-O1", "-g", "-fopenmp",
                         "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                         "-fno-sanitize-recover=undefined")


@pytest.mark.parametrize("kernel", [k for k in X86_TABLES if k != "generic"])
def test_x86_table_equals_reference_under_asan(asan_driver, kernel):
    missing = X86_TABLES[kernel] - cpu_flags()
    if missing:
        pytest.skip(f"this CPU lacks {' '.join(sorted(missing))} for the {kernel} kernel")
    p = subprocess.run([str(asan_driver), kernel], capture_output=True, text=True, timeout=600)
    _check_driver_output(p, kernel)


def test_unsupported_table_is_refused_by_the_driver(asan_driver):
    lacking = [k for k, need in X86_TABLES.items() if not need <= cpu_flags()]
    if not lacking:
        pytest.skip("this CPU has every x86 table's features (avx512_vbmi included)")
    p = subprocess.run([str(asan_driver), lacking[0]], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip() == f"kernel {lacking[0]}: unknown or not supported by this CPU"


@pytest.fixture(scope="module")
def ir_driver(tmp_path_factory):
    """The driver built as the runtime is (clang-22 -O1 IR with Ditto's fast-math policy,
    llvmlite O3 for the host, per-function target attributes kept)."""
    from ditto_core.stages.cc import compile_c

    exe, _ = compile_c([DRIVER, *SRC], blas=None,
                       out=tmp_path_factory.mktemp("qgemv_ir") / "qgemv_ir",
                       include_dirs=[NATIVE], openmp=True)
    return exe


@pytest.mark.parametrize("kernel", list(X86_TABLES))
def test_driver_through_ditto_ir_pipeline(ir_driver, kernel):
    """Every x86 table this CPU runs, built through the IR pipeline, equals the reference bit
    for bit (GEMV, GEMM and activation quantization). The driver's random stream reaches the
    GEMM case b = 1, G = 576, cols = 4200, T = 8 whose input 2 once differed (53815408 vs
    53789932: the fast-math policy rewrote the quantization's divisions differently in the
    generic and AVX2 code, so a block multiplier differed by one); the test pins that case."""
    missing = X86_TABLES[kernel] - cpu_flags()
    if missing:
        pytest.skip(f"this CPU lacks {' '.join(sorted(missing))} for the {kernel} kernel")
    p = subprocess.run([str(ir_driver), kernel, str(1 << 30), "-v"], capture_output=True,
                       text=True, timeout=600)
    _check_driver_output(p, kernel)
    if kernel in TABLE_GEMM:
        assert "gemm b=1 G=576 cols=4200 T=8: equal" in p.stdout.splitlines(), p.stdout


def test_gcc_builds_every_kernel_warning_free(tmp_path):
    exe = _build_driver(tmp_path, "-O2", "-fopenmp", cc="gcc")
    best = next(n for n, need in X86_TABLES.items() if need <= cpu_flags())
    _check_driver_output(subprocess.run([str(exe), best], capture_output=True, text=True),
                         best)


AARCH64_SYSROOT = Path("/usr/aarch64-linux-gnu")


def test_neon_equals_reference_under_qemu(tmp_path):
    """The NEON table cross-compiled for aarch64 (Armv8.2-A + DotProd, against Debian's arm64
    cross libc) and run under qemu-aarch64: bit-exact against the scalar reference. The tools
    come from scripts/setup.sh (qemu-user, gcc-12-aarch64-linux-gnu, libc6-dev-arm64-cross)."""
    assert shutil.which("qemu-aarch64"), "qemu-aarch64 missing: run scripts/setup.sh"
    assert (AARCH64_SYSROOT / "lib" / "crt1.o").exists(), \
        "arm64 cross libc missing: run scripts/setup.sh"
    for march in ("armv8.2-a+dotprod", "armv8-a"):  # the kernel's target attribute suffices
        exe = _build_driver(tmp_path, "--target=aarch64-linux-gnu", f"-march={march}", "-O2")
        for kernel in ("neon", "generic"):
            p = subprocess.run(["qemu-aarch64", "-L", str(AARCH64_SYSROOT), str(exe), kernel],
                               capture_output=True, text=True, timeout=600)
            _check_driver_output(p, kernel)


@pytest.mark.parametrize("bits,G", [(4, 128), (4, 256), (4, 384), (4, 512), (6, 64), (6, 576),
                                    (6, 1088)])
def test_extreme_sums_are_exact_on_every_table(lib, bits, G):
    """The largest sub-block sums (every |m q| = 255 * 127 = 32385 against centroids of
    magnitude 127: |T| up to G * 127 * 32385, above 2^31 for G > 521) and sign patterns that
    give negative low and high bytes of m q: the VNNI kernels form T modulo 2^32 from
    (w + 128) * m q and a correction (b = 6: in runs of at most 512 columns), which must come
    out exact."""
    # whole steps, a partial last sub-block, a partial chunk of more (100) and of at most 64
    # columns (40: the zmm kernels take it in ymm)
    for extra in (100, 40):
        rows, cols = 9, 3 * G + extra
        S, K = -(-cols // G), 1 << bits
        rng = np.random.default_rng(G)
        cent = np.empty((rows, S, K))
        cent[0] = 127.0  # all centroids +127 (row 0) and -127 (row 1): the extreme sums
        cent[1] = -127.0
        cent[2:] = rng.choice([-127.0, 127.0, -1.0, 0.0, 64.0], size=(rows - 2, S, K))
        idx = rng.integers(0, K, size=(rows, cols), dtype=np.uint8)
        ct = CodebookTensor(bits=bits, group_size=G, codebooks=cent, indices=idx,
                            codebook_type="int8", scales=np.ones((rows, S), np.float16))
        for x in (np.ones(cols, np.float32),  # m = 255, q = 127 everywhere
                  np.where(np.arange(cols) % 3 == 0, -1.0, 1.0).astype(np.float32),
                  (rng.normal(size=cols) * rng.choice([1e-3, 1, 50], size=cols))
                  .astype(np.float32)):
            want = i8_gemv_np(ct, x)
            if x.min() == 1:  # T = (columns of the sub-block) * 127 * 32385, D = 1 / 32385
                D = float(np.float32(1) / np.float32(127 * 255))
                assert want[0] == np.float32(float(cols * 127 * 32385) * D) == -want[1]
            for kernel, need in X86_TABLES.items():
                if need <= cpu_flags():
                    got, rc = run_kernel(lib, kernel, ct, x)
                    assert rc == (kernel != "generic"), kernel
                    np.testing.assert_array_equal(got, want, err_msg=kernel)


def test_threads_do_not_change_bits(lib):
    rng = np.random.default_rng(3)
    ct = random_int8_tensor(rng, 1000, 576, 4, 256)
    x = rng.normal(size=576).astype(np.float32)
    payload = codebook_payload(ct)
    best = lib.kernel_active_name().decode()
    try:
        lib.omp_set_num_threads(1)
        one, _ = run_kernel(lib, best, ct, x, payload)
        lib.omp_set_num_threads(2)
        two, _ = run_kernel(lib, best, ct, x, payload)
    finally:
        lib.omp_set_num_threads(2)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(one, i8_gemv_np(ct, x))


# ------------------------------------------------------------------ whole model

def _int8_linear(mf, weights):
    """linear(h, name) for tests/native_reference.py emulating gemv() on an int8 model: each
    row of h quantized as act_quantize does (float32), exact integer sums per sub-block,
    combined in float64 (native/kernels/qgemv.h); f32 tensors in float64."""
    from ditto_pack_bits import unpack_indices

    cache = {}

    def tensor(name):
        if name not in cache:
            info = mf.tensors["token_embd.weight" if name == "output.weight"
                              and "output.weight" not in mf.tensors else name]
            p = np.asarray(mf.payload(info.name), np.uint8)
            rows, cols, G, b = info.rows, info.cols, info.group_size, info.bits
            S, K = -(-cols // G), 1 << b
            cent = p[:rows * S * K].view(np.int8).reshape(rows, S, K).astype(np.int64)
            sc = p[rows * S * K: rows * S * (K + 2)].view("<f2").reshape(rows, S)
            cb_bytes = -(-rows * S * (K + 2) // 64) * 64
            idx = unpack_indices(p[cb_bytes:].reshape(rows, -1), b, cols).astype(np.int64)
            Wint = cent[np.arange(rows)[:, None], np.arange(cols)[None, :] // G, idx]
            cache[name] = (Wint, sc.astype(np.float64), G)
        return cache[name]

    def linear(h, name):
        if mf.tensors.get(name, mf.tensors["token_embd.weight"]).codebook_type != "int8":
            return h @ weights[name].T
        Wint, sc, G = tensor(name)
        cols = Wint.shape[1]
        out = np.empty((h.shape[0], Wint.shape[0]))
        for t, row in enumerate(np.asarray(h, np.float32)):
            D, m, q = act_quantize_np(row)
            mq = m[np.arange(cols) // 32] * q[:cols]
            acc = np.zeros(Wint.shape[0])
            for s in range(sc.shape[1]):
                c = slice(s * G, min(s * G + G, cols))
                acc = acc + sc[:, s] * (Wint[:, c] @ mq[c]).astype(np.float64)
            out[t] = (acc * float(D)).astype(np.float32)
        return out

    return linear


def test_int8_model_logits_equal_numpy_reference(native_build, tmp_path):
    """A random model with every matrix an int8 codebook tensor (b = 1..8, G with and without
    the SIMD kernels' chunk, tails) run by ditto-run: its logits equal the NumPy reference
    forward with the int8 GEMV emulated, and stay close to the float-weights reference; the
    same with --batch-size 1 (to float rounding) and the same bits with every kernel table this
    CPU runs."""
    from ditto_core.model.modelfile import ModelFile
    from tests.fixtures_native import dump_logits, model_weights, rel_error, synthetic_model
    from tests.native_reference import reference_logits

    exe = native_build.run
    path = tmp_path / "int8.ditto"
    cfg, _ = synthetic_model(path, seed=4, tied=False, quantized=True, cb_types=("int8",),
                             group_sizes=(2, 3, 32, 32, 64, 37, 64, 5, 256))
    mf = ModelFile(path)
    assert {t.codebook_type for t in mf.tensors.values() if t.encoding == "codebook"} == {"int8"}
    assert {(t.bits, t.group_size) for t in mf.tensors.values()} >= {(4, 32)}
    _, w = model_weights(path)
    ids = np.random.default_rng(9).integers(0, cfg.vocab_size, size=24).tolist()
    got = dump_logits(exe, path, ids, tmp_path)
    emulated = reference_logits(cfg, w, ids, linear=_int8_linear(mf, w))
    # measured 2e-7 (float32 vs float64 elsewhere in the forward pass), 1.9e-2
    assert rel_error(got, emulated).max() <= 1e-5
    assert rel_error(got, reference_logits(cfg, w, ids)).max() <= 3e-2
    # batched prefill against token by token: the same bits (gemm_i8 equals gemv_i8 per row,
    # the grouped attention equals one head at a time, the rest is the same per-token code)
    one = dump_logits(exe, path, ids, tmp_path, "--batch-size", 1)
    np.testing.assert_array_equal(one, got)
    for tile in (5, 13):
        np.testing.assert_array_equal(
            dump_logits(exe, path, ids, tmp_path, "--batch-size", tile, "--threads", 2), got)
    for kernel, need in X86_TABLES.items():  # every table this CPU runs: the same bits
        if need <= cpu_flags():
            forced = dump_logits(exe, path, ids, tmp_path,
                                 env={"DITTO_KERNEL": kernel})
            np.testing.assert_array_equal(forced, got, err_msg=kernel)


def test_arm_runtime_runs_int8_model_under_qemu(native_build, tmp_path):
    """The whole runtime cross-compiled for aarch64 picks the NEON table by itself and its
    logits of the int8 model equal the x86 build's within float32 rounding (the integer GEMVs
    agree exactly; attention and norms are float code compiled for another ISA)."""
    from tests.fixtures_native import dump_logits, rel_error, synthetic_model

    assert shutil.which("qemu-aarch64"), "qemu-aarch64 missing: run scripts/setup.sh"
    exe = tmp_path / "ditto-run-aarch64"
    srcs = [str(f) for f in runtime_sources(NATIVE)]
    p = subprocess.run(["nice", "clang-22", "--target=aarch64-linux-gnu", *STD, "-O2", *WARN,
                        "-o", str(exe), *srcs, "-lm"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    path = tmp_path / "int8.ditto"
    synthetic_model(path, seed=4, tied=False, quantized=True, cb_types=("int8",),
                    group_sizes=(32, 64, 256, 37))
    ids = list(range(5, 21))
    x86 = dump_logits(native_build.run, path, ids, tmp_path)
    ids_file = tmp_path / "ids.json"
    out = tmp_path / "arm.f32"
    p = subprocess.run(["qemu-aarch64", "-L", str(AARCH64_SYSROOT), str(exe), "-m", str(path),
                        "--ids", str(ids_file), "--dump-logits", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert '"kernel": "neon"' in p.stderr
    arm = np.fromfile(out, "<f4").reshape(len(ids), -1)
    assert rel_error(arm, x86).max() <= 1e-5


class _Tensor(ctypes.Structure):
    """native/model/model.h Tensor."""
    _fields_ = [("name", ctypes.c_char_p), ("encoding", ctypes.c_uint32),
                ("codebook_type", ctypes.c_uint32), ("bits", ctypes.c_uint32),
                ("group_size", ctypes.c_uint32), ("rows", ctypes.c_uint64),
                ("cols", ctypes.c_uint64), ("data", ctypes.c_void_p), ("nbytes", ctypes.c_uint64),
                ("w8", ctypes.c_void_p), ("ndim", ctypes.c_uint32), ("tiled", ctypes.c_uint32)]


@pytest.mark.parametrize("bits,G,cols", [(4, 256, 576), (6, 576, 576), (4, 32, 100), (3, 7, 50),
                                         (5, 64, 200), (8, 32, 70), (2, 96, 33), (6, 64, 100),
                                         (1, 32, 64), (7, 32, 4200), (4, 4160, 4200)])
def test_gemm_rows_equal_gemv_bits(lib, bits, G, cols):
    """gemm_i8 (batched prefill; with G % 32 == 0 the table's GEMM kernel, which decodes each
    row once) gives each activation row exactly the definition's bits, on every table this
    CPU runs: 70 rows (4 panels of 16 and a partial one), T = 1, 5, 13, 20 inputs (blocks of 6
    and rests; 20 is past the few-input path)."""
    rng = np.random.default_rng(bits * G)
    rows = 70
    ct = random_int8_tensor(rng, rows, cols, bits, G)
    payload = np.frombuffer(codebook_payload(ct), np.uint8)
    W = _Tensor(b"w", 1, 2, bits, G, rows, cols, payload.ctypes.data, payload.size)
    X = rng.normal(size=(20, cols)).astype(np.float32)
    X[2] *= 1e3  # inputs of very different scales in one call
    X[3, : cols // 2] = 0
    want = np.array([i8_gemv_np(ct, X[t]) for t in range(20)])
    tables = [k for k in X86_TABLES if X86_TABLES[k] <= cpu_flags()] or [None]
    err = ctypes.create_string_buffer(256)
    try:
        for kernel in tables:
            if kernel:
                assert lib.kernels_select(kernel.encode(), err, len(err)) == 0, err.value
            for T in (1, 5, 13, 20):
                Y = np.full((T, rows), np.nan, np.float32)
                lib.gemm_i8_float_input(Y.ctypes.data, X[:T].ctypes.data, T, ctypes.byref(W))
                np.testing.assert_array_equal(Y, want[:T], err_msg=f"{kernel} T={T}")
    finally:
        assert lib.kernels_select(None, err, len(err)) == 0, err.value


def test_gemm_multi_equals_one_tensor_at_a_time(lib):
    """matmul_batch_multi (prefill's q/k/v and gate/up: the input quantized once, the tensors
    in one parallel region) gives each tensor gemm_i8's bits: three int8 tensors of different
    b, G and rows (the other encodings go through matmul_batch one at a time, which
    tests/test_native_prefill.py covers through the f32 and f16/f32 codebook models)."""
    rng = np.random.default_rng(17)
    cols, T = 320, 9
    specs = [(70, 4, 64), (33, 6, 320), (16, 3, 32)]
    tensors, payloads = [], []
    for rows, bits, G in specs:
        ct = random_int8_tensor(rng, rows, cols, bits, G)
        payloads.append(np.frombuffer(codebook_payload(ct), np.uint8))
        p = payloads[-1]
        tensors.append(_Tensor(b"w", 1, 2, bits, G, rows, cols, p.ctypes.data, p.size))
    X = rng.normal(size=(T, cols)).astype(np.float32)
    want = []
    for W, (rows, _, _) in zip(tensors, specs):
        Y = np.full((T, rows), np.nan, np.float32)
        lib.gemm_i8_float_input(Y.ctypes.data, X.ctypes.data, T, ctypes.byref(W))
        want.append(Y)
    outs = [np.full((T, rows), np.nan, np.float32) for rows, _, _ in specs]
    Yp = (ctypes.c_void_p * 3)(*[o.ctypes.data for o in outs])
    Wp = (ctypes.c_void_p * 3)(*[ctypes.addressof(W) for W in tensors])
    lib.matmul_batch_multi.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                       ctypes.c_void_p, ctypes.c_int]
    lib.matmul_batch_multi(Yp, X.ctypes.data, T, Wp, 3)
    for got, w in zip(outs, want):
        np.testing.assert_array_equal(got, w)


def test_gemv_multi_equals_one_tensor_at_a_time(lib):
    """gemv_multi (decode's q/k/v and gate/up: the input quantized once, the tensors in one
    parallel region) gives each tensor gemv()'s bits, which are the definition's: int8 tensors
    of different b, G and rows, one of them decoded to int8 at load where this CPU's table
    decodes; and a mix with an f32 tensor, which goes through gemv() one tensor at a time."""
    rng = np.random.default_rng(23)
    cols = 320
    specs = [(70, 4, 64), (33, 6, 320), (16, 3, 32)]
    tensors, payloads, cts = [], [], []
    for rows, bits, G in specs:
        ct = random_int8_tensor(rng, rows, cols, bits, G)
        cts.append(ct)
        payloads.append(np.frombuffer(codebook_payload(ct), np.uint8))
        p = payloads[-1]
        tensors.append(_Tensor(b"w", 1, 2, bits, G, rows, cols, p.ctypes.data, p.size))
    decoded = lib.kernels_decode_tensor(ctypes.byref(tensors[1]))
    assert decoded == int(lib.kernel_active_name().decode() in DECODING_TABLES)
    f32 = rng.normal(size=(24, cols)).astype(np.float32)
    tensors.append(_Tensor(b"f", 0, 0, 0, 0, 24, cols, f32.ctypes.data, f32.nbytes))
    x = rng.normal(size=cols).astype(np.float32)
    lib.gemv_multi.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    try:
        for group in ([0, 1, 2], [2, 0], [0, 3]):
            outs = [np.full(tensors[i].rows, np.nan, np.float32) for i in group]
            Yp = (ctypes.c_void_p * len(group))(*[o.ctypes.data for o in outs])
            Wp = (ctypes.c_void_p * len(group))(*[ctypes.addressof(tensors[i]) for i in group])
            lib.gemv_multi(Yp, x.ctypes.data, Wp, len(group))
            for i, got in zip(group, outs):
                want = np.full(tensors[i].rows, np.nan, np.float32)
                lib.gemv(want.ctypes.data, x.ctypes.data, ctypes.byref(tensors[i]))
                np.testing.assert_array_equal(got, want)
                if i < 3:
                    np.testing.assert_array_equal(got, i8_gemv_np(cts[i], x))
    finally:
        lib.kernels_free_tensor(ctypes.byref(tensors[1]))


@pytest.mark.parametrize("rows,row_bytes", [
    ([896, 128, 128], [448] * 3),                  # Qwen2.5-Coder-0.5B q/k/v at b = 4
    ([151936], [896]),                             # its decoded classifier
    ([8192, 1024, 1024], [4096] * 3),              # a 70B's q/k/v: 512 chunks from ~130 threads
    ([28672, 28672], [4096] * 2),                  # a 70B's gate/up
    ([5, 20, 0, 33], [16, 40, 8, 3000]),           # less than a run, an empty tensor
])
def test_row_chunks_cover_every_row_once(lib, rows, row_bytes):
    """kernels.c row_chunks, for 1 to 1,024 threads: each tensor's rows [0, rows) in order, in
    chunks that start on a multiple of 16 rows and end on one or at the tensor's end, no chunk
    across tensors, and no more than ROW_CHUNKS_MAX (512) + one per tensor (the table past 512 chunks, which
    hundreds of threads reach on a 70B's q/k/v, takes each tensor's rest whole)."""
    P = ctypes.c_void_p
    lib.row_chunks_for_test.argtypes = [ctypes.c_int, P, P, ctypes.c_int, P, P, P, ctypes.c_int]
    n = len(rows)
    R, B = np.array(rows, np.int32), np.array(row_bytes, np.int32)
    cap = 600
    tensor, r0, r1 = (np.zeros(cap, np.int32) for _ in range(3))
    for nt in (1, 2, 3, 8, 64, 129, 256, 1024):
        k = lib.row_chunks_for_test(n, R.ctypes.data, B.ctypes.data, nt, tensor.ctypes.data,
                                    r0.ctypes.data, r1.ctypes.data, cap)
        assert 0 <= k <= 512 + n, (nt, k)
        got = list(zip(tensor[:k].tolist(), r0[:k].tolist(), r1[:k].tolist()))
        for t in range(n):
            mine = [(a, b) for i, a, b in got if i == t]
            if rows[t] == 0:
                assert mine == [], (nt, t)
                continue
            assert mine[0][0] == 0 and mine[-1][1] == rows[t], (nt, t)
            for (a, b), (c, _) in zip(mine, mine[1:]):
                assert b == c and b % 16 == 0, (nt, t, a, b, c)
            assert all(a % 16 == 0 and a < b for a, b in mine), (nt, t)
        assert [i for i, _, _ in got] == sorted(i for i, _, _ in got), nt  # tensor by tensor
    assert lib.row_chunks_for_test(0, R.ctypes.data, B.ctypes.data, 2, tensor.ctypes.data,
                                   r0.ctypes.data, r1.ctypes.data, cap) == -1


def test_rows_claimed_by_any_team_give_the_definition_bits(lib):
    """gemv, gemv_multi and the prefill GEMMs (T = 3, one tensor and several) hand rows to the
    threads in claimed chunks (kernels.c row_chunks: runs of 16 rows, never across a tensor,
    sizes falling as rows run out): with 1, 2, 3 and 8 threads, every row of every tensor is
    written with the definition's bits. The tensors
    mix a tiled b = 4 matrix of 1,508 rows (many chunks, the last run partial at 4 rows), a
    decoded b = 6 one, a 5-row and a 20-row tensor (one chunk each, less than a run)."""
    rng = np.random.default_rng(31)
    cols = 512
    specs = [(1508, 4, 256), (5, 4, 64), (200, 6, 512), (20, 3, 32)]
    cts, payloads, tensors = [], [], []
    for rows, bits, G in specs:
        cts.append(random_int8_tensor(rng, rows, cols, bits, G))
        payloads.append(np.frombuffer(codebook_payload(cts[-1]), np.uint8).copy())
        p = payloads[-1]
        tensors.append(_Tensor(b"w", 1, 2, bits, G, rows, cols, p.ctypes.data, p.size))
    table = lib.kernel_active_name().decode()
    assert lib.kernels_tile_tensor(ctypes.byref(tensors[0])) == int(table in TILING_TABLES)
    assert lib.kernels_decode_tensor(ctypes.byref(tensors[2])) == int(table in DECODING_TABLES)
    X = rng.normal(size=(3, cols)).astype(np.float32)
    x = X[0]
    want = [np.array([i8_gemv_np(ct, X[t]) for t in range(3)]) for ct in cts]
    P = ctypes.c_void_p
    lib.gemv_multi.argtypes = [P, P, P, ctypes.c_int]
    lib.gemm_i8_float_input_multi.argtypes = [P, P, ctypes.c_int, P, ctypes.c_int]
    Wp = (P * 4)(*[ctypes.addressof(t) for t in tensors])
    try:
        for threads in (1, 2, 3, 8):
            lib.omp_set_num_threads(threads)
            outs = [np.full(t.rows, np.nan, np.float32) for t in tensors]
            lib.gemv_multi((P * 4)(*[o.ctypes.data for o in outs]), x.ctypes.data, Wp, 4)
            outs3 = [np.full((3, t.rows), np.nan, np.float32) for t in tensors]
            lib.gemm_i8_float_input_multi((P * 4)(*[o.ctypes.data for o in outs3]),
                                          X.ctypes.data, 3, Wp, 4)
            for i, got in enumerate(outs):
                what = f"{threads} threads, tensor {i}"
                np.testing.assert_array_equal(got, want[i][0], err_msg="gemv_multi " + what)
                np.testing.assert_array_equal(outs3[i], want[i], err_msg="gemm multi " + what)
                one = np.full(tensors[i].rows, np.nan, np.float32)
                lib.gemv(one.ctypes.data, x.ctypes.data, ctypes.byref(tensors[i]))
                np.testing.assert_array_equal(one, want[i][0], err_msg="gemv " + what)
                one3 = np.full((3, tensors[i].rows), np.nan, np.float32)
                lib.gemm_i8_float_input(one3.ctypes.data, X.ctypes.data, 3,
                                        ctypes.byref(tensors[i]))
                np.testing.assert_array_equal(one3, want[i], err_msg="gemm " + what)
    finally:
        lib.omp_set_num_threads(2)
        lib.kernels_free_tensor(ctypes.byref(tensors[2]))


#: the x86 tables that read weights decoded to int8 for b >= 5 (native/kernels/kernels.c i8_dec8)
DECODING_TABLES = {"avx512vnni", "avxvnni", "avx2"}


@pytest.mark.parametrize("bits,G,cols", [(6, 576, 576), (6, 64, 100), (6, 32, 4200),
                                         (5, 64, 200), (7, 32, 77), (8, 96, 300),
                                         (6, 4160, 4200), (4, 256, 576), (6, 7, 50)])
def test_decoded_weights_give_the_reference_bits(lib, bits, G, cols):
    """Weights decoded to int8 once (the classifier at load: kernels_decode_tensor) and the
    table's decoded-weight kernel give the definition's bits: b >= 5 with G % 32 == 0 on the
    tables that decode (b = 6 at G = cols is the default classifier; 4200 columns pass the
    int32 lanes' 128-chunk limit; 77 and 100 leave a partial chunk), and b = 4 or G % 32 != 0
    fall back to the row kernels (return 0)."""
    rng = np.random.default_rng(bits * 1000 + G)
    rows = 13  # three groups of four rows and a short one
    ct = random_int8_tensor(rng, rows, cols, bits, G)
    x = (rng.normal(size=cols) * rng.choice([1e-3, 1, 50], size=cols)).astype(np.float32)
    want = i8_gemv_np(ct, x)
    payload = np.frombuffer(codebook_payload(ct), np.uint8)
    for kernel, need in X86_TABLES.items():
        if not need <= cpu_flags():
            continue
        y = np.full(rows, np.nan, np.float32)
        rc = lib.i8cb_gemv_decoded_with(kernel.encode(), y.ctypes.data, x.ctypes.data,
                                        payload.ctypes.data, bits, G, rows, cols)
        decodes = kernel in DECODING_TABLES and bits >= 5 and min(G, cols) % 32 == 0
        assert rc == int(decodes), kernel
        np.testing.assert_array_equal(y, want, err_msg=kernel)


def test_gemv_reads_the_decoded_tensor(lib):
    """kernels_decode_tensor fills Tensor.w8 on each decoding table this CPU runs (selected as
    --kernel does) for a b = 6 tensor (and not for b = 4), gemv() then reads w8 with the
    reference bits, and kernels_free_tensor clears it; on a table that decodes nothing
    (avx512vbmi), kernels_decode_tensor leaves w8 NULL."""
    tables = [k for k in X86_TABLES if X86_TABLES[k] <= cpu_flags()]
    if not any(k in DECODING_TABLES for k in tables):
        pytest.skip("this CPU runs none of the tables that decode")
    err = ctypes.create_string_buffer(256)
    try:
        for kernel in tables:
            assert lib.kernels_select(kernel.encode(), err, len(err)) == 0, err.value
            assert lib.kernel_active_name().decode() == kernel
            _check_decoded_gemv(lib, kernel in DECODING_TABLES)
    finally:
        assert lib.kernels_select(None, err, len(err)) == 0, err.value


def test_decoded_tensor_larger_than_a_huge_page(lib):
    """A decoded tensor of 2 MiB or more (Qwen2.5-Coder's classifier: 136 MB) lies on a
    2 MiB boundary, so Linux can back it with transparent huge pages, and still gives the
    reference bits."""
    tables = [k for k in X86_TABLES if X86_TABLES[k] <= cpu_flags() and k in DECODING_TABLES]
    if not tables:
        pytest.skip("this CPU runs none of the tables that decode")
    err = ctypes.create_string_buffer(256)
    try:
        assert lib.kernels_select(tables[0].encode(), err, len(err)) == 0, err.value
        _check_decoded_gemv(lib, True, rows=1100, cols=2048, huge=True)
    finally:
        assert lib.kernels_select(None, err, len(err)) == 0, err.value


def tiled_dec8(w):
    """The decoded int8 layout of native/kernels/qgemv.h (DEC8_TILE): rows padded with zeros to
    a multiple of 4 and columns to a multiple of 32, then per tile of 4 rows the 32-column
    chunks of its rows side by side (chunk j of row i at byte (4 j + i) 32). Returns the bytes
    as a flat int8 array."""
    rows, cols = w.shape
    R, C = -(-rows // 4) * 4, -(-cols // 32) * 32
    p = np.zeros((R, C), np.int8)
    p[:rows, :cols] = w
    return p.reshape(R // 4, 4, C // 32, 32).transpose(0, 2, 1, 3).reshape(-1)


def _check_decoded_gemv(lib, decodes, rows=70, cols=576, huge=False):
    rng = np.random.default_rng(3)
    for bits, decoded in ((6, int(decodes)), (4, 0)):
        ct = random_int8_tensor(rng, rows, cols, bits, cols)
        payload = np.frombuffer(codebook_payload(ct), np.uint8)
        W = _Tensor(b"w", 1, 2, bits, cols, rows, cols, payload.ctypes.data, payload.size)
        assert lib.kernels_decode_tensor(ctypes.byref(W)) == decoded
        assert bool(W.w8) == bool(decoded)
        if decoded:  # the decoded weights are the centroids of the indices, zero-padded
            if huge:
                assert W.w8 % (2 << 20) == 0
            cent = np.rint(ct.codebooks / ct.scales.astype(np.float64)[..., None])
            want = tiled_dec8(cent[np.arange(rows)[:, None], 0, ct.indices])
            w8 = np.ctypeslib.as_array(ctypes.cast(W.w8, ctypes.POINTER(ctypes.c_int8)),
                                       want.shape)
            np.testing.assert_array_equal(w8, want)
        x = rng.normal(size=cols).astype(np.float32)
        y = np.full(rows, np.nan, np.float32)
        lib.gemv(y.ctypes.data, x.ctypes.data, ctypes.byref(W))
        np.testing.assert_array_equal(y, i8_gemv_np(ct, x))
        lib.kernels_free_tensor(ctypes.byref(W))
        assert not W.w8


#: the tables that put b = 4 indices in row tiles at load (kernels.c i8_b4_tiled)
TILING_TABLES = {"avx2", "avx512vbmi"}


def row_tiles(idx_bytes: np.ndarray) -> np.ndarray:
    """qgemv.h's row tiles of b = 4 index bytes [rows, row_bytes] (rows % 4 == 0, row_bytes %
    32 == 0): per tile of 4 rows, chunk j (32 bytes) of row i at byte (4 j + i) 32."""
    rows, rb = idx_bytes.shape
    return idx_bytes.reshape(rows // 4, 4, rb // 32, 32).transpose(0, 2, 1, 3).reshape(-1)


@pytest.mark.parametrize("rows,cols,G,tiled", [
    (72, 576, 64, 1), (72, 640, 128, 1), (40, 1536, 256, 1), (8, 1024, 512, 1),
    (72, 576, 256, 1),  # a last sub-block of 64 columns (avx512vbmi: the ymm step)
    (8, 960, 192, 1),   # G % 128 == 64 (avx512vbmi: the any-b kernel on the tiles)
    (72, 576, 576, 0),  # a sub-block past 512 columns: int32 sums no longer hold
    (70, 576, 64, 0),   # rows not whole tiles
    (72, 608, 32, 0),   # chunks and sub-blocks not whole 64-column runs
])
def test_row_tiles_give_the_reference_bits(lib, monkeypatch, rows, cols, G, tiled):
    """kernels_tile_tensor puts a b = 4 tensor's index bytes in row tiles in place (exactly the
    bytes of row_tiles) only on a table that reads them (avx2, avx512vbmi) and only where every tile,
    chunk and sub-block is whole; then gemv (the tiled four-row kernel), gemm_i8_float_input
    (the GEMM, T = 1, 5, 20) and, with another table selected afterwards, the scalar reference
    reading the tiles all give the definition's bits. DITTO_TILES=0 turns tiling off."""
    tables = [k for k in X86_TABLES if X86_TABLES[k] <= cpu_flags()]
    rng = np.random.default_rng(rows + cols + G)
    ct = random_int8_tensor(rng, rows, cols, 4, G)
    X = rng.normal(size=(20, cols)).astype(np.float32)
    X[1] *= 1e3
    want = np.array([i8_gemv_np(ct, X[t]) for t in range(20)])
    err = ctypes.create_string_buffer(256)
    try:
        for kernel in tables:
            assert lib.kernels_select(kernel.encode(), err, len(err)) == 0, err.value
            payload = np.frombuffer(codebook_payload(ct), np.uint8).copy()
            file_order = payload.copy()
            W = _Tensor(b"w", 1, 2, 4, G, rows, cols, payload.ctypes.data, payload.size)
            monkeypatch.setenv("DITTO_TILES", "0")
            assert lib.kernels_tile_tensor(ctypes.byref(W)) == 0 and W.tiled == 0
            monkeypatch.delenv("DITTO_TILES")
            expect = tiled if kernel in TILING_TABLES else 0
            assert lib.kernels_tile_tensor(ctypes.byref(W)) == expect, kernel
            assert W.tiled == expect
            n_idx = rows * cols // 2
            head = payload.size - n_idx
            np.testing.assert_array_equal(payload[:head], file_order[:head])
            if expect:
                np.testing.assert_array_equal(
                    payload[head:], row_tiles(file_order[head:].reshape(rows, cols // 2)))
            else:
                np.testing.assert_array_equal(payload, file_order)
            readers = [kernel] + (["generic"] if expect else [])
            for reader in readers:  # the tiles read through another table's fallback too
                assert lib.kernels_select(reader.encode(), err, len(err)) == 0, err.value
                y = np.full(rows, np.nan, np.float32)
                lib.gemv(y.ctypes.data, X[0].ctypes.data, ctypes.byref(W))
                np.testing.assert_array_equal(y, want[0], err_msg=f"{kernel}/{reader} gemv")
                for T in (1, 5, 20):
                    Y = np.full((T, rows), np.nan, np.float32)
                    lib.gemm_i8_float_input(Y.ctypes.data, X[:T].ctypes.data, T,
                                            ctypes.byref(W))
                    np.testing.assert_array_equal(Y, want[:T],
                                                  err_msg=f"{kernel}/{reader} T={T}")
    finally:
        assert lib.kernels_select(None, err, len(err)) == 0, err.value
