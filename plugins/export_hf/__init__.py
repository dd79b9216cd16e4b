"""Ditto default plugin export_hf (not yet implemented)."""
