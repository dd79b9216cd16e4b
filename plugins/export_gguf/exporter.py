"""The ``gguf`` exporter: a llama.cpp GGUF file (``llama`` or ``qwen2`` architecture) ->
``Checkpoint``.

Config comes from the ``<arch>.*`` keys, the tokenizer from ``tokenizer.ggml.*``. Tensors stay in
the mmapped file and are dequantized one at a time when loaded (``gguf.quants.dequantize``, any
type the ``gguf`` package supports) to float32 ``[out_features, in_features]``. For ``llama``,
llama.cpp's converter stores q/k rows permuted for adjacent-pair RoPE; ``unpermute_qk``
restores the Hugging Face rotate-half order Ditto uses (docs/FORMAT.md, "Rotary layout of q and
k"). For ``qwen2`` the converter keeps HF's order (llama.cpp runs it with NEOX-style RoPE, the
rotate-half form), so q/k are read as stored; its per-layer ``attn_{q,k,v}.bias`` F32 vectors
are exported as they are.
"""

from __future__ import annotations

import functools
import os
import stat
from pathlib import Path

import numpy as np

from ditto_core.base.errors import DittoError
from ditto_core.base.types import Checkpoint, ModelConfig
from ditto_core.base.untrusted import F32_MAX, Fields
from ditto_core.model.modelfile import check_config, expected_shapes
from ditto_core.text.chat_template import with_chat_text

from .tokenizer import tokenizer_from_gguf

GGUF_MAGIC = b"GGUF"

#: ``general.architecture`` values read -> tensors per layer (the bound on ``block_count``);
#: the ``ModelConfig.arch`` of the export is the same string
ARCHITECTURES = {"llama": 9, "qwen2": 12}


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: within each of ``n_heads`` heads of d rows, GGUF row
    ``2·i + half`` holds HF row ``half·d/2 + i``. ``w``: float32 [n_heads·d, cols]; returns a new
    C-contiguous array in HF row order (convert_hf_to_gguf.py ``LlamaModel.permute``, inverted).
    """
    rows, cols = w.shape
    d = rows // n_heads
    return np.ascontiguousarray(w.reshape(n_heads, d // 2, 2, cols).swapaxes(1, 2)
                                .reshape(rows, cols))


@functools.cache
def _plain_reader_class():
    """``gguf.GGUFReader`` whose ``data`` is a plain ndarray view of the file's memory map.

    The reader slices ``data`` once or more per metadata value (about 760,000 slices for
    Qwen2.5's 151,936-token vocabulary); on a ``np.memmap`` every slice goes through the
    subclass's ``__getitem__`` and ``__array_finalize__``, which take most of the parse (11 s of
    the 0.5B GGUF's, against 3.3 s on the plain view). The view maps the same pages read-only,
    so fields and tensors hold the same bytes."""
    import gguf

    class PlainGGUFReader(gguf.GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._plain_data

        @data.setter
        def data(self, mapped: np.ndarray) -> None:
            self._plain_data = mapped.view(np.ndarray)

    return PlainGGUFReader


def _read_gguf(path: Path):
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            raise DittoError(f"{path}: not a regular file")
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise DittoError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if magic != GGUF_MAGIC:
        raise DittoError(f"{path}: not a GGUF file (magic {magic!r})")
    try:
        return _plain_reader_class()(path, "r")
    except Exception as exc:  # the gguf package raises ValueError/IndexError/... on bad files
        msg = str(exc)
        if isinstance(exc, ValueError) and "alignment" in msg:  # its own check, keep it
            raise DittoError(f"{path}: GGUF key 'general.alignment' must be a non-zero power "
                             f"of two stored as UINT32 (gguf reader: {msg})") from None
        if isinstance(exc, ValueError) and msg.startswith(("Sorry, file appears to be version",
                                                           "Found duplicated")):
            raise DittoError(f"{path}: {msg}") from None
        # other messages are numpy internals ("cannot reshape array ...", "When changing to
        # a larger dtype ..."): name the file, its size and only the kind of failure
        raise DittoError(f"{path}: truncated or corrupt GGUF ({st.st_size:,} bytes; the gguf "
                         f"reader failed with {type(exc).__name__})") from None


def _metadata(reader) -> dict:
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            meta[key] = field.contents()
        except Exception:  # a field type we do not use
            continue
    return meta


#: tokenizer.ggml.* keys Ditto reads, and how each is checked (``Fields`` method, arguments)
TOKENIZER_KEYS = {
    "tokenizer.ggml.model": ("str", {}),
    "tokenizer.ggml.pre": ("str", {}),
    "tokenizer.ggml.tokens": ("list", {"item": str}),
    "tokenizer.ggml.token_type": ("list", {"item": int, "lo": 0, "hi": 6}),
    "tokenizer.ggml.scores": ("list", {"item": (int, float), "finite": True}),
    "tokenizer.ggml.merges": ("list", {"item": str}),
    "tokenizer.ggml.bos_token_id": ("int", {"lo": 0}),
    "tokenizer.ggml.eos_token_id": ("int", {"lo": 0}),
    "tokenizer.ggml.unknown_token_id": ("int", {"lo": 0}),
    "tokenizer.ggml.padding_token_id": ("int", {"lo": 0}),
    **{f"tokenizer.ggml.{k}_token_id": ("int", {"lo": 0})
       for k in ("eot", "eom", "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep",
                 "prefix", "suffix", "middle")},
    "tokenizer.ggml.add_bos_token": ("bool", {}),
    "tokenizer.ggml.add_eos_token": ("bool", {}),
    "tokenizer.ggml.add_space_prefix": ("bool", {}),
    "tokenizer.chat_template": ("str", {}),
}


def checked_tokenizer_meta(f: Fields) -> dict:
    """GGUF metadata ``f`` with the tokenizer keys type-checked (``TOKENIZER_KEYS``): a key
    of the wrong type is a DittoError naming it, never a crash in the converter."""
    out = dict(f.data)
    for key, (kind, kw) in TOKENIZER_KEYS.items():
        if f.has(key):
            out[key] = getattr(f, kind)(key, **kw)
    return out


def _swappable():
    from gguf import GGMLQuantizationType as Q

    return frozenset({Q.F32, Q.F16})


#: Tensor types whose values Ditto byte-swaps in a big-endian GGUF (gguf-py reads them as
#: '>f4' / '>f2' arrays); block-quantized types of such files are refused.
SWAPPABLE = _swappable()


class GGUFExporter:
    """Exporter component ``gguf`` (see ditto_core.kit.components.Exporter)."""

    name = "gguf"

    def can_load(self, path: Path) -> bool:
        """True if ``path`` is a file starting with the GGUF magic (reads 4 bytes)."""
        path = Path(path)
        if not path.is_file():
            return False
        try:
            with open(path, "rb") as f:
                return f.read(4) == GGUF_MAGIC
        except OSError:
            return False

    def load(self, path: Path) -> Checkpoint:
        """Read config and tokenizer, index tensors lazily (float32 HF order on load).

        Raises DittoError naming the file for: not a GGUF / truncated file, an architecture
        other than ``llama`` / ``qwen2``, missing hyper-parameters or tokenizer, rope scaling or
        partial rotary (unsupported), tensor names/shapes not matching the config (a ``qwen2``
        file without its q/k/v biases, a ``llama`` file with biases), or a tensor type the
        ``gguf`` package cannot dequantize."""
        path = Path(path)
        where = str(path)
        reader = _read_gguf(path)
        meta = _metadata(reader)
        f = Fields(meta, where, "GGUF key")
        arch = f.str("general.architecture", None)
        if arch not in ARCHITECTURES:
            raise DittoError(f"{where}: architecture {arch!r} is not supported "
                             f"(Ditto exports {', '.join(repr(a) for a in ARCHITECTURES)})")
        dim = f.int(f"{arch}.embedding_length")
        n_heads = f.int(f"{arch}.attention.head_count")
        n_kv = f.int(f"{arch}.attention.head_count_kv", n_heads)
        head_dim = f.int(f"{arch}.attention.key_length", dim // n_heads)
        rot = f.int(f"{arch}.rope.dimension_count", head_dim)
        if rot != head_dim:
            raise DittoError(f"{where}: partial rotary embeddings (rope dimension {rot} of "
                             f"head_dim {head_dim}) are not supported")
        scaling = f.str(f"{arch}.rope.scaling.type", "none")
        if scaling != "none":
            raise DittoError(f"{where}: RoPE scaling {scaling!r} is not supported")
        # llama.cpp reads a scaling factor without a type as linear scaling, and the older
        # rope.scale_linear key likewise; either, unless 1, changes every position's angles
        for key in (f"{arch}.rope.scaling.factor", f"{arch}.rope.scale_linear"):
            factor = f.float(key, 1.0, hi=F32_MAX)
            if factor not in (0.0, 1.0):
                raise DittoError(f"{where}: {key} = {factor:g} (linear RoPE scaling, as "
                                 f"llama.cpp reads it) is not supported")
        tokenizer = with_chat_text(tokenizer_from_gguf(checked_tokenizer_meta(f), where), where)
        per_layer = ARCHITECTURES[arch]
        config = ModelConfig(
            dim=dim, hidden_dim=f.int(f"{arch}.feed_forward_length"),
            n_layers=f.int(f"{arch}.block_count",
                           hi=max(1, len(reader.tensors) // per_layer)),
            n_heads=n_heads, n_kv_heads=n_kv,
            head_dim=head_dim, vocab_size=len(tokenizer.tokens),
            max_seq_len=f.int(f"{arch}.context_length", 2048),
            rope_theta=f.float(f"{arch}.rope.freq_base", 10000.0, hi=F32_MAX, positive=True),
            norm_eps=f.float(f"{arch}.attention.layer_norm_rms_epsilon", positive=True),
            tied_embeddings="output.weight" not in {t.name for t in reader.tensors},
            arch=arch)

        swapped = reader.byte_order == "S"  # a GGUF of the other byte order (big-endian)
        shapes, infos = {}, {}
        for t in reader.tensors:
            if swapped and t.tensor_type not in SWAPPABLE:
                raise DittoError(f"{where}: big-endian GGUF with tensor {t.name!r} of type "
                                 f"{t.tensor_type.name}: only F32 and F16 tensors of a "
                                 "big-endian file are read (their values are byte-swapped)")
            ne = [int(x) for x in t.shape]
            shapes[t.name] = (ne[1], ne[0]) if len(ne) == 2 else tuple(reversed(ne))
            infos[t.name] = t
        try:
            check_config(config, shapes, where)
        except DittoError as exc:
            if arch == "qwen2" and ".bias" in str(exc):
                raise DittoError(f"{exc} (a qwen2 model has F32 biases blk.N.attn_q.bias "
                                 f"[n_heads*head_dim], attn_k.bias and attn_v.bias "
                                 f"[n_kv_heads*head_dim] in every layer)") from None
            raise
        shapes = {n: shapes[n] for n in expected_shapes(config)}  # canonical order

        def loader(name):
            return lambda: self._load_tensor(where, infos[name], shapes[name], config)

        return Checkpoint(config=config, tokenizer=tokenizer,
                          tensors={n: loader(n) for n in shapes}, shapes=shapes, source=path)

    @staticmethod
    def _load_tensor(where, t, shape, config: ModelConfig) -> np.ndarray:
        import gguf

        data = t.data
        if data.dtype.byteorder not in ("=", "|", "<"):  # big-endian F32/F16: to native order
            data = data.astype(data.dtype.newbyteorder("="))
        try:
            w = gguf.quants.dequantize(data, t.tensor_type)
        except NotImplementedError:
            raise DittoError(f"{where}: tensor {t.name!r} has type {t.tensor_type.name}, which "
                             f"the gguf package cannot dequantize") from None
        except Exception as exc:
            raise DittoError(f"{where}: tensor {t.name!r} could not be read "
                             f"({type(exc).__name__}: {exc})") from None
        w = np.asarray(w, dtype=np.float32).reshape(shape)
        if config.arch != "llama":  # qwen2: q/k rows already in HF order
            return np.array(w, dtype=np.float32, order="C", copy=True)
        if t.name.endswith("attn_q.weight"):
            return unpermute_qk(w, config.n_heads)
        if t.name.endswith("attn_k.weight"):
            return unpermute_qk(w, config.n_kv_heads)
        return np.array(w, dtype=np.float32, order="C", copy=True)
