"""The paper's int8 baseline: PyTorch dynamic quantization of the transformers model.

``torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)``
(PyTorch docs, "Dynamic Quantization"): every Linear (q/k/v/o, gate/up/down, the classifier)
gets per-tensor int8 weights and quantizes its activations on the fly; the embedding, norms and
everything else stay fp32. The fp32 model is built from Ditto's own export of MODEL (the same
weights as the fp32 Ditto build: names mapped back to transformers', q/k already in rotate-half
order), so its logits match the fp32 build and the int8 row isolates the quantization.

It is evaluated like a build (``evaluate``: same corpus, chunks and fp32 baseline logits) and
benchmarked with the same measures (``bench``, in a fresh process so peak RSS is its own):
``ditto compare MODEL --config torch-int8``. Needs ``torch`` and ``transformers``.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ditto_core.base.errors import DittoError

SPEC = "torch-int8"
LAYER = {"attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
         "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
         "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
         "attn_v.bias": "self_attn.v_proj.bias",
         "attn_output.weight": "self_attn.o_proj.weight",
         "ffn_norm.weight": "post_attention_layernorm.weight",
         "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
         "ffn_down.weight": "mlp.down_proj.weight"}
GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight":
          "model.norm.weight", "output.weight": "lm_head.weight"}


def hf_name(name: str) -> str:
    """Ditto tensor name → transformers LlamaForCausalLM / Qwen2ForCausalLM state-dict name."""
    if name in GLOBAL:
        return GLOBAL[name]
    parts = name.split(".", 2)  # blk.N.rest
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER:
        return f"model.layers.{parts[1]}.{LAYER[parts[2]]}"
    raise DittoError(f"tensor {name}: no transformers name for it")


def fp32_model(model: str):
    """transformers LlamaForCausalLM / Qwen2ForCausalLM (fp32, eval mode; see
    ``fp32_model_from_checkpoint``) with the weights of Ditto's export of
    MODEL (path or bundled name). Raises DittoError if torch/transformers are missing."""
    from ditto_core.stages import pipeline

    return fp32_model_from_checkpoint(pipeline.export(model))


def fp32_model_from_checkpoint(ck):
    """transformers LlamaForCausalLM, or Qwen2ForCausalLM for ``arch == "qwen2"`` (q/k/v
    biases, full attention in every layer), fp32 and in eval mode, holding the weights of the
    Ditto Checkpoint ``ck`` (names mapped with ``hf_name``). Raises DittoError if
    torch/transformers are missing."""
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    except ImportError:
        raise DittoError("the fp32 PyTorch model needs torch and transformers") from None

    c = ck.config
    common = dict(vocab_size=c.vocab_size, hidden_size=c.dim, intermediate_size=c.hidden_dim,
                  num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                  num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
                  max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps,
                  rope_theta=c.rope_theta, tie_word_embeddings=c.tied_embeddings)
    if c.arch == "qwen2":
        cfg, model_class = Qwen2Config(use_sliding_window=False, **common), Qwen2ForCausalLM
    else:
        cfg = LlamaConfig(attention_bias=False, mlp_bias=False, **common)
        model_class = LlamaForCausalLM
    with torch.device("meta"):
        m = model_class(cfg)
    state = {hf_name(n): torch.from_numpy(np.ascontiguousarray(ck.tensors[n](), np.float32))
             for n in ck.shapes}
    if c.tied_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    m.load_state_dict(state, strict=True, assign=True)
    if c.tied_embeddings:
        m.tie_weights()
    m.model.rotary_emb.__init__(cfg)  # the meta-device init left its inv_freq buffer empty
    return m.eval()


def int8_model(model: str):
    """fp32_model(MODEL) with every nn.Linear dynamically quantized to int8."""
    import torch

    return torch.ao.quantization.quantize_dynamic(fp32_model(model), {torch.nn.Linear},
                                                  dtype=torch.qint8)


def logits(m, ids: list[int], rows: slice) -> np.ndarray:
    """float32 ``[rows, vocab]`` logits of one sequence (one forward pass, no BOS added)."""
    import torch

    with torch.inference_mode():
        out = m(torch.tensor([ids])).logits[0, rows]
    return out.float().numpy()


def evaluate(model: str, baseline_dir: Path, *, n_chunks: int | None = None,
             threads: int | None = None, quantize: bool = True,
             progress: Callable[[int, int], None] | None = None) -> dict:
    """Perplexity and KL divergence of the int8 model (``quantize=False``: the fp32 one)
    against the fp32 build ``baseline_dir`` on the corpus chunks, tokenized by that build;
    the same keys as fidelity.evaluate_fidelity."""
    import hashlib
    import tempfile

    import torch

    from ditto_core.runtime.run import find_build
    from . import corpus as corpus_mod
    from .fidelity import LogitsCache, build_vocab, dump_logits
    from .metrics import KLAccumulator

    if threads:
        torch.set_num_threads(threads)
    m = int8_model(model) if quantize else fp32_model(model)
    vocab, tok = build_vocab(baseline_dir)
    if m.config.vocab_size != vocab:
        raise DittoError(f"{baseline_dir}: vocabulary {vocab} differs from {model}'s "
                         f"{m.config.vocab_size}")
    exe, mfile, _ = find_build(baseline_dir)
    data = corpus_mod.corpus_bytes()
    tokens = corpus_mod.tokenize(exe, mfile, data, tok.add_bos)
    n_ctx = corpus_mod.N_CTX
    chunk_list = corpus_mod.chunks(tokens, n_ctx, n_chunks,
                                   bos_id=tok.bos_id if tok.add_bos else None)
    first = n_ctx // 2
    rows = slice(first, n_ctx - 1)
    acc = KLAccumulator()
    cache = LogitsCache(baseline_dir, threads=threads)
    with tempfile.TemporaryDirectory(prefix="ditto-eval-") as tmp:
        for i, chunk in enumerate(chunk_list):
            base = cache.get(chunk, rows, vocab)
            if base is None:
                base = dump_logits(baseline_dir, chunk, Path(tmp), threads=threads, rows=rows)
                cache.put(chunk, rows, base)
            acc.add(base, logits(m, chunk, rows), chunk[first + 1:])
            if progress:
                progress(i + 1, len(chunk_list))
    out = acc.summary()
    out.update(chunks=len(chunk_list), n_ctx=n_ctx, corpus_tokens=len(tokens),
               corpus_sha256=hashlib.sha256(data).hexdigest())
    return out


def _bench_here(model: str, threads: int, tokens: int, prompt_ids: list[int],
                decode_ids: list[int]) -> dict:
    """One benchmark sample in this process (called by ``bench`` in a fresh process)."""
    import resource

    import torch

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    m = int8_model(model)
    load_ms = 1000 * (time.perf_counter() - t0)
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    n_weights = sum(p.numel() for p in fp32_model(model).parameters())
    with torch.inference_mode():
        t0 = time.perf_counter()
        m(torch.tensor([prompt_ids]))
        prompt_ms = 1000 * (time.perf_counter() - t0)
        t0 = time.perf_counter()
        out = m(torch.tensor([decode_ids]), use_cache=True)
        nxt = out.logits[0, -1].argmax()
        ttft_ms = 1000 * (time.perf_counter() - t0)
        past = out.past_key_values
        t1 = time.perf_counter()
        for _ in range(tokens - 1):
            out = m(nxt.view(1, 1), past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[0, -1].argmax()
        decode_ms = 1000 * (time.perf_counter() - t1)
    return {"load_ms": load_ms, "prompt_tokens": len(prompt_ids), "prompt_ms": prompt_ms,
            "ttft_ms": ttft_ms, "generated_tokens": tokens, "decode_ms": decode_ms,
            "tok_per_s": 1000 * (tokens - 1) / decode_ms,
            "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "file_bytes": buf.getbuffer().nbytes, "n_weights": n_weights}


def bench(model: str, baseline_dir: Path, *, threads: list[int], repeat: int = 3,
          tokens: int = 128, prompt_tokens: int = 512) -> dict:
    """ditto bench's measures for the int8 model, each sample in a fresh Python process (peak
    RSS includes the fp32 model quantize_dynamic starts from). ``file_bytes`` is the size of
    the quantized state dict saved by torch.save. Same keys as bench.bench_build."""
    from ditto_core.runtime.run import find_build
    from . import corpus as corpus_mod
    from .bench import DECODE_PROMPT, spread
    from .fidelity import build_vocab

    exe, mfile, _ = find_build(baseline_dir)
    _, tok = build_vocab(baseline_dir)
    prompt_ids = corpus_mod.tokenize(exe, mfile, corpus_mod.corpus_bytes(),
                                     tok.add_bos)[:prompt_tokens]
    decode_ids = corpus_mod.tokenize(exe, mfile, DECODE_PROMPT.encode(), tok.add_bos)
    samples = {t: [] for t in threads}
    load_before = os.getloadavg()[0]
    for _ in range(repeat):
        for t in threads:
            args = json.dumps([str(model), t, tokens, prompt_ids, decode_ids])
            proc = subprocess.run([sys.executable, "-c", "import json, sys; from ditto_core.eval "
                                   "import torch_int8 as m; print(json.dumps(m._bench_here("
                                   "*json.loads(sys.stdin.read()))))"],
                                  input=args, capture_output=True, text=True)
            if proc.returncode != 0:
                raise DittoError(f"torch-int8 bench failed: {proc.stderr.strip()[-2000:]}")
            samples[t].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first = samples[threads[0]][0]
    per = {str(t): {
        "prompt_tok_per_s": spread([1000 * r["prompt_tokens"] / r["prompt_ms"] for r in s]),
        "decode_tok_per_s": spread([r["tok_per_s"] for r in s]),
        "ttft_ms": spread([r["ttft_ms"] for r in s]),
        "ttft_prompt_ms": spread([r["prompt_ms"] for r in s]),
        "load_ms": spread([r["load_ms"] for r in s]),
        "peak_rss_mib": max(r["peak_rss_kib"] for r in s) / 1024,
        "joules_per_token": None} for t, s in samples.items()}
    return {"build": SPEC, "quantizer": SPEC, "options": None,
            "file_bytes": first["file_bytes"], "n_weights": first["n_weights"],
            "bpw": 8.0 * first["file_bytes"] / first["n_weights"],
            "prompt_tokens": len(prompt_ids), "tokens": tokens, "decode_prompt": DECODE_PROMPT,
            "repeat": repeat, "energy": "not measured for torch-int8", "threads": per,
            "median_of": statistics.median([len(s) for s in samples.values()]),
            "load_average": [load_before, os.getloadavg()[0]]}
