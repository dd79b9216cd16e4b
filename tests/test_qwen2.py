"""The ``qwen2`` architecture end to end, against transformers' ``Qwen2ForCausalLM``.

Tiny random checkpoints (tests/fixtures_qwen2.py): HF directory → ``ditto export`` (all f32) →
ditto-run logits equal transformers' (GQA, q/k/v biases, tied and untied classifier); a
quantized build runs and keeps the biases f32; the PyTorch model Ditto builds for calibration
gives transformers' logits. A tiny ``qwen2`` GGUF: biases read, q/k rows kept in the stored
order (llama.cpp does not permute them for qwen2). The real Qwen2.5-Coder-0.5B-Instruct GGUF:
fp32 export vs transformers reading the same GGUF, every position's top-1 equal. Bad input:
each a DittoError naming the file and the problem.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from ditto_core.cli.main import cli
from ditto_core.model.modelfile import ModelFile
from tests.fixtures_compile import build_model
from tests.fixtures_native import dump_logits, rel_error
from tests.fixtures_qwen2 import hf_logits, shared_gguf_reader
from tests.test_export_bad_input import assert_refused, run_export

IDS = [5, 17, 99, 3, 250, 42, 42, 7, 311, 0, 128, 64, 1, 200, 33, 9, 180, 77, 260, 12]


def export(model: Path, out: Path) -> Path:
    r = CliRunner().invoke(cli, ["export", str(model), "-o", str(out), "-q"])
    assert r.exit_code == 0, (r.output, r.exception)
    return out


# ----------------------------------------------------------------------------- tiny HF models

@pytest.mark.parametrize("which", ["tied", "untied"])
def test_tiny_qwen2_fp32_logits_equal_transformers(native_build, tiny_qwen2_hf, tmp_path, which):
    d = getattr(tiny_qwen2_hf, which)
    f = export(d, tmp_path / "m.ditto")
    mf = ModelFile(f)
    c = mf.config
    assert (c.arch, c.tied_embeddings, c.n_heads, c.n_kv_heads, c.head_dim) == (
        "qwen2", which == "tied", 4, 2, 16)
    assert (c.rope_theta, c.norm_eps) == (1e6, np.float32(1e-6))
    assert mf.tensors["blk.1.attn_q.bias"].shape == (64,)
    assert mf.tensors["blk.1.attn_k.bias"].shape == mf.tensors["blk.1.attn_v.bias"].shape == (32,)
    from safetensors.numpy import load_file
    stored = load_file(str(d / "model.safetensors"))
    np.testing.assert_array_equal(mf.f32("blk.0.attn_v.bias"),
                                  stored["model.layers.0.self_attn.v_proj.bias"])
    got = dump_logits(native_build.run, f, IDS, tmp_path)
    ref = hf_logits(d, IDS)
    assert got.shape == ref.shape == (len(IDS), 320)
    err = np.abs(got - ref).max()
    assert rel_error(got, ref).max() <= 1e-4, f"max |Δlogit| {err:.3g}"
    assert (got.argmax(-1) == ref.argmax(-1)).all()


def test_tiny_qwen2_quantized_build_runs_with_f32_biases(tiny_qwen2_hf, build_cache_root,
                                                        tmp_path):
    """kmeans b = 4 with G = 48 (rows of 64 and 96: partial last sub-blocks); the biases are
    vectors, so they stay f32 whatever --tensor-type says about the matrices."""
    from ditto_core.kit.components import QuantOptions
    from ditto_core.runtime.run import find_build

    d = tiny_qwen2_hf.untied
    rec = build_model(d, tmp_path / "q", build_cache_root, quantizer="kmeans",
                      quant=QuantOptions(bits=4, group_size=48,
                                         tensor_types=("blk.*.attn_*=b5",)))
    assert rec["status"] == "complete"
    exe, mfile, _ = find_build(tmp_path / "q")
    mf = ModelFile(mfile)
    for n in ("q", "k", "v"):
        t = mf.tensors[f"blk.1.attn_{n}.bias"]
        assert (t.encoding, t.bits) == ("f32", 0)
        w = mf.tensors[f"blk.1.attn_{n}.weight"]
        assert (w.encoding, w.bits, w.group_size) == ("codebook", 5, 48)
    assert mf.tensors["blk.0.ffn_down.weight"].n_sub_blocks == 2  # 96 = 48 + 48
    f32 = export(d, tmp_path / "f32.ditto")
    np.testing.assert_array_equal(mf.f32("blk.0.attn_q.bias"),
                                  ModelFile(f32).f32("blk.0.attn_q.bias"))
    got = dump_logits(exe, mfile, IDS, tmp_path)
    ref = hf_logits(d, IDS)
    assert np.isfinite(got).all() and got.shape == ref.shape
    # 4-5 bit codebooks of random weights: close to the fp32 logits, not equal
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.9


def test_calibration_model_gives_transformers_logits(tiny_qwen2_hf):
    """The PyTorch model ``ditto calibrate`` runs (eval.torch_int8.fp32_model_from_checkpoint)
    is a Qwen2ForCausalLM with the biases: its logits are transformers' on the directory."""
    import torch

    from ditto_core.eval.calibration import linear_inputs
    from ditto_core.eval.torch_int8 import fp32_model_from_checkpoint
    from ditto_core.stages import pipeline

    d = tiny_qwen2_hf.tied
    ck = pipeline.export(d)
    m = fp32_model_from_checkpoint(ck)
    assert type(m).__name__ == "Qwen2ForCausalLM"
    with torch.no_grad():
        got = m(torch.tensor([IDS])).logits[0].double().numpy()
    np.testing.assert_allclose(got, hf_logits(d, IDS), rtol=0, atol=1e-5)
    names = linear_inputs(m, tied=True)
    assert names["model.layers.1.self_attn.k_proj"] == "blk.1.attn_k.weight"
    assert names["lm_head"] == "token_embd.weight"


# ----------------------------------------------------------------------------- HF bad input

@pytest.fixture
def qwen2_dir(tiny_qwen2_hf, tmp_path) -> Path:
    d = tmp_path / "model"
    shutil.copytree(tiny_qwen2_hf.untied, d)
    return d


def _edit_config(d: Path, **changes):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes,needles", [
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}),
     ["RoPE scaling 'yarn' is not supported"]),
    (dict(rope_parameters=None, rope_scaling={"type": "dynamic", "factor": 2.0}),
     ["RoPE scaling 'dynamic' is not supported"]),
    (dict(use_sliding_window=True, sliding_window=16, max_window_layers=0),
     ["use_sliding_window: true", "not supported"]),
    (dict(layer_types=["full_attention", "sliding_attention"]),
     ["layer_types has 'sliding_attention'"]),
    (dict(hidden_act="gelu"), ["activation 'gelu' is not supported"]),
])
def test_hf_qwen2_unsupported_config_is_refused(qwen2_dir, tmp_path, changes, needles):
    _edit_config(qwen2_dir, **changes)
    r, out, outdir = run_export(qwen2_dir, tmp_path)
    assert_refused(r, out, outdir, qwen2_dir / "config.json", *needles)


def test_hf_qwen2_missing_bias_is_refused(qwen2_dir, tmp_path):
    from safetensors.numpy import load_file, save_file

    f = qwen2_dir / "model.safetensors"
    t = load_file(str(f))
    del t["model.layers.1.self_attn.k_proj.bias"]
    save_file(t, str(f), metadata={"format": "pt"})
    r, out, outdir = run_export(qwen2_dir, tmp_path)
    assert_refused(r, out, outdir, qwen2_dir, "missing tensor(s) blk.1.attn_k.bias")


def test_hf_llama_with_bias_tensor_is_refused(qwen2_dir, tmp_path):
    _edit_config(qwen2_dir, model_type="llama", architectures=["LlamaForCausalLM"])
    r, out, outdir = run_export(qwen2_dir, tmp_path)
    assert_refused(r, out, outdir, qwen2_dir,
                   "unexpected tensor 'blk.0.attn_k.bias' for a 2-layer Llama model")


# ----------------------------------------------------------------------------- tiny GGUF

def write_qwen2_gguf(path: Path, arch: str = "qwen2", drop=(), replace=None) -> dict:
    """A 1-layer GGUF of ``arch`` (dim 8, 2 heads / 1 KV head of 4, SentencePiece vocab of 4)
    with q/k/v biases; ``drop``: tensor names left out; ``replace``: name -> array stored
    instead. Returns the arrays written, by GGUF name ([rows, cols])."""
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (4, 8), "output_norm.weight": (8,),
              "blk.0.attn_norm.weight": (8,), "blk.0.attn_q.weight": (8, 8),
              "blk.0.attn_k.weight": (4, 8), "blk.0.attn_v.weight": (4, 8),
              "blk.0.attn_q.bias": (8,), "blk.0.attn_k.bias": (4,), "blk.0.attn_v.bias": (4,),
              "blk.0.attn_output.weight": (8, 8), "blk.0.ffn_norm.weight": (8,),
              "blk.0.ffn_gate.weight": (16, 8), "blk.0.ffn_up.weight": (16, 8),
              "blk.0.ffn_down.weight": (8, 16)}
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    arrays.update(replace or {})
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", "a"])
    w.add_token_scores([0.0, 0.0, 0.0, -1.0])
    for n, a in arrays.items():
        if n not in drop:
            w.add_tensor(n, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return arrays


def test_qwen2_gguf_keeps_q_k_rows_and_reads_biases(tmp_path):
    """llama.cpp's converter writes qwen2 q/k rows in HF order (it runs qwen2 with NEOX-style
    RoPE, the rotate-half form), so the exporter takes them as stored; the real 0.5B test below
    checks the same against transformers."""
    from ditto_export_gguf import GGUFExporter

    src = tmp_path / "q.gguf"
    arrays = write_qwen2_gguf(src)
    ck = GGUFExporter().load(src)
    c = ck.config
    assert (c.arch, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.tied_embeddings) == (
        "qwen2", 8, 2, 1, 4, True)
    assert (c.rope_theta, c.norm_eps) == (1e6, float(np.float32(1e-6)))  # GGUF stores f32
    for n in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_q.bias",
              "blk.0.attn_k.bias", "blk.0.attn_v.bias"):
        np.testing.assert_array_equal(ck.tensors[n](), arrays[n])


@pytest.mark.parametrize("arch,drop,replace,needles", [
    ("qwen2", ("blk.0.attn_k.bias",), None,
     ["missing tensor(s) blk.0.attn_k.bias", "a qwen2 model has F32 biases"]),
    ("qwen2", (), {"blk.0.attn_q.bias": np.zeros(4, np.float32)},
     ["tensor 'blk.0.attn_q.bias' has shape (4,), the config implies (8,)",
      "a qwen2 model has F32 biases"]),
    ("qwen2", (), {"blk.0.attn_v.bias": np.zeros((1, 4), np.float32)},
     ["tensor 'blk.0.attn_v.bias' has shape (1, 4), the config implies (4,)"]),
    ("llama", (), None, ["unexpected tensor 'blk.0.attn_q.bias' for a 1-layer Llama model"]),
])
def test_bad_qwen2_gguf_is_refused(tmp_path, arch, drop, replace, needles):
    bad = tmp_path / "bad.gguf"
    write_qwen2_gguf(bad, arch, drop, replace)
    r, out, outdir = run_export(bad, tmp_path)
    assert_refused(r, out, outdir, bad, *needles)


# ----------------------------------------------------------------------------- the real 0.5B

#: short code prompts: a function body, a class, a fill-in-the-middle request
QWEN_PROMPTS = ("def fibonacci(n):\n    if n < 2:\n        return n\n",
                "import numpy as np\n\nclass Matrix:\n    def __init__(self, rows",
                "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n<|fim_middle|>")


@pytest.fixture(scope="module")
def qwen05_transformers(qwen05_gguf, qwen05_gguf_reader, qwen05_hf_tokenizer):
    """(tokenizer, Qwen2ForCausalLM fp32) that transformers reads from the 0.5B GGUF."""
    import torch
    from transformers import AutoModelForCausalLM

    with shared_gguf_reader(qwen05_gguf_reader):
        model = AutoModelForCausalLM.from_pretrained(str(qwen05_gguf.parent),
                                                     gguf_file=qwen05_gguf.name,
                                                     dtype=torch.float32)
    return qwen05_hf_tokenizer, model.eval()


def test_qwen05_fp32_logits_equal_transformers(native_build, qwen05_f32_ditto,
                                               qwen05_transformers, tmp_path):
    import torch

    tok, model = qwen05_transformers
    assert type(model).__name__ == "Qwen2ForCausalLM"
    c = ModelFile(qwen05_f32_ditto).config
    assert (c.arch, c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim) == (
        "qwen2", 24, 896, 14, 2, 64)
    worst = []
    for prompt in QWEN_PROMPTS:
        ids = tok(prompt)["input_ids"]
        assert 8 <= len(ids) <= 20, ids
        # mapped, not read into memory: the 2.5 GB f32 file takes ~12 s to read and ~4 s to
        # map here, and f32 tensors go through the same kernels either way
        got = dump_logits(native_build.run, qwen05_f32_ditto, ids, tmp_path, "--mmap")
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].double().numpy()
        assert got.shape == ref.shape == (len(ids), 151936)
        err = float(np.abs(got - ref).max())
        worst.append(err)
        # measured: max |Δlogit| 6.5e-5 .. 7.7e-5 (logits up to ~30)
        assert err < 1e-3, f"{prompt!r}: max |Δlogit| {err:.3g}"
        top = got.argmax(-1) == ref.argmax(-1)
        assert top.all(), f"{prompt!r}: top-1 differs at {np.flatnonzero(~top)}, " \
                          f"max |Δlogit| {err:.3g}"
    print(f"qwen05 fp32 vs transformers: max |Δlogit| per prompt {worst}")
