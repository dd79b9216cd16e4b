"""The ``bits`` packer: streams a QuantizedModel into a Ditto model file (docs/FORMAT.md).

The tensor table comes from the model's plan, so the layout is fixed before any tensor is
quantized; tensors are then pulled one at a time from ``QuantizedModel.tensors()`` (which is
where the quantizer does its work), encoded (f32 bytes, or codebooks + bit-packed indices) and
handed to ``ditto_core.model.modelfile.write_model``, which writes atomically. A rich progress bar
counts weights.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from ditto_core.base.errors import DittoError
from ditto_core.base.types import CodebookTensor, QuantizedModel
from ditto_core.model.codebook import codebook_payload
from ditto_core.model.modelfile import TensorInfo, write_model


def plan_infos(model: QuantizedModel) -> list[TensorInfo]:
    """Tensor table (offsets still 0) from ``model.plan`` and ``model.shapes``, in plan order.
    Raises DittoError for an unknown plan entry."""
    infos = []
    for name, (encoding, params) in model.plan.items():
        shape = tuple(model.shapes[name])
        if encoding == "f32":
            infos.append(TensorInfo(name, "f32", shape))
        elif encoding == "codebook":
            bits, group_size, cb_type = params
            infos.append(TensorInfo(name, "codebook", shape, bits, group_size, cb_type))
        else:
            raise DittoError(f"tensor {name!r}: unknown planned encoding {encoding!r}")
    return infos


class BitsPacker:
    """Packer component ``bits`` (exact b-bit index packing, FORMAT.md encoding 1)."""

    name = "bits"

    def __init__(self, show_progress: bool = True):
        self.show_progress = show_progress

    def pack(self, model: QuantizedModel, out: Path) -> dict:
        """Write ``model`` to ``out`` atomically (temp file + rename, nothing left on failure).

        Returns a summary: ``path``, ``file_bytes``, ``n_weights``, ``bpw`` (8 · file bytes /
        weights), ``theoretical_bytes`` (indices + codebooks + f32 tensors, no padding or
        metadata), ``overhead_bytes`` (file − theoretical), ``seconds``, ``total_rel_error`` (from
        the quantizer's report, if any), ``quantizer`` and ``method`` (the resolved method, from
        the report), per-tensor ``tensors`` (encoding, b, G, bytes, bpw, rel_error when
        quantized, ``reason`` when the quantizer kept it f32 and said why) and the quantizer's
        ``report``.
        Raises DittoError (naming the tensor) if a tensor does not match its plan."""
        out = Path(out)
        infos = plan_infos(model)
        by_name = {t.name: t for t in infos}
        total_weights = sum(t.n_weights for t in infos)
        t0 = time.perf_counter()

        def payloads():
            for item in model.tensors():
                name, value = item[0], item[-1]  # (name, value) or (name, shape, value)
                info = by_name.get(name)
                if info is None:
                    raise DittoError(f"quantizer produced tensor {name!r} that is not in its plan")
                if isinstance(value, CodebookTensor):
                    if info.encoding != "codebook":
                        raise DittoError(f"tensor {name!r} is planned as {info.encoding} but "
                                         f"came quantized")
                    got = (value.bits, value.group_size, value.codebook_type,
                           tuple(value.indices.shape))
                    want = (info.bits, info.group_size, info.codebook_type, info.shape)
                    if got != want:
                        raise DittoError(f"tensor {name!r}: (b, G, codebook type, shape) {got} "
                                         f"differs from the plan {want}")
                    yield name, codebook_payload(value)
                else:
                    arr = np.asarray(value)
                    if info.encoding != "f32":
                        raise DittoError(f"tensor {name!r} is planned as {info.encoding} but "
                                         f"came as an array")
                    if tuple(arr.shape) != info.shape:
                        raise DittoError(f"tensor {name!r} has shape {tuple(arr.shape)}, "
                                         f"planned {info.shape}")
                    yield name, np.ascontiguousarray(arr, dtype=np.float32)

        console = Console(file=sys.stderr)
        with Progress(TextColumn("pack", style="bold"),
                      TextColumn("{task.description}", markup=False), BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                      console=console, transient=True,
                      disable=not self.show_progress) as bar:
            task = bar.add_task(out.name, total=total_weights)

            def progress(info: TensorInfo):
                bar.update(task, advance=info.n_weights, description=info.name)

            laid = write_model(out, model.config, model.tokenizer, infos, payloads(),
                               progress=progress)
        seconds = time.perf_counter() - t0
        file_bytes = out.stat().st_size
        theo = sum(t.theoretical_bytes for t in laid)
        per_tensor = model.report.get("tensors", {})
        tensors = {}
        for t in laid:
            row = {"encoding": t.encoding, "shape": list(t.shape), "bytes": t.nbytes,
                   "bpw": 8.0 * t.nbytes / t.n_weights}
            if t.encoding == "codebook":
                row.update(bits=t.bits, group_size=t.group_size, codebook_type=t.codebook_type)
            if t.name in per_tensor and "rel_error" in per_tensor[t.name]:
                row["rel_error"] = per_tensor[t.name]["rel_error"]
            if t.encoding == "f32" and "reason" in per_tensor.get(t.name, {}):
                row["reason"] = per_tensor[t.name]["reason"]
            if "rule" in per_tensor.get(t.name, {}):
                row["rule"] = per_tensor[t.name]["rule"]
            tensors[t.name] = row
        return {
            "path": str(out),
            "file_bytes": file_bytes,
            "n_weights": total_weights,
            "bpw": 8.0 * file_bytes / total_weights,
            "theoretical_bytes": theo,
            "overhead_bytes": file_bytes - theo,
            "overhead_fraction": (file_bytes - theo) / theo,
            "seconds": seconds,
            "total_rel_error": model.report.get("total_rel_error"),
            "quantizer": model.report.get("quantizer"),
            "method": model.report.get("method"),
            "tensors": tensors,
            "report": model.report,
        }
