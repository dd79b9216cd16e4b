"""Ditto default plugin export_gguf (not yet implemented)."""
