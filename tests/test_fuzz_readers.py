"""Property-based fuzzing of the Python readers (issue: reliability, "Fuzzing"): GGUF files,
HF config.json / safetensors headers, and Ditto model files, mutated by hypothesis. Each mutated
input either reads completely (config, tokenizer, every tensor) or is refused with a DittoError;
any other exception (TypeError, struct.error, ZeroDivisionError, a numpy error ...) fails.

Examples are bounded (``max_examples``) so the file runs in seconds in CI; run longer with
``DITTO_FUZZ_EXAMPLES=5000 python -m pytest tests/test_fuzz_readers.py``."""

import json
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ditto_core.base.errors import DittoError
from ditto_core.model.modelfile import ModelFile
from ditto_core.stages.pipeline import load_checkpoint, write_f32
from ditto_export_gguf.exporter import GGUFExporter
from ditto_export_hf.exporter import HFExporter

from .malformed_models import hf_config, hf_weights, make_gguf, make_hf, safetensors_bytes

N = int(os.environ.get("DITTO_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=N, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


def read_all(exporter, path):
    """Export ``path`` completely: config, tokenizer and every tensor, as `ditto export` does."""
    ck = load_checkpoint(exporter, path)
    for load in ck.tensors.values():
        load()
    return ck


def accepts_or_refuses(fn, *args):
    try:
        fn(*args)
    except DittoError:
        pass


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory):
    p = tmp_path_factory.mktemp("fz") / "m.gguf"
    make_gguf(p)
    return p.read_bytes()


@pytest.fixture(scope="module")
def ditto_bytes(tmp_path_factory, gguf_bytes):
    d = tmp_path_factory.mktemp("fzd")
    (d / "m.gguf").write_bytes(gguf_bytes)
    write_f32(load_checkpoint(GGUFExporter(), d / "m.gguf"), d / "m.ditto", show_progress=False)
    return (d / "m.ditto").read_bytes()


def _mutate(data: bytes, edits, cut) -> bytes:
    b = bytearray(data)
    for pos, val in edits:
        b[pos % len(b)] = val
    return bytes(b[:cut]) if cut is not None else bytes(b)


def _edits(limit: int):
    """Byte edits biased to the first ``limit`` bytes (headers, metadata, tables)."""
    return st.lists(st.tuples(st.integers(0, limit - 1), st.integers(0, 255)),
                    min_size=1, max_size=6)


@FUZZ
@given(edits=_edits(12_000), cut=st.none() | st.integers(0, 70_000))
def test_fuzz_gguf(tmp_path, gguf_bytes, edits, cut):
    p = tmp_path / "m.gguf"
    p.write_bytes(_mutate(gguf_bytes, edits, cut))
    accepts_or_refuses(read_all, GGUFExporter(), p)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                    | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)


@FUZZ
@given(key=st.sampled_from(sorted(hf_config()) + ["head_dim", "rope_scaling", "attention_bias"]),
       value=JSON)
def test_fuzz_hf_config(tmp_path, key, value):
    d = make_hf(tmp_path / "m", cfg_patch=lambda c: c.__setitem__(key, value))
    accepts_or_refuses(read_all, HFExporter(), d)


WEIGHT_NAMES = sorted(hf_weights())


@FUZZ
@given(name=st.sampled_from(WEIGHT_NAMES), field=st.sampled_from(["dtype", "shape",
                                                                   "data_offsets"]),
       value=JSON | st.lists(st.integers(-10, 70_000), max_size=3))
def test_fuzz_safetensors_header(tmp_path, name, field, value):
    d = make_hf(tmp_path / "m",
                st_patch=lambda h: h[name].__setitem__(field, value))
    accepts_or_refuses(read_all, HFExporter(), d)


@FUZZ
@given(edits=_edits(3_000), cut=st.none() | st.integers(0, 60_000))
def test_fuzz_safetensors_bytes(tmp_path, edits, cut):
    d = make_hf(tmp_path / "m")
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(_mutate(raw, edits, cut))
    accepts_or_refuses(read_all, HFExporter(), d)


def _read_model_file(path):
    with ModelFile.open(path, verify=False) as mf:
        _ = (mf.config, mf.tokenizer)
        for name, t in mf.tensors.items():
            if t.encoding == "f32":
                mf.f32(name)


@FUZZ
@given(edits=_edits(40_000), cut=st.none() | st.integers(0, 5_000_000))
def test_fuzz_model_file(tmp_path, ditto_bytes, edits, cut):
    p = tmp_path / "m.ditto"
    p.write_bytes(_mutate(ditto_bytes, edits, cut))
    accepts_or_refuses(_read_model_file, p)


def test_safetensors_bytes_helper_round_trips():
    """The fuzzers' base input is a valid file (else every case would be a refusal)."""
    from safetensors.numpy import load

    w = hf_weights()
    got = load(safetensors_bytes(w))
    assert set(got) == set(w) and all((got[k] == w[k]).all() for k in w)
    assert json.loads(safetensors_bytes(w)[8:8 + struct.unpack("<Q",
                                                               safetensors_bytes(w)[:8])[0]])
