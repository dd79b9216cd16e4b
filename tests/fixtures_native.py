"""Session fixtures for the native inference program (native/): the built executables and small
random model files (f32 and quantized), written with the project's writer
(ditto_core.model.modelfile.write_model) and packer (ditto_pack_bits.codebook_payload).

SmolLM2 comes from tests/fixtures_hf.py: ``smollm2_f32_ditto`` (the GGUF exported to an all-f32
.ditto) and ``smollm2_hf_dir`` (the HF directory transformers loads).
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

from ditto_core.model.format import CB_F16, CB_F32  # noqa: F401  (re-exported for the tests)
from ditto_core.base.types import CodebookTensor, ModelConfig, TokenizerSpec
from ditto_core.model.modelfile import ModelFile, TensorInfo, write_model
from ditto_pack_bits import codebook_payload, dequantize
from ditto_quant_kmeans.quantizer import int8_codebooks

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native"
#: `make` over native/ at low priority, its independent targets on every core
MAKE = ["nice", "make", "-s", f"-j{os.cpu_count() or 1}"]


def cc_parallel(cc: str, flags: list[str], sources, exe: Path,
                libs: tuple[str, ...] = ("-lm",)) -> subprocess.CompletedProcess:
    """Build ``exe`` from C ``sources`` with ``cc flags``: each source compiled to an object
    (``nice``, as many at once as there are CPUs), then one link with the same flags. Returns
    the first failed compile's CompletedProcess, else the link's."""
    from concurrent.futures import ThreadPoolExecutor

    objdir = exe.parent / (exe.name + ".objs")
    objdir.mkdir(parents=True, exist_ok=True)
    objs = [objdir / f"{k:03d}_{Path(src).stem}.o" for k, src in enumerate(sources)]

    def compile_one(src_obj):
        src, obj = src_obj
        return subprocess.run(["nice", cc, *flags, "-c", str(src), "-o", str(obj)],
                              capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        done = list(pool.map(compile_one, zip(sources, objs)))
    for p in done:
        if p.returncode != 0:
            return p
    return subprocess.run(["nice", cc, *flags, "-o", str(exe), *map(str, objs), *libs],
                          capture_output=True, text=True)

# exit codes of ditto-run (native/README.md)
EXIT_OK, EXIT_USAGE, EXIT_MODEL, EXIT_PROMPT, EXIT_IO, EXIT_OOM = 0, 1, 2, 3, 4, 5


# ----------------------------------------------------------------------------- codebook tensors

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
    scales = None
    if cb_type == "int8":
        cb, scales = int8_codebooks(cb)
    cb = cb.astype(np.float16).astype(np.float32) if cb_type == "f16" else cb
    idx = rng.integers(0, K, size=(rows, cols), dtype=np.uint8)
    return CodebookTensor(bits=bits, group_size=G, codebooks=cb, indices=idx,
                          codebook_type=cb_type, scales=scales)


# ----------------------------------------------------------------------------- model files

def rewrite_crc(data: bytearray) -> bytearray:
    """Recompute the header CRC of a model file image (to test checks behind the checksum)."""
    data[12:16] = np.array([zlib.crc32(bytes(data[64:]))], dtype="<u4").tobytes()
    return data


# ----------------------------------------------------------------------------- small models

def byte_vocab(chat: bool = True) -> TokenizerSpec:
    """Byte-level BPE vocabulary without merges: 3 control tokens, then the 256 bytes (259);
    with ``chat``, a ChatML user turn as the chat template text."""
    tokens = (b"<|endoftext|>", b"<|im_start|>", b"<|im_end|>") + tuple(bytes([i]) for i in range(256))
    types = np.array([3] * 3 + [1] * 256, dtype=np.uint32)
    return TokenizerSpec(kind="bpe_bytes", tokens=tokens, scores=np.zeros(259, np.float32),
                         token_types=types, merges=(), pre="gpt2", bos_id=1, eos_id=2,
                         pad_id=0, add_bos=False, chat_format="chatml",
                         chat_prefix="<|im_start|>user\n" if chat else None,
                         chat_suffix="<|im_end|>\n<|im_start|>assistant\n" if chat else None)


def synthetic_model(path: Path, *, seed: int, tied: bool, quantized: bool,
                    n_kv_heads: int = 2, cb_types=("f16", "f32"),
                    group_sizes=(2, 3, 8, 16, 32, 37, 64, 5, 256),
                    arch: str = "llama", head_dim: int = 12) -> tuple[ModelConfig, dict]:
    """A random Llama model over ``byte_vocab`` (vocab 259) with GQA, tails (dim 72, hidden 100),
    and, if ``quantized``, every matrix a codebook tensor with a different (b, G, codebook
    type), b cycling through 1..8, G through ``group_sizes``, codebook type through ``cb_types``
    (token_embd and the classifier included). ``arch="qwen2"``: with q/k/v biases ~ N(0, 0.5)
    (f32 vectors). ``head_dim``: 12 (the scalar attention), or a multiple of 8 for the SIMD
    one (6 query heads of it, so q_dim = 6 * head_dim).
    Returns (config, float64 weights as the runtime sees them, "output.weight" always set)."""
    rng = np.random.default_rng(seed)
    cfg = ModelConfig(dim=72, hidden_dim=100, n_layers=2, n_heads=6, n_kv_heads=n_kv_heads,
                      head_dim=head_dim, vocab_size=259, max_seq_len=64, rope_theta=10000.0,
                      norm_eps=1e-5, tied_embeddings=tied, arch=arch)
    q_dim, kv_dim = cfg.n_heads * cfg.head_dim, n_kv_heads * cfg.head_dim
    shapes = [("token_embd.weight", (259, 72)), ("output_norm.weight", (72,))]
    if not tied:
        shapes.append(("output.weight", (259, 72)))
    for l in range(cfg.n_layers):
        shapes += [(f"blk.{l}.attn_norm.weight", (72,)), (f"blk.{l}.attn_q.weight", (q_dim, 72)),
                   (f"blk.{l}.attn_k.weight", (kv_dim, 72)),
                   (f"blk.{l}.attn_v.weight", (kv_dim, 72))]
        if arch == "qwen2":
            shapes += [(f"blk.{l}.attn_q.bias", (q_dim,)), (f"blk.{l}.attn_k.bias", (kv_dim,)),
                       (f"blk.{l}.attn_v.bias", (kv_dim,))]
        shapes += [(f"blk.{l}.attn_output.weight", (72, q_dim)),
                   (f"blk.{l}.ffn_norm.weight", (72,)), (f"blk.{l}.ffn_gate.weight", (100, 72)),
                   (f"blk.{l}.ffn_up.weight", (100, 72)), (f"blk.{l}.ffn_down.weight", (72, 100))]
    infos, payloads, weights = [], [], {}
    k = 0
    for name, shape in shapes:
        if name.endswith(".bias"):
            w = (0.5 * rng.normal(size=shape)).astype(np.float32)
        elif len(shape) == 1:
            w = (1.0 + 0.1 * rng.normal(size=shape)).astype(np.float32)
        elif not quantized:
            s = 1.0 if name == "token_embd.weight" else 1.0 / np.sqrt(shape[1])
            w = rng.normal(0.0, s, size=shape).astype(np.float32)
        if len(shape) == 1 or not quantized:
            infos.append(TensorInfo(name, "f32", shape))
            payloads.append((name, w))
            weights[name] = w.astype(np.float64)
            continue
        scale = 1.0 if name == "token_embd.weight" else None
        ct = random_codebook_tensor(rng, shape[0], shape[1], bits=k % 8 + 1,
                                    G=group_sizes[k % len(group_sizes)],
                                    cb_type=cb_types[k % len(cb_types)], scale=scale)
        k += 1
        infos.append(TensorInfo(name, "codebook", shape, ct.bits, ct.group_size,
                                ct.codebook_type))
        payloads.append((name, codebook_payload(ct)))
        weights[name] = dequantize_codebook(ct)
    write_model(path, cfg, byte_vocab(), infos, payloads)
    if tied:
        weights["output.weight"] = weights["token_embd.weight"]
    return cfg, weights


def model_weights(path: Path) -> tuple[ModelConfig, dict]:
    """Config and float64 weights of any .ditto file, decoded with the packer's reference
    decoder (ditto_pack_bits.dequantize); "output.weight" is the embedding when tied."""
    mf = ModelFile(path)
    weights = {name: dequantize(info, mf.payload(name)).astype(np.float64)
               for name, info in mf.tensors.items()}
    if mf.config.tied_embeddings:
        weights["output.weight"] = weights["token_embd.weight"]
    return mf.config, weights


# ----------------------------------------------------------------------------- running

def run_native(exe: Path, *args, input_bytes: bytes | None = None, timeout: float = 600,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the program; returns the CompletedProcess (stdout/stderr as bytes)."""
    full_env = dict(os.environ)
    full_env.update({"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=99",
                     "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=98",
                     "OMP_WAIT_POLICY": "passive"})
    full_env.update(env or {})
    argv = [str(exe)] + [a if isinstance(a, bytes) else str(a) for a in args]
    return subprocess.run(argv, input=input_bytes, capture_output=True,
                          timeout=timeout, env=full_env)


def token_file(path: Path, ids) -> Path:
    path.write_text(json.dumps([int(i) for i in ids]))
    return path


def dump_logits(exe: Path, model: Path, ids, tmp: Path, *extra, env: dict | None = None) -> np.ndarray:
    """Logits [len(ids), vocab] of every prompt position, via --ids and --dump-logits
    (``env``: extra environment variables)."""
    ids_path = token_file(tmp / "ids.json", ids)
    out = tmp / "logits.f32"
    p = run_native(exe, "-m", model, "--ids", ids_path, "--dump-logits", out, *extra, env=env)
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
    p = subprocess.run([*MAKE, "-C", str(NATIVE), f"BUILD={build}", "all", "asan", "kernels"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    return SimpleNamespace(run=build / "ditto-run", asan=build / "ditto-run-asan",
                           kernels=build / "libditto_kernels.so", dir=build)


@pytest.fixture(scope="session")
def native_synth(tmp_path_factory) -> SimpleNamespace:
    """Small random models: f32 tied, quantized tied (GQA), quantized untied (no GQA),
    quantized untied Qwen2 (GQA, q/k/v biases)."""
    d = tmp_path_factory.mktemp("native_synth")
    out = SimpleNamespace()
    for name, kw in [("f32", dict(seed=1, tied=True, quantized=False)),
                     ("quant", dict(seed=2, tied=True, quantized=True)),
                     ("quant_untied", dict(seed=3, tied=False, quantized=True, n_kv_heads=6)),
                     ("quant_qwen2", dict(seed=4, tied=False, quantized=True, arch="qwen2"))]:
        path = d / f"{name}.ditto"
        cfg, w = synthetic_model(path, **kw)
        setattr(out, name, SimpleNamespace(path=path, cfg=cfg, weights=w))
    return out




@pytest.fixture(scope="session")
def native_hf_smollm2(smollm2_hf_dir):
    """transformers LlamaForCausalLM (float32, CPU, eval) loaded from ``smollm2_hf_dir``."""
    import torch
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(smollm2_hf_dir, dtype=torch.float32).eval()

