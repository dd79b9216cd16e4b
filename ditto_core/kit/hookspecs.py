"""Ditto's hook specifications: one registration hook per pipeline stage, in pipeline order.

The seven component kinds, in pipeline order, and their names everywhere (hook, CLI flag,
``Registry`` key, ``ditto plugins``): exporter, quantizer, packer, emitter, pass, linker, blas.

A plugin is a module (or object) listed under the entry-point group ``ditto``; pluggy calls each
of its ``register_*`` hooks with a ``register`` callable, and the plugin calls
``register(component)`` once per component it provides. A component is an object with a ``name``
attribute (what users type: ``--quantizer kmeans``) and the methods of its stage's Protocol in
``ditto_core.kit.components``. The default plugins register through this same mechanism.
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
def register_emitters(register):
    """Stage 4, emit IR. Register ``IREmitter`` components (``--emitter NAME``, default
    ``clang``) that compile C sources to an ``IRModule`` (LLVM IR text)."""


@hookspec
def register_passes(register):
    """Stage 5, rewrite. Register ``IRPass`` components (``--pass NAME``, repeatable, default
    ``gemv-blas``) that transform an ``IRModule`` and report what they changed
    (``PassReport``). A build runs the named passes in the order given."""


@hookspec
def register_linkers(register):
    """Stage 6, link. Register ``Linker`` components (``--linker NAME``, default ``llvm``) that
    optimise an ``IRModule`` and link it with a ``BlasTarget`` into an executable."""


@hookspec
def register_blas(register):
    """Stage 6 input. Register ``BlasTarget`` components (``--blas NAME``): symbol names,
    compile and link flags of a BLAS library, and whether it is available here."""


# Earlier names of three hooks, still called (their components join the same stage).
@hookspec
def register_ir_emitters(register):
    """Same as ``register_emitters``."""


@hookspec
def register_ir_passes(register):
    """Same as ``register_passes``."""


@hookspec
def register_blas_targets(register):
    """Same as ``register_blas``."""
