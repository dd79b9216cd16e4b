"""Ditto default plugin pass_gemv_blas (not yet implemented)."""
