"""Session fixtures of the quantize/pack area: the example third-party RTN plugin installed
with pip, and a deterministic subset of SmolLM2 (the tied embedding, blocks 0, 15 and 29 with
all their matrices and norms, renumbered 0..2) quantized once with ``kmeans`` and once with
``rtn`` (b = 4, G = 256, f16 codebooks) and packed by ``bits`` — all through the plugin
registry. The subset keeps the session short on 2 cores; bench/bench_quantize.py and
``ditto build smollm2`` cover the whole model (docs/QUANT.md)."""

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from ditto_core.kit.components import QuantOptions
from ditto_core.stages.plugins import build_registry

ROOT = Path(__file__).resolve().parents[1]

# Values cached per process, so each is computed once per session even if a test module also
# imports these fixtures.
_CACHE: dict = {}


@pytest.fixture(scope="session")
def rtn_registry(tmp_path_factory):
    """Plugin registry after ``pip install --no-deps --no-build-isolation`` of a copy of
    examples/ditto-quant-rtn (copied so the source tree gets no build/ or egg-info)."""
    if "rtn_registry" in _CACHE:
        return _CACHE["rtn_registry"]
    dst = tmp_path_factory.mktemp("rtn_src") / "ditto-quant-rtn"
    shutil.copytree(ROOT / "examples" / "ditto-quant-rtn", dst,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps",
                    "--no-build-isolation", "--quiet", "--disable-pip-version-check", str(dst)],
                   check=True, capture_output=True, timeout=600)
    importlib.invalidate_caches()
    _CACHE["rtn_registry"] = build_registry()
    return _CACHE["rtn_registry"]


#: SmolLM2 blocks in the subset (renumbered 0, 1, 2)
SUBSET_BLOCKS = (0, 15, 29)


@pytest.fixture(scope="session")
def smollm2_subset(smollm2_gguf, rtn_registry):
    """A Checkpoint of SmolLM2 reduced to the embedding, blocks SUBSET_BLOCKS (renamed
    blk.0..blk.2) and the output norm, with the GGUF exporter's lazy loaders."""
    if "smollm2_subset" in _CACHE:
        return _CACHE["smollm2_subset"]
    full = rtn_registry.get("exporter", "gguf").load(smollm2_gguf)
    rename = {}
    for name in full.shapes:
        if not name.startswith("blk."):
            rename[name] = name
            continue
        layer, rest = name[4:].split(".", 1)
        if int(layer) in SUBSET_BLOCKS:
            rename[f"blk.{SUBSET_BLOCKS.index(int(layer))}.{rest}"] = name
    ck = attrs.evolve(full, config=attrs.evolve(full.config, n_layers=len(SUBSET_BLOCKS)),
                      tensors={new: full.tensors[old] for new, old in rename.items()},
                      shapes={new: full.shapes[old] for new, old in rename.items()})
    _CACHE["smollm2_subset"] = ck
    return ck


@pytest.fixture(scope="session")
def smollm2_packed(smollm2_subset, rtn_registry, tmp_path_factory):
    """{"kmeans"|"rtn": (path of the packed .ditto, packer summary)} for ``smollm2_subset``."""
    if "smollm2_packed" in _CACHE:
        return _CACHE["smollm2_packed"]
    out_dir = tmp_path_factory.mktemp("smollm2_packed")
    packer = rtn_registry.get("packer", "bits")
    result = {}
    for name in ("kmeans", "rtn"):
        checkpoint = smollm2_subset
        qmodel = rtn_registry.get("quantizer", name).quantize(
            checkpoint, QuantOptions(bits=4, group_size=256))
        path = out_dir / f"{name}.ditto"
        result[name] = (path, packer.pack(qmodel, path))
    _CACHE["smollm2_packed"] = result
    return result
