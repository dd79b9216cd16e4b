"""Model-side example components: an exporter of Ditto's own f32 model files, a quantizer that
keeps every tensor in fp32, and a packer that writes f32 tensors with ditto_core's writer."""

from pathlib import Path

import numpy as np

from ditto_core.base.errors import DittoError
from ditto_core.base.types import Checkpoint, QuantizedModel
from ditto_core.model.modelfile import ModelFile, TensorInfo, write_model


class DittoFileExporter:
    """Exporter ``test-ditto``: reads a ``.ditto`` file whose tensors are all f32 (what
    ``ditto export`` writes) back into a Checkpoint."""

    name = "test-ditto"

    def can_load(self, path):
        return Path(path).suffix == ".ditto" and Path(path).is_file()

    def load(self, path):
        mf = ModelFile.open(path)
        bad = [n for n, t in mf.tensors.items() if t.encoding != "f32"]
        if bad:
            raise DittoError(f"{path}: tensor {bad[0]!r} is not f32 (export it with "
                             "`ditto export`)")
        return Checkpoint(config=mf.config, tokenizer=mf.tokenizer,
                          tensors={n: (lambda n=n: np.array(mf.f32(n))) for n in mf.tensors},
                          shapes={n: t.shape for n, t in mf.tensors.items()}, source=Path(path))


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


class F32Packer:
    """Packer ``test-f32``: writes a model whose plan is all f32 (refuses codebook tensors)."""

    name = "test-f32"

    def pack(self, model, out):
        infos = []
        for name, (encoding, _) in model.plan.items():
            if encoding != "f32":
                raise DittoError(f"test-f32: tensor {name!r} is {encoding}; this packer writes "
                                 "f32 tensors only")
            infos.append(TensorInfo(name, "f32", tuple(model.shapes[name])))
        laid = write_model(out, model.config, model.tokenizer, infos, model.tensors())
        size = Path(out).stat().st_size
        n = sum(t.n_weights for t in laid)
        return {"file_bytes": size, "n_weights": n, "bpw": 8.0 * size / n,
                "tensors": {t.name: {"encoding": "f32", "bytes": t.nbytes} for t in laid}}
