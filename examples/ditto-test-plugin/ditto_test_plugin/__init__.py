"""Example third-party Ditto plugin: the ``test-identity`` quantizer (every tensor fp32)."""

import numpy as np

from ditto_core.hookspecs import hookimpl
from ditto_core.types import QuantizedModel


class IdentityQuantizer:
    """Quantizer ``test-identity``: plans and returns every tensor as float32, unchanged."""

    name = "test-identity"

    def quantize(self, checkpoint, options):
        names = list(checkpoint.shapes)

        def tensors():
            for n in names:
                yield n, np.ascontiguousarray(checkpoint.tensors[n](), dtype=np.float32)

        return QuantizedModel(config=checkpoint.config, tokenizer=checkpoint.tokenizer,
                              plan={n: ("f32", None) for n in names},
                              shapes=dict(checkpoint.shapes), tensors=tensors,
                              report={"quantizer": self.name})


@hookimpl
def register_quantizers(register):
    register(IdentityQuantizer())
