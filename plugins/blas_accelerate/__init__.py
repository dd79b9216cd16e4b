"""Ditto default plugin blas_accelerate (not yet implemented)."""
