"""The ``kmeans`` quantizer's output bytes, pinned: SHA-256 of the unrounded centroids and of
the finished CodebookTensor (codebooks + indices) for fixed seeded matrices and a slice of
SmolLM2. The hashes were recorded with the straightforward Knuth-window DP (one sub-block per
iteration); any faster kernel has to reproduce them byte for byte (docs/QUANT.md, "Speed")."""

import hashlib

import gguf
import numpy as np
import pytest
from gguf import quants

from ditto_quant_kmeans import kmeans1d, quantize_matrix
from ditto_quant_kmeans.quantizer import METHODS


def to_bf16(W):
    """float32 → the nearest bfloat16 (round to nearest even), returned as float32."""
    u = W.astype(np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return u.view(np.float32)


def heavy_tailed(seed=1234, rows=48, cols=1000):
    """Student-t (ν = 5) weights in bf16, three input channels (columns) scaled ×20 as
    outliers; cols = 1000 gives sub-blocks of 256 + 256 + 256 + 232 at G = 256."""
    rng = np.random.default_rng(seed)
    W = rng.standard_t(5, size=(rows, cols)) * 0.5
    W[:, [7, 300, 901]] *= 20
    return to_bf16(W)


def q41_grid(seed=99, rows=32, cols=512):
    """A Q4_1-like matrix: every 32 weights on a 16-level grid (min + scale·q, f16 scale and
    min), so sub-blocks hold ~100 distinct, evenly spaced values and SSE ties are common."""
    rng = np.random.default_rng(seed)
    lo = rng.normal(-0.5, 0.1, size=(rows, cols // 32, 1)).astype(np.float16)
    sc = rng.uniform(0.05, 0.08, size=(rows, cols // 32, 1)).astype(np.float16)
    q = rng.integers(0, 16, size=(rows, cols // 32, 32))
    return (lo.astype(np.float32) + sc.astype(np.float32) * q).reshape(rows, cols)


def few_valued():
    """Rows that are constant, all zero, 10-valued, and one continuous row."""
    rng = np.random.default_rng(5)
    W = np.zeros((4, 300), np.float32)
    W[0] = 0.75
    W[2] = rng.integers(-5, 5, 300) * 0.125
    W[3] = rng.standard_normal(300)
    return W


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def centroids(W, bits, group_size, method="optimal", seed=0):
    """The unrounded float64 centroids [rows, S, 2^b] of kmeans1d.matrix_centroids."""
    rows, cols = W.shape
    cent = np.empty((rows, -(-cols // group_size), 1 << bits), np.float64)
    kmeans1d.matrix_centroids(kmeans1d.sort_sub_blocks(W, group_size), group_size, 1 << bits,
                              METHODS[method], np.uint64(seed), 4, 100, 1e-6, cent)
    return cent


CASES = {
    # name: (matrix, bits, G, method, codebook type, centroid hash, CodebookTensor hash)
    "heavy_b4_g256": (heavy_tailed, 4, 256, "optimal", "f32",
        "bcee505c91105344d0d7a88c42147c117365644ad48f8e4e1ac91fbbfba8a7e1",
        "de8a189aac5611187be004caa47c24a57a7e266d6dc03d87617221a5bbc3edfa"),
    "heavy_b3_g64": (heavy_tailed, 3, 64, "optimal", "f32",
        "a5088ce4ee9c1742d421526dc12bcbffcd761b7213c72168e4c1de822b025633",
        "90c64c7f14644d400429aa48d8a0d48993427c99a3bf13793d79fa6027f8da2b"),
    "heavy_b6_row": (heavy_tailed, 6, 1000, "optimal", "f32",
        "8281630d017ed729604a51190e9441c087fe996b7d23ef9b3cf56b0b8c84afc9",
        "d3dead21417263ab1030e8c868e009a05c356a0eb0499b82aa9d68c63fbf2f44"),
    "heavy_b4_lloyd": (heavy_tailed, 4, 256, "lloyd", "f32",
        "a69d692fb9d0ca60156b39f5c09bda800086d1f69aebd6568058c7aa489617f9",
        "3c045a59c4b2d3904d66f0c5d402d73756dce430642c49f092d16eb352089a97"),
    "grid_b4_g256": (q41_grid, 4, 256, "optimal", "f32",
        "a337ec7bfab2e40fbd6d8b10d9dd62d689f2749943694fdbeccb0b2d51f44f77",
        "b0295d4f5cbe743d2d7f7cb30cddff658d51fba734a20d6b3acf40781218e4ea"),
    "grid_b2_g128": (q41_grid, 2, 128, "optimal", "f32",
        "6967c780c7ae41f27fd680f1d45c4b6fbbd09d7058eb92a923bfcb1c8523b78d",
        "1a58ec33999c2529472353bb83d1fe364cc3607bc5da006d9ad4cf4940cfb26a"),
    "few_b4_g256": (few_valued, 4, 256, "optimal", "f32",
        "9fe09a8ae6f0720067dacde42b28d16cc15eff33736c58124b35238c8c836b02",
        "15757dafd264f79fe2ba9349c3ef2f383f2321510e3f47b5b049f15b3a15ff40"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pinned_output(case):
    make, bits, g, method, cbt, want_c, want_q = CASES[case]
    W = make()
    assert digest(centroids(W, bits, g, method)) == want_c
    q = quantize_matrix(W, bits, g, method, cbt, 0, case)
    assert digest(q.codebooks, q.indices) == want_q


def test_pinned_smollm2_slice(smollm2_gguf):
    """64 rows of SmolLM2's blk.3.attn_q.weight (Q4_1 in the GGUF: ~105 distinct values per
    256, so the DP meets exact ties), b = 4, G = 256, f32 and f16 codebooks."""
    r = gguf.GGUFReader(smollm2_gguf)
    t = next(t for t in r.tensors if t.name == "blk.3.attn_q.weight")
    W = np.ascontiguousarray(quants.dequantize(t.data, t.tensor_type)[:64], np.float32)
    assert digest(centroids(W, 4, 256)) == (
        "cb31a1d2f6ac6f35bb8a545e1d8fc0b48f8df96c1acd1453d27f927bb99fe172")
    q = quantize_matrix(W, 4, 256, "optimal", "f32", 0, "blk.3.attn_q.weight")
    assert digest(q.codebooks, q.indices) == (
        "d9b316cf77757e02706ea2dad3a4a21f5d6d8b6e02be653465fe5b94282f95b0")
    q = quantize_matrix(W, 4, 256, "optimal", "f16", 0, "blk.3.attn_q.weight")
    assert digest(q.codebooks, q.indices) == (
        "cec414b81e94c0698994b9ccd8e0418f32ba9e2c2f860a7b5030dfe67fe8401c")
