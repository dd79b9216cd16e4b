"""The typed interface of each stage's components (typing.Protocol), with their contracts.

Every component has a ``name`` (what users type after its stage's flag) and may declare options:
a nested attrs class ``Options`` and a method ``with_options(options) -> component`` returning
a configured copy (``Configurable``; ``ditto_core.base.options``, docs/PLUGINS.md).

Errors: every component raises ``ditto_core.base.errors.DittoError`` (or a subclass) with a message
naming the offending file or tensor and the problem; anything else is a bug.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import attrs

from ditto_core.base.types import Checkpoint, IRModule, PassReport, QuantizedModel


@runtime_checkable
class Configurable(Protocol):
    """A component with options (any kind): ``Options`` is an attrs class whose fields are made
    with ``ditto_core.base.options.option`` (default, doc, validator)."""

    name: str
    Options: type

    def with_options(self, options) -> "Configurable":
        """A copy of this component configured with ``options`` (an ``Options`` instance)."""


@runtime_checkable
class Exporter(Protocol):
    name: str

    def can_load(self, path: Path) -> bool:
        """True if ``path`` looks like this exporter's format (cheap: no weights read)."""

    def load(self, path: Path) -> Checkpoint:
        """Read config and tokenizer, and index tensors lazily. Raises DittoError naming the
        file for a missing/truncated/unsupported input or a shape that does not match config."""


@attrs.frozen
class QuantOptions:
    """Options of the quantize stage. ``bits`` b in 1..8, ``group_size`` G in 2..2^24, ``keep_fp32``
    glob patterns over tensor names kept in fp32 (norms always are), ``method`` a quantizer
    specific name (kmeans: "optimal" | "lloyd"), ``codebook_type`` "f16" | "f32" | "int8";
    ``tensor_types``: ``GLOB=SPEC`` rules (``--tensor-type``, ``ditto_core.kit.quantkit``), the
    first matching one decides a tensor's encoding, b, G or codebook type. ``importance``: path
    of an importance file (``ditto_core.eval.calibration``: per tensor, the mean squared activation
    of each input channel) that quantizers may weight their error with (kmeans does; None:
    unweighted). ``target_bpw`` / ``max_size_of`` (a file whose byte size is the budget): the
    file-size budget under which quantizers that support it choose each tensor's b and G
    (``ditto_core.kit.allocate``; explicit ``tensor_types`` rules and ``keep_fp32`` win).
    ``speed_table``: with a budget, the name of the GEMV kernel table
    (``ditto_core.model.kernel_paths``) on which the plan's modelled GEMV time is held to
    ``allocate.SPEED_SLACK`` above the default plan's (None: the byte budget alone)."""

    bits: int = 4
    group_size: int = 256
    keep_fp32: tuple[str, ...] = ()
    method: str | None = None
    codebook_type: str = "f16"
    seed: int = 0
    tensor_types: tuple[str, ...] = ()
    importance: str | None = None
    target_bpw: float | None = None
    max_size_of: str | None = None
    speed_table: str | None = None


@runtime_checkable
class Quantizer(Protocol):
    name: str

    def quantize(self, checkpoint: Checkpoint, options: QuantOptions) -> QuantizedModel:
        """Plan and (lazily) quantize every tensor. Raises DittoError for bad options or
        non-finite weights (naming tensor and position)."""


@runtime_checkable
class ChecksQuantOptions(Protocol):
    """Optional for a Quantizer: ``ditto build`` calls ``check_options`` before the export
    stage starts, so a bad ``--method`` etc. fails before any work."""

    def check_options(self, options: QuantOptions) -> object:
        """Raise DittoError for options this quantizer refuses; the return value is unused."""


@runtime_checkable
class Packer(Protocol):
    name: str

    def pack(self, model: QuantizedModel, out: Path) -> dict:
        """Write the model file atomically (temp file + rename); return a summary dict
        (bytes, bpw, per-tensor info). Nothing is left at ``out`` on failure."""


@runtime_checkable
class IREmitter(Protocol):
    name: str

    def emit(self, sources: Sequence[Path], *, include_dirs: Sequence[Path] = (),
             defines: Sequence[str] = (), flags: Sequence[str] = (), workdir: Path) -> IRModule:
        """Compile C sources to one LLVM IR module (text)."""


@runtime_checkable
class BlasTarget(Protocol):
    name: str

    def available(self) -> tuple[bool, str]:
        """(True, "") if usable here, else (False, a message saying how to get it)."""

    def symbol(self, routine: str) -> str:
        """Linker symbol for a CBLAS routine, e.g. "cblas_sgemv" → "scipy_cblas_sgemv"."""

    def compile_flags(self) -> list[str]:
        """Flags for compiling C that includes the BLAS header (-I...)."""

    def link_flags(self) -> list[str]:
        """Flags for linking an executable against the library, with an rpath."""

    def thread_control(self) -> dict:
        """Symbols setting the library's thread count from C, None where it has none:
        ``{"set_num_threads": void f(int), "set_num_threads_local": int f(int),
        "get_num_threads": int f()}`` (the GEMV pass uses them inside OpenMP regions)."""


@runtime_checkable
class IRPass(Protocol):
    """An IR pass. It runs when named with ``--pass``, or, when no ``--pass`` is given, if it
    declares ``default_order`` (an int; optional attribute): the default pass list is every
    such pass of the registry in increasing ``default_order``, then name
    (``selection.default_passes``)."""

    name: str

    def run(self, module: IRModule, blas: BlasTarget | None) -> tuple[IRModule, PassReport]:
        """Rewrite the module (or return it unchanged); the result must parse and verify in
        llvmlite. ``blas``: the build's BLAS target, None when none is linked."""


@runtime_checkable
class Linker(Protocol):
    name: str

    def link(self, module: IRModule, blas: BlasTarget | None, out: Path, *,
             extra_flags: Sequence[str] = ()) -> Path:
        """Optimise, emit an object and link an executable at ``out`` atomically (nothing left
        there on failure) against ``blas`` (None: no BLAS); return ``out``. The BLAS target's
        availability was checked by the caller."""
