"""Example Ditto quantizer ``quantile``, built on the quantizer kit (ditto_core.kit.quantkit):
each sub-block's codebook is its 2^b quantiles at (i + 1/2) / 2^b, and each weight takes the
index of the nearest one. Planning, rules, streaming, checks and the report come from the kit."""

import numpy as np

from ditto_core.kit.hookspecs import hookimpl
from ditto_core.kit.quantkit import CodebookQuantizer
from ditto_core.model.codebook import n_centroids


class QuantileQuantizer(CodebookQuantizer):
    """Quantizer ``quantile`` (``ditto build --quantizer quantile``)."""

    name = "quantile"

    def quantize_matrix(self, weights, bits, group_size, options):
        """weights float32 [rows, cols] → (indices uint8 [rows, cols], codebooks
        [rows, S, 2^b]), S = ceil(cols / G)."""
        k = n_centroids(bits)
        levels = (np.arange(k) + 0.5) / k
        indices = np.empty(weights.shape, np.uint8)
        codebooks = []
        for a in range(0, weights.shape[1], group_size):
            x = weights[:, a:a + group_size]
            cb = np.quantile(x, levels, axis=1).T  # [rows, k], ascending
            indices[:, a:a + group_size] = np.abs(x[:, :, None] - cb[:, None, :]).argmin(-1)
            codebooks.append(cb)
        return indices, np.stack(codebooks, axis=1)


@hookimpl
def register_quantizers(register):
    register(QuantileQuantizer())
