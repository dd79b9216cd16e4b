"""A codebook is never allowed to make a tensor larger than f32; options are checked before any
tensor is loaded; the report names the method actually used.

Byte counts below are the FORMAT.md formulas done by hand (``roundup(rows·S·2^b·itemsize, 64)``
codebooks + ``rows·ceil(cols/8)·b`` index bytes, against ``4·rows·cols`` for f32)."""

import numpy as np
import pytest

from ditto_core.base.errors import DittoError
from ditto_core.base.types import Checkpoint, ModelConfig, TokenizerSpec
from ditto_core.kit.components import QuantOptions
from ditto_core.model.codebook import saves_space as codebook_saves_space
from ditto_core.model.modelfile import ModelFile
from ditto_pack_bits import BitsPacker
from ditto_quant_kmeans import KMeansQuantizer, plan_tensors, plan_with_reasons

LARGER = "codebook larger than f32"


def test_size_rule_at_the_boundary():
    # rows 2, cols 9, b 2, one sub-block: codebooks roundup(2·1·4·2, 64) = 64, indices
    # 2·ceil(9/8)·2 = 8 → 72 bytes = 4·2·9: not smaller, so f32.
    assert not codebook_saves_space(2, 9, 2, 16, "f16")
    # cols 10: 64 + 8 = 72 < 80 → codebook.
    assert codebook_saves_space(2, 10, 2, 16, "f16")
    plan, why = plan_with_reasons({"blk.0.attn_q.weight": (2, 9), "blk.0.attn_k.weight": (2, 10)},
                                  QuantOptions(bits=2, group_size=16))
    assert plan == {"blk.0.attn_q.weight": ("f32", None),
                    "blk.0.attn_k.weight": ("codebook", (2, 16, "f16"))}
    assert why == {"blk.0.attn_q.weight": {"reason": LARGER, "codebook_bytes": 72,
                                           "f32_bytes": 72, "bits": 2, "group_size": 16}}


def test_user_report_cases_stay_f32():
    """The two cases reported on tinycoder (rows of 16 weights)."""
    shapes = {"token_embd.weight": (32000, 16), "blk.0.attn_q.weight": (16, 16),
              "blk.0.ffn_gate.weight": (64, 16), "blk.0.attn_norm.weight": (16,)}
    # default b = 4 → embedding at b + 2 = 6: 64 f16 centroids per row of 16 weights
    # = 32000·128 + 32000·2·6 bytes (70 bpw) > 32000·64 → f32; attn_q at 4 bits:
    # 16·16·2 + 16·2·4 = 640 < 1024 → codebook.
    plan, why = plan_with_reasons(shapes, QuantOptions())
    assert plan["token_embd.weight"] == ("f32", None)
    assert why["token_embd.weight"] == {"reason": LARGER, "codebook_bytes": 4_480_000,
                                        "f32_bytes": 2_048_000, "bits": 6, "group_size": 256}
    assert plan["blk.0.attn_q.weight"] == ("codebook", (4, 256, "f16"))
    assert plan["blk.0.ffn_gate.weight"] == ("codebook", (4, 256, "f16"))
    assert why["blk.0.attn_norm.weight"] == {"reason": "vector"}
    # b = 8, G = 100000, f32 codebooks: 256·4 bytes of centroids per row of 16 (524 bpw)
    plan, why = plan_with_reasons(shapes, QuantOptions(bits=8, group_size=100000,
                                                       codebook_type="f32"))
    assert all(p == ("f32", None) for p in plan.values())
    assert why["blk.0.attn_q.weight"]["codebook_bytes"] == 16 * 256 * 4 + 16 * 2 * 8
    # the b = 3, G = 64 build of tinycoder: embedding at 5 bits = 2,368,000 > 2,048,000 bytes
    assert plan_with_reasons(shapes, QuantOptions(bits=3, group_size=64))[1][
        "token_embd.weight"]["codebook_bytes"] == 2_368_000
    assert plan_tensors(shapes, QuantOptions(bits=3, group_size=64))["blk.0.attn_q.weight"] == \
        ("codebook", (3, 64, "f16"))


def _packed(tiny_gguf, tmp_path, name, options):
    from ditto_core.stages.plugins import build_registry
    ck = build_registry().get("exporter", "gguf").load(tiny_gguf)
    qm = KMeansQuantizer().quantize(ck, options)
    out = tmp_path / name
    summary = BitsPacker(show_progress=False).pack(qm, out)
    return ck, out, summary


def test_tinycoder_files_never_exceed_f32(tiny_gguf, tmp_path):
    ck, path, summary = _packed(tiny_gguf, tmp_path, "b4.ditto", QuantOptions())
    mf = ModelFile(path)
    for name, t in mf.tensors.items():
        assert t.nbytes <= 4 * t.n_weights, name
    emb = mf.tensors["token_embd.weight"]
    assert (emb.encoding, emb.nbytes) == ("f32", 32000 * 16 * 4)
    np.testing.assert_array_equal(mf.f32("token_embd.weight"), ck.tensors["token_embd.weight"]())
    assert summary["tensors"]["token_embd.weight"]["encoding"] == "f32"
    assert summary["tensors"]["token_embd.weight"]["reason"] == LARGER
    assert summary["tensors"]["token_embd.weight"]["bpw"] == 32.0
    q = summary["tensors"]["blk.0.attn_q.weight"]
    assert (q["encoding"], q["bits"], q["bytes"]) == ("codebook", 4, 640)
    assert summary["method"] == "optimal" and summary["quantizer"] == "kmeans"
    assert summary["report"]["method"] == "optimal"

    # --bits 8 --group-size 100000 --codebook-type f32: every matrix stays f32, so the file
    # is byte for byte the all-f32 file (every tensor kept with --keep-fp32 '*').
    _, big, s8 = _packed(tiny_gguf, tmp_path, "b8.ditto",
                         QuantOptions(bits=8, group_size=100000, codebook_type="f32"))
    _, ref, _ = _packed(tiny_gguf, tmp_path, "f32.ditto", QuantOptions(keep_fp32=("*",)))
    assert big.read_bytes() == ref.read_bytes()
    assert all(r["encoding"] == "f32" for r in s8["tensors"].values())
    assert s8["bpw"] == pytest.approx(8 * ref.stat().st_size / s8["n_weights"])


class _Untouchable(dict):
    """Tensor loaders that fail the test if called."""

    def __getitem__(self, name):
        raise AssertionError(f"tensor {name!r} was loaded before the options were checked")


def _checkpoint():
    cfg = ModelConfig(dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                      vocab_size=40, max_seq_len=16, rope_theta=1e4, norm_eps=1e-5,
                      tied_embeddings=True)
    tok = TokenizerSpec(kind="bpe_bytes", tokens=tuple(bytes([65 + i]) for i in range(40)),
                        scores=np.zeros(40, np.float32), token_types=np.ones(40, np.uint32))
    from ditto_core.model.modelfile import expected_shapes
    shapes = expected_shapes(cfg)
    return Checkpoint(config=cfg, tokenizer=tok, tensors=_Untouchable(), shapes=shapes,
                      source=__file__)


@pytest.mark.parametrize("kw, match", [
    ({"method": "foo"}, "unknown method 'foo'; choose one of optimal, lloyd"),
    ({"bits": 0}, "bit width b must be an integer in 1..8, got 0"),
    ({"group_size": 1}, "group size G must be an integer in 2..16777216, got 1"),
    ({"group_size": 2**32 - 1}, "group size G must be an integer in 2..16777216, got 4294967295"),
    ({"codebook_type": "bf16"}, "codebook type must be 'f16', 'f32' or 'int8', got 'bf16'"),
])
def test_bad_options_raise_before_any_tensor_is_loaded(kw, match):
    with pytest.raises(DittoError, match=match):
        KMeansQuantizer().quantize(_checkpoint(), QuantOptions(**kw))
    with pytest.raises(DittoError, match=match):  # and without a checkpoint at all
        KMeansQuantizer().check_options(QuantOptions(**kw))


def test_report_names_the_resolved_method():
    for method, want in ((None, "optimal"), ("lloyd", "lloyd")):
        qm = KMeansQuantizer().quantize(_checkpoint(), QuantOptions(method=method))
        assert qm.report["method"] == want  # planned without loading a tensor
        assert KMeansQuantizer().check_options(QuantOptions(method=method)) == want


def test_rtn_plugin_applies_the_same_rule(rtn_registry):
    """The example third-party quantizer plans with the same size rule and names its method."""
    rtn = rtn_registry.get("quantizer", "rtn")
    ck = _checkpoint()  # dim 16: rows of 16 weights; no tensor may be loaded while planning
    qm = rtn.quantize(ck, QuantOptions(bits=8, group_size=100000, codebook_type="f32"))
    assert all(p == ("f32", None) for p in qm.plan.values())
    assert qm.report["tensors"]["blk.0.attn_q.weight"] == {
        "encoding": "f32", "rule": "default", "reason": LARGER,
        "codebook_bytes": 16 * 256 * 4 + 16 * 2 * 8, "f32_bytes": 16 * 16 * 4, "bits": 8,
        "group_size": 100000}
    assert qm.report["method"] == "rtn"
    qm = rtn.quantize(ck, QuantOptions(bits=2, group_size=8))
    # 16 rows · 2 sub-blocks · 4 f16 centroids = 256 bytes + 16·2·2 index bytes < 1024
    assert qm.plan["blk.0.attn_q.weight"] == ("codebook", (2, 8, "f16"))
    with pytest.raises(DittoError, match="unknown method 'foo'"):
        rtn.quantize(ck, QuantOptions(method="foo"))
    with pytest.raises(DittoError, match="rtn: bit width b must be an integer in 1..8, got 9"):
        rtn.check_options(QuantOptions(bits=9))
    assert rtn.check_options(QuantOptions()) == "rtn"


def test_inspect_names_the_size_guard_after_the_rule_it_overrode():
    from ditto_core.kit.quantkit import plan_tensors as kit_plan  # build.json's reasons
    from ditto_core.model.summary import build_rules

    shapes = {"token_embd.weight": (32000, 16), "blk.0.attn_q.weight": (16, 16),
              "blk.0.attn_norm.weight": (16,)}
    plan, why = kit_plan(shapes, QuantOptions(bits=4, group_size=16,
                                              keep_fp32=("blk.0.attn_q*",)))
    record = {"options": {"tensor_types": []},
              "tensors": {n: {"encoding": plan[n][0], **r} for n, r in why.items()}}
    assert build_rules(record)["tensors"] == {
        "token_embd.weight": f"embedding (b+2, one codebook per row), kept f32: {LARGER}",
        "blk.0.attn_q.weight": "keep_fp32 blk.0.attn_q*",
        "blk.0.attn_norm.weight": "vector"}
