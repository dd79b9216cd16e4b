"""Ditto's hook specifications: one registration hook per pipeline stage, in pipeline order.

A plugin is a module (or object) listed under the entry-point group ``ditto``; pluggy calls each
of its ``register_*`` hooks with a ``register`` callable, and the plugin calls
``register(component)`` once per component it provides. A component is an object with a ``name``
attribute (what users type: ``--quantizer kmeans``) and the methods of its stage's Protocol in
``ditto_core.components``. The default plugins register through this same mechanism.
"""

import pluggy

hookspec = pluggy.HookspecMarker("ditto")
hookimpl = pluggy.HookimplMarker("ditto")


@hookspec
def register_exporters(register):
    """Stage 1, export. Register ``Exporter`` components that read a checkpoint (HF directory,
    GGUF file, ...) into a ``Checkpoint``. ``ditto export``/``build`` picks the first exporter
    whose ``can_load(path)`` is true, or the one named by ``--exporter``."""


@hookspec
def register_quantizers(register):
    """Stage 2, quantize. Register ``Quantizer`` components (``--quantizer NAME``) that turn a
    ``Checkpoint`` into a ``QuantizedModel``."""


@hookspec
def register_packers(register):
    """Stage 3, pack. Register ``Packer`` components that write a ``QuantizedModel`` to a model
    file (docs/FORMAT.md), atomically."""


@hookspec
def register_ir_emitters(register):
    """Stage 4, emit IR. Register ``IREmitter`` components that compile C sources to an
    ``IRModule`` (LLVM IR text)."""


@hookspec
def register_ir_passes(register):
    """Stage 5, rewrite. Register ``IRPass`` components that transform an ``IRModule`` and report
    what they changed (``PassReport``). The pipeline runs every enabled pass in order."""


@hookspec
def register_blas_targets(register):
    """Stage 6 input. Register ``BlasTarget`` components (``--blas NAME``): symbol names,
    header and link flags of a BLAS library, and whether it is available here."""


@hookspec
def register_linkers(register):
    """Stage 6, link. Register ``Linker`` components that optimise an ``IRModule`` for the host
    CPU and link it with a ``BlasTarget`` into an executable."""
