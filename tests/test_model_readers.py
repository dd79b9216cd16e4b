"""Model readers on malformed and unusual input (issues: reliability, input fidelity).

Every malformed GGUF / config.json / tokenizer file / safetensors header gives exit 1 and one
line `error: <file>: <problem>` naming the key or tensor (never a traceback); what Ditto accepts
it reads as the reference does (gguf-py for big-endian GGUF, the safetensors library for
headers); NaN/Inf weights are refused on every export path; a stored-but-unused lm_head is
reported; index shards stay inside the model directory and every file read is hashed."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ditto_core.base.errors import DittoError
from ditto_core.cli.main import cli
from ditto_core.model.modelfile import ModelFile
from ditto_core.stages.pipeline import model_fingerprint
from ditto_export_hf.exporter import HFExporter

from .malformed_models import make_gguf, make_hf


def export(model, tmp_path):
    out = tmp_path / "out.ditto"
    r = CliRunner().invoke(cli, ["export", str(model), "-o", str(out), "-q"])
    return r, out


def refused(r, out, *needles):
    assert r.exit_code == 1, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)
    assert not out.exists()


# --- GGUF metadata ---------------------------------------------------------------------------
@pytest.mark.parametrize("kv,needle", [
    ({"llama.attention.head_count": ("u32", 0)},
     "GGUF key 'llama.attention.head_count' must be an integer in [1, 4294967295], found 0"),
    ({"llama.embedding_length": ("str", "sixteen")}, "'llama.embedding_length' must be an integer"),
    ({"llama.embedding_length": ("arr", [16, 16])}, "'llama.embedding_length' must be an integer"),
    ({"llama.embedding_length": ("f32", 16.0)}, "'llama.embedding_length' must be an integer"),
    ({"llama.embedding_length": ("bool", True)}, "'llama.embedding_length' must be an integer"),
    ({"llama.block_count": ("u32", 0xFFFFFFFF)}, "'llama.block_count' must be an integer in [1,"),
    ({"llama.block_count": ("u64", 2**63)}, "'llama.block_count' must be an integer"),
    ({"llama.rope.freq_base": ("f64", 1e300)}, "'llama.rope.freq_base' must be a finite number"),
    ({"llama.rope.freq_base": ("f32", float("inf"))}, "'llama.rope.freq_base' must be a finite"),
    ({"llama.attention.layer_norm_rms_epsilon": ("str", "1e-5")},
     "'llama.attention.layer_norm_rms_epsilon' must be a finite number > 0"),
    ({"llama.attention.layer_norm_rms_epsilon": ("f32", float("nan"))}, "must be a finite"),
    ({"tokenizer.ggml.bos_token_id": ("str", "one")}, "'tokenizer.ggml.bos_token_id' must be"),
    ({"tokenizer.ggml.bos_token_id": ("i32", -5)}, "'tokenizer.ggml.bos_token_id' must be"),
    ({"tokenizer.chat_template": ("u32", 5)}, "'tokenizer.chat_template' must be a string"),
    ({"tokenizer.ggml.tokens": ("arr", list(range(268)))},
     "'tokenizer.ggml.tokens' must be an array of str; item 0 is 0 (int)"),
    ({"tokenizer.ggml.token_type": ("arr", [-1] * 268)}, "'tokenizer.ggml.token_type' must be"),
    ({"tokenizer.ggml.scores": ("arr", [float("nan")] * 268)}, "'tokenizer.ggml.scores' must"),
    ({"tokenizer.ggml.add_bos_token": ("str", "false")}, "'tokenizer.ggml.add_bos_token' must"),
    ({"general.alignment": ("u32", 24)}, "'general.alignment' must be a non-zero power of two"),
    ({"general.alignment": ("u32", 0)}, "'general.alignment' must be a non-zero power of two"),
    # a scaling factor without a type is linear scaling to llama.cpp, as is rope.scale_linear
    ({"llama.rope.scaling.factor": ("f32", 4.0)},
     "llama.rope.scaling.factor = 4 (linear RoPE scaling, as llama.cpp reads it) is not "
     "supported"),
    ({"llama.rope.scale_linear": ("f32", 2.0)}, "llama.rope.scale_linear = 2 (linear RoPE"),
])
def test_gguf_metadata_of_the_wrong_type_or_range_is_refused_naming_the_key(tmp_path, kv,
                                                                            needle):
    p = tmp_path / "m.gguf"
    make_gguf(p, kv=kv)
    r, out = export(p, tmp_path)
    refused(r, out, f"error: {p}: ", needle)


def test_gguf_missing_key_is_named(tmp_path):
    p = tmp_path / "m.gguf"
    make_gguf(p, drop=["llama.feed_forward_length"])
    r, out = export(p, tmp_path)
    refused(r, out, "GGUF key 'llama.feed_forward_length' is missing")


# --- big-endian GGUF ---------------------------------------------------------------------------
def test_big_endian_gguf_reads_like_the_little_endian_copy(tmp_path):
    import gguf

    make_gguf(tmp_path / "le.gguf", f16=("blk.0.ffn_up.weight",))
    make_gguf(tmp_path / "be.gguf", big_endian=True, f16=("blk.0.ffn_up.weight",))
    for n in ("le", "be"):
        r = CliRunner().invoke(cli, ["export", str(tmp_path / f"{n}.gguf"), "-o",
                                     str(tmp_path / f"{n}.ditto"), "-q"])
        assert r.exit_code == 0, r.output
    with ModelFile.open(tmp_path / "le.ditto") as le, ModelFile.open(tmp_path / "be.ditto") as be:
        assert list(le.tensors) == list(be.tensors)
        for name in le.tensors:
            assert np.array_equal(le.f32(name), be.f32(name)), name
        # and the reference reader agrees on the big-endian file's values
        ref = {t.name: np.asarray(t.data, np.float32) for t in
               gguf.GGUFReader(str(tmp_path / "be.gguf")).tensors}
        assert np.array_equal(be.f32("token_embd.weight"), ref["token_embd.weight"])
        assert le.config == be.config


def test_big_endian_gguf_with_block_quantized_tensor_is_refused(tmp_path):
    p = tmp_path / "be.gguf"
    make_gguf(p, big_endian=True, q8=("blk.0.ffn_down.weight",))
    r, out = export(p, tmp_path)
    refused(r, out, "big-endian GGUF with tensor 'blk.0.ffn_down.weight' of type Q8_0")


# --- HF config.json / tokenizer files --------------------------------------------------------
def _set(k, v):
    return lambda c: c.__setitem__(k, v)


@pytest.mark.parametrize("kw,file,needle", [
    ({"cfg_patch": _set("num_attention_heads", 0)}, "config.json",
     "key 'num_attention_heads' must be an integer in [1, 4294967295], found 0 (int)"),
    ({"cfg_patch": _set("num_attention_heads", "four")}, "config.json",
     "key 'num_attention_heads' must be an integer"),
    ({"cfg_patch": _set("num_attention_heads", None)}, "config.json",
     "key 'num_attention_heads' is missing"),
    ({"cfg_patch": _set("num_attention_heads", [4])}, "config.json", "must be an integer"),
    ({"cfg_patch": _set("num_attention_heads", 4.9)}, "config.json", "must be an integer"),
    ({"cfg_patch": _set("hidden_size", 10**30)}, "config.json", "key 'hidden_size' must be"),
    ({"cfg_patch": _set("num_hidden_layers", 10**9)}, "config.json", "num_hidden_layers"),
    ({"cfg_patch": _set("rms_norm_eps", "small")}, "config.json", "key 'rms_norm_eps' must be"),
    ({"cfg_patch": _set("rms_norm_eps", 1e300)}, "config.json", "key 'rms_norm_eps' must be"),
    ({"cfg_patch": _set("rope_theta", "ten thousand")}, "config.json", "key 'rope_theta' must"),
    ({"cfg_raw": json.dumps({"rope_theta": float("nan"), **{k: v for k, v in
                                                            __import__("tests.malformed_models",
                                                                       fromlist=["x"])
                                                            .hf_config().items()
                                                            if k != "rope_theta"}})},
     "config.json", "key 'rope_theta' must be a finite number"),
    ({"cfg_patch": _set("rope_scaling", "linear")}, "config.json",
     "key 'rope_scaling' must be an object"),
    ({"cfg_patch": _set("tie_word_embeddings", "false")}, "config.json",
     "key 'tie_word_embeddings' must be true or false"),
    ({"cfg_raw": "[1, 2, 3]"}, "config.json", "the config must be a JSON object, found list"),
    ({"tok_patch": lambda t: t["model"]["vocab"].update({"zzz": "7"})}, "tokenizer.json",
     "field 'model' key 'vocab' must map tokens to ids"),
    ({"tok_patch": lambda t: t["added_tokens"].append({"content": "<x>"})}, "tokenizer.json",
     "field 'added_tokens[3]' key 'id' is missing"),
    ({"tok_patch": lambda t: t["added_tokens"].append({"id": -3, "content": "<x>"})},
     "tokenizer.json", "key 'id' must be an integer in [0,"),
    ({"tok_patch": lambda t: t["model"]["merges"].append(["a", 1])}, "tokenizer.json",
     "key 'merges' item 4 must be"),
    ({"tok_patch": lambda t: t["added_tokens"].append({"id": 5, "content": "<x>"})},
     "tokenizer.json", "added token '<x>' has id 5, the id of vocabulary token"),
    ({"tcfg": {"chat_template": 7}}, "tokenizer_config.json",
     "key 'chat_template' must be a string or a list"),
    ({"tcfg": {"bos_token": 5}}, "tokenizer_config.json", "key 'bos_token' must be a string"),
    ({"tcfg": {"add_bos_token": "yes"}}, "tokenizer_config.json",
     "key 'add_bos_token' must be true or false"),
    # transformers 5 follows the post-processor, 4's Llama tokenizer add_bos_token
    ({"tcfg": {"add_bos_token": True}}, "tokenizer_config.json",
     "add_bos_token is true but the post_processor of"),
])
def test_hf_fields_of_the_wrong_type_are_refused_naming_file_and_key(tmp_path, kw, file, needle):
    d = make_hf(tmp_path / "m", **kw)
    r, out = export(d, tmp_path)
    refused(r, out, f"error: {d / file}: ", needle)


# --- safetensors headers ---------------------------------------------------------------------
def _negative(h):
    e = h["model.norm.weight"]
    n = e["data_offsets"][1] - e["data_offsets"][0]
    e["data_offsets"] = [-200, -200 + n]


def _overlap(h):
    h["model.layers.0.self_attn.o_proj.weight"]["data_offsets"] = list(
        h["model.layers.0.self_attn.q_proj.weight"]["data_offsets"])


@pytest.mark.parametrize("patch,needle", [
    (_negative, "expected usize"),
    (_overlap, "invalid offset for tensor"),
    (lambda h: h["model.norm.weight"].update(data_offsets=[0.5, 64.5]), "floating point"),
    (lambda h: h["model.norm.weight"].update(data_offsets=[64, 0]), "invalid offset"),
    (lambda h: h["model.norm.weight"].update(shape=[8]), "invalid shape, data type, or offset"),
    (lambda h: h["model.norm.weight"].update(shape="16"), "invalid type"),
])
def test_safetensors_header_is_validated_like_the_library(tmp_path, patch, needle):
    from safetensors import safe_open

    d = make_hf(tmp_path / "m", st_patch=patch)
    with pytest.raises(Exception):  # the reference refuses the same file
        safe_open(str(d / "model.safetensors"), framework="numpy")
    r, out = export(d, tmp_path)
    refused(r, out, f"error: {d / 'model.safetensors'}: not a valid safetensors file", needle)


def test_safetensors_trailing_bytes_are_refused(tmp_path):
    d = make_hf(tmp_path / "m")
    with open(d / "model.safetensors", "ab") as f:
        f.write(b"GARBAGE")
    r, out = export(d, tmp_path)
    refused(r, out, "not fully covered")


def test_safetensors_fifo_does_not_block(tmp_path):
    d = make_hf(tmp_path / "m")
    (d / "model.safetensors").unlink()
    os.mkfifo(d / "weights.safetensors")
    r, out = export(d, tmp_path)
    refused(r, out, f"{d / 'weights.safetensors'}: not a regular file")


# --- NaN / Inf weights -----------------------------------------------------------------------
def _nan(w):
    w["model.layers.0.mlp.up_proj.weight"][0, 0] = np.nan


def _inf(w):
    w["model.norm.weight"][3] = np.inf


@pytest.mark.parametrize("patch,needle", [
    (_nan, "tensor 'blk.0.ffn_up.weight' has a non-finite value nan at (row, col) = (0, 0)"),
    (_inf, "tensor 'output_norm.weight' has a non-finite value inf at position (3,)"),
])
@pytest.mark.parametrize("how", ["export", "none", "gguf"])
def test_non_finite_weights_are_refused_on_every_path(tmp_path, patch, needle, how):
    if how == "gguf":
        model = tmp_path / "m.gguf"
        gpatch = {_nan: lambda w: w["blk.0.ffn_up.weight"].__setitem__((0, 0), np.nan),
                  _inf: lambda w: w["output_norm.weight"].__setitem__(3, np.inf)}[patch]
        make_gguf(model, w_patch=gpatch)
    else:
        model = make_hf(tmp_path / "m", w_patch=patch)
    if how == "none":
        env = {"DITTO_CACHE_DIR": str(tmp_path / "c")}
        r = CliRunner(env=env).invoke(cli, ["build", str(model), "--quantizer", "none",
                                            "--blas", "openblas", "-o", str(tmp_path / "b"),
                                            "-q"])
        assert r.exit_code == 1 and f"error: {model}: {needle}" in r.stderr, r.output
        assert not (tmp_path / "b").exists()
        return
    r, out = export(model, tmp_path)
    refused(r, out, f"error: {model}: {needle}")


# --- unused tensors --------------------------------------------------------------------------
def test_untied_lm_head_next_to_tied_config_is_refused(tmp_path):
    """transformers 4 ties the output layer to the embedding, transformers 5 keeps the stored
    lm_head: which one the author ran is unknown, so a different lm_head is refused."""
    d = make_hf(tmp_path / "m", cfg_patch=_set("tie_word_embeddings", True))
    with pytest.raises(DittoError) as e:
        HFExporter().load(d)
    assert str(e.value) == (
        f"{d / 'model.safetensors'}: tensor 'lm_head.weight' differs from "
        f"'model.embed_tokens.weight', and {d / 'config.json'} has tie_word_embeddings: true: "
        "transformers 4 uses the embedding as the output layer, transformers 5 the stored "
        "'lm_head.weight'; set tie_word_embeddings to false to use it, or store the embedding")


def test_identical_lm_head_next_to_tied_config_is_silent(tmp_path, capfd):
    def same(w):
        w["lm_head.weight"] = w["model.embed_tokens.weight"].copy()
    d = make_hf(tmp_path / "m", cfg_patch=_set("tie_word_embeddings", True), w_patch=same)
    HFExporter().load(d)
    assert capfd.readouterr().err == ""


# --- shards ----------------------------------------------------------------------------------
@pytest.mark.parametrize("shard", ["../elsewhere/w.safetensors", "/tmp/w.safetensors",
                                   "sub/../../w.safetensors"])
def test_index_shards_outside_the_directory_are_refused(tmp_path, shard):
    d = make_hf(tmp_path / "m")
    names = list(json.loads((d / "model.safetensors").read_bytes()[8:][:int.from_bytes(
        (d / "model.safetensors").read_bytes()[:8], "little")]))
    (d / "model.safetensors").rename(d / "w.safetensors")  # else the single file is read
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: shard for n in names}}))
    r, out = export(d, tmp_path)
    refused(r, out, f"error: {d / 'model.safetensors.index.json'}: shard {shard!r} is outside "
                    "the model directory")


def test_model_safetensors_wins_over_an_index(tmp_path):
    """transformers loads model.safetensors when it is there, whatever index lies beside it."""
    from ditto_export_hf.exporter import weight_files
    d = make_hf(tmp_path / "m")
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "gone.safetensors"}}))
    assert weight_files(d) == [d / "model.safetensors"]
    assert HFExporter().load(d).config.n_layers == 2


@pytest.mark.parametrize("patch,needle", [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
      "rope_scaling": {"type": "linear", "factor": 4.0}},
     "RoPE scaling 'linear' is not supported (rope_scaling)"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0}},
     "RoPE scaling 'llama3' is not supported (rope_parameters)"),
    ({"rope_theta": 500.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
     "rope_theta 500 and rope_parameters.rope_theta 10000 disagree (transformers 4 reads the "
     "first, 5 the second)"),
])
def test_rope_settings_transformers_versions_read_differently_are_refused(tmp_path, patch,
                                                                          needle):
    d = make_hf(tmp_path / "m", cfg_patch=lambda c: c.update(patch))
    r, out = export(d, tmp_path)
    refused(r, out, f"error: {d / 'config.json'}: {needle}")


def test_rope_theta_and_context_defaults_as_transformers(tmp_path):
    """rope_parameters.rope_theta alone (transformers 5's form) is the theta; a Qwen2 config
    without max_position_embeddings has Qwen2Config's 32768, a Llama one LlamaConfig's 2048."""
    from transformers import LlamaConfig, Qwen2Config

    from ditto_export_hf.exporter import read_config
    base = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    for arch, mtype, ref in (("LlamaForCausalLM", "llama", LlamaConfig()),
                             ("Qwen2ForCausalLM", "qwen2", Qwen2Config())):
        p = tmp_path / f"{mtype}.json"
        p.write_text(json.dumps({**base, "architectures": [arch], "model_type": mtype}))
        config = read_config(p)[1]
        assert config.rope_theta == 500000.0
        assert config.max_seq_len == ref.max_position_embeddings


def test_fingerprint_hashes_shards_behind_a_symlinked_directory(tmp_path):
    d = make_hf(tmp_path / "m")
    (tmp_path / "store").mkdir()
    shutil.move(d / "model.safetensors", tmp_path / "store" / "w.safetensors")
    (d / "sub").symlink_to(tmp_path / "store")
    raw = (tmp_path / "store" / "w.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    names = [k for k in json.loads(raw[8:8 + n]) if k != "__metadata__"]
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: "sub/w.safetensors" for k in names}}))
    exp = HFExporter()
    before = model_fingerprint(d, exp)
    assert exp.load(d).config.n_layers == 2  # the shard is read through the symlink
    b = bytearray(raw)
    b[-4:] = np.float32(7.0).tobytes()  # change the last weight, same size
    (tmp_path / "store" / "w.safetensors").write_bytes(bytes(b))
    os.utime(tmp_path / "store" / "w.safetensors", ns=(1, 1))
    assert model_fingerprint(d, exp) != before
