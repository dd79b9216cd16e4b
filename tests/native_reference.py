"""NumPy reference forward pass of a Llama decoder, in float64, over a whole token sequence.

Written from the definitions (transformers' LlamaModel): RMSNorm (Zhang & Sennrich 2019),
rotate-half RoPE (Su et al. 2021; HF q/k order, docs/FORMAT.md), causal grouped-query
attention (Ainslie et al. 2023), SwiGLU feed-forward (Shazeer 2020), final RMSNorm and classifier.
A Qwen2 model (``cfg.arch == "qwen2"``, transformers' Qwen2Model) adds the biases
``blk.N.attn_{q,k,v}.bias`` after the q/k/v projections, before RoPE.
Used to check the C runtime on quantized models (weights given already dequantized).
"""

from __future__ import annotations

import numpy as np


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x [T, dim] -> w * x / sqrt(mean(x^2) + eps)."""
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE. x [T, heads, d]; cos/sin [T, d/2]."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def reference_logits(cfg: dict, w: dict, ids, linear=None, k_dtype=None,
                     v_dtype=None) -> np.ndarray:
    """Logits [T, vocab] (float64) at every position of the token ids ``ids``.

    ``cfg``: a ditto_core.base.types.ModelConfig; ``w``: float64 weights by FORMAT.md tensor name
    (matrices [out, in]; "output.weight" present, the embedding itself when tied; the q/k/v
    biases of a Qwen2 model).
    ``linear(h, name)``: the product h [T, in] @ w[name].T, by default in float64 (a caller can
    emulate a kernel's arithmetic, e.g. the int8 GEMV's activation quantization).
    ``k_dtype``, ``v_dtype``: the keys (after RoPE) and values rounded to this dtype before
    attention, as a KV cache of that element type stores them (np.float16: --cache-type-k/v
    f16)."""
    if linear is None:
        def linear(h, name):
            return h @ w[name].T
    ids = np.asarray(ids, dtype=np.int64)
    T, d = len(ids), cfg.head_dim
    H, KV = cfg.n_heads, cfg.n_kv_heads
    eps = float(np.float32(cfg.norm_eps))  # as stored in the file (f32)
    theta = float(np.float32(cfg.rope_theta))
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2) / d)
    ang = np.arange(T)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    x = w["token_embd.weight"][ids]
    bias = getattr(cfg, "arch", "llama") == "qwen2"
    for l in range(cfg.n_layers):
        p = f"blk.{l}."
        h = rmsnorm(x, w[p + "attn_norm.weight"], eps)
        q, k, v = (linear(h, p + f"attn_{n}.weight") + (w[p + f"attn_{n}.bias"] if bias
                                                         else 0.0) for n in "qkv")
        q = rope(q.reshape(T, H, d), cos, sin)
        k = rope(k.reshape(T, KV, d), cos, sin)
        v = v.reshape(T, KV, d)
        if k_dtype is not None:
            k = k.astype(np.float32).astype(k_dtype).astype(np.float64)
        if v_dtype is not None:
            v = v.astype(np.float32).astype(v_dtype).astype(np.float64)
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(d) + mask
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        att = scores / scores.sum(axis=-1, keepdims=True)
        out = np.einsum("hts,shd->thd", att, v).reshape(T, H * d)
        x = x + linear(out, p + "attn_output.weight")
        h = rmsnorm(x, w[p + "ffn_norm.weight"], eps)
        g = linear(h, p + "ffn_gate.weight")
        x = x + linear(g / (1.0 + np.exp(-g)) * linear(h, p + "ffn_up.weight"),
                       p + "ffn_down.weight")
    x = rmsnorm(x, w["output_norm.weight"], eps)
    return linear(x, "output.weight")
