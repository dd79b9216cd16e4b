"""Ditto default plugin ``pack_bits``: the ``bits`` packer (docs/FORMAT.md, CODEBOOK encoding).

Also the reference codec other components and tests use: ``pack_indices``/``unpack_indices``
(exact b-bit packing), ``codebook_payload`` (CodebookTensor → payload bytes) and ``dequantize``
(payload → float32 weights).
"""

from ditto_core.hookspecs import hookimpl

from .bitpack import (codebook_payload, dequantize, pack_indices, row_bytes, split_payload,
                      unpack_indices)
from .packer import BitsPacker, plan_infos

__all__ = ["BitsPacker", "codebook_payload", "dequantize", "pack_indices", "plan_infos",
           "row_bytes", "split_payload", "unpack_indices"]


@hookimpl
def register_packers(register):
    register(BitsPacker())
