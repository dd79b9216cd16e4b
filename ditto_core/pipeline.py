"""The build pipeline as plain stage functions: export → quantize → pack → emit IR → rewrite →
link (docs/ARCHITECTURE.md).

Each stage takes the previous stage's artifact (ditto_core.types) and the component chosen by
name from the plugin registry, and is timed by ``build`` into ``Timings``. ``build`` runs the
stages in order; a stage whose components do not exist yet raises ``MissingStage`` (the CLI
says which, and exits non-zero): nothing is faked.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Iterator, Sequence

import attrs
import numpy as np

from .bundled import BUNDLED, bundled_model
from .components import QuantOptions
from .errors import DittoError
from .modelfile import TensorInfo, write_model
from .plugins import Registry, get_registry
from .progress import progress_bar
from .types import Checkpoint, QuantizedModel


class MissingStage(DittoError):
    """A pipeline stage has no implementation (no component registered, or not wired yet)."""

    def __init__(self, stage: str, detail: str):
        super().__init__(f"stage '{stage}' is not available: {detail}")
        self.stage = stage


@attrs.define
class Timings:
    """Wall-clock seconds per stage, in the order the stages ran."""

    seconds: dict[str, float] = attrs.field(factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - t0


# --------------------------------------------------------------------------------------------
# Stage 1: export
# --------------------------------------------------------------------------------------------

def resolve_model(model: str | os.PathLike) -> Path:
    """Path of MODEL: an existing path (HF directory or .gguf file), else a bundled model name
    ("smollm2", "tinycoder"). Raises DittoError if it is neither."""
    p = Path(model)
    if p.exists():
        return p
    if str(model) in BUNDLED:
        return bundled_model(str(model))
    raise DittoError(f"{model}: no such file or directory, and not a bundled model name "
                     f"({', '.join(BUNDLED)})")


def choose_exporter(path: Path, name: str | None = None, registry: Registry | None = None):
    """The exporter called ``name``, or the first whose ``can_load(path)`` is true."""
    registry = registry or get_registry()
    if name is not None:
        return registry.get("exporter", name)
    exporters = registry.all("exporter")
    if not exporters:
        raise MissingStage("export", "no exporter plugin is installed")
    for exp in exporters:
        if exp.can_load(path):
            return exp
    names = ", ".join(e.name for e in exporters)
    if path.is_dir():
        raise DittoError(f"{path}: not a model directory any exporter reads ({names}); an HF "
                         f"directory needs config.json")
    raise DittoError(f"{path}: not a model file any exporter reads ({names})")


def export(model: str | os.PathLike, exporter: str | None = None,
           registry: Registry | None = None) -> Checkpoint:
    """Stage 1. MODEL (path or bundled name) → Checkpoint (tensors loaded lazily)."""
    path = resolve_model(model)
    return choose_exporter(path, exporter, registry).load(path)


def checkpoint_infos(checkpoint: Checkpoint) -> list[TensorInfo]:
    """An all-f32 tensor table for ``checkpoint``, in checkpoint order."""
    return [TensorInfo(n, "f32", s) for n, s in checkpoint.shapes.items()]


def write_f32(checkpoint: Checkpoint, out: Path, show_progress: bool = True) -> list[TensorInfo]:
    """Write ``checkpoint`` to a model file with every tensor in f32 (``ditto export``),
    atomically; returns the tensor table. Shows a progress bar counting weights."""
    infos = checkpoint_infos(checkpoint)
    total = sum(t.n_weights for t in infos)
    with progress_bar("export", total, enabled=show_progress) as advance:
        def payloads():
            for t in infos:
                yield t.name, np.ascontiguousarray(checkpoint.tensors[t.name](), np.float32)

        return write_model(out, checkpoint.config, checkpoint.tokenizer, infos, payloads(),
                           progress=lambda info: advance(info.n_weights, info.name))


# --------------------------------------------------------------------------------------------
# Stages 2 and 3: quantize, pack
# --------------------------------------------------------------------------------------------

def quantize(checkpoint: Checkpoint, quantizer: str, options: QuantOptions,
             registry: Registry | None = None) -> QuantizedModel:
    """Stage 2. Plan (now) and quantize (lazily, as the packer pulls tensors)."""
    registry = registry or get_registry()
    return registry.get("quantizer", quantizer).quantize(checkpoint, options)


def pack(model: QuantizedModel, out: Path, packer: str | None = None,
         registry: Registry | None = None) -> dict:
    """Stage 3. Write the model file at ``out`` atomically; returns the packer's summary."""
    registry = registry or get_registry()
    if packer is None:
        packers = registry.all("packer")
        if not packers:
            raise MissingStage("pack", "no packer plugin is installed")
        comp = packers[0]
    else:
        comp = registry.get("packer", packer)
    return comp.pack(model, out)


# --------------------------------------------------------------------------------------------
# Stages 4-6: emit IR, rewrite, link (the compile stages; wired in by a later issue)
# --------------------------------------------------------------------------------------------

#: Compile stages in order. ``build`` calls each function in ``COMPILE_STAGES`` with the build
#: state dict; ``None`` means the stage is not wired into ``ditto build`` yet.
COMPILE_STAGES: dict[str, object] = {"emit IR": None, "rewrite": None, "link": None}


@attrs.frozen
class BuildOptions:
    """Everything ``ditto build`` takes besides MODEL and the output directory."""

    quantizer: str
    blas: str
    quant: QuantOptions = QuantOptions()
    exporter: str | None = None
    packer: str | None = None
    rewrite: bool = True


def _write_json_atomic(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def build(model: str | os.PathLike, out_dir: Path, options: BuildOptions,
          registry: Registry | None = None) -> dict:
    """Run every stage; write ``out_dir/model.ditto`` and ``out_dir/build.json`` (stage
    timings, pack summary). Raises MissingStage at the first stage that has no implementation
    (after writing what the earlier stages produced), DittoError for bad input."""
    registry = registry or get_registry()
    out_dir = Path(out_dir)
    blas = registry.get("blas", options.blas)  # fail early on an unknown --blas
    ok, why = blas.available()
    if not ok:
        raise DittoError(f"BLAS target {options.blas!r} is not available here: {why}")
    registry.get("quantizer", options.quantizer)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DittoError(f"{out_dir}: cannot create the output directory: "
                         f"{exc.strerror or exc}") from None
    timings = Timings()
    state: dict = {"out_dir": out_dir, "options": options, "registry": registry,
                   "blas": blas, "timings": timings}
    record = {"model": str(model), "quantizer": options.quantizer, "blas": options.blas,
              "options": attrs.asdict(options.quant), "stages": timings.seconds}
    with timings.stage("export"):
        checkpoint = export(model, options.exporter, registry)
    with timings.stage("quantize (plan)"):
        qmodel = quantize(checkpoint, options.quantizer, options.quant, registry)
    with timings.stage("quantize + pack"):
        summary = pack(qmodel, out_dir / "model.ditto", options.packer, registry)
    state.update(checkpoint=checkpoint, quantized=qmodel, pack=summary,
                 model_file=out_dir / "model.ditto")
    record["pack"] = {k: v for k, v in summary.items() if k not in ("tensors", "report")}
    try:
        for stage, func in COMPILE_STAGES.items():
            if stage == "rewrite" and not options.rewrite:
                continue
            if func is None:
                raise MissingStage(stage, f"`ditto build` does not implement the compile "
                                   f"stages yet; {out_dir / 'model.ditto'} was written, but no "
                                   f"executable")
            with timings.stage(stage):
                func(state)
        record["status"] = "complete"
    except MissingStage as exc:
        record["status"] = f"incomplete: {exc}"
        _write_json_atomic(out_dir / "build.json", record)
        raise
    _write_json_atomic(out_dir / "build.json", record)
    return record
