"""Ditto default plugin pass_gemv_blas: the IR pass ``gemv-blas`` (stage 5, rewrite).

Finds naive GEMV loop nests (``y[i] = Σ_k A[i*ld+k]·x[k]`` and its variants) in LLVM IR and
replaces each by a guarded call to the BLAS target's ``cblas_sgemv``/``cblas_dgemv``; see
docs/PASS.md.
"""

import os

from ditto_core.hookspecs import hookimpl

from .gemv_pass import GemvBlasPass

__all__ = ["GemvBlasPass"]


@hookimpl
def register_ir_passes(register):
    """Register ``gemv-blas``. Environment: ``DITTO_GEMV_OMP`` = ``single`` (default) |
    ``region`` | ``blas`` (OpenMP option, docs/PASS.md), ``DITTO_GEMV_STRICT=1`` to rewrite
    reductions without reassoc flags too."""
    register(GemvBlasPass(allow_strict=os.environ.get("DITTO_GEMV_STRICT", "") == "1",
                          omp_threads=os.environ.get("DITTO_GEMV_OMP", "single")))
