"""Ditto default plugin ``pack_bits``: the ``bits`` packer (docs/FORMAT.md, CODEBOOK encoding).

The codec it writes with is ``ditto_core.model.codebook`` (the one owner of the CODEBOOK encoding),
re-exported here for the components and tests that use it: ``pack_indices``/``unpack_indices``
(exact b-bit packing), ``codebook_payload`` (CodebookTensor → payload bytes), ``split_payload``
and ``dequantize`` (payload → float32 weights).
"""

from ditto_core.model.codebook import (codebook_payload, dequantize, pack_indices, row_bytes,
                                       split_payload, unpack_indices)
from ditto_core.kit.hookspecs import hookimpl

from .packer import BitsPacker, plan_infos

__all__ = ["BitsPacker", "codebook_payload", "dequantize", "pack_indices", "plan_infos",
           "row_bytes", "split_payload", "unpack_indices"]


@hookimpl
def register_packers(register):
    register(BitsPacker())
