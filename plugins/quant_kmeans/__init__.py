"""Ditto default plugin ``quant_kmeans``: the ``kmeans`` quantizer (sub-block 1-D k-means
codebooks, methods ``optimal`` and ``lloyd``; docs/QUANT.md)."""

from ditto_core.kit.hookspecs import hookimpl

from .quantizer import (DEFAULT_METHOD, METHODS, KMeansQuantizer, check_options, plan_tensors,
                        plan_with_reasons, quantize_matrix)

__all__ = ["DEFAULT_METHOD", "METHODS", "KMeansQuantizer", "check_options", "plan_tensors",
           "plan_with_reasons", "quantize_matrix"]


@hookimpl
def register_quantizers(register):
    register(KMeansQuantizer())
