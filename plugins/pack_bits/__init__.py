"""Ditto default plugin pack_bits (not yet implemented)."""
