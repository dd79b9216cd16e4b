"""The int8 GEMM kernels of batched prefill (KernelTable.i8_gemm:
native/kernels/arch/x86/qgemm_avx2.c with its AVX2, AVX-VNNI and AVX-512 VNNI multiply-adds,
native/kernels/arch/arm/qgemm_neon.c) against the scalar reference GEMV, bit for bit, through tests/qgemm_driver.c: b = 1..8, G <= 512 and G > 512, row
lengths with and without a partial 32-column chunk, T = 1..9 inputs, several row ranges (rows
outside the range untouched).

x86 tables run natively under ASan + UBSan and built through Ditto's IR pipeline (a table this
CPU cannot run is skipped with the missing features named); the NEON table is cross-compiled
for aarch64 and run under qemu-aarch64, as tests/test_kernels_int.py runs its GEMV kernels.
"""

import shutil
import subprocess

import pytest

from tests.fixtures_native import cc_parallel
from tests.test_kernels_int import (AARCH64_SYSROOT, NATIVE, SRC, STD, WARN, X86_TABLES,
                                    cpu_flags)

DRIVER = NATIVE.parent / "tests" / "qgemm_driver.c"
#: the driver's cases (tests/qgemm_driver.c): b = 1..8 x these G x these row lengths, where
#: min(G, cols) % 32 == 0 (the GEMM slot's contract), each on 4 row ranges
GEMM_GROUPS = (32, 64, 256, 512, 576, 4160)
GEMM_LENGTHS = (32, 33, 100, 257, 576, 1000, 4200)
#: the x86 tables with a GEMM kernel (native/kernels/kernels.c)
X86_GEMM_TABLES = [k for k in X86_TABLES if k != "generic"]


def expected_line():
    n = 8 * sum(min(G, cols) % 32 == 0 for G in GEMM_GROUPS for cols in GEMM_LENGTHS)
    return f"ok {n} cases, {4 * n} GEMM calls"


def build_driver(tmp_path, *flags, name="qgemm_driver", cc="clang-22"):
    exe = tmp_path / name
    p = cc_parallel(cc, [*STD, *WARN, *flags, f"-I{NATIVE}"], [DRIVER, *SRC], exe)
    assert p.returncode == 0, p.stderr
    return exe


def check(p):
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.splitlines()[-1] == expected_line(), p.stdout


@pytest.fixture(scope="module")
def asan_driver(tmp_path_factory):
    return build_driver(tmp_path_factory.mktemp("qgemm_asan"), "-O1", "-g", "-fopenmp",
                        "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                        "-fno-sanitize-recover=undefined")


@pytest.mark.parametrize("kernel", X86_GEMM_TABLES)
def test_x86_gemm_equals_reference_under_asan(asan_driver, kernel):
    skip_unless_cpu_runs(kernel)
    check(subprocess.run([str(asan_driver), kernel], capture_output=True, text=True,
                         timeout=600))


def skip_unless_cpu_runs(kernel):
    missing = X86_TABLES[kernel] - cpu_flags()
    if missing:
        pytest.skip(f"this CPU lacks {' '.join(sorted(missing))} for the {kernel} kernel")


@pytest.fixture(scope="module")
def ir_driver(tmp_path_factory):
    """The driver built as the runtime is (clang-22 -O1 IR, llvmlite O3 for the host,
    per-function target attributes kept)."""
    from ditto_core.stages.cc import compile_c

    exe, _ = compile_c([DRIVER, *SRC], blas=None,
                       out=tmp_path_factory.mktemp("qgemm_ir") / "qgemm_driver",
                       include_dirs=[NATIVE], openmp=True)
    return exe


@pytest.mark.parametrize("kernel", X86_GEMM_TABLES)
def test_x86_gemm_equals_reference_through_ir_pipeline(ir_driver, kernel):
    skip_unless_cpu_runs(kernel)
    check(subprocess.run([str(ir_driver), kernel], capture_output=True, text=True,
                         timeout=600))


def test_table_without_gemm_is_refused(asan_driver):
    p = subprocess.run([str(asan_driver), "generic"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip() == "kernel generic: no GEMM kernel"


def test_neon_gemm_equals_reference_under_qemu(tmp_path):
    """The NEON GEMM (tbl decode once per row, sdot against four inputs per weight load)
    cross-compiled for aarch64 against Debian's arm64 cross libc and run under qemu-aarch64:
    bit-exact against the scalar reference GEMV, with and without +dotprod in -march (the
    kernel's target attribute suffices), and built by gcc as well as clang-22."""
    assert shutil.which("qemu-aarch64"), "qemu-aarch64 missing: run scripts/setup.sh"
    assert (AARCH64_SYSROOT / "lib" / "crt1.o").exists(), \
        "arm64 cross libc missing: run scripts/setup.sh"
    builds = [("clang-22", "--target=aarch64-linux-gnu", "-march=armv8.2-a+dotprod"),
              ("clang-22", "--target=aarch64-linux-gnu", "-march=armv8-a"),
              ("aarch64-linux-gnu-gcc-12", "-march=armv8-a", "-fopenmp")]
    for i, (cc, *flags) in enumerate(builds):
        exe = build_driver(tmp_path, *flags, "-O2", name=f"qgemm_driver_{i}", cc=cc)
        check(subprocess.run(["qemu-aarch64", "-L", str(AARCH64_SYSROOT), str(exe), "neon"],
                             capture_output=True, text=True, timeout=600))
        p = subprocess.run(["qemu-aarch64", "-L", str(AARCH64_SYSROOT), str(exe), "generic"],
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 2 and p.stderr.strip() == "kernel generic: no GEMM kernel"
