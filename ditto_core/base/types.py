"""Artifact types that flow between Ditto's stages.

Plugins never import each other; they meet only through these classes. Every class is an attrs
class; the ones that carry no large data are frozen.

Data flow (see docs/ARCHITECTURE.md)::

    MODEL --export--> Checkpoint --quantize--> QuantizedModel --pack--> model file (.ditto)
    native/**/*.c --emit IR--> IRModule --rewrite--> IRModule + PassReport --link--> executable
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator, Mapping

import attrs
import numpy as np


@attrs.frozen
class ModelConfig:
    """Hyper-parameters of a Llama-family decoder (the fields of ``DittoConfig`` in FORMAT.md).

    ``head_dim`` is usually ``dim // n_heads``; ``max_seq_len`` is the context length in tokens;
    ``rope_theta`` the RoPE base θ; ``norm_eps`` the RMSNorm ε; ``tied_embeddings`` means the
    classifier reuses ``token_embd.weight`` (no ``output.weight`` tensor). ``arch``:
    ``"llama"`` (transformers' LlamaForCausalLM without biases) or ``"qwen2"`` (its
    Qwen2ForCausalLM: the same decoder plus float32 biases ``blk.N.attn_{q,k,v}.bias`` added
    after the q, k and v projections, before RoPE); FORMAT.md "Config".
    """

    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    max_seq_len: int
    rope_theta: float
    norm_eps: float
    tied_embeddings: bool
    arch: str = "llama"


@attrs.frozen
class TokenizerSpec:
    """A tokenizer as stored in the model file (FORMAT.md, "Tokenizer block").

    ``kind``: ``"bpe_bytes"`` (byte-level BPE, merges) or ``"spm_bpe"`` (SentencePiece BPE,
    scores, byte fallback). ``tokens``: token text, raw bytes for byte-level BPE (the GPT-2
    byte-to-unicode mapping undone), UTF-8 pieces for SentencePiece. ``scores``: float32
    [n_tokens]. ``token_types``: uint32 [n_tokens], GGUF numbering. ``merges``: (left_id,
    right_id) in rank order. ``pre``: ``"none"``, ``"gpt2"``, ``"gpt2_digits"`` or ``"qwen2"``.
    """

    kind: str
    tokens: tuple[bytes, ...]
    scores: np.ndarray = attrs.field(eq=False)
    token_types: np.ndarray = attrs.field(eq=False)
    merges: tuple[tuple[int, int], ...] = ()
    pre: str = "none"
    bos_id: int = -1
    eos_id: int = -1
    unk_id: int = -1
    pad_id: int = -1
    add_bos: bool = False
    add_space_prefix: bool = False
    chat_format: str = "none"  # "none" | "chatml"
    chat_template: str = ""
    #: FORMAT.md "Tokenizer flags" (DITTO_TOKF_*): HF behaviours beyond GGUF's
    flags: int = 0
    #: normalizer steps in order: ("lowercase",), ("strip", left, right),
    #: ("replace", pattern, content), ("prepend", text)
    normalizer: tuple = ()
    #: added tokens matched in text (with flag ADDED_RECORDS): (id, DITTO_ADDED_* bits, text)
    added: tuple = ()
    #: the chat template rendered around a user message: text before and after it, or None
    chat_prefix: str | None = None
    chat_suffix: str | None = None
    #: end-of-generation ids (EOG records), sorted; () = just ``eos_id`` (a file without them)
    eog_ids: tuple[int, ...] = ()
    #: FIM token ids (prefix, suffix, middle, pad, repo, sep), -1 where missing (FIM records);
    #: () = none (ditto_core.text.special_tokens)
    fim_ids: tuple[int, ...] = ()


@attrs.define
class Checkpoint:
    """An exported model: config, tokenizer and lazily loaded fp32 tensors.

    ``tensors`` maps Ditto tensor names (FORMAT.md "Tensor names") to zero-argument loaders that
    return a C-contiguous float32 array of the tensor's shape ([rows, cols] or [n]); loading one
    at a time keeps a 7B export within memory (the source stays mmapped).
    """

    config: ModelConfig
    tokenizer: TokenizerSpec
    tensors: Mapping[str, Callable[[], np.ndarray]]
    shapes: Mapping[str, tuple[int, ...]]
    source: Path


@attrs.frozen
class CodebookTensor:
    """One tensor quantized with sub-block codebooks (FORMAT.md, encoding CODEBOOK), unpacked.

    ``codebooks``: float32 [rows, S, 2^b] with S = ceil(cols / G); ``indices``: uint8
    [rows, cols], each < 2^b. ``codebook_type``: ``"f16"``, ``"f32"`` or ``"int8"`` (storage
    precision; the values here are already rounded to it). For ``"int8"``, ``scales`` is float32
    [rows, S] holding f16 values and each centroid is ``scales[r, s] · q`` with q an integer in
    −127..127 (FORMAT.md); ``scales`` is None otherwise. ``rel_error``: ‖W − Ŵ‖²/‖W‖².
    """

    bits: int
    group_size: int
    codebooks: np.ndarray = attrs.field(eq=False)
    indices: np.ndarray = attrs.field(eq=False)
    codebook_type: str = "f16"
    rel_error: float = 0.0
    scales: np.ndarray | None = attrs.field(default=None, eq=False)


@attrs.define
class QuantizedModel:
    """Output of the quantize stage: per tensor either fp32 (ndarray) or a CodebookTensor.

    ``tensors()`` yields ``(name, value)`` lazily in plan order (value: a float32 ndarray of
    the tensor's shape, or a CodebookTensor), so the packer can stream a
    large model; ``plan`` gives, for each name, ``("f32", None)`` or ``("codebook", (b, G,
    codebook_type))`` up front, so the file layout is known before any payload is computed.
    """

    config: ModelConfig
    tokenizer: TokenizerSpec
    plan: Mapping[str, tuple[str, tuple | None]]
    shapes: Mapping[str, tuple[int, ...]]
    tensors: Callable[[], Iterator[tuple[str, np.ndarray | CodebookTensor]]]
    report: dict = attrs.field(factory=dict)


@attrs.frozen
class IRModule:
    """LLVM IR text of the inference program (or of a user's C file, for ``ditto cc``)."""

    text: str
    source: str = ""


@attrs.frozen
class PassReport:
    """What an IR pass did: one dict per candidate loop nest (``function``, ``status``
    ``"rewritten"``/``"rejected"``, ``reason``, and whatever else the pass reports, e.g.
    ``kind``). ``name`` is the pass that produced it (the compile stage sets it)."""

    candidates: tuple[dict, ...] = ()
    name: str = ""

    @property
    def rewritten(self) -> int:
        return sum(1 for c in self.candidates if c.get("status") == "rewritten")

    @property
    def total(self) -> int:
        return len(self.candidates)

    def to_json(self) -> dict:
        """``{"name", "candidates", "rewritten", "total"}`` (build.json, ``--report``)."""
        return {"name": self.name, "candidates": [dict(c) for c in self.candidates],
                "rewritten": self.rewritten, "total": self.total}

    @classmethod
    def from_json(cls, data: dict) -> "PassReport":
        """The report ``to_json`` wrote (the compile cache keeps reports as JSON)."""
        return cls(tuple(dict(c) for c in data.get("candidates", ())), data.get("name", ""))
