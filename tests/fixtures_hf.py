"""Session fixtures: an HF-format SmolLM2 directory derived from the GGUF, and all-f32 .ditto
files of the bundled models.

``smollm2_hf_dir`` is built WITHOUT Ditto's exporters, from the ``gguf`` package's dequantized
weights, so the HF→Ditto vs GGUF→Ditto comparison checks two independent paths:
- weights renamed to HF names; q/k rows put back in HF order with the index formula of
  llama.cpp's HF→GGUF converter, undone (GGUF row ``h·d + 2i + half`` is HF row ``h·d + half·d/2 + i``),
  written as float32 safetensors so logits can be compared tightly;
- config.json written by ``transformers.LlamaConfig`` (tie_word_embeddings, rope θ, RMSNorm ε
  from the GGUF);
- tokenizer.json built with the ``tokenizers`` library from the GGUF vocab and merges, with the
  SmolLM2 pre-tokenizer (digits split, then GPT-2 ByteLevel regex), a ByteLevel decoder and the
  control tokens as special tokens; tokenizer_config.json with BOS/EOS/UNK/PAD and the chat
  template from the GGUF metadata.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

HF_LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
HF_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def gguf_meta(reader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def hf_name(gguf_name: str) -> str:
    if gguf_name in HF_GLOBAL:
        return HF_GLOBAL[gguf_name]
    _, layer, kind, _ = gguf_name.split(".")
    return f"model.layers.{layer}.{HF_LAYER[kind]}.weight"


def gguf_rows_to_hf(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF row order of a GGUF q/k weight [n_heads·d, cols], by explicit row indices."""
    d = w.shape[0] // n_heads
    src = np.empty(w.shape[0], dtype=np.int64)
    for h in range(n_heads):
        for half in range(2):
            for i in range(d // 2):
                src[h * d + half * (d // 2) + i] = h * d + 2 * i + half
    return np.ascontiguousarray(w[src])


def gguf_hf_weights(gguf_path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(GGUF metadata, HF-named float32 weights in HF row order)."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    meta = gguf_meta(reader)
    n_heads = meta["llama.attention.head_count"]
    n_kv = meta.get("llama.attention.head_count_kv", n_heads)
    out = {}
    for t in reader.tensors:
        ne = [int(x) for x in t.shape]
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        w = w.reshape(ne[::-1])
        if ".attn_q." in t.name:
            w = gguf_rows_to_hf(w, n_heads)
        elif ".attn_k." in t.name:
            w = gguf_rows_to_hf(w, n_kv)
        out[hf_name(t.name)] = np.ascontiguousarray(w)
    return meta, out


def build_bytelevel_tokenizer(meta: dict):
    """A ``tokenizers.Tokenizer`` from the GGUF byte-level vocab and merges (SmolLM2 style)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i in range(len(tokens)) if types[i] == 3])
    return tok


def write_smollm2_hf_dir(gguf_path: Path, out: Path) -> Path:
    """Write the HF directory described in the module docstring into ``out``."""
    from safetensors.numpy import save_file
    from transformers import LlamaConfig

    meta, weights = gguf_hf_weights(gguf_path)
    out.mkdir(parents=True, exist_ok=True)
    tokens = meta["tokenizer.ggml.tokens"]
    cfg = LlamaConfig(
        vocab_size=len(tokens), hidden_size=meta["llama.embedding_length"],
        intermediate_size=meta["llama.feed_forward_length"],
        num_hidden_layers=meta["llama.block_count"],
        num_attention_heads=meta["llama.attention.head_count"],
        num_key_value_heads=meta["llama.attention.head_count_kv"],
        max_position_embeddings=meta["llama.context_length"],
        rms_norm_eps=meta["llama.attention.layer_norm_rms_epsilon"],
        rope_theta=meta["llama.rope.freq_base"], tie_word_embeddings=True,
        bos_token_id=meta["tokenizer.ggml.bos_token_id"],
        eos_token_id=meta["tokenizer.ggml.eos_token_id"],
        pad_token_id=meta["tokenizer.ggml.padding_token_id"],
        architectures=["LlamaForCausalLM"])
    cfg.save_pretrained(out)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    build_bytelevel_tokenizer(meta).save(str(out / "tokenizer.json"))
    name = {k: tokens[meta[f"tokenizer.ggml.{k}_token_id"]]
            for k in ("bos", "eos", "unknown", "padding")}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": name["bos"], "eos_token": name["eos"],
        "unk_token": name["unknown"], "pad_token": name["padding"],
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "chat_template": meta["tokenizer.chat_template"], "model_max_length": 8192}, indent=2))
    return out


@pytest.fixture(scope="session")
def smollm2_hf_dir(smollm2_gguf, tmp_path_factory) -> Path:
    """HF directory (config.json, model.safetensors f32, tokenizer.json,
    tokenizer_config.json) of SmolLM2-135M-Instruct, derived from the bundled GGUF."""
    return write_smollm2_hf_dir(smollm2_gguf, tmp_path_factory.mktemp("smollm2_hf"))


def _export_f32(model, out: Path) -> Path:
    """Write ``model`` (a path, or an already exported Checkpoint) as an all-f32 .ditto."""
    from ditto_core.stages import pipeline

    ck = pipeline.export(model) if isinstance(model, (str, Path)) else model
    pipeline.write_f32(ck, out, show_progress=False)
    return out


@pytest.fixture(scope="session")
def smollm2_checkpoint(smollm2_gguf):
    """The SmolLM2 GGUF through the ``gguf`` exporter (tensors load lazily)."""
    from ditto_export_gguf import GGUFExporter

    return GGUFExporter().load(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_f32_ditto(smollm2_checkpoint, tmp_path_factory) -> Path:
    """SmolLM2 GGUF exported to an all-f32 .ditto file (539 MB)."""
    return _export_f32(smollm2_checkpoint,
                       tmp_path_factory.mktemp("smollm2_f32") / "model.ditto")


@pytest.fixture(scope="session")
def tiny_f32_ditto(tiny_gguf, tmp_path_factory) -> Path:
    """tinycoder tiny GGUF exported to an all-f32 .ditto file (4.7 MB)."""
    return _export_f32(tiny_gguf, tmp_path_factory.mktemp("tiny_f32") / "model.ditto")


# --------------------------------------------------------------------------------------------
# A tiny synthetic HF directory (random weights, trained byte-level BPE) for dtype/shard and
# bad-input tests
# --------------------------------------------------------------------------------------------

TINY_CORPUS = ["def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
               "for i in range(10):\n    print(i, i * i)\n",
               "The quick brown fox jumps over the lazy dog. 12345 café naïve\n"] * 20


def train_tiny_tokenizer(vocab_size: int = 320):
    """A byte-level BPE trained by ``tokenizers`` on TINY_CORPUS, SmolLM2-style pre-tokenizer,
    with two special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|im_start|>",
                                                                         "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TINY_CORPUS, trainer)
    return tok


TINY_DIMS = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)


def tiny_hf_weights(vocab: int, tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    d, f, L = TINY_DIMS["hidden_size"], TINY_DIMS["intermediate_size"], \
        TINY_DIMS["num_hidden_layers"]
    hd = d // TINY_DIMS["num_attention_heads"]
    kv = TINY_DIMS["num_key_value_heads"] * hd
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,)}
    if not tied:
        shapes["lm_head.weight"] = (vocab, d)
    for i in range(L):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "self_attn.q_proj.weight": (d, d),
                       p + "self_attn.k_proj.weight": (kv, d),
                       p + "self_attn.v_proj.weight": (kv, d),
                       p + "self_attn.o_proj.weight": (d, d),
                       p + "post_attention_layernorm.weight": (d,),
                       p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                       p + "mlp.down_proj.weight": (d, f)})
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def write_tiny_hf_dir(out: Path, dtype: str = "float32", shards: int = 1,
                      tied: bool = False) -> tuple[Path, dict[str, np.ndarray]]:
    """Write a tiny HF Llama directory with weights stored as ``dtype`` (float32, float16,
    bfloat16; written by ``safetensors.torch``), in ``shards`` files (an index json when > 1).
    Returns (directory, the float32 weights a correct reader must return)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    out.mkdir(parents=True, exist_ok=True)
    tok = train_tiny_tokenizer()
    vocab = tok.get_vocab_size()
    LlamaConfig(vocab_size=vocab, max_position_embeddings=256, rope_theta=10000.0,
                rms_norm_eps=1e-5, tie_word_embeddings=tied, bos_token_id=0, eos_token_id=1,
                architectures=["LlamaForCausalLM"], **TINY_DIMS).save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>"
                         "{% endfor %}"}))
    weights = tiny_hf_weights(vocab, tied)
    tdtype = getattr(torch, dtype)
    stored = {k: torch.from_numpy(v).to(tdtype) for k, v in weights.items()}
    expect = {k: v.to(torch.float32).numpy() for k, v in stored.items()}
    names = list(stored)
    if shards == 1:
        save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for s in range(shards):
            part = names[s::shards]
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            save_file({k: stored[k] for k in part}, str(out / fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in part})
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": weight_map}))
    return out, expect
