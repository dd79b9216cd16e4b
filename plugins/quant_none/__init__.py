"""Ditto default plugin ``quant_none``: the ``none`` quantizer keeps every tensor in fp32.

It is the identity of the quantize stage: ``ditto build --quantizer none`` gives a model file
whose tensors equal the exported ones bit for bit (the reference the quantized builds are
compared against)."""

from __future__ import annotations

import numpy as np

from ditto_core.base.types import Checkpoint, QuantizedModel
from ditto_core.kit.components import QuantOptions
from ditto_core.kit.hookspecs import hookimpl


class NoneQuantizer:
    """Quantizer component ``none``: plan ``("f32", None)`` for every tensor."""

    name = "none"

    def quantize(self, checkpoint: Checkpoint, options: QuantOptions) -> QuantizedModel:
        """Every tensor of ``checkpoint`` as float32, in checkpoint order, loaded lazily.
        ``options`` are ignored (there is nothing to choose)."""
        names = list(checkpoint.shapes)
        report = {"quantizer": self.name, "tensors": {n: {"encoding": "f32"} for n in names}}

        def tensors():
            for name in names:
                yield name, np.ascontiguousarray(checkpoint.tensors[name](), dtype=np.float32)

        return QuantizedModel(config=checkpoint.config, tokenizer=checkpoint.tokenizer,
                              plan={n: ("f32", None) for n in names},
                              shapes=dict(checkpoint.shapes), tensors=tensors, report=report)


@hookimpl
def register_quantizers(register):
    register(NoneQuantizer())
