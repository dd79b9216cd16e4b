"""Tiny, deliberately malformable model inputs for the reader tests (GGUF and HF directories).

Adapted from the generators of issue 8's reproducer `export-tracebacks-on-malformed-input`
(make_gguf.py / make_hf.py): a 2-layer Llama (dim 16, 4 heads, 2 KV heads) with a SentencePiece
vocabulary (GGUF) or a byte-level BPE tokenizer.json (HF), each with hooks to replace metadata,
headers, weights or tokenizer fields.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import numpy as np

from ditto_core.text.bytelevel import byte_to_unicode

DIM, HID, NL, NH, NKV = 16, 32, 2, 4, 2
HD = DIM // NH


def gguf_vocab():
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + \
           ["\u2581", "\u2581h", "\u2581he", "ll", "o", "\u2581hello", "\u2581world", "wor", "ld"]
    types = [2, 3, 3] + [6] * 256 + [1] * 9
    scores = [0.0] * 259 + [-float(i) for i in range(9)]
    return toks, types, scores


def gguf_shapes(V: int) -> dict:
    shapes = {"token_embd.weight": (V, DIM), "output_norm.weight": (DIM,),
              "output.weight": (V, DIM)}
    for layer in range(NL):
        p = f"blk.{layer}."
        shapes.update({p + "attn_norm.weight": (DIM,), p + "attn_q.weight": (NH * HD, DIM),
                       p + "attn_k.weight": (NKV * HD, DIM), p + "attn_v.weight": (NKV * HD, DIM),
                       p + "attn_output.weight": (DIM, NH * HD), p + "ffn_norm.weight": (DIM,),
                       p + "ffn_gate.weight": (HID, DIM), p + "ffn_up.weight": (HID, DIM),
                       p + "ffn_down.weight": (DIM, HID)})
    return shapes


def make_gguf(path: Path, kv: dict | None = None, drop=(), big_endian: bool = False,
              w_patch=None, f16: tuple = (), q8: tuple = ()) -> dict[str, np.ndarray]:
    """Write a tiny llama GGUF at ``path``; ``kv``: {key: (type, value)} overrides (types u32,
    i32, u64, f32, f64, str, bool, arr); ``drop``: keys left out; ``w_patch(weights)`` edits
    the float32 weights first; tensors named in ``f16`` / ``q8`` are stored as F16 / Q8_0.
    Returns the float32 weights written (GGUF row order)."""
    toks, types, scores = gguf_vocab()
    endian = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    meta = {
        "llama.context_length": ("u32", 128), "llama.embedding_length": ("u32", DIM),
        "llama.block_count": ("u32", NL), "llama.feed_forward_length": ("u32", HID),
        "llama.rope.dimension_count": ("u32", HD), "llama.attention.head_count": ("u32", NH),
        "llama.attention.head_count_kv": ("u32", NKV),
        "llama.attention.layer_norm_rms_epsilon": ("f32", 1e-5),
        "tokenizer.ggml.model": ("str", "llama"), "tokenizer.ggml.tokens": ("arr", toks),
        "tokenizer.ggml.scores": ("arr", scores), "tokenizer.ggml.token_type": ("arr", types),
        "tokenizer.ggml.bos_token_id": ("u32", 1), "tokenizer.ggml.eos_token_id": ("u32", 2),
        "tokenizer.ggml.unknown_token_id": ("u32", 0),
    }
    meta.update(kv or {})
    for k in drop:
        meta.pop(k, None)
    add = {"u32": w.add_uint32, "i32": w.add_int32, "u64": w.add_uint64, "i64": w.add_int64,
           "f32": w.add_float32, "f64": w.add_float64, "str": w.add_string, "bool": w.add_bool,
           "arr": w.add_array}
    for k, (t, v) in meta.items():
        add[t](k, v)
    rng = np.random.default_rng(0)
    weights = {n: (np.ones(s, np.float32) if len(s) == 1
                   else (rng.standard_normal(s) * 0.3).astype(np.float32))
               for n, s in gguf_shapes(len(toks)).items()}
    if w_patch:
        w_patch(weights)
    for name, a in weights.items():
        if name in f16:
            w.add_tensor(name, a.astype(np.float16))
        elif name in q8:
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


# ---------------------------------------------------------------------------------------------
def hf_tokenizer_json() -> dict:
    b2u = byte_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges = []
    for a, b in [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o")]:
        vocab[a + b] = len(vocab)
        merges.append(f"{a} {b}")
    n = len(vocab)
    added = [{"id": n + k, "content": c, "special": True, "single_word": False,
              "lstrip": False, "rstrip": False, "normalized": False}
             for k, c in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])]
    return {"version": "1.0", "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                              "trim_offsets": True, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                      "merges": merges}}


HF_V = 256 + 4 + 3


def hf_config() -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": DIM,
            "intermediate_size": HID, "num_hidden_layers": NL, "num_attention_heads": NH,
            "num_key_value_heads": NKV, "vocab_size": HF_V, "max_position_embeddings": 128,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
            "hidden_act": "silu", "bos_token_id": HF_V - 3, "eos_token_id": HF_V - 3}


def hf_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    w = {"model.embed_tokens.weight": (HF_V, DIM), "model.norm.weight": (DIM,),
         "lm_head.weight": (HF_V, DIM)}
    for layer in range(NL):
        p = f"model.layers.{layer}."
        w.update({p + "input_layernorm.weight": (DIM,),
                  p + "self_attn.q_proj.weight": (NH * HD, DIM),
                  p + "self_attn.k_proj.weight": (NKV * HD, DIM),
                  p + "self_attn.v_proj.weight": (NKV * HD, DIM),
                  p + "self_attn.o_proj.weight": (DIM, NH * HD),
                  p + "post_attention_layernorm.weight": (DIM,),
                  p + "mlp.gate_proj.weight": (HID, DIM), p + "mlp.up_proj.weight": (HID, DIM),
                  p + "mlp.down_proj.weight": (DIM, HID)})
    return {k: (np.ones(s, np.float32) if len(s) == 1
                else (rng.standard_normal(s) * 0.3).astype(np.float32)) for k, s in w.items()}


def safetensors_bytes(tensors: dict[str, np.ndarray], header_patch=None) -> bytes:
    """A safetensors file (F32) of ``tensors``; ``header_patch(header)`` edits the header."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        b = a.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if header_patch:
        header_patch(header)
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def make_hf(d: Path, cfg_patch=None, cfg_raw: str | None = None, st_patch=None, w_patch=None,
            tok_patch=None, tcfg=None) -> Path:
    """Write a tiny HF Llama directory at ``d`` with the given edits; returns ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    c = hf_config()
    if cfg_patch:
        cfg_patch(c)
    (d / "config.json").write_text(cfg_raw if cfg_raw is not None else json.dumps(c))
    t = hf_tokenizer_json()
    if tok_patch:
        tok_patch(t)
    (d / "tokenizer.json").write_text(json.dumps(t))
    if tcfg is not None:
        (d / "tokenizer_config.json").write_text(tcfg if isinstance(tcfg, str)
                                                 else json.dumps(tcfg))
    w = hf_weights()
    if w_patch:
        w_patch(w)
    (d / "model.safetensors").write_bytes(safetensors_bytes(w, st_patch))
    return d
