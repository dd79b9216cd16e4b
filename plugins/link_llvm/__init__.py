"""Ditto default plugin link_llvm (not yet implemented)."""
