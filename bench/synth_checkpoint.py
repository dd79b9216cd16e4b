"""Write a synthetic HF Llama checkpoint with Code Llama-7B shapes (and optionally its GGUF).

    python bench/synth_checkpoint.py -o DIR [--layers 32] [--dim 4096] [--ffn 11008]
        [--heads 32] [--vocab 32016] [--seed 0] [--shard-gb 2] [--gguf FILE]

No 7B checkpoint can be downloaded on the benchmark machine, so this one is drawn: the shapes
and hyper-parameters of Code Llama-7B (config.json of codellama/CodeLlama-7b-hf: 32 layers,
hidden size 4096, intermediate size 11008, 32 heads, vocabulary 32016, RoPE θ = 1e6, RMSNorm
ε = 1e-5, untied classifier), bf16 safetensors shards of at most ``--shard-gb`` GB listed in
``model.safetensors.index.json``, and a SentencePiece-BPE ``tokenizer.json`` (Llama-2 style:
Prepend/Replace "▁" normalizer, ``<0xXX>`` byte fallback) trained with ``tokenizers`` on the
Python standard library's sources.

Weights: every matrix is Student-t (ν = 5, heavy tails) scaled to std 1/sqrt(in_features), with a
few outlier input channels (×8..×20): six hidden-state channels shared by every matrix that reads
the residual stream (as in real LLMs), six random ones for the others. Norm weights are
1 + 0.05·N(0, 1). Each tensor has its own generator seeded by (``--seed``, CRC-32 of its name),
so a tensor is the same whatever ``--layers`` is and in whatever order it is written.

Memory: tensors are drawn, converted and written one at a time (shard headers are computed from
the shapes first), so the script holds one tensor, never a shard or the model. ``--gguf FILE``
also writes the equivalent llama.cpp GGUF (F16 matrices, F32 norms, q/k rows in llama.cpp's
permuted order, tokenizer as ``tokenizer.ggml.model = llama`` with the pieces, scores and types
Ditto's HF exporter reads from tokenizer.json) in the same pass.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
import sysconfig
import time
import zlib
from pathlib import Path

import numpy as np

#: Code Llama-7B (codellama/CodeLlama-7b-hf config.json)
CODE_LLAMA_7B = {"layers": 32, "dim": 4096, "ffn": 11008, "heads": 32, "vocab": 32016,
                 "rope_theta": 1e6, "norm_eps": 1e-5, "context": 16384}
STUDENT_NU = 5.0
N_OUTLIERS = 6
FILL_TOKENS = ("<PRE>", "<SUF>", "<MID>", "<EOT>")  # Code Llama's infilling tokens


def to_bf16_bits(W: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16, same shape) of float32 ``W``, rounded to nearest even."""
    u = np.ascontiguousarray(W, np.float32).view(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return r.astype(np.uint16)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bit patterns ``b`` (uint16)."""
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def synth_matrix(rng: np.random.Generator, rows: int, cols: int,
                 outliers: np.ndarray | None = None, std: float | None = None) -> np.ndarray:
    """A [rows, cols] weight matrix (float32 holding bf16 values): Student-t (ν = 5) with std
    ``std`` (default 1/sqrt(cols)), columns ``outliers`` (default: six drawn from ``rng``)
    scaled by ×8..×20."""
    nu = STUDENT_NU
    z = rng.standard_normal((rows, cols), dtype=np.float32)
    g = rng.standard_gamma(nu / 2, size=(rows, cols), dtype=np.float32)
    scale = np.float32(math.sqrt((nu - 2) / nu) * (std if std else 1 / math.sqrt(cols)))
    # t = z / sqrt(chi2_nu / nu), chi2_nu = 2·Gamma(nu/2); (nu-2)/nu makes the std 1
    W = z * np.sqrt(np.float32(nu / 2) / g) * scale
    del z, g
    if outliers is None:
        outliers = rng.choice(cols, N_OUTLIERS, replace=False)
    W[:, outliers] *= rng.uniform(8, 20, len(outliers)).astype(np.float32)
    return from_bf16_bits(to_bf16_bits(W))


def tensor_rng(seed: int, name: str) -> np.random.Generator:
    """The generator of tensor ``name``: seeded by (seed, CRC-32 of the name)."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def hf_shapes(layers, dim, ffn, vocab):
    """HF tensor name → shape, in the order the checkpoint is written."""
    out = {"model.embed_tokens.weight": (vocab, dim)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (dim,),
                    p + "self_attn.q_proj.weight": (dim, dim),
                    p + "self_attn.k_proj.weight": (dim, dim),
                    p + "self_attn.v_proj.weight": (dim, dim),
                    p + "self_attn.o_proj.weight": (dim, dim),
                    p + "post_attention_layernorm.weight": (dim,),
                    p + "mlp.gate_proj.weight": (ffn, dim),
                    p + "mlp.up_proj.weight": (ffn, dim),
                    p + "mlp.down_proj.weight": (dim, ffn)})
    out["model.norm.weight"] = (dim,)
    out["lm_head.weight"] = (vocab, dim)
    return out


def synth_tensor(name: str, shape, seed: int, hidden_outliers: "HiddenOutliers") -> np.ndarray:
    """The float32 (bf16-valued) tensor ``name`` of the synthetic model."""
    rng = tensor_rng(seed, name)
    if len(shape) == 1:
        w = 1.0 + 0.05 * rng.standard_normal(shape[0], dtype=np.float32)
        return from_bf16_bits(to_bf16_bits(w))
    rows, cols = shape
    # matrices that read the residual stream share its outlier channels; o_proj and down_proj
    # read the attention output / FFN activations and get their own
    reads_hidden = not name.endswith(("o_proj.weight", "down_proj.weight"))
    outl = hidden_outliers if reads_hidden else None
    std = 0.02 if name == "model.embed_tokens.weight" else None  # embedding rows: ~0.02
    return synth_matrix(rng, rows, cols, None if outl is None else outl.channels, std)


class HiddenOutliers:
    """The model-wide outlier channels of the hidden state (``dim`` = hidden size)."""

    def __init__(self, seed: int, dim: int):
        self.dim = dim
        self.channels = np.sort(tensor_rng(seed, "hidden_outliers").choice(dim, N_OUTLIERS,
                                                                           replace=False))


def plan_shards(shapes: dict, shard_bytes: int) -> list[list[str]]:
    """Tensor names grouped into consecutive shards of at most ``shard_bytes`` bf16 bytes (a
    larger tensor gets a shard of its own)."""
    shards, cur, size = [], [], 0
    for name, shape in shapes.items():
        n = 2 * math.prod(shape)
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(name)
        size += n
    if cur:
        shards.append(cur)
    return shards


def safetensors_header(names, shapes) -> bytes:
    """The 8-byte length + JSON header of a BF16 safetensors file holding ``names`` in order
    (huggingface/safetensors "Format"; the JSON padded with spaces to a multiple of 8)."""
    meta, off = {"__metadata__": {"format": "pt"}}, 0
    for n in names:
        nb = 2 * math.prod(shapes[n])
        meta[n] = {"dtype": "BF16", "shape": list(shapes[n]), "data_offsets": [off, off + nb]}
        off += nb
    raw = json.dumps(meta, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


# --------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------

def stdlib_corpus(max_bytes: int) -> list[str]:
    """Up to ``max_bytes`` of text from the standard library's .py files (sorted paths)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for p in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        out.append(text)
        total += len(text.encode())
        if total >= max_bytes:
            break
    return out


def train_tokenizer(vocab: int, corpus_bytes: int = 4_000_000):
    """A Llama-2-style SentencePiece-BPE ``tokenizers.Tokenizer`` of exactly ``vocab`` tokens:
    ids 0-2 ``<unk> <s> </s>``, 3-258 the byte-fallback pieces ``<0x00>``..``<0xFF>``, then
    the BPE pieces trained on the stdlib sources, then Code Llama's infilling tokens and
    ``<unusedN>`` fillers as added tokens up to ``vocab``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers

    special = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    n_fill = len(FILL_TOKENS)
    trainer = trainers.BpeTrainer(vocab_size=vocab - n_fill, special_tokens=special,
                                  show_progress=False, max_token_length=16)
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")
    tok.train_from_iterator(stdlib_corpus(corpus_bytes), trainer)
    # rebuild as a plain BPE model (no pre-tokenizer, as Llama's tokenizer.json): byte pieces
    # are vocabulary entries, not added tokens
    model = json.loads(tok.to_str())["model"]
    pieces = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
              for m in model["merges"]]
    out = Tokenizer(models.BPE(vocab=dict(pieces), merges=merges, unk_token="<unk>",
                               byte_fallback=True, fuse_unk=True))
    out.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    out.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    out.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<unk>", "<s>", "</s>")])
    # BOS first, as Llama-2's tokenizer.json (and add_bos_token in tokenizer_config.json)
    out.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    extra = list(FILL_TOKENS) + [f"<unused{i}>" for i in range(vocab)]
    extra = extra[:vocab - out.get_vocab_size()]
    out.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in extra])
    if out.get_vocab_size() != vocab:
        raise SystemExit(f"tokenizer has {out.get_vocab_size()} tokens, wanted {vocab}")
    return out


def hf_config(layers, dim, ffn, heads, vocab) -> dict:
    c = CODE_LLAMA_7B
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": dim, "intermediate_size": ffn, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": heads, "vocab_size": vocab,
            "max_position_embeddings": c["context"], "rope_theta": c["rope_theta"],
            "rms_norm_eps": c["norm_eps"], "hidden_act": "silu", "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
            "attention_bias": False, "mlp_bias": False}


# --------------------------------------------------------------------------------------------
# GGUF
# --------------------------------------------------------------------------------------------

GGUF_LAYER = {"input_layernorm.weight": "attn_norm.weight",
              "self_attn.q_proj.weight": "attn_q.weight",
              "self_attn.k_proj.weight": "attn_k.weight",
              "self_attn.v_proj.weight": "attn_v.weight",
              "self_attn.o_proj.weight": "attn_output.weight",
              "post_attention_layernorm.weight": "ffn_norm.weight",
              "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
              "mlp.down_proj.weight": "ffn_down.weight"}
GGUF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
               "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def gguf_name(hf: str) -> str:
    if hf in GGUF_GLOBAL:
        return GGUF_GLOBAL[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{GGUF_LAYER[rest]}"


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF (rotate-half) q/k rows → llama.cpp's interleaved order (convert_hf_to_gguf.py
    ``LlamaModel.permute``)."""
    return np.ascontiguousarray(
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2).reshape(w.shape))


def open_gguf(path: Path, cfg: dict, tokenizer_dir: Path, shapes: dict):
    """A ``gguf.GGUFWriter`` with the metadata, tokenizer and tensor table written, ready for
    ``write_tensor_data`` in ``shapes`` order."""
    import gguf

    from ditto_export_hf.tokenizer import tokenizer_from_hf

    spec = tokenizer_from_hf(tokenizer_dir, cfg["vocab_size"], cfg)
    w = gguf.GGUFWriter(str(path), "llama")
    heads = cfg["num_attention_heads"]
    w.add_name("ditto-synth-codellama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    w.add_head_count(heads)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("llama")
    w.add_token_list([t.decode("utf-8") for t in spec.tokens])
    w.add_token_scores([float(s) for s in spec.scores])
    w.add_token_types([int(t) for t in spec.token_types])
    w.add_bos_token_id(spec.bos_id)
    w.add_eos_token_id(spec.eos_id)
    w.add_unk_token_id(spec.unk_id)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    for hf, shape in shapes.items():
        dt = np.float32 if len(shape) == 1 else np.float16
        w.add_tensor_info(gguf_name(hf), shape, np.dtype(dt), math.prod(shape) * dt().itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return w


# --------------------------------------------------------------------------------------------

def write_checkpoint(out: Path, layers: int, dim: int, ffn: int, heads: int, vocab: int,
                     seed: int = 0, shard_bytes: int = 2_000_000_000,
                     gguf_path: Path | None = None, corpus_bytes: int = 4_000_000,
                     log=print) -> dict:
    """Write the synthetic checkpoint into directory ``out`` (created); returns a summary
    {files, n_params, bytes, seconds}. See the module docstring."""
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(layers, dim, ffn, heads, vocab)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2}, indent=2) + "\n")
    tok = train_tokenizer(vocab, corpus_bytes)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
         "add_eos_token": False, "model_max_length": cfg["max_position_embeddings"]},
        indent=2) + "\n")
    log(f"tokenizer: {tok.get_vocab_size()} tokens ({time.perf_counter() - t0:.1f} s)")

    shapes = hf_shapes(layers, dim, ffn, vocab)
    shards = plan_shards(shapes, shard_bytes)
    n = len(shards)
    files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    total = sum(2 * math.prod(s) for s in shapes.values())
    index = {"metadata": {"total_size": total},
             "weight_map": {name: files[i] for i, names in enumerate(shards) for name in names}}
    hidden = HiddenOutliers(seed, dim)
    gw = open_gguf(gguf_path, cfg, out, shapes) if gguf_path else None
    for fname, names in zip(files, shards):
        with open(out / fname, "wb") as f:
            f.write(safetensors_header(names, shapes))
            for name in names:
                W = synth_tensor(name, shapes[name], seed, hidden)
                f.write(to_bf16_bits(W).tobytes())
                if gw is not None:
                    if len(shapes[name]) == 1:
                        gw.write_tensor_data(W.astype(np.float32))
                    else:
                        if name.endswith(("q_proj.weight", "k_proj.weight")):
                            W = permute_qk(W, heads)
                        gw.write_tensor_data(W.astype(np.float16))
                del W
        log(f"{fname}: {len(names)} tensors ({time.perf_counter() - t0:.1f} s)")
    if gw is not None:
        gw.close()
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    n_params = sum(math.prod(s) for s in shapes.values())
    return {"dir": str(out), "files": files, "n_params": n_params, "bytes": total,
            "gguf": str(gguf_path) if gguf_path else None,
            "seconds": time.perf_counter() - t0}


def main(argv=None):
    c = CODE_LLAMA_7B
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", required=True, type=Path, help="output directory")
    ap.add_argument("--layers", type=int, default=c["layers"])
    ap.add_argument("--dim", type=int, default=c["dim"])
    ap.add_argument("--ffn", type=int, default=c["ffn"])
    ap.add_argument("--heads", type=int, default=c["heads"])
    ap.add_argument("--vocab", type=int, default=c["vocab"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-gb", type=float, default=2.0, help="max shard size (GB, 1e9)")
    ap.add_argument("--corpus-mb", type=float, default=4.0,
                    help="MB of stdlib sources to train the tokenizer on")
    ap.add_argument("--gguf", type=Path, help="also write the equivalent F16 GGUF here")
    args = ap.parse_args(argv)
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        ap.error("--dim must be a multiple of --heads with an even head size")
    res = write_checkpoint(args.out, args.layers, args.dim, args.ffn, args.heads, args.vocab,
                           args.seed, int(args.shard_gb * 1e9), args.gguf,
                           int(args.corpus_mb * 1e6), log=lambda s: print(s, file=sys.stderr))
    json.dump(res, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
