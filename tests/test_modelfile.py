"""ditto_core.model.modelfile: write/read round trips, the FORMAT.md size formulas, and refusals."""

import os
import re
import struct
import zlib

import attrs
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ditto_core.base.errors import DittoError
from ditto_core.model import format as F
from ditto_core.model.codebook import codebook_bytes, payload_bytes as codebook_nbytes
from ditto_core.model.modelfile import (ModelFile, TensorInfo, expected_shapes, f32_nbytes,
                                        parse_tokenizer, serialize_tokenizer, tokenizers_equal,
                                        write_model)
from ditto_core.base.types import ModelConfig, TokenizerSpec

CFG = ModelConfig(dim=16, hidden_dim=40, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=4,
                  vocab_size=8, max_seq_len=32, rope_theta=10000.0, norm_eps=1e-5,
                  tied_embeddings=True)


def tiny_tokenizer(n=8) -> TokenizerSpec:
    tokens = (b"a", b"b", b"ab", b"<|im_start|>", b"\xff", b"", b"abab", b" x")[:n]
    return TokenizerSpec(kind="bpe_bytes", tokens=tokens,
                         scores=np.zeros(n, np.float32),
                         token_types=np.array([1, 1, 1, 3, 1, 5, 1, 1][:n], np.uint32),
                         merges=((0, 1), (2, 2)), pre="gpt2_digits", bos_id=3, eos_id=3,
                         add_bos=True, chat_format="chatml", chat_template="{{ x }} ✓")


def plan(cfg=CFG, codebook=("blk.0.ffn_down.weight", "blk.1.attn_q.weight")):
    """Tensor plan: everything f32 except ``codebook`` (b=3, G=12, f16)."""
    out = []
    for name, shape in expected_shapes(cfg).items():
        if name in codebook:
            out.append(TensorInfo(name, "codebook", shape, 3, 12, "f16"))
        else:
            out.append(TensorInfo(name, "f32", shape))
    return out


def payloads_for(infos, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for t in infos:
        if t.encoding == "f32":
            out[t.name] = rng.standard_normal(t.shape).astype(np.float32)
        else:
            out[t.name] = rng.integers(0, 256, t.expected_nbytes(), dtype=np.uint8).tobytes()
    return out


@pytest.fixture
def written(tmp_path):
    infos = plan()
    data = payloads_for(infos)
    path = tmp_path / "m.ditto"
    laid = write_model(path, CFG, tiny_tokenizer(), infos, ((t.name, data[t.name]) for t in infos))
    return path, laid, data


def test_round_trip(written):
    path, laid, data = written
    with ModelFile.open(path) as mf:
        assert mf.version == 1 and mf.file_size == path.stat().st_size
        assert mf.config == attrs.evolve(CFG, norm_eps=float(np.float32(1e-5)))
        assert tokenizers_equal(mf.tokenizer, tiny_tokenizer())
        assert list(mf.tensors) == [t.name for t in laid]
        assert list(mf.tensors.values()) == laid
        for t in laid:
            assert t.offset % 64 == 0
            if t.encoding == "f32":
                np.testing.assert_array_equal(mf.f32(t.name), data[t.name])
            else:
                assert mf.payload(t.name).tobytes() == data[t.name]
                with pytest.raises(DittoError, match="not f32"):
                    mf.f32(t.name)
        # payloads do not overlap and follow each other in table order
        for a, b in zip(laid, laid[1:]):
            assert a.offset + a.nbytes <= b.offset < a.offset + a.nbytes + 64
    # the header's CRC is zlib.crc32 of everything after the 64-byte header
    raw = path.read_bytes()
    assert raw[:8] == b"DITTOMDL"
    assert struct.unpack_from("<I", raw, 12)[0] == zlib.crc32(raw[64:])


def test_payload_is_zero_copy_view(written):
    path, laid, _ = written
    mf = ModelFile(path)
    v = mf.f32("token_embd.weight")
    assert not v.flags.owndata and not v.flags.writeable
    assert v.dtype == np.float32 and v.shape == (CFG.vocab_size, CFG.dim)


def test_size_formulas_follow_format_md():
    # FORMAT.md: S = ceil(cols/G), codebook_bytes = roundup(rows*S*2^b*sizeof, 64),
    # row_bytes = ceil(cols/8)*b. rows=3, cols=10, b=3, G=4, f16: S=3, 3*3*8*2 = 144 -> 192;
    # row_bytes = 2*3 = 6, indices = 18.
    assert codebook_bytes(3, 10, 3, 4, "f16") == 192
    assert codebook_nbytes(3, 10, 3, 4, "f16") == 192 + 18
    # 576x1536, b=4, G=256, f32: 576*6*16*4 = 221184 (already a multiple of 64); 576*768.
    assert codebook_nbytes(576, 1536, 4, 256, "f32") == 221184 + 576 * 768
    assert f32_nbytes((576,)) == 2304 and f32_nbytes((3, 5)) == 60
    t = TensorInfo("x", "codebook", (576, 1536), 4, 256, "f16")
    assert t.n_sub_blocks == 6 and t.rows == 576 and t.cols == 1536
    assert t.bpw == pytest.approx(8 * codebook_nbytes(576, 1536, 4, 256, "f16") / (576 * 1536))
    v = TensorInfo("v", "f32", (7,))
    assert (v.rows, v.cols, v.bpw) == (1, 7, 32.0)
    with pytest.raises(DittoError, match="1..8"):
        codebook_nbytes(3, 10, 9, 4, "f16")


def _rewrite_header(path, **changes):
    raw = bytearray(path.read_bytes())
    h = F.unpack(F.HEADER, F.HEADER_FIELDS, raw)
    h.update(changes)
    raw[:64] = F.pack(F.HEADER, F.HEADER_FIELDS, **h)
    path.write_bytes(bytes(raw))


def _fix_crc(path):
    raw = path.read_bytes()
    _rewrite_header(path, crc32=zlib.crc32(raw[64:]))


def test_refuses_bad_magic(written):
    path = written[0]
    raw = bytearray(path.read_bytes())
    raw[:8] = b"GGUF\0\0\0\0"
    path.write_bytes(bytes(raw))
    with pytest.raises(DittoError, match=f"{path}.*not a Ditto model file"):
        ModelFile(path)


def test_refuses_unknown_version(written):
    path = written[0]
    _rewrite_header(path, version=3)
    with pytest.raises(DittoError, match=f"{path}.*version 3"):
        ModelFile(path)


def test_refuses_nonzero_reserved_header_bytes(written):
    """FORMAT.md: header bytes 32..63 are reserved and zero; the CRC covers [64, size) only, so
    the reader must check them itself."""
    path = written[0]
    for at in (32, 63):
        raw = bytearray(path.read_bytes())
        raw[32:64] = bytes(32)
        raw[at] = 0x01
        path.write_bytes(bytes(raw))
        with pytest.raises(DittoError, match=f"{path}: header reserved bytes 32..63 must be "
                                             f"zero, byte {at} is 0x01"):
            ModelFile(path)
    raw = bytearray(path.read_bytes())
    raw[32:64] = bytes(32)
    path.write_bytes(bytes(raw))
    assert ModelFile(path).file_size == len(raw)  # zeros again: accepted


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_file_mode_follows_umask(tmp_path, umask):
    """write_model's temp file (mkstemp, 0600) gets 0666 & ~umask before the rename, the mode
    open(path, "w") would give."""
    infos = plan()
    data = payloads_for(infos)
    path = tmp_path / f"m{umask:o}.ditto"
    old = os.umask(umask)
    try:
        write_model(path, CFG, tiny_tokenizer(), infos, ((t.name, data[t.name]) for t in infos))
        ref = tmp_path / "ref"
        ref.write_bytes(b"")  # a file created the ordinary way under the same umask
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert path.stat().st_mode & 0o777 == ref.stat().st_mode & 0o777
    assert os.umask(old) == old  # the process umask is left as it was
    os.umask(old)


def test_refuses_truncated(written):
    path = written[0]
    raw = path.read_bytes()
    path.write_bytes(raw[:-100])
    with pytest.raises(DittoError, match=f"{path}.*truncated"):
        ModelFile(path)


def test_refuses_bad_checksum(written):
    path, laid, _ = written
    raw = bytearray(path.read_bytes())
    raw[laid[-1].offset] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(DittoError, match=f"{path}.*checksum"):
        ModelFile(path)
    ModelFile(path, verify=False)  # the layout itself is still fine


def _rewrite_entry(path, index, **changes):
    raw = bytearray(path.read_bytes())
    at = 128 + 128 * index
    e = F.unpack(F.TENSOR_ENTRY, F.TENSOR_ENTRY_FIELDS, raw, at)
    e.update(changes)
    raw[at:at + 128] = F.pack(F.TENSOR_ENTRY, F.TENSOR_ENTRY_FIELDS, **e)
    path.write_bytes(bytes(raw))
    _fix_crc(path)


def test_refuses_misaligned_offset(written):
    path, laid, _ = written
    _rewrite_entry(path, 1, offset=laid[1].offset + 4)
    with pytest.raises(DittoError, match="misaligned"):
        ModelFile(path)


def test_refuses_payload_past_end(written):
    path, laid, _ = written
    last = len(laid) - 1
    _rewrite_entry(path, last, offset=laid[last].offset + 64)
    with pytest.raises(DittoError, match="past the end"):
        ModelFile(path)


def test_refuses_config_not_matching_tensors(written):
    path = written[0]
    raw = bytearray(path.read_bytes())
    c = F.unpack(F.CONFIG, F.CONFIG_FIELDS, raw, 64)
    c["hidden_dim"] = 48
    raw[64:128] = F.pack(F.CONFIG, F.CONFIG_FIELDS, **c)
    path.write_bytes(bytes(raw))
    _fix_crc(path)
    with pytest.raises(DittoError, match="ffn_gate.weight.*shape"):
        ModelFile(path)


def _names_in(d):
    return sorted(os.listdir(d))


def test_write_wrong_length_names_tensor_and_leaves_nothing(tmp_path):
    infos = plan()
    data = payloads_for(infos)
    data["blk.0.ffn_down.weight"] = data["blk.0.ffn_down.weight"][:-1]
    with pytest.raises(DittoError, match="blk.0.ffn_down.weight.*bytes"):
        write_model(tmp_path / "m.ditto", CFG, tiny_tokenizer(), infos,
                    ((t.name, data[t.name]) for t in infos))
    assert _names_in(tmp_path) == []


def test_write_wrong_f32_shape_and_order(tmp_path):
    infos = plan()
    data = payloads_for(infos)
    data["output_norm.weight"] = data["output_norm.weight"][None, :]
    with pytest.raises(DittoError, match="output_norm.weight.*float32"):
        write_model(tmp_path / "m.ditto", CFG, tiny_tokenizer(), infos,
                    ((t.name, data[t.name]) for t in infos))
    with pytest.raises(DittoError, match="expected"):
        write_model(tmp_path / "m.ditto", CFG, tiny_tokenizer(), infos,
                    ((t.name, data[t.name]) for t in reversed(infos)))
    assert _names_in(tmp_path) == []


def test_write_interrupted_leaves_nothing_and_keeps_old_file(tmp_path, written):
    path, laid, data = written
    before = path.read_bytes()

    def gen():
        yield laid[0].name, data[laid[0].name]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_model(path, CFG, tiny_tokenizer(), plan(), gen())
    assert _names_in(path.parent) == [path.name]
    assert path.read_bytes() == before


def test_write_rejects_config_mismatch(tmp_path):
    infos = [t for t in plan() if t.name != "blk.1.ffn_up.weight"]
    with pytest.raises(DittoError, match="missing tensor.*blk.1.ffn_up.weight"):
        write_model(tmp_path / "m.ditto", CFG, tiny_tokenizer(), infos, [])
    untied = plan() + [TensorInfo("output.weight", "f32", (8, 16))]
    with pytest.raises(DittoError, match="output.weight"):
        write_model(tmp_path / "m.ditto", CFG, tiny_tokenizer(), untied, [])
    with pytest.raises(DittoError, match="7 tokens"):
        write_model(tmp_path / "m.ditto", CFG, tiny_tokenizer(7), plan(), [])
    assert _names_in(tmp_path) == []


def test_write_into_missing_directory(tmp_path):
    with pytest.raises(DittoError, match="nope.*cannot write"):
        write_model(tmp_path / "nope" / "m.ditto", CFG, tiny_tokenizer(), plan(), [])


token_bytes = st.binary(min_size=0, max_size=12)


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(token_bytes, min_size=1, max_size=40), data=st.data())
def test_tokenizer_block_round_trip(tokens, data):
    n = len(tokens)
    kind = data.draw(st.sampled_from(["bpe_bytes", "spm_bpe"]))
    merges = tuple(data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                                      max_size=10))) if kind == "bpe_bytes" else ()
    ids = st.integers(-1, n - 1)
    # the block must be valid (FORMAT.md "Validity rules"): a merge yields a token, control /
    # user-defined texts are UTF-8, SentencePiece byte tokens read <0xXX>
    merges = tuple((a, b) for a, b in merges if tokens[a] + tokens[b] in set(tokens))
    types = data.draw(st.lists(st.integers(1, 6), min_size=n, max_size=n))
    for i, t in enumerate(tokens):
        try:
            t.decode("utf-8")
        except UnicodeDecodeError:
            types[i] = 1 if types[i] in (3, 4) else types[i]
        if kind == "spm_bpe" and types[i] == 6 and not re.fullmatch(rb"<0x[0-9A-Fa-f]{2}>", t):
            types[i] = 1
    tok = TokenizerSpec(
        kind=kind, tokens=tuple(tokens),
        scores=np.array(data.draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=n,
                                           max_size=n)), np.float32),
        token_types=np.array(types, np.uint32),
        merges=merges, pre=data.draw(st.sampled_from(["none", "gpt2", "gpt2_digits"])),
        bos_id=data.draw(ids), eos_id=data.draw(ids), unk_id=data.draw(ids),
        pad_id=data.draw(ids), add_bos=data.draw(st.booleans()),
        add_space_prefix=data.draw(st.booleans()),
        chat_format=data.draw(st.sampled_from(["none", "chatml"])),
        chat_template=data.draw(st.text(max_size=30)))
    buf = serialize_tokenizer(tok)
    assert len(buf) % 4 == 0
    assert tokenizers_equal(parse_tokenizer(buf), tok)
    with pytest.raises(DittoError, match="sections take"):
        parse_tokenizer(buf[:64 + 4 * n])


def test_tokenizer_rejects_out_of_range_ids():
    tok = attrs.evolve(tiny_tokenizer(), bos_id=8)
    with pytest.raises(DittoError, match="bos_id 8"):
        serialize_tokenizer(tok)
    tok = attrs.evolve(tiny_tokenizer(), merges=((0, 9),))
    with pytest.raises(DittoError, match="merge"):
        serialize_tokenizer(tok)
