"""Ditto default plugin blas_openblas (not yet implemented)."""
