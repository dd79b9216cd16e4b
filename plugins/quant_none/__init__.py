"""Ditto default plugin quant_none (not yet implemented)."""
