"""One set of rules for a valid model file (docs/FORMAT.md "Validity rules"), enforced alike by
the Python reader (ditto_core.model.modelfile.ModelFile, behind `ditto inspect`), the Python writer
(plan_layout, behind `ditto export/build`) and the C loader (native/model/model.c + tokenizer.c,
behind ditto-run).

The same generated cases, each a valid file with one field changed (the CRC fixed up), go to
both readers; each case says whether the rules make it valid, and both readers must agree with
it, case by case (reliability/build-accepts-config-runtime-rejects,
reliability/ditto-overlapping-payloads-accepted). Config changes also go to the writer: a build
refuses exactly what the runtime would refuse.
"""

from __future__ import annotations

import math
import struct

import attrs
import pytest

from ditto_core.base.errors import DittoError
from ditto_core.model import format as F
from ditto_core.model.modelfile import ModelFile, plan_layout
from tests.fixtures_native import EXIT_MODEL, EXIT_OK, run_native
from tests.modelfile_edit import ModelImage

NAN, INF = float("nan"), float("inf")


def _cfg(**kw):
    return lambda img: img.set_config(**kw)


def _ent(name, **kw):
    return lambda img: img.set_entry(name, **kw)


def _tok(**kw):
    return lambda img: img.set_tokenizer(**kw)


def _shift(name, delta):
    return lambda img: img.set_entry(name, offset=img.entry(name)["offset"] + delta)


def _overlap(name, other, delta=0):
    return lambda img: img.set_entry(name, offset=img.entry(other)["offset"] + delta)


def _name(name, raw):
    return lambda img: img.set_entry(name, name=raw)


def _token_text_byte(token_id, index, value):
    def f(img):
        sec = img.token_sections()
        start = struct.unpack_from("<I", img.b, sec["offsets"] + 4 * token_id)[0]
        img.b[sec["blob"] + start + index] = value
    return f


def _token_type(token_id, value):
    return lambda img: struct.pack_into("<I", img.b, img.token_sections()["types"] + 4 * token_id,
                                        value)


def _meta_size(delta):
    return lambda img: img.set_header(meta_size=img.header()["meta_size"] + delta)


def _config_reserved(img):
    img.set_config(reserved=b"\0" * 11 + b"\1")


def _entry_reserved(img):
    img.set_entry("blk.0.attn_q.weight", reserved=b"\1" + b"\0" * 11)


def _tok_reserved(img):
    img.set_tokenizer(reserved=7)


# (case id, change, valid?) over native_synth.quant: byte-level BPE vocab of 259 (3 control
# tokens, then the 256 bytes), dim 72, hidden 100, 2 layers, 6 heads of 12, 2 KV heads, tied;
# every matrix a codebook tensor, the vectors f32.
CASES = [
    ("unchanged", lambda img: None, True),
    # config values
    ("rope_theta=1", _cfg(rope_theta=1.0), True),
    ("rope_theta=0.5", _cfg(rope_theta=0.5), True),
    ("rope_theta=0", _cfg(rope_theta=0.0), False),
    ("rope_theta<0", _cfg(rope_theta=-10000.0), False),
    ("rope_theta=inf", _cfg(rope_theta=INF), False),
    ("rope_theta=nan", _cfg(rope_theta=NAN), False),
    ("norm_eps=1", _cfg(norm_eps=1.0), True),
    ("norm_eps=2", _cfg(norm_eps=2.0), True),
    ("norm_eps=1e-38", _cfg(norm_eps=1e-38), True),
    ("norm_eps=0", _cfg(norm_eps=0.0), False),
    ("norm_eps<0", _cfg(norm_eps=-1e-5), False),
    ("norm_eps=nan", _cfg(norm_eps=NAN), False),
    ("norm_eps=inf", _cfg(norm_eps=INF), False),
    ("max_seq_len=1", _cfg(max_seq_len=1), True),
    ("max_seq_len=1e8", _cfg(max_seq_len=10**8), True),
    ("max_seq_len=2^31-1", _cfg(max_seq_len=2**31 - 1), True),
    ("max_seq_len=2^31", _cfg(max_seq_len=2**31), False),
    ("max_seq_len=0", _cfg(max_seq_len=0), False),
    ("arch=2 (Qwen2 without biases)", _cfg(arch=2), False),
    ("arch=3", _cfg(arch=3), False),
    ("tied=2", _cfg(tied_embeddings=2), False),
    ("tied=0 (no output.weight)", _cfg(tied_embeddings=0), False),
    ("n_kv_heads=4 (not a divisor)", _cfg(n_kv_heads=4), False),
    ("n_kv_heads=0", _cfg(n_kv_heads=0), False),
    ("n_kv_heads=12 > n_heads", _cfg(n_kv_heads=12), False),
    ("head_dim odd", _cfg(head_dim=13), False),
    ("dim=0", _cfg(dim=0), False),
    ("n_layers=1 (extra tensors)", _cfg(n_layers=1), False),
    ("n_layers=3 (missing tensors)", _cfg(n_layers=3), False),
    ("n_layers above limit", _cfg(n_layers=F.MAX_LAYERS + 1), False),
    ("vocab above limit", _cfg(vocab_size=F.MAX_VOCAB + 1), False),
    ("hidden_dim above limit", _cfg(hidden_dim=F.MAX_HIDDEN_DIM + 1), False),
    ("n_heads*head_dim above limit", _cfg(n_heads=6 * 2**17), False),
    ("config reserved", _config_reserved, False),
    ("n_tensors+1", lambda img: img.set_config(n_tensors=img.n_tensors() + 1), False),
    # tensor table
    ("name with junk after NUL", _name("blk.0.attn_q.weight",
                                       b"blk.0.attn_q.weight\0junk"), False),
    ("name not UTF-8", _name("blk.0.attn_q.weight", b"blk.0.attn_q.weigh\xff"), False),
    ("empty name", _name("blk.0.attn_q.weight", b""), False),
    ("duplicate name", _name("blk.0.attn_k.weight", b"blk.0.attn_q.weight"), False),
    ("entry reserved", _entry_reserved, False),
    ("f32 with b, G, codebook type", _ent("output_norm.weight", bits=4, group_size=256,
                                          codebook_type=1), False),
    ("f32 with codebook type only", _ent("output_norm.weight", codebook_type=1), False),
    ("f32 with bits only", _ent("output_norm.weight", bits=4), False),
    ("vector as codebook", _ent("output_norm.weight", encoding=1, bits=4, group_size=256,
                                codebook_type=1), False),
    ("encoding=2", _ent("blk.0.attn_q.weight", encoding=2), False),
    ("codebook_type=3", _ent("blk.0.attn_q.weight", codebook_type=3), False),
    ("codebook_type=2 (int8) with an f16 payload size", _ent("blk.0.attn_q.weight",
                                                            codebook_type=2), False),
    ("bits=0", _ent("blk.0.attn_q.weight", bits=0), False),
    ("bits=9", _ent("blk.0.attn_q.weight", bits=9), False),
    ("G=1", _ent("blk.0.attn_q.weight", group_size=1), False),
    ("G=2^24+1", _ent("blk.0.attn_q.weight", group_size=F.MAX_GROUP_SIZE + 1), False),
    ("ndim=3", _ent("blk.0.attn_q.weight", ndim=3), False),
    ("ndim=1 for a matrix", _ent("blk.0.attn_q.weight", ndim=1), False),
    ("vector rows=2", _ent("output_norm.weight", rows=2), False),
    ("rows=2^40", _ent("blk.0.attn_q.weight", rows=2**40), False),
    ("cols=2^63", _ent("blk.0.attn_q.weight", cols=2**63), False),
    ("nbytes+64", lambda img: img.set_entry(
        "blk.0.attn_q.weight", nbytes=img.entry("blk.0.attn_q.weight")["nbytes"] + 64), False),
    ("offset misaligned", _shift("output_norm.weight", 8), False),
    ("offset 0 (metadata)", _ent("output_norm.weight", offset=0), False),
    ("offset past the end", _ent("output_norm.weight", offset=2**62), False),
    ("offset near 2^64", _ent("output_norm.weight", offset=2**64 - 64), False),
    ("two tensors, one payload", _overlap("blk.0.attn_k.weight", "blk.0.attn_q.weight"), False),
    ("payloads overlap by 64 bytes", _overlap("blk.0.attn_k.weight", "blk.0.attn_q.weight", 64),
     False),
    ("payload inside another", _overlap("blk.1.attn_norm.weight", "blk.1.ffn_up.weight", 128),
     False),
    # tokenizer block
    ("chat_format=7", _tok(chat_format=7), False),
    ("add_bos=2", _tok(add_bos=2), False),
    ("add_space_prefix=2", _tok(add_space_prefix=2), False),
    ("tokenizer reserved", _tok_reserved, False),
    ("pad_id=n", _tok(pad_id=259), False),
    ("bos_id=-2", _tok(bos_id=-2), False),
    ("eos_id=-1", _tok(eos_id=-1), True),
    ("kind=3", _tok(kind=3), False),
    ("pre=4", _tok(pre=4), False),
    ("n_tokens+1", _tok(n_tokens=260), False),
    ("blob_bytes-1", lambda img: img.set_tokenizer(
        blob_bytes=img.tokenizer()["blob_bytes"] - 1), False),
    ("token type 7", _token_type(5, 7), False),
    ("token type 0", _token_type(5, 0), False),
    ("control token not UTF-8", _token_text_byte(0, 3, 0xFF), False),
    ("byte token made control (0xff)", _token_type(3 + 0xFF, 3), False),
    ("byte token made control ('a')", _token_type(3 + ord("a"), 3), True),
    ("metadata 4 bytes longer", _meta_size(4), False),
    ("metadata 4 bytes shorter", _meta_size(-4), False),
    # header
    ("header reserved", lambda img: img.set_header(reserved=b"\1" + b"\0" * 31), False),
    ("version 3", lambda img: img.set_header(version=3), False),
]


def _c_accepts(exe, path) -> tuple[bool, str]:
    p = run_native(exe, "-m", path, "-p", "hi", "--tokens")
    err = p.stderr.decode(errors="replace")
    assert "Sanitizer" not in err and "runtime error" not in err, err
    assert p.returncode in (EXIT_OK, EXIT_MODEL), (p.returncode, err)
    return p.returncode == EXIT_OK, err


def _py_accepts(path) -> tuple[bool, str]:
    try:
        ModelFile(path)
    except DittoError as exc:
        return False, str(exc)
    return True, ""


def test_cases_cover_every_kind():
    assert len({c[0] for c in CASES}) == len(CASES)
    assert sum(1 for c in CASES if c[2]) >= 10 and sum(1 for c in CASES if not c[2]) >= 60


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_both_readers_agree(native_build, native_synth, tmp_path, case):
    name, change, valid = case
    img = ModelImage(native_synth.quant.path)
    change(img)
    path = img.save(tmp_path / "case.ditto")
    c_ok, c_err = _c_accepts(native_build.asan, path)
    py_ok, py_err = _py_accepts(path)
    assert (c_ok, py_ok) == (valid, valid), (name, c_err, py_err)
    if not valid:  # both name the file
        assert str(path) in c_err and str(path) in py_err


# cases on a Qwen2 file (q/k/v biases; kv_dim 24, q_dim 72)
QWEN2_CASES = [
    ("unchanged", lambda img: None, True),
    ("arch=1 (Llama with biases)", _cfg(arch=1), False),
    ("arch=0", _cfg(arch=0), False),
    ("a bias renamed (missing)", _name("blk.1.attn_v.bias", b"blk.1.attn_v.biaz"), False),
    ("q bias of kv length", _ent("blk.0.attn_q.bias", cols=24, nbytes=96), False),
    ("bias as a 2-D [1, n] tensor", _ent("blk.0.attn_k.bias", ndim=2), False),
]


@pytest.mark.parametrize("case", QWEN2_CASES, ids=[c[0] for c in QWEN2_CASES])
def test_both_readers_agree_on_qwen2_files(native_build, native_synth, tmp_path, case):
    name, change, valid = case
    img = ModelImage(native_synth.quant_qwen2.path)
    change(img)
    path = img.save(tmp_path / "case.ditto")
    c_ok, c_err = _c_accepts(native_build.asan, path)
    py_ok, py_err = _py_accepts(path)
    assert (c_ok, py_ok) == (valid, valid), (name, c_err, py_err)
    if not valid:
        assert str(path) in c_err and str(path) in py_err


CONFIG_VALUES = [c for c in CASES if c[0].split("=")[0].split("<")[0] in
                 ("rope_theta", "norm_eps", "max_seq_len")]


@pytest.mark.parametrize("case", CONFIG_VALUES, ids=[c[0] for c in CONFIG_VALUES])
def test_writer_refuses_exactly_what_the_runtime_refuses(native_synth, case):
    name, change, valid = case
    img = ModelImage(native_synth.quant.path)
    change(img)
    c = img.config()
    mf = ModelFile(native_synth.quant.path)
    cfg = attrs.evolve(mf.config, rope_theta=c["rope_theta"], norm_eps=c["norm_eps"],
                       max_seq_len=c["max_seq_len"])
    tensors = [attrs.evolve(t, offset=0, nbytes=0) for t in mf.tensors.values()]
    if valid:
        plan_layout(cfg, mf.tokenizer, tensors, "built.ditto")
    else:
        with pytest.raises(DittoError, match="built.ditto: config"):
            plan_layout(cfg, mf.tokenizer, tensors, "built.ditto")


def test_writer_refuses_config_values_of_wrong_type(native_synth):
    mf = ModelFile(native_synth.quant.path)
    tensors = [attrs.evolve(t, offset=0, nbytes=0) for t in mf.tensors.values()]
    for field, value in [("rope_theta", "10000"), ("norm_eps", None), ("max_seq_len", 2.5),
                         ("rope_theta", 1e39), ("norm_eps", math.inf)]:
        cfg = attrs.evolve(mf.config, **{field: value})
        with pytest.raises(DittoError, match=f"config {field}"):
            plan_layout(cfg, mf.tokenizer, tensors, "built.ditto")
