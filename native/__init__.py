"""The C inference runtime sources, shipped as package data (see native/README.md)."""
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent

#: The GEMV/GEMM kernel sources with their dispatch tables: what a program linking the kernels
#: alone (tests through ctypes, drivers, benchmarks) compiles, besides its own main.
KERNEL_SOURCES = ("matmul.c", "gemm.c", "codebook_ref.c", "gemm_avx2.c", "codebook_avx2.c",
                  "codebook_avx512.c", "kernels.c", "qgemv_generic.c", "qgemv_avx2.c", "qgemm_avx2.c",
                  "qact_avx2.c", "qgemv_avx512.c", "qgemv_neon.c", "qgemm_neon.c")
