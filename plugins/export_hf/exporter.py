"""The ``hf`` exporter: a Hugging Face ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` directory ->
``Checkpoint``.

Reads ``config.json``, the weights (``model.safetensors``, or the shards named by
``model.safetensors.index.json``; F32/F16/BF16, mmapped, converted to float32 one tensor at a
time) and the tokenizer (see ``tokenizer.py``). HF q/k rows are already in the rotate-half order
Ditto uses (docs/FORMAT.md), so tensors are only renamed; a Qwen2 model's q/k/v projection
biases become ``blk.N.attn_{q,k,v}.bias``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath

import numpy as np

from ditto_core.base.errors import DittoError
from ditto_core.base.types import Checkpoint, ModelConfig
from ditto_core.base.untrusted import Fields
from ditto_core.model.modelfile import ARCH_NAMES, check_config, expected_shapes
from ditto_core.text.chat_template import with_chat_text

from .safetensors_index import SafetensorsIndex
from .tokenizer import tokenizer_from_hf
from .tokenizer_types import check_tokenizer_files

#: ``architectures`` entry -> ``model_type`` -> ModelConfig.arch
ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2"}
#: tensors per layer (the bound ``num_hidden_layers`` is checked against)
PER_LAYER = {"llama": 9, "qwen2": 12}
#: max_position_embeddings when config.json leaves it out: transformers' LlamaConfig and
#: Qwen2Config defaults
DEFAULT_CONTEXT = {"llama": 2048, "qwen2": 32768}

#: HF per-layer tensor suffix -> Ditto per-layer name
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def ditto_name(hf_name: str) -> str | None:
    """Ditto tensor name of an HF Llama tensor name, or None if it has none
    (``model.layers.3.mlp.up_proj.weight`` -> ``blk.3.ffn_up.weight``)."""
    if hf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf_name]
    m = _LAYER.match(hf_name)
    if m and m.group(2) in LAYER_NAMES:
        return f"blk.{m.group(1)}.{LAYER_NAMES[m.group(2)]}"
    return None


def _f32(x) -> float:
    """The value the model file will store (float32), so both exporters agree exactly."""
    return float(np.float32(x))


def read_config(path: Path) -> tuple[dict, ModelConfig]:
    """(raw config.json, ModelConfig). Raises DittoError naming the file for a missing file,
    an architecture other than Llama / Qwen2, missing keys, or unsupported features (RoPE
    scaling, Llama biases, Qwen2 sliding-window attention)."""
    if not path.is_file():
        raise DittoError(f"{path}: missing (an HF model directory needs config.json)")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise DittoError(f"{path}: cannot read JSON: {exc}") from None
    f = Fields(cfg, str(path), "key", "config")
    archs = f.list("architectures", str, [])
    mtype = f.get("model_type", None)
    arch = MODEL_TYPES.get(mtype) if isinstance(mtype, str) else None
    if arch is None or (archs and arch not in {ARCHITECTURES.get(a) for a in archs}):
        raise DittoError(f"{path}: architecture {archs or mtype!r} (model_type {mtype!r}) is "
                         f"not supported; Ditto exports {' and '.join(ARCHITECTURES)} models")
    # transformers 4 reads rope_theta and rope_scaling, 5 reads rope_parameters and merges a
    # rope_scaling into it: scaling in either is refused, and a theta the two read
    # differently (rope_theta beside a different rope_parameters.rope_theta) too
    ropes = {}
    for key in ("rope_parameters", "rope_scaling"):
        rope = Fields(f.mapping(key, {}), str(path), f"key {key!r} field")
        rope_type = rope.str("rope_type", rope.str("type", "default"))
        if rope_type != "default":
            raise DittoError(f"{path}: RoPE scaling {rope_type!r} is not supported ({key})")
        ropes[key] = rope
    if arch == "llama" and (f.bool("attention_bias", False) or f.bool("mlp_bias", False)):
        raise DittoError(f"{path}: attention/MLP biases are not supported")
    if arch == "qwen2":
        # transformers' Qwen2 masks "sliding_attention" layers to a window; Ditto attends to
        # every earlier position, so such a model is refused rather than run differently
        if f.bool("use_sliding_window", False):
            raise DittoError(f"{path}: use_sliding_window: true (sliding-window attention) is "
                             f"not supported")
        layer_types = f.list("layer_types", str, [])
        if any(t != "full_attention" for t in layer_types):
            bad = next(t for t in layer_types if t != "full_attention")
            raise DittoError(f"{path}: layer_types has {bad!r}; only 'full_attention' layers "
                             f"are supported")
    act = f.str("hidden_act", "silu")
    if act != "silu":
        raise DittoError(f"{path}: activation {act!r} is not supported (silu)")

    dim = f.int("hidden_size")
    n_heads = f.int("num_attention_heads")
    theta = f.float("rope_theta", None, positive=True)
    nested = ropes["rope_parameters"].float("rope_theta", None, positive=True)
    if theta is not None and nested is not None and theta != nested:
        raise DittoError(f"{path}: rope_theta {theta:g} and rope_parameters.rope_theta "
                         f"{nested:g} disagree (transformers 4 reads the first, 5 the second)")
    if theta is None:
        theta = nested if nested is not None else 10000.0
    config = ModelConfig(
        dim=dim, hidden_dim=f.int("intermediate_size"),
        n_layers=f.int("num_hidden_layers"), n_heads=n_heads,
        n_kv_heads=f.int("num_key_value_heads", n_heads),
        head_dim=f.int("head_dim", dim // n_heads),
        vocab_size=f.int("vocab_size"),
        max_seq_len=f.int("max_position_embeddings", DEFAULT_CONTEXT[arch]),
        rope_theta=_f32(theta), norm_eps=_f32(f.float("rms_norm_eps", 1e-6, positive=True)),
        tied_embeddings=f.bool("tie_word_embeddings", False), arch=arch)
    return cfg, config


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a model directory, in transformers' order of preference:
    ``model.safetensors``, else the shards of ``model.safetensors.index.json``, else the only
    ``*.safetensors``. Raises DittoError naming the directory when there are none, and naming
    the index when it is malformed or lists a shard outside the model directory (an absolute
    path or one climbing out with ``..``): every file a model is read from lies in its
    directory, so the directory's contents identify the model (the build cache relies on it)."""
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise DittoError(f"{index}: not a safetensors index ({exc})") from None
        if not isinstance(weight_map, dict) or not weight_map:
            raise DittoError(f"{index}: 'weight_map' must be a non-empty object of tensor name "
                             "-> shard file name")
        files = []
        for shard in dict.fromkeys(weight_map.values()):
            if not isinstance(shard, str) or not shard:
                raise DittoError(f"{index}: shard file name {shard!r} is not a non-empty string")
            parts = PurePosixPath(shard).parts
            if shard.startswith("/") or "\\" in shard or ".." in parts or "\0" in shard:
                raise DittoError(f"{index}: shard {shard!r} is outside the model directory; "
                                 "shards must be files in it (a relative path without '..')")
            f = directory / shard
            if not f.is_file():
                what = "not a regular file" if f.exists() else "missing"
                raise DittoError(f"{f}: shard listed in {index.name} is {what}")
            files.append(f)
        return files
    found = sorted(directory.glob("*.safetensors"))
    if len(found) == 1:
        return found
    if not found:
        extra = " (PyTorch .bin weights are not supported)" if list(
            directory.glob("*.bin")) else ""
        raise DittoError(f"{directory}: no model.safetensors or model.safetensors.index.json"
                         f"{extra}")
    raise DittoError(f"{directory}: several .safetensors files but no "
                     f"model.safetensors.index.json")


def check_tied_lm_head(index: SafetensorsIndex, lm_head: str, embed: str | None,
                       directory: Path) -> None:
    """``tie_word_embeddings: true`` with an ``lm_head.weight`` stored as well. Equal to the
    embedding, the output layer is the embedding either way. Different, transformers 4 ties
    them (the embedding is the output layer) and transformers 5 keeps the stored lm_head, so
    which logits the checkpoint's author saw is unknown: DittoError naming both."""
    if embed is None or index.tensors[lm_head].shape != index.tensors[embed].shape:
        differ = True
    else:
        differ = not np.array_equal(index.load_f32(lm_head), index.load_f32(embed))
    if differ:
        raise DittoError(f"{index.tensors[lm_head].file}: tensor {lm_head!r} differs from "
                         f"{embed!r}, and {directory / 'config.json'} has tie_word_embeddings: "
                         f"true: transformers 4 uses the embedding as the output layer, "
                         f"transformers 5 the stored {lm_head!r}; set tie_word_embeddings to "
                         f"false to use it, or store the embedding")


class HFExporter:
    """Exporter component ``hf`` (see ditto_core.kit.components.Exporter)."""

    name = "hf"

    def can_load(self, path: Path) -> bool:
        """True if ``path`` is a directory with a config.json (nothing is parsed)."""
        return Path(path).is_dir() and (Path(path) / "config.json").is_file()

    def input_files(self, path: Path) -> list[Path]:
        """Every file ``load(path)`` reads: config.json, the tokenizer files, the safetensors
        index and weight files (the build cache hashes exactly these, besides the directory's
        other files). Raises DittoError as ``weight_files`` does."""
        d = Path(path)
        names = ("config.json", "tokenizer.json", "tokenizer_config.json",
                 "model.safetensors.index.json")
        return [d / n for n in names if (d / n).is_file()] + weight_files(d)

    def load(self, path: Path) -> Checkpoint:
        """Read config.json and the tokenizer, index the safetensors tensors lazily.

        Raises DittoError naming the file for: missing config/weights/tokenizer, a non-Llama
        architecture, a truncated safetensors file, a dtype other than F32/F16/BF16, unknown
        tensors, or tensor shapes that do not match the config."""
        directory = Path(path)
        if not directory.is_dir():
            raise DittoError(f"{directory}: not a directory")
        raw, config = read_config(directory / "config.json")
        index = SafetensorsIndex(weight_files(directory))
        per_layer = PER_LAYER[config.arch]
        if config.n_layers > len(index.tensors) // per_layer:
            raise DittoError(f"{directory / 'config.json'}: num_hidden_layers = "
                             f"{config.n_layers}, but the weights hold only "
                             f"{len(index.tensors)} tensors ({per_layer} per layer)")
        names: dict[str, str] = {}  # ditto -> hf
        untied = None
        for hf_name in index.tensors:
            d = ditto_name(hf_name)
            if d is None:
                if hf_name.endswith("rotary_emb.inv_freq"):
                    continue  # a buffer older transformers saved; recomputed from rope_theta
                t = index.tensors[hf_name]
                raise DittoError(f"{t.file}: unexpected tensor {hf_name!r} for a "
                                 f"{ARCH_NAMES[config.arch]} model")
            if d == "output.weight" and config.tied_embeddings:
                untied = hf_name  # tied: the classifier is the embedding; see below
                continue
            names[d] = hf_name
        if untied is not None:
            check_tied_lm_head(index, untied, names.get("token_embd.weight"), directory)
        shapes = {d: index.tensors[h].shape for d, h in names.items()}
        where = str(directory)
        try:
            check_config(config, shapes, where)
        except DittoError as exc:
            raise DittoError(f"{exc} (config: {directory / 'config.json'})") from None
        check_tokenizer_files(directory)
        tokenizer = with_chat_text(tokenizer_from_hf(directory, config.vocab_size, raw),
                                   str(directory))
        order = list(expected_shapes(config))

        def loader(d):
            return lambda: index.load_f32(names[d])

        return Checkpoint(config=config, tokenizer=tokenizer,
                          tensors={d: loader(d) for d in order},
                          shapes={d: shapes[d] for d in order}, source=directory)
