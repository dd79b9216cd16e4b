"""Bad input to `ditto export`: each case gives a clear message naming the file and the
problem on stderr, exit code 1, and leaves no output (nor temp file) behind."""

import json
import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from ditto_core.cli.main import cli
from tests.fixtures_hf import write_tiny_hf_dir


@pytest.fixture(scope="module")
def good_hf(tmp_path_factory) -> Path:
    return write_tiny_hf_dir(tmp_path_factory.mktemp("good_hf") / "m")[0]


@pytest.fixture
def hf(good_hf, tmp_path) -> Path:
    d = tmp_path / "model"
    shutil.copytree(good_hf, d)
    return d


def run_export(model, tmp_path, out=None):
    outdir = tmp_path / "out"
    outdir.mkdir(exist_ok=True)
    out = out or outdir / "m.ditto"
    r = CliRunner().invoke(cli, ["export", str(model), "-o", str(out), "-q"])
    return r, out, outdir


def assert_refused(r, out, outdir, *needles):
    assert r.exit_code == 1, (r.exit_code, r.output, r.exception)
    assert r.stderr.startswith("error: "), r.stderr
    for n in needles:
        assert str(n) in r.stderr, (n, r.stderr)
    assert not Path(out).exists()
    if outdir.is_dir():
        assert os.listdir(outdir) == []


def test_good_hf_dir_exports(hf, tmp_path):
    r, out, _ = run_export(hf, tmp_path)
    assert r.exit_code == 0, r.output
    assert out.is_file()


def test_missing_config(hf, tmp_path):
    (hf / "config.json").unlink()
    r, out, outdir = run_export(hf, tmp_path)
    assert_refused(r, out, outdir, hf, "config.json")


def test_missing_weights(hf, tmp_path):
    (hf / "model.safetensors").unlink()
    r, out, outdir = run_export(hf, tmp_path)
    assert_refused(r, out, outdir, hf, "no model.safetensors")


def test_missing_shard(tmp_path):
    d, _ = write_tiny_hf_dir(tmp_path / "sharded", shards=2)
    (d / "model-00002-of-00002.safetensors").unlink()
    r, out, outdir = run_export(d, tmp_path)
    assert_refused(r, out, outdir, "model-00002-of-00002.safetensors", "missing")


def test_missing_tokenizer(hf, tmp_path):
    (hf / "tokenizer.json").unlink()
    r, out, outdir = run_export(hf, tmp_path)
    assert_refused(r, out, outdir, hf / "tokenizer.json", "missing")


def _edit_config(hf, **changes):
    cfg = json.loads((hf / "config.json").read_text())
    cfg.update(changes)
    (hf / "config.json").write_text(json.dumps(cfg))


def test_non_llama_architecture(hf, tmp_path):
    _edit_config(hf, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    r, out, outdir = run_export(hf, tmp_path)
    assert_refused(r, out, outdir, hf / "config.json", "GPT2LMHeadModel", "not supported")


def test_shape_not_matching_config(hf, tmp_path):
    _edit_config(hf, intermediate_size=64)
    r, out, outdir = run_export(hf, tmp_path)
    assert_refused(r, out, outdir, hf, "config.json", "blk.0.ffn_", "has shape", "config implies")


def test_truncated_safetensors(hf, tmp_path):
    f = hf / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 1000])
    r, out, outdir = run_export(hf, tmp_path)
    assert_refused(r, out, outdir, f, "truncated")


def test_unsupported_dtype(hf, tmp_path):
    from safetensors.numpy import load_file, save_file

    f = hf / "model.safetensors"
    tensors = load_file(str(f))
    tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(np.float64)
    save_file(tensors, str(f))
    r, out, outdir = run_export(hf, tmp_path)
    assert_refused(r, out, outdir, f, "model.norm.weight", "F64")


def test_truncated_gguf(tiny_gguf, tmp_path):
    bad = tmp_path / "tiny.gguf"
    data = tiny_gguf.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    r, out, outdir = run_export(bad, tmp_path)
    assert_refused(r, out, outdir, bad, "truncated")
    assert r.stderr == (f"error: {bad}: truncated or corrupt GGUF ({len(data) // 2:,} bytes; "
                        "the gguf reader failed with ValueError)\n")


@pytest.mark.parametrize("keep", [30, 1000, -1])  # in the header, in the metadata, last byte
def test_truncated_gguf_message_has_no_numpy_internals(tiny_gguf, tmp_path, keep):
    bad = tmp_path / "tiny.gguf"
    data = tiny_gguf.read_bytes()[:keep]
    bad.write_bytes(data)
    r, out, outdir = run_export(bad, tmp_path)
    assert_refused(r, out, outdir, f"{bad}: truncated or corrupt GGUF ({len(data):,} bytes; "
                   "the gguf reader failed with ")
    assert "When changing to a larger dtype" not in r.stderr and "array" not in r.stderr


def _write_gguf(path: Path, arch: str, tokenizer: bool):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_context_length(64)
    if tokenizer:
        w.add_tokenizer_model("llama")
        w.add_token_list(["<unk>", "<s>", "</s>", "a"])
        w.add_token_scores([0.0, 0.0, 0.0, -1.0])
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_non_llama_gguf(tmp_path):
    bad = tmp_path / "gpt2.gguf"
    _write_gguf(bad, "gpt2", tokenizer=True)
    r, out, outdir = run_export(bad, tmp_path)
    assert_refused(r, out, outdir, bad, "architecture 'gpt2'")


def test_gguf_without_tokenizer(tmp_path):
    bad = tmp_path / "notok.gguf"
    _write_gguf(bad, "llama", tokenizer=False)
    r, out, outdir = run_export(bad, tmp_path)
    assert_refused(r, out, outdir, bad, "no tokenizer")


def test_gguf_missing_tensors(tmp_path):
    bad = tmp_path / "partial.gguf"
    _write_gguf(bad, "llama", tokenizer=True)
    r, out, outdir = run_export(bad, tmp_path)
    assert_refused(r, out, outdir, bad, "missing tensor", "blk.0.")


def test_output_not_writable(tiny_gguf, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    out = blocker / "m.ditto"
    r = CliRunner().invoke(cli, ["export", str(tiny_gguf), "-o", str(out), "-q"])
    assert r.exit_code == 1 and str(out) in r.stderr and "cannot write" in r.stderr, r.stderr
    assert blocker.read_text() == "not a directory"
    missing = tmp_path / "no" / "such" / "dir" / "m.ditto"
    r = CliRunner().invoke(cli, ["export", str(tiny_gguf), "-o", str(missing), "-q"])
    assert r.exit_code == 1 and str(missing) in r.stderr and "cannot write" in r.stderr
    assert not (tmp_path / "no").exists()


def test_unknown_model_name(tmp_path):
    r, out, outdir = run_export("no-such-model", tmp_path)
    assert_refused(r, out, outdir, "no-such-model", "not a bundled model")
