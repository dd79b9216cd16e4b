"""Session fixtures for the native inference program (native/): the built executables, small
model files written by hand, and the SmolLM2 references.

Until the project's own writer (ditto_core format writer, pack_bits, the GGUF exporter) lands,
the model files here are written by ``write_ditto``, a direct transcription of docs/FORMAT.md.
The transformers reference for SmolLM2 is built by transformers' own GGUF conversion
(``load_gguf_checkpoint``), so it shares no code with the .ditto export below.
"""

from __future__ import annotations

import json
import os
import subprocess
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ditto_core.types import CodebookTensor

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native"
GOLDEN = ROOT.parent / "shared" / "data" / "smollm2_tokenizer_golden.jsonl"

MAGIC = b"DITTOMDL"
VERSION = 1
ENC_F32, ENC_CODEBOOK = 0, 1
CB_F32, CB_F16 = 0, 1
TOK_BPE_BYTES, TOK_SPM_BPE = 1, 2
PRE_NONE, PRE_GPT2, PRE_GPT2_DIGITS = 0, 1, 2
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6
CHAT_NONE, CHAT_CHATML = 0, 1

# exit codes of ditto-run (native/README.md)
EXIT_OK, EXIT_USAGE, EXIT_MODEL, EXIT_PROMPT, EXIT_IO, EXIT_OOM = 0, 1, 2, 3, 4, 5


def _roundup(x: int, a: int = 64) -> int:
    return (x + a - 1) // a * a


def _pad(b: bytes, a: int) -> bytes:
    return b + b"\0" * (_roundup(len(b), a) - len(b))


# ----------------------------------------------------------------------------- codebook payload

def pack_codebook(ct: CodebookTensor) -> bytes:
    """Payload of a CODEBOOK tensor (FORMAT.md "encoding = 1"): codebooks [rows][S][K] in
    f16/f32, zero-padded to 64 bytes, then per row groups of 8 indices, each group b bytes
    read as one little-endian integer, index j at bits [j*b, (j+1)*b)."""
    b = ct.bits
    cb_dtype = "<f2" if ct.codebook_type == "f16" else "<f4"
    cb = _pad(np.ascontiguousarray(ct.codebooks, dtype=cb_dtype).tobytes(), 64)
    idx = np.asarray(ct.indices, dtype=np.uint64)
    rows, cols = idx.shape
    n_groups = (cols + 7) // 8
    padded = np.zeros((rows, n_groups * 8), dtype=np.uint64)
    padded[:, :cols] = idx
    groups = padded.reshape(rows, n_groups, 8)
    v = np.zeros((rows, n_groups), dtype=np.uint64)
    for j in range(8):
        v |= groups[:, :, j] << np.uint64(j * b)
    out = np.empty((rows, n_groups, b), dtype=np.uint8)
    for i in range(b):
        out[:, :, i] = ((v >> np.uint64(8 * i)) & np.uint64(0xFF)).astype(np.uint8)
    return cb + out.tobytes()


def dequantize_codebook(ct: CodebookTensor) -> np.ndarray:
    """W[r, c] = codebooks[r, c // G, indices[r, c]] as float64 [rows, cols]."""
    rows, cols = ct.indices.shape
    sub = np.arange(cols) // ct.group_size
    cb = np.asarray(ct.codebooks, dtype=np.float64)
    return cb[np.arange(rows)[:, None], sub[None, :], ct.indices.astype(np.int64)]


def random_codebook_tensor(rng: np.random.Generator, rows: int, cols: int, bits: int, G: int,
                           cb_type: str = "f16", scale: float | None = None) -> CodebookTensor:
    """A codebook tensor with random centroids ~ N(0, scale) and random indices."""
    S, K = -(-cols // G), 1 << bits
    scale = scale if scale is not None else 1.0 / np.sqrt(cols)
    cb = rng.normal(0.0, scale, size=(rows, S, K)).astype(np.float32)
    cb = cb.astype(np.float16).astype(np.float32) if cb_type == "f16" else cb
    idx = rng.integers(0, K, size=(rows, cols), dtype=np.uint8)
    return CodebookTensor(bits=bits, group_size=G, codebooks=cb, indices=idx,
                          codebook_type=cb_type)


# ----------------------------------------------------------------------------- model file writer

def tokenizer_block(tok: dict) -> bytes:
    """Tokenizer block of FORMAT.md: header, scores, types, offsets, blob, merges, template."""
    tokens = tok["tokens"]
    n = len(tokens)
    blob = b"".join(tokens)
    offsets = np.zeros(n + 1, dtype="<u4")
    offsets[1:] = np.cumsum([len(t) for t in tokens])
    merges = np.asarray(tok.get("merges", []), dtype="<u4").reshape(-1, 2)
    template = tok.get("template", b"")
    header = np.array([tok["kind"], tok.get("pre", PRE_NONE), n, len(merges)], dtype="<u4").tobytes()
    header += np.array([tok.get("bos", -1), tok.get("eos", -1), tok.get("unk", -1),
                        tok.get("pad", -1)], dtype="<i4").tobytes()
    header += np.array([tok.get("add_bos", 0), tok.get("add_space_prefix", 0),
                        tok.get("chat_format", CHAT_NONE), len(blob), len(template), 0, 0, 0],
                       dtype="<u4").tobytes()
    assert len(header) == 64
    scores = np.asarray(tok.get("scores", np.zeros(n)), dtype="<f4")
    types = np.asarray(tok["types"], dtype="<u4")
    return (header + scores.tobytes() + types.tobytes() + offsets.tobytes() + _pad(blob, 4)
            + merges.tobytes() + _pad(template, 4))


def write_ditto(path: Path, cfg: dict, tok: dict, tensors) -> Path:
    """Write a .ditto file (FORMAT.md, version 1) atomically.

    ``cfg``: the DittoConfig fields by name; ``tok``: see ``tokenizer_block``; ``tensors``: an
    iterable of (name, float32 ndarray | CodebookTensor) in file order (may be a generator)."""
    path = Path(path)
    items = []  # (name, enc, cbt, bits, G, rows, cols, ndim, payload)
    for name, val in tensors:
        if isinstance(val, CodebookTensor):
            rows, cols = val.indices.shape
            payload = pack_codebook(val)
            items.append((name, ENC_CODEBOOK, CB_F16 if val.codebook_type == "f16" else CB_F32,
                          val.bits, val.group_size, rows, cols, 2, payload))
        else:
            a = np.ascontiguousarray(val, dtype="<f4")
            rows, cols = (1, a.shape[0]) if a.ndim == 1 else a.shape
            items.append((name, ENC_F32, 0, 0, 0, rows, cols, a.ndim, a.tobytes()))
    tblock = tokenizer_block(tok)
    n = len(items)
    meta_size = 64 + 128 * n + len(tblock)
    offset = _roundup(64 + meta_size)
    table = b""
    for name, enc, cbt, bits, G, rows, cols, ndim, payload in items:
        nb = name.encode()
        assert len(nb) < 64
        table += nb + b"\0" * (64 - len(nb))
        table += np.array([enc, cbt, bits, G], dtype="<u4").tobytes()
        table += np.array([rows, cols, offset, len(payload)], dtype="<u8").tobytes()
        table += np.array([ndim, 0, 0, 0], dtype="<u4").tobytes()
        offset = _roundup(offset + len(payload))
    config = np.array([1, cfg["dim"], cfg["hidden_dim"], cfg["n_layers"], cfg["n_heads"],
                       cfg["n_kv_heads"], cfg["head_dim"], cfg["vocab_size"],
                       cfg["max_seq_len"]], dtype="<u4").tobytes()
    config += np.array([cfg["rope_theta"], cfg["norm_eps"]], dtype="<f4").tobytes()
    config += np.array([int(cfg["tied_embeddings"]), n, 0, 0, 0], dtype="<u4").tobytes()
    body = [config, table, tblock]
    pos = 64 + meta_size
    for item in items:
        payload = item[-1]
        start = _roundup(pos)
        body.append(b"\0" * (start - pos))
        body.append(payload)
        pos = start + len(payload)
    end = _roundup(pos)
    body.append(b"\0" * (end - pos))
    crc = 0
    for part in body:
        crc = zlib.crc32(part, crc)
    header = MAGIC + np.array([VERSION, crc], dtype="<u4").tobytes()
    header += np.array([end, meta_size], dtype="<u8").tobytes() + b"\0" * 32
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(header)
        for part in body:
            f.write(part)
    os.replace(tmp, path)
    return path


def rewrite_crc(data: bytearray) -> bytearray:
    """Recompute the header CRC of a model file image (to test checks behind the checksum)."""
    data[12:16] = np.array([zlib.crc32(bytes(data[64:]))], dtype="<u4").tobytes()
    return data


# ----------------------------------------------------------------------------- small models

def byte_vocab(chat: bool = True) -> dict:
    """Byte-level BPE vocabulary without merges: 3 control tokens, then the 256 bytes."""
    controls = [b"<|endoftext|>", b"<|im_start|>", b"<|im_end|>"]
    tokens = controls + [bytes([i]) for i in range(256)]
    types = [TT_CONTROL] * 3 + [TT_NORMAL] * 256
    return dict(kind=TOK_BPE_BYTES, pre=PRE_GPT2, tokens=tokens, types=types, merges=[],
                bos=1, eos=2, unk=-1, pad=0, add_bos=0,
                chat_format=CHAT_CHATML if chat else CHAT_NONE)


def synthetic_model(path: Path, *, seed: int, tied: bool, quantized: bool,
                    n_kv_heads: int = 2) -> tuple[dict, dict]:
    """A random Llama model over ``byte_vocab`` (vocab 259) with GQA, tails (dim 72, hidden 100),
    and, if ``quantized``, every matrix a codebook tensor with a different (b, G, codebook
    type), b cycling through 1..8. Returns (config, float64 weights as the runtime sees them)."""
    rng = np.random.default_rng(seed)
    cfg = dict(dim=72, hidden_dim=100, n_layers=2, n_heads=6, n_kv_heads=n_kv_heads,
               head_dim=12, vocab_size=259, max_seq_len=64, rope_theta=10000.0,
               norm_eps=1e-5, tied_embeddings=tied)
    q_dim, kv_dim = cfg["n_heads"] * cfg["head_dim"], n_kv_heads * cfg["head_dim"]
    shapes = [("token_embd.weight", (259, 72)), ("output_norm.weight", (72,))]
    if not tied:
        shapes.append(("output.weight", (259, 72)))
    for l in range(cfg["n_layers"]):
        shapes += [(f"blk.{l}.attn_norm.weight", (72,)), (f"blk.{l}.attn_q.weight", (q_dim, 72)),
                   (f"blk.{l}.attn_k.weight", (kv_dim, 72)),
                   (f"blk.{l}.attn_v.weight", (kv_dim, 72)),
                   (f"blk.{l}.attn_output.weight", (72, q_dim)),
                   (f"blk.{l}.ffn_norm.weight", (72,)), (f"blk.{l}.ffn_gate.weight", (100, 72)),
                   (f"blk.{l}.ffn_up.weight", (100, 72)), (f"blk.{l}.ffn_down.weight", (72, 100))]
    group_sizes = [2, 3, 8, 16, 32, 37, 64, 5, 256]
    tensors, weights = [], {}
    k = 0
    for name, shape in shapes:
        if len(shape) == 1:
            w = (1.0 + 0.1 * rng.normal(size=shape)).astype(np.float32)
            tensors.append((name, w))
            weights[name] = w.astype(np.float64)
        elif quantized:
            scale = 1.0 if name == "token_embd.weight" else None
            ct = random_codebook_tensor(rng, shape[0], shape[1], bits=k % 8 + 1,
                                        G=group_sizes[k % len(group_sizes)],
                                        cb_type="f16" if k % 2 == 0 else "f32", scale=scale)
            k += 1
            tensors.append((name, ct))
            weights[name] = dequantize_codebook(ct)
        else:
            s = 1.0 if name == "token_embd.weight" else 1.0 / np.sqrt(shape[1])
            w = rng.normal(0.0, s, size=shape).astype(np.float32)
            tensors.append((name, w))
            weights[name] = w.astype(np.float64)
    write_ditto(path, cfg, byte_vocab(), tensors)
    if tied:
        weights["output.weight"] = weights["token_embd.weight"]
    return cfg, weights


# ----------------------------------------------------------------------------- GGUF -> .ditto

def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte <-> printable-unicode table (Radford et al. 2019, encoder.py), inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def gguf_to_ditto_f32(gguf_path: Path, out: Path) -> tuple[dict, dict]:
    """Export a llama GGUF (SmolLM2: byte-level BPE; tinycoder: SentencePiece) to an all-f32
    .ditto with q/k rows put back in Hugging Face order (FORMAT.md "Rotary layout").
    Returns (config, tokenizer dict)."""
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(gguf_path)

    def field(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    n_heads = int(field("llama.attention.head_count"))
    n_kv = int(field("llama.attention.head_count_kv", n_heads))
    dim = int(field("llama.embedding_length"))
    head_dim = int(field("llama.rope.dimension_count", dim // n_heads))
    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    names = [t.name for t in r.tensors]
    cfg = dict(dim=dim, hidden_dim=int(field("llama.feed_forward_length")),
               n_layers=int(field("llama.block_count")), n_heads=n_heads, n_kv_heads=n_kv,
               head_dim=head_dim, vocab_size=len(tokens),
               max_seq_len=int(field("llama.context_length")),
               rope_theta=float(field("llama.rope.freq_base", 10000.0)),
               norm_eps=float(field("llama.attention.layer_norm_rms_epsilon")),
               tied_embeddings="output.weight" not in names)
    model = field("tokenizer.ggml.model")
    template = (field("tokenizer.chat_template") or "").encode()
    tok = dict(types=types, bos=int(field("tokenizer.ggml.bos_token_id", -1)),
               eos=int(field("tokenizer.ggml.eos_token_id", -1)),
               unk=int(field("tokenizer.ggml.unknown_token_id", -1)),
               pad=int(field("tokenizer.ggml.padding_token_id", -1)), template=template,
               chat_format=CHAT_CHATML if b"<|im_start|>" in template else CHAT_NONE)
    if model == "gpt2":
        dec = _bytes_to_unicode()
        tok_bytes = [t.encode() if ty in (TT_CONTROL, TT_USER) else bytes(dec[c] for c in t)
                     for t, ty in zip(tokens, types)]
        index = {t: i for i, t in enumerate(tokens)}
        merges = [tuple(index[p] for p in m.split(" ")) for m in field("tokenizer.ggml.merges")]
        pre = PRE_GPT2_DIGITS if field("tokenizer.ggml.pre") == "smollm" else PRE_GPT2
        tok.update(kind=TOK_BPE_BYTES, pre=pre, tokens=tok_bytes, merges=merges,
                   add_bos=int(bool(field("tokenizer.ggml.add_bos_token", False))))
    else:
        tok.update(kind=TOK_SPM_BPE, pre=PRE_NONE, tokens=[t.encode() for t in tokens],
                   scores=field("tokenizer.ggml.scores"),
                   add_bos=int(bool(field("tokenizer.ggml.add_bos_token", True))),
                   add_space_prefix=int(bool(field("tokenizer.ggml.add_space_prefix", True))))

    def unpermute(w, heads):  # GGUF (head, i, half) rows -> HF (head, half, i)
        return w.reshape(heads, head_dim // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)

    order = ["token_embd.weight", "output_norm.weight", "output.weight"]
    rank = {n: (order.index(n) if n in order else 3) for n in names}

    def gen():
        for t in sorted(r.tensors, key=lambda t: (rank[t.name], names.index(t.name))):
            w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
            if t.name.endswith("attn_q.weight"):
                w = unpermute(w, n_heads)
            elif t.name.endswith("attn_k.weight"):
                w = unpermute(w, n_kv)
            yield t.name, w

    write_ditto(out, cfg, tok, gen())
    return cfg, tok


def hf_from_gguf(gguf_path: Path):
    """transformers' own GGUF conversion (dequantize + q/k un-permutation) into a float32
    LlamaForCausalLM in eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=False)
    conf = dict(parsed["config"])
    conf.pop("model_type", None)
    conf.pop("architectures", None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**conf)).eval()
    state = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)
    missing, unexpected = model.load_state_dict(state["tensors"], strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if missing:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model.to(torch.float32)


def read_ditto_weights(path: Path) -> tuple[dict, dict]:
    """Config and float64 weights of an all-f32 .ditto written by ``write_ditto`` (for the
    NumPy reference forward)."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    c = np.frombuffer(data[64:128].tobytes(), dtype="<u4")
    f = np.frombuffer(data[64 + 36:64 + 44].tobytes(), dtype="<f4")
    cfg = dict(dim=int(c[1]), hidden_dim=int(c[2]), n_layers=int(c[3]), n_heads=int(c[4]),
               n_kv_heads=int(c[5]), head_dim=int(c[6]), vocab_size=int(c[7]),
               max_seq_len=int(c[8]), rope_theta=float(f[0]), norm_eps=float(f[1]),
               tied_embeddings=bool(c[11]))
    weights = {}
    for i in range(int(c[12])):
        e = data[128 + 128 * i:256 + 128 * i].tobytes()
        name = e[:64].rstrip(b"\0").decode()
        enc = np.frombuffer(e[64:68], "<u4")[0]
        rows, cols, off, nb = np.frombuffer(e[80:112], "<u8")
        ndim = np.frombuffer(e[112:116], "<u4")[0]
        assert enc == ENC_F32, name
        w = np.frombuffer(data[off:off + nb].tobytes(), "<f4").astype(np.float64)
        weights[name] = w if ndim == 1 else w.reshape(int(rows), int(cols))
    if cfg["tied_embeddings"]:
        weights["output.weight"] = weights["token_embd.weight"]
    return cfg, weights


# ----------------------------------------------------------------------------- running

def run_native(exe: Path, *args, input_bytes: bytes | None = None, timeout: float = 600,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the program; returns the CompletedProcess (stdout/stderr as bytes)."""
    full_env = dict(os.environ)
    full_env.update({"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=99",
                     "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=98",
                     "OMP_WAIT_POLICY": "passive"})
    full_env.update(env or {})
    return subprocess.run([str(exe), *map(str, args)], input=input_bytes, capture_output=True,
                          timeout=timeout, env=full_env)


def token_file(path: Path, ids) -> Path:
    path.write_text(json.dumps([int(i) for i in ids]))
    return path


def dump_logits(exe: Path, model: Path, ids, tmp: Path, *extra) -> np.ndarray:
    """Logits [len(ids), vocab] of every prompt position, via --ids and --dump-logits."""
    ids_path = token_file(tmp / "ids.json", ids)
    out = tmp / "logits.f32"
    p = run_native(exe, "-m", model, "--ids", ids_path, "--dump-logits", out, *extra)
    assert p.returncode == 0, p.stderr.decode()
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def rel_error(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per position: max |a - ref| / max |ref| (rows of [n_positions, vocab])."""
    return np.abs(a - ref).max(axis=-1) / np.abs(ref).max(axis=-1)


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def native_build(tmp_path_factory) -> SimpleNamespace:
    """ditto-run (clang-22 -O3 -fopenmp), ditto-run-asan (ASan + UBSan) and
    libditto_kernels.so (matmul.c + model.c, for ctypes), built once per session."""
    build = tmp_path_factory.mktemp("native_build")
    p = subprocess.run(["nice", "make", "-s", "-C", str(NATIVE), f"BUILD={build}", "all",
                        "asan", "kernels"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    return SimpleNamespace(run=build / "ditto-run", asan=build / "ditto-run-asan",
                           kernels=build / "libditto_kernels.so", dir=build)


@pytest.fixture(scope="session")
def native_synth(tmp_path_factory) -> SimpleNamespace:
    """Small random models: f32 tied, quantized tied (GQA), quantized untied (no GQA)."""
    d = tmp_path_factory.mktemp("native_synth")
    out = SimpleNamespace()
    for name, kw in [("f32", dict(seed=1, tied=True, quantized=False)),
                     ("quant", dict(seed=2, tied=True, quantized=True)),
                     ("quant_untied", dict(seed=3, tied=False, quantized=True, n_kv_heads=6))]:
        path = d / f"{name}.ditto"
        cfg, w = synthetic_model(path, **kw)
        setattr(out, name, SimpleNamespace(path=path, cfg=cfg, weights=w))
    return out


@pytest.fixture(scope="session")
def native_tiny_f32(tmp_path_factory, tiny_gguf) -> SimpleNamespace:
    """tinycoder (random tiny Llama, SentencePiece vocab, untied classifier) as f32 .ditto."""
    path = tmp_path_factory.mktemp("native_tiny") / "tiny_f32.ditto"
    cfg, tok = gguf_to_ditto_f32(tiny_gguf, path)
    return SimpleNamespace(path=path, cfg=cfg, tok=tok)


@pytest.fixture(scope="session")
def native_smollm2_f32(tmp_path_factory, smollm2_gguf) -> SimpleNamespace:
    """SmolLM2-135M-Instruct exported to an all-f32 .ditto (about 540 MB)."""
    path = tmp_path_factory.mktemp("native_smollm2") / "smollm2_f32.ditto"
    cfg, tok = gguf_to_ditto_f32(smollm2_gguf, path)
    return SimpleNamespace(path=path, cfg=cfg, tok=tok)


@pytest.fixture(scope="session")
def native_hf_smollm2(smollm2_gguf):
    """transformers LlamaForCausalLM (float32, CPU) of SmolLM2 from transformers' own GGUF
    conversion."""
    return hf_from_gguf(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_golden() -> list[dict]:
    """Rows of ../shared/data/smollm2_tokenizer_golden.jsonl (llama.cpp token ids)."""
    return [json.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]
