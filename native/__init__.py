"""The C inference runtime sources, shipped as package data (see native/README.md).

One folder per concern, every ``#include`` of another folder spelled from this directory
(compile with ``-I`` it): ``app/`` the command line (``main.c``), ``io/`` the files the program
reads and writes besides the model, ``model/`` the model file (format, loading, validation),
``runtime/`` the forward passes, sampling and the C API (``ditto.h``), ``kernels/`` the
dispatchers, kernel tables and scalar references with ``kernels/arch/x86`` and
``kernels/arch/arm`` beside them, ``tokenizer/`` with its generated tables in
``tokenizer/unicode/``. ``fuzz/`` holds the libFuzzer targets, not part of the runtime.
"""
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent

#: The folders whose ``.c`` files (recursively) make up the runtime, in link order.
RUNTIME_DIRS = ("app", "io", "model", "runtime", "kernels", "tokenizer")

#: The GEMV/GEMM kernel sources with their dispatch tables, relative to SOURCE_DIR: what a
#: program linking the kernels alone (tests through ctypes, drivers, benchmarks) compiles,
#: besides its own main.
KERNEL_SOURCES = ("kernels/matmul.c", "kernels/gemm.c", "kernels/codebook_ref.c",
                  "kernels/arch/x86/gemm_avx2.c", "kernels/arch/x86/codebook_avx2.c",
                  "kernels/arch/x86/codebook_avx512.c", "kernels/kernels.c",
                  "kernels/qgemv_generic.c", "kernels/arch/x86/qgemv_avx2.c",
                  "kernels/arch/x86/qgemm_avx2.c", "kernels/arch/x86/qact_avx2.c",
                  "kernels/arch/x86/qgemv_avx512.c", "kernels/arch/arm/qgemv_neon.c",
                  "kernels/arch/arm/qgemm_neon.c")
