"""Session fixtures of the Qwen2 architecture: tiny random ``Qwen2ForCausalLM`` directories
written by transformers (``save_pretrained``), a tiny ``qwen2`` GGUF written from the same kind
of weights with the ``gguf`` package, and the real Qwen2.5-Coder-0.5B-Instruct GGUF exported to
an all-f32 .ditto.

transformers initialises Linear biases to zero and norms to one; the fixtures draw them at
random so that a reader or a forward pass that drops the q/k/v biases (or puts them after RoPE)
gives visibly different logits.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from unittest import mock
from types import SimpleNamespace

import numpy as np
import pytest

from tests.fixtures_hf import _export_f32, train_tiny_tokenizer

#: 2 layers, dim 64, GQA 4 / 2 heads of 16, rope θ and RMSNorm ε as in Qwen2.5
TINY_QWEN2 = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=256, rope_theta=1e6, rms_norm_eps=1e-6)


def write_tiny_qwen2_dir(out: Path, tied: bool, seed: int = 0) -> Path:
    """A random ``Qwen2ForCausalLM`` (TINY_QWEN2, float32) saved by ``save_pretrained`` into
    ``out`` with a trained byte-level BPE tokenizer (``fixtures_hf.train_tiny_tokenizer``);
    q/k/v biases ~ N(0, 0.5), norm weights ~ 1 + N(0, 0.1)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = train_tiny_tokenizer()
    cfg = Qwen2Config(vocab_size=tok.get_vocab_size(), tie_word_embeddings=tied,
                      use_sliding_window=False, bos_token_id=0, eos_token_id=1,
                      architectures=["Qwen2ForCausalLM"], **TINY_QWEN2)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False}))
    return out


def hf_logits(model_dir: Path, ids) -> np.ndarray:
    """float64 [len(ids), vocab] logits of transformers' model loaded from ``model_dir``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].double().numpy()


@pytest.fixture(scope="session")
def tiny_qwen2_hf(tmp_path_factory) -> SimpleNamespace:
    """Two tiny random Qwen2 HF directories: ``tied`` (tie_word_embeddings) and ``untied``
    (a separate lm_head)."""
    d = tmp_path_factory.mktemp("tiny_qwen2")
    return SimpleNamespace(tied=write_tiny_qwen2_dir(d / "tied", tied=True, seed=1),
                           untied=write_tiny_qwen2_dir(d / "untied", tied=False, seed=2))


@pytest.fixture(scope="session")
def qwen05_f32_ditto(qwen05_gguf, tmp_path_factory) -> Path:
    """Qwen2.5-Coder-0.5B-Instruct GGUF exported to an all-f32 .ditto (2.5 GB: its Q8_0
    output.weight and Q5_0 token_embd are both stored)."""
    return _export_f32(qwen05_gguf, tmp_path_factory.mktemp("qwen05_f32") / "model.ditto")


@pytest.fixture(scope="session")
def qwen05_gguf_reader(qwen05_gguf):
    """One ``gguf.GGUFReader`` of the 0.5B GGUF, shared by every transformers load of it: the
    exporter's subclass, whose ``data`` is a plain view of the memory map (the same fields and
    tensors, tests/test_export_gguf.py; 4.5 s to parse instead of 12)."""
    from plugins.export_gguf.exporter import _plain_reader_class

    return _plain_reader_class()(qwen05_gguf)


@contextlib.contextmanager
def shared_gguf_reader(reader):
    """Within the block, transformers' loaders get ``reader`` for its file instead of parsing
    the file again. transformers builds a new ``gguf.GGUFReader`` in every ``from_pretrained``
    (config, tokenizer, weights: three per model), and one parse of Qwen2.5's 151,936-token
    vocabulary takes ~17 s; the reader is read-only (a memory map), so what transformers
    builds from it is the same. Only for reference loads: Ditto's own export is not patched."""
    import gguf

    real = gguf.GGUFReader
    mapped = reader.data if isinstance(reader.data, np.memmap) else reader.data.base
    path = Path(mapped.filename).resolve()

    def reader_for(file, *args, **kwargs):
        return reader if Path(file).resolve() == path else real(file, *args, **kwargs)

    with mock.patch.object(gguf, "GGUFReader", reader_for):
        yield


@pytest.fixture(scope="session")
def qwen05_hf_tokenizer(qwen05_gguf, qwen05_gguf_reader):
    """The tokenizer transformers builds from the 0.5B GGUF (``AutoTokenizer``, gguf_file;
    built once per session)."""
    from transformers import AutoTokenizer

    with shared_gguf_reader(qwen05_gguf_reader):
        return AutoTokenizer.from_pretrained(qwen05_gguf.parent, gguf_file=qwen05_gguf.name)
