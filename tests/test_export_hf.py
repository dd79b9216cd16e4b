"""HF exporter: the derived SmolLM2 HF directory gives the same checkpoint as the GGUF; its
tokenizer.json matches llama.cpp's golden ids; transformers confirms the q/k row order; F16,
BF16 and sharded safetensors read exactly."""

import filecmp
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ditto_core.cli.main import cli
from ditto_core.model.modelfile import tokenizers_equal
from ditto_export_hf import HFExporter
from tests.fixtures_hf import TINY_CORPUS, write_tiny_hf_dir

GOLDEN = Path(__file__).resolve().parent / "data" / "smollm2_tokenizer_golden.jsonl"


def test_hf_tokenizer_json_matches_llama_cpp_golden_ids(smollm2_hf_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(smollm2_hf_dir / "tokenizer.json"))
    rows = [json.loads(x) for x in GOLDEN.read_text().splitlines() if x.strip()]
    assert len(rows) == 59
    for row in rows:
        assert tok.encode(row["text"], add_special_tokens=False).ids == row["ids_special"], \
            row["text"]


def test_hf_and_gguf_exports_are_identical(smollm2_hf_dir, smollm2_checkpoint):
    a = HFExporter().load(smollm2_hf_dir)
    b = smollm2_checkpoint
    assert a.config == b.config
    assert tokenizers_equal(a.tokenizer, b.tokenizer)
    assert list(a.shapes) == list(b.shapes) and a.shapes == b.shapes
    for name in a.shapes:
        np.testing.assert_array_equal(a.tensors[name](), b.tensors[name](), err_msg=name)


def test_ditto_export_of_hf_dir_equals_gguf_file(smollm2_hf_dir, smollm2_f32_ditto, tmp_path):
    out = tmp_path / "from_hf.ditto"
    r = CliRunner().invoke(cli, ["export", str(smollm2_hf_dir), "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert filecmp.cmp(out, smollm2_f32_ditto, shallow=False)
    r = CliRunner().invoke(cli, ["inspect", "--json", str(out)])
    s = json.loads(r.output)
    assert s["config"]["n_layers"] == 30 and s["n_tensors"] == 272
    assert s["n_weights"] == 134_515_008  # SmolLM2-135M: 134.5 M parameters (tied)


def test_transformers_confirms_hf_row_order(smollm2_hf_dir):
    """The rotate-half RoPE of transformers only models code well with q/k in HF order: the
    GGUF (adjacent-pair) order gives a much higher loss on the same weights."""
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(smollm2_hf_dir, dtype=torch.float32).eval()
    tok = Tokenizer.from_file(str(smollm2_hf_dir / "tokenizer.json"))
    text = ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
            "    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n")
    ids = torch.tensor([tok.encode(text).ids])

    def loss():
        with torch.no_grad():
            return model(ids, labels=ids).loss.item()

    hf_order = loss()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj, heads in ((layer.self_attn.q_proj, 9), (layer.self_attn.k_proj, 3)):
                w = proj.weight
                w.copy_(w.reshape(heads, 2, w.shape[0] // heads // 2, -1).transpose(1, 2)
                        .reshape(w.shape))
    gguf_order = loss()
    assert hf_order < 1.5, hf_order
    assert gguf_order > hf_order + 1.0, (hf_order, gguf_order)


@pytest.mark.parametrize("dtype,shards", [("float32", 1), ("float16", 3), ("bfloat16", 2)])
def test_dtypes_and_shards(tmp_path, dtype, shards):
    from tokenizers import Tokenizer

    d, expect = write_tiny_hf_dir(tmp_path / "m", dtype=dtype, shards=shards)
    ck = HFExporter().load(d)
    assert ck.config.n_layers == 2 and ck.config.n_kv_heads == 2 and ck.config.head_dim == 8
    assert not ck.config.tied_embeddings
    pairs = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
             "blk.1.attn_k.weight": "model.layers.1.self_attn.k_proj.weight",
             "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
             "blk.1.ffn_norm.weight": "model.layers.1.post_attention_layernorm.weight"}
    for ours, theirs in pairs.items():
        got = ck.tensors[ours]()
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, expect[theirs])
    assert len(ck.shapes) == 2 + 1 + 2 * 9
    # tokenizer: ids from `tokenizers` map back to the text through our raw-byte tokens
    ref = Tokenizer.from_file(str(d / "tokenizer.json"))
    spec = ck.tokenizer
    assert spec.pre == "gpt2_digits" and spec.bos_id == ref.token_to_id("<|im_start|>")
    for text in TINY_CORPUS[:3] + ["naïve café 2024 <|im_end|>"]:
        ids = ref.encode(text, add_special_tokens=False).ids
        assert b"".join(spec.tokens[i] for i in ids) == text.encode()


def test_tied_hf_dir_has_no_output_tensor(tmp_path):
    d, _ = write_tiny_hf_dir(tmp_path / "t", tied=True)
    ck = HFExporter().load(d)
    assert ck.config.tied_embeddings and "output.weight" not in ck.shapes
