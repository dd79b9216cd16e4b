"""Row tiles (native/kernels/qgemv.h i8_b4_at, kernels.c kernels_tile_tensor): on the
avx2 and avx512vbmi tables, ditto-run puts every b = 4 int8 weight matrix that fits whole
tiles into row tiles at load, and its logits (batched prefill through the GEMM, one token at
a time through the GEMV) and generated tokens are byte for byte those of the same run in file
order (DITTO_TILES=0), also under ASan/UBSan; a mapped model file (read-only) is left in file
order; a DITTO_TILES other than 0 or 1 is refused. The kernels themselves are checked against
the definition in tests/test_kernels_int.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ditto_core.base.types import ModelConfig
from ditto_core.model.modelfile import TensorInfo, write_model
from ditto_pack_bits import codebook_payload

from .fixtures_native import byte_vocab, dump_logits, random_codebook_tensor, run_native
from .test_kernels_int import TILING_TABLES, X86_TABLES, cpu_flags

IDS = [1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 35, 32, 100, 101, 102]
#: the block matrices: (name, rows, cols, G); each fits tiles (rows % 4, cols % 64, G % 64)
MATRICES = [("attn_q", 128, 128, 64), ("attn_k", 64, 128, 128), ("attn_v", 64, 128, 256),
            ("attn_output", 128, 128, 64), ("ffn_gate", 256, 128, 128),
            ("ffn_up", 256, 128, 64), ("ffn_down", 128, 256, 256)]


@pytest.fixture(scope="module")
def tiles_model(tmp_path_factory):
    """A random two-layer model whose block matrices are b = 4 int8 codebooks that fit tiles;
    the embedding and the classifier (259 rows, not whole tiles) are b = 4 and b = 6."""
    rng = np.random.default_rng(11)
    cfg = ModelConfig(dim=128, hidden_dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32,
                      vocab_size=259, max_seq_len=64, rope_theta=10000.0, norm_eps=1e-5,
                      tied_embeddings=False, arch="llama")
    infos, payloads = [], []

    def matrix(name, rows, cols, bits, G, scale=None):
        ct = random_codebook_tensor(rng, rows, cols, bits, G, cb_type="int8", scale=scale)
        infos.append(TensorInfo(name, "codebook", (rows, cols), bits, G, "int8"))
        payloads.append((name, codebook_payload(ct)))

    def vector(name):
        infos.append(TensorInfo(name, "f32", (128,)))
        payloads.append((name, (1.0 + 0.1 * rng.normal(size=128)).astype(np.float32)))

    matrix("token_embd.weight", 259, 128, 4, 64, scale=1.0)
    vector("output_norm.weight")
    matrix("output.weight", 259, 128, 6, 128)
    for layer in range(cfg.n_layers):
        vector(f"blk.{layer}.attn_norm.weight")
        for name, rows, cols, G in MATRICES[:4]:
            matrix(f"blk.{layer}.{name}.weight", rows, cols, 4, G)
        vector(f"blk.{layer}.ffn_norm.weight")
        for name, rows, cols, G in MATRICES[4:]:
            matrix(f"blk.{layer}.{name}.weight", rows, cols, 4, G)
    path = tmp_path_factory.mktemp("tiles") / "tiles.ditto"
    write_model(path, cfg, byte_vocab(), infos, payloads)
    return path


def _stats(stderr: bytes) -> dict:
    line = [l for l in stderr.decode().splitlines() if l.startswith("stats ")][-1]
    return json.loads(line[len("stats "):])


def _generate(exe, model, env, *extra):
    p = run_native(exe, "-m", model, "-p", "def add(a, b):", "-n", "16", "--temp", "0",
                   "--ignore-eos", "--print-ids", *extra, env=env)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout, _stats(p.stderr)


@pytest.mark.parametrize("table", sorted(TILING_TABLES))
@pytest.mark.parametrize("which", ["run", "asan"])
def test_tiled_run_equals_file_order(native_build, tiles_model, tmp_path, which, table):
    if not X86_TABLES[table] <= cpu_flags():
        pytest.skip(f"this CPU lacks the {table} table")
    exe = getattr(native_build, which)
    on, off = {"DITTO_KERNEL": table}, {"DITTO_KERNEL": table, "DITTO_TILES": "0"}
    for extra in ([], ["-b", "1"]):  # the prefill GEMM, then the GEMV token by token
        tiled = dump_logits(exe, tiles_model, IDS, tmp_path, *extra, env=on)
        plain = dump_logits(exe, tiles_model, IDS, tmp_path, *extra, env=off)
        assert tiled.shape == (len(IDS), 259) and np.isfinite(tiled).all()
        assert tiled.tobytes() == plain.tobytes(), extra
    ids_on, st_on = _generate(exe, tiles_model, on)
    ids_off, st_off = _generate(exe, tiles_model, off)
    assert (st_on["load"], st_on["tiled_tensors"]) == ("read", 2 * len(MATRICES))
    assert st_off["tiled_tensors"] == 0
    assert ids_on == ids_off and len(json.loads(ids_on.decode().splitlines()[-1])) == 16
    ids_map, st_map = _generate(exe, tiles_model, on, "--mmap")
    assert (st_map["load"], st_map["tiled_tensors"]) == ("mmap", 0)
    assert ids_map == ids_on


def test_bad_ditto_tiles_is_refused(native_build, tiles_model):
    """DITTO_TILES takes 0 or 1, as DITTO_MMAP does: another value is a usage error (exit 1)
    that names the variable and the value, before any work."""
    p = run_native(native_build.run, "-m", tiles_model, "-p", "x", "-n", "2",
                   env={"DITTO_TILES": "yes"})
    assert p.returncode == 1
    assert p.stderr.decode() == ("ditto-run: error: DITTO_TILES must be 1 (b = 4 weight matrices "
                                 "in row tiles where the kernel table reads them) or 0 (file "
                                 "order), got 'yes'\n")
