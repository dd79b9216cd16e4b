"""Ditto default plugin pass_gemv_blas: the IR pass ``gemv-blas`` (stage 5, rewrite).

Finds naive GEMV loop nests (``y[i] = Σ_k A[i*ld+k]·x[k]`` and its variants) in LLVM IR and
replaces each by a guarded call to the BLAS target's ``cblas_sgemv``/``cblas_dgemv``; see
docs/PASS.md.
"""

from ditto_core.kit.hookspecs import hookimpl

from .gemv_pass import GemvBlasPass

__all__ = ["GemvBlasPass"]


@hookimpl
def register_passes(register):
    """Register ``gemv-blas`` with its default options (``-O gemv-blas.omp_threads=...``,
    ``-O gemv-blas.strict=true``; ``GemvBlasPass.Options``)."""
    register(GemvBlasPass())
