"""Ditto default plugin quant_kmeans (not yet implemented)."""
