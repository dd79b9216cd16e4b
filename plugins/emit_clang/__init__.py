"""Ditto default plugin emit_clang (not yet implemented)."""
