"""The ``bits`` packer: exact b-bit index packing (docs/FORMAT.md), CODEBOOK payloads, the
reference decoder, and model files written by the packer."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ditto_core.base.errors import DittoError
from ditto_core.base.types import CodebookTensor, ModelConfig, QuantizedModel, TokenizerSpec
from ditto_core.model.codebook import payload_bytes as codebook_nbytes
from ditto_core.model.modelfile import ModelFile, TensorInfo
from ditto_pack_bits import (BitsPacker, codebook_payload, dequantize, pack_indices,
                             unpack_indices)


def scalar_pack_row(idx, bits):
    """FORMAT.md read literally: groups of 8 indices, each group one little-endian integer of
    8·b bits holding index j in bits [j·b, (j+1)·b), zero-padded last group."""
    out = bytearray()
    for g in range(0, len(idx), 8):
        group = list(idx[g:g + 8]) + [0] * (8 - len(idx[g:g + 8]))
        value = 0
        for j, v in enumerate(group):
            value |= int(v) << (j * bits)
        out += value.to_bytes(bits, "little")
    return bytes(out)


# hand-computed from FORMAT.md
EXACT = [
    (1, [1, 0, 1, 1, 0, 0, 0, 1, 1], [0x8D, 0x01]),
    (3, [0, 1, 2, 3, 4, 5, 6, 7], [0x88, 0xC6, 0xFA]),
    (3, [7, 0, 0, 0, 0, 0, 0, 0, 5], [0x07, 0x00, 0x00, 0x05, 0x00, 0x00]),
    (4, [1, 2, 3, 4, 5, 6, 7, 8, 15], [0x21, 0x43, 0x65, 0x87, 0x0F, 0, 0, 0]),
    (8, [0, 1, 2, 3, 4, 5, 6, 7, 200], [0, 1, 2, 3, 4, 5, 6, 7, 200, 0, 0, 0, 0, 0, 0, 0]),
]


@pytest.mark.parametrize("bits,idx,expect", EXACT)
def test_exact_bytes(bits, idx, expect):
    packed = pack_indices(np.array([idx], np.uint8), bits)
    assert packed.tolist() == [expect]
    assert unpack_indices(packed, bits, len(idx)).tolist() == [idx]


@settings(max_examples=200, deadline=None)
@given(bits=st.integers(1, 8), rows=st.integers(1, 4), cols=st.integers(1, 70),
       seed=st.integers(0, 2**32 - 1))
def test_round_trip_and_scalar_reference(bits, rows, cols, seed):
    idx = np.random.default_rng(seed).integers(0, 1 << bits, (rows, cols), dtype=np.uint8)
    packed = pack_indices(idx, bits)
    assert packed.shape == (rows, (cols + 7) // 8 * bits)
    for r in range(rows):
        assert packed[r].tobytes() == scalar_pack_row(idx[r], bits)
    np.testing.assert_array_equal(unpack_indices(packed, bits, cols), idx)


def test_chunked_rows_round_trip():
    # more rows than one internal chunk, odd row length
    idx = np.random.default_rng(1).integers(0, 8, (5000, 13), dtype=np.uint8)
    np.testing.assert_array_equal(unpack_indices(pack_indices(idx, 3), 3, 13), idx)


def test_pack_errors():
    with pytest.raises(DittoError, match="1..8"):
        pack_indices(np.zeros((1, 8), np.uint8), 9)
    with pytest.raises(DittoError, match="1..8"):
        pack_indices(np.zeros((1, 8), np.uint8), 0)
    with pytest.raises(DittoError, match="does not fit"):
        pack_indices(np.full((1, 8), 16, np.uint8), 4)
    with pytest.raises(DittoError, match="bytes per row"):
        unpack_indices(np.zeros((1, 3), np.uint8), 4, 8)


def _random_codebook_tensor(rng, rows, cols, bits, g, cbt):
    s = -(-cols // g)
    cb = np.sort(rng.standard_normal((rows, s, 1 << bits)), axis=-1)
    cb = cb.astype(np.float16 if cbt == "f16" else np.float32).astype(np.float32)
    idx = rng.integers(0, 1 << bits, (rows, cols), dtype=np.uint8)
    return CodebookTensor(bits=bits, group_size=g, codebooks=cb, indices=idx,
                          codebook_type=cbt)


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(1, 8), rows=st.integers(1, 5), cols=st.integers(2, 90),
       g=st.integers(2, 40), cbt=st.sampled_from(["f16", "f32"]),
       seed=st.integers(0, 2**32 - 1))
def test_payload_dequantize(bits, rows, cols, g, cbt, seed):
    t = _random_codebook_tensor(np.random.default_rng(seed), rows, cols, bits, g, cbt)
    payload = np.frombuffer(codebook_payload(t), np.uint8)
    assert payload.size == codebook_nbytes(rows, cols, bits, g, cbt)
    info = TensorInfo("x", "codebook", (rows, cols), bits, g, cbt)
    W = dequantize(info, payload)
    # scalar reference: W[r][c] = codebook[r][c // G][index[r][c]]
    for r in range(rows):
        for c in range(cols):
            assert W[r, c] == t.codebooks[r, c // g, t.indices[r, c]]


def test_payload_layout_by_hand():
    # 1 row, 3 columns, G = 2 (sub-blocks of 2 + tail 1), b = 1, f32 codebooks
    cb = np.array([[[-1.0, 2.0], [0.5, 3.0]]], np.float32)
    t = CodebookTensor(bits=1, group_size=2, codebooks=cb,
                       indices=np.array([[1, 0, 1]], np.uint8), codebook_type="f32")
    raw = codebook_payload(t)
    assert len(raw) == 64 + 1  # 16 bytes of codebook padded to 64, then ceil(3/8)·1 byte
    assert np.frombuffer(raw[:16], "<f4").tolist() == [-1.0, 2.0, 0.5, 3.0]
    assert raw[16:64] == bytes(48)
    assert raw[64] == 0b101
    info = TensorInfo("x", "codebook", (1, 3), 1, 2, "f32")
    assert dequantize(info, np.frombuffer(raw, np.uint8)).tolist() == [[2.0, -1.0, 3.0]]


def test_payload_rejects_unrounded_codebook():
    cb = np.full((1, 1, 2), 0.1, np.float32)  # 0.1 is not an f16 value
    t = CodebookTensor(bits=1, group_size=8, codebooks=cb, indices=np.zeros((1, 8), np.uint8))
    with pytest.raises(DittoError, match="f16"):
        codebook_payload(t)


def test_dequantize_rejects_wrong_length():
    info = TensorInfo("blk.0.attn_q.weight", "codebook", (4, 16), 4, 8, "f16")
    with pytest.raises(DittoError, match="blk.0.attn_q.weight"):
        dequantize(info, np.zeros(10, np.uint8))


# ---- the packer writes a model file ModelFile reads back ------------------------------------

def _tiny_model(rng, bad_shape=False):
    cfg = ModelConfig(dim=16, hidden_dim=24, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                      vocab_size=5, max_seq_len=32, rope_theta=10000.0, norm_eps=1e-5,
                      tied_embeddings=True)
    tok = TokenizerSpec(kind="bpe_bytes", tokens=(b"a", b"b", b"c", b"ab", b"abc"),
                        scores=np.zeros(5, np.float32), token_types=np.ones(5, np.uint32),
                        merges=((0, 1), (3, 2)), pre="gpt2")
    from ditto_core.model.modelfile import expected_shapes
    shapes = expected_shapes(cfg)
    values, plan = {}, {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            plan[name] = ("f32", None)
            values[name] = rng.standard_normal(shape).astype(np.float32)
        else:
            bits = 3 if "ffn" in name else 4
            plan[name] = ("codebook", (bits, 8, "f16"))
            rows, cols = shape
            if bad_shape and name == "blk.0.ffn_up.weight":
                rows += 1
            values[name] = _random_codebook_tensor(rng, rows, cols, bits, 8, "f16")
    qm = QuantizedModel(config=cfg, tokenizer=tok, plan=plan, shapes=shapes,
                        tensors=lambda: iter(values.items()), report={})
    return qm, values


def test_packer_writes_readable_file(tmp_path):
    qm, values = _tiny_model(np.random.default_rng(3))
    out = tmp_path / "m.ditto"
    summary = BitsPacker(show_progress=False).pack(qm, out)
    mf = ModelFile.open(out)
    assert list(mf.tensors) == list(qm.plan)
    for name, v in values.items():
        info = mf.tensors[name]
        got = dequantize(info, mf.payload(name))
        if isinstance(v, CodebookTensor):
            assert (info.encoding, info.bits, info.group_size) == ("codebook", v.bits, 8)
            rows = np.arange(v.indices.shape[0])[:, None]
            cols = np.arange(v.indices.shape[1])[None, :]
            np.testing.assert_array_equal(got, v.codebooks[rows, cols // 8, v.indices])
        else:
            np.testing.assert_array_equal(got, v)
    assert summary["file_bytes"] == out.stat().st_size
    assert summary["tensors"]["blk.0.ffn_up.weight"]["bits"] == 3
    n = sum(np.prod(s) for s in qm.shapes.values())
    assert summary["bpw"] == pytest.approx(8 * out.stat().st_size / n)


def test_packer_mismatch_leaves_nothing(tmp_path):
    qm, _ = _tiny_model(np.random.default_rng(4), bad_shape=True)
    out = tmp_path / "m.ditto"
    with pytest.raises(DittoError, match="blk.0.ffn_up.weight"):
        BitsPacker(show_progress=False).pack(qm, out)
    assert list(tmp_path.iterdir()) == []
