"""The quantizer kit (ditto_core.kit.quantkit): --tensor-type rules, the planning order, checks of
what a quantize_matrix returns, and the ≤ 40-line example quantizer (examples/
ditto-quant-quantile) producing a runnable build whose rules build.json and inspect show."""

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ditto_core.base.errors import DittoError
from ditto_core.kit import quantkit
from ditto_core.kit.components import QuantOptions
from ditto_core.kit.quantkit import CodebookQuantizer, TensorRule, plan_tensors
from ditto_core.stages import pipeline
from ditto_core.stages.plugins import build_registry

from .fixtures_compile import greedy_ids

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ditto-quant-quantile"


def test_rule_parsing():
    assert TensorRule.parse("blk.0.*=f32") == TensorRule("blk.0.*", f32=True)
    assert TensorRule.parse("token_embd.weight=b6,G576") == TensorRule(
        "token_embd.weight", bits=6, group_size=576)
    assert TensorRule.parse("*=cb:f32,b3") == TensorRule("*", bits=3, codebook_type="f32")
    assert str(TensorRule.parse("*.ffn_down.weight=b5")) == "*.ffn_down.weight=b5"
    for bad, msg in [("noequals", "expected GLOB=SPEC"), ("*=b9", "b must be an integer in 1..8"),
                     ("*=G1", "group size G must be an integer in 2.."),
                     ("*=q4", "'q4' is not bN, GN, cb:TYPE or f32"),
                     ("*=cb:f8", "codebook type must be 'f16', 'f32' or 'int8', got 'f8'"),
                     ("*=b4,b5", "'b5' sets bits a second time"),
                     ("*=G128,b4,G256", "'G256' sets group size a second time"),
                     ("*=cb:f16,cb:f32", "'cb:f32' sets codebook type a second time")]:
        pattern = re.escape(f"--tensor-type {bad!r}") + ".*" + re.escape(msg)
        with pytest.raises(DittoError, match=pattern):
            TensorRule.parse(bad)


def test_plan_order_rules_keep_embedding_default_size_guard():
    shapes = {"token_embd.weight": (1000, 64), "blk.0.attn_q.weight": (64, 64),
              "blk.1.attn_q.weight": (64, 64), "blk.1.ffn_down.weight": (64, 256),
              "blk.1.ffn_norm.weight": (64,), "output.weight": (1000, 256),
              "blk.1.attn_k.weight": (4, 4)}
    rules = quantkit.parse_rules(["blk.0.*=f32", "*.ffn_down.weight=b5,cb:f32",
                                  "output.weight=b6,G128"])
    opts = QuantOptions(bits=3, group_size=64, keep_fp32=("blk.0.attn_q.weight",
                                                          "blk.1.attn_q.weight"))
    plan, why = plan_tensors(shapes, opts, rules)
    assert plan == {"token_embd.weight": ("codebook", (5, 64, "f16")),
                    "blk.0.attn_q.weight": ("f32", None),
                    "blk.1.attn_q.weight": ("f32", None),
                    "blk.1.ffn_down.weight": ("codebook", (5, 64, "f32")),
                    "blk.1.ffn_norm.weight": ("f32", None),
                    "output.weight": ("codebook", (6, 128, "f16")),
                    "blk.1.attn_k.weight": ("f32", None)}
    assert {n: r["rule"] for n, r in why.items()} == {
        "token_embd.weight": "embedding (b+2, one codebook per row)",
        "blk.0.attn_q.weight": "blk.0.*=f32",  # the rule comes before --keep-fp32
        "blk.1.attn_q.weight": "keep_fp32 blk.1.attn_q.weight",
        "blk.1.ffn_down.weight": "*.ffn_down.weight=b5,cb:f32",
        "blk.1.ffn_norm.weight": "vector", "output.weight": "output.weight=b6,G128",
        "blk.1.attn_k.weight": "default"}
    # 4 rows of 4 at b = 3: 8 centroids per 4 weights, larger than f32
    assert why["blk.1.attn_k.weight"]["reason"] == "codebook larger than f32"


def test_attn_v_rule_under_gqa_of_four_or_more():
    """The default attn_v rule: b + 1 for a V projection whose layer has at least 4 query
    heads per KV head (Qwen2.5-Coder-0.5B: 896 / 128 = 7; llama.cpp's IQ4_NL gives attn_v Q5_K
    at n_gqa >= 4), not under GQA 3 (SmolLM2: 576 / 192), not where a rule, --keep-fp32 or a
    quantizer without the default rules (embedding_extra_bits None) decides."""
    shapes = {"blk.0.attn_q.weight": (896, 896), "blk.0.attn_v.weight": (128, 896),
              "blk.1.attn_q.weight": (576, 576), "blk.1.attn_v.weight": (192, 576),
              "blk.2.attn_q.weight": (896, 896), "blk.2.attn_v.weight": (128, 896),
              "blk.3.attn_q.weight": (256, 256), "blk.3.attn_v.weight": (64, 256),
              "blk.4.attn_v.weight": (64, 256)}  # no attn_q in its layer: no GQA known
    opts = QuantOptions(bits=4, group_size=256, keep_fp32=("blk.3.attn_v.weight",))
    rules = quantkit.parse_rules(["blk.2.attn_v.weight=b6"])
    plan, why = plan_tensors(shapes, opts, rules)
    assert plan["blk.0.attn_v.weight"] == ("codebook", (5, 256, "f16"))
    assert why["blk.0.attn_v.weight"]["rule"] == "attn_v under GQA >= 4 (b+1)"
    # the allocator (the layer below) knows the rule by this prefix
    assert quantkit.ATTN_V_RULE.startswith("attn_v under GQA")
    assert plan["blk.1.attn_v.weight"] == ("codebook", (4, 256, "f16"))
    assert why["blk.1.attn_v.weight"]["rule"] == "default"
    assert plan["blk.2.attn_v.weight"] == ("codebook", (6, 256, "f16"))
    assert plan["blk.3.attn_v.weight"] == ("f32", None)
    assert why["blk.4.attn_v.weight"]["rule"] == "default"
    assert plan_tensors(shapes, QuantOptions(bits=8, group_size=256))[0][
        "blk.0.attn_v.weight"] == ("codebook", (8, 256, "f16"))  # capped at 8
    plain, _ = plan_tensors(shapes, QuantOptions(bits=4, group_size=256), (), None)
    assert plain["blk.0.attn_v.weight"] == ("codebook", (4, 256, "f16"))


class Broken(CodebookQuantizer):
    name = "broken"

    def __init__(self, result):
        self.result = result

    def quantize_matrix(self, weights, bits, group_size, options):
        return self.result(weights, bits, group_size)


@pytest.mark.parametrize("result,message", [
    (lambda W, b, g: (np.zeros(W.shape, np.int64), np.zeros((W.shape[0], 1, 1 << b))),
     r"returned indices int64\[8, 8\], expected uint8\[8, 8\]"),
    (lambda W, b, g: (np.full(W.shape, 4, np.uint8), np.zeros((W.shape[0], 1, 1 << b))),
     r"returned an index 4 >= 2\^2"),
    (lambda W, b, g: (np.zeros(W.shape, np.uint8), np.zeros((W.shape[0], 2, 1 << b))),
     r"returned codebooks of shape \[8, 2, 4\], expected \[8, 1, 4\] or \[8, 4\] "
     r"\(rows, sub-blocks, 2\^b\)$"),
    # the right number of values in the wrong order: [rows, 2^b, S] at S = 2
    (lambda W, b, g: (np.zeros(W.shape, np.uint8), np.zeros((W.shape[0], 1 << b, 2))),
     r"returned codebooks of shape \[8, 4, 2\], expected \[8, 2, 4\] or \[16, 4\]"),
    (lambda W, b, g: (np.zeros(W.shape, np.uint8),
                      np.where(np.arange(1 << b) == 2, np.nan, 0.0)[None, None, :].repeat(8, 0)),
     r"returned a non-finite centroid nan \(row 0, sub-block 0, centroid 2\)$"),
    (lambda W, b, g: None, r"returned NoneType, expected \(indices, codebooks\) or "
     r"StoredCodebooks$"),
    (lambda W, b, g: (np.zeros(W.shape, np.uint8), np.full((W.shape[0], 1, 1 << b), "x")),
     r"returned codebooks of dtype <U1, expected floats$"),
])
def test_kit_checks_quantize_matrix_results(result, message, tiny_checkpoint_8x8):
    g = 4 if "8, 4, 2" in message else 8  # two sub-blocks per row for the transposed case
    q = Broken(result).quantize(tiny_checkpoint_8x8, QuantOptions(bits=2, group_size=g))
    with pytest.raises(DittoError, match=f"broken: tensor 'blk.0.attn_q.weight': quantize_matrix {message}"):
        list(q.tensors())


def _stored(W, b, g, scales=None, **kw):
    """A StoredCodebooks for W [8, 8] at G = 8: centroids 0.25·k (exact in f16), every index 1."""
    cb = np.tile(0.25 * np.arange(1 << b, dtype=np.float32), (W.shape[0], 1, 1))
    return quantkit.StoredCodebooks(np.ones(W.shape, np.uint8), cb, scales, **kw)


def test_kit_takes_stored_codebooks_as_they_are(tiny_checkpoint_8x8):
    """A quantize_matrix that rounded its codebooks itself: the kit keeps them (no second
    rounding), uses the error the quantizer measured and adds its report fields."""
    q = Broken(lambda W, b, g: _stored(W, b, g, sse=3.0, norm2=4.0,
                                       report={"note": "mine"})).quantize(
        tiny_checkpoint_8x8, QuantOptions(bits=2, group_size=8))
    (name, t), = list(q.tensors())
    np.testing.assert_array_equal(t.codebooks[:, 0], [[0.0, 0.25, 0.5, 0.75]] * 8)
    assert t.codebooks.dtype == np.float32 and t.codebooks.shape == (8, 1, 4)
    assert t.rel_error == 0.75 and t.scales is None
    rep = q.report["tensors"][name]
    assert (rep["sse"], rep["norm2"], rep["rel_error"], rep["note"]) == (3.0, 4.0, 0.75, "mine")
    # without sse / norm2 the kit measures them: W - 0.25 everywhere
    q = Broken(_stored).quantize(tiny_checkpoint_8x8, QuantOptions(bits=2, group_size=8))
    (_, t), = list(q.tensors())
    W = tiny_checkpoint_8x8.tensors[name]().astype(np.float64)
    assert t.rel_error == pytest.approx(((W - 0.25) ** 2).sum() / (W ** 2).sum(), rel=1e-12)


@pytest.mark.parametrize("cb_type,scales,message", [
    ("int8", None, r"scales None for int8 codebooks, expected \[8, 1\]"),
    ("f16", np.ones((8, 1), np.float32), r"scales \(8, 1\) for f16 codebooks, expected None"),
    ("int8", np.ones((8, 2), np.float32), r"scales \(8, 2\) for int8 codebooks, expected "
                                           r"\[8, 1\]"),
])
def test_kit_checks_stored_scales(tiny_checkpoint_8x8, cb_type, scales, message):
    q = Broken(lambda W, b, g: _stored(W, b, g, scales)).quantize(
        tiny_checkpoint_8x8, QuantOptions(bits=2, group_size=8, codebook_type=cb_type))
    with pytest.raises(DittoError, match="broken: tensor 'blk.0.attn_q.weight': quantize_matrix "
                                         "returned " + message):
        list(q.tensors())


def test_kit_refuses_non_finite_weights(tiny_checkpoint_8x8):
    import attrs

    bad = attrs.evolve(tiny_checkpoint_8x8, tensors={
        "blk.0.attn_q.weight": lambda: np.array([[0.0] * 8] * 7 + [[0.0] * 7 + [np.nan]],
                                                np.float32)})
    q = Broken(None).quantize(bad, QuantOptions(bits=2, group_size=8))
    with pytest.raises(DittoError, match=r"tensor 'blk.0.attn_q.weight' has a non-finite value "
                                         r"nan at \(row, col\) = \(7, 7\)"):
        list(q.tensors())


@pytest.fixture
def tiny_checkpoint_8x8():
    from ditto_core.base.types import Checkpoint

    W = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    return Checkpoint(config=None, tokenizer=None, tensors={"blk.0.attn_q.weight": lambda: W},
                      shapes={"blk.0.attn_q.weight": (8, 8)}, source=Path("x"))


def test_example_quantizer_is_short():
    lines = (EXAMPLE / "ditto_quant_quantile" / "__init__.py").read_text().splitlines()
    assert len(lines) <= 40


def test_example_quantizer_builds_and_runs(quantile_plugin_installed, tiny_builds,
                                           build_cache_root, tmp_path):
    reg = build_registry()
    rules = ("blk.0.*=f32", "*.ffn_down.weight=b2")
    opts = pipeline.BuildOptions(quantizer="quantile", blas="openblas",
                                 quant=QuantOptions(bits=3, group_size=64, tensor_types=rules))
    rec = pipeline.build("tinycoder", tmp_path / "q", opts, reg, cache_root=build_cache_root)
    assert list(rec["options"]["tensor_types"]) == list(rules)
    on_disk = json.loads((tmp_path / "q" / "build.json").read_text())
    assert on_disk["options"]["tensor_types"] == list(rules)
    t = rec["tensors"]
    assert t["blk.0.attn_q.weight"]["rule"] == "blk.0.*=f32"
    assert (t["blk.1.attn_q.weight"]["encoding"], t["blk.1.attn_q.weight"]["bits"],
            t["blk.1.attn_q.weight"]["rule"]) == ("codebook", 3, "default")
    assert (t["blk.1.ffn_down.weight"]["bits"], t["blk.1.ffn_down.weight"]["rule"]) == (
        2, "*.ffn_down.weight=b2")
    assert 0 < t["blk.1.ffn_up.weight"]["rel_error"] < 0.2
    ids = greedy_ids(tmp_path / "q", "def fib(n):", 8)
    assert len(ids) == 8
    out = subprocess.run(["ditto", "inspect", "--json", str(tmp_path / "q" / "model.ditto")],
                         check=True, capture_output=True, text=True).stdout
    summary = json.loads(out)
    assert summary["rules"] == list(rules)
    assert {r["name"]: r["rule"] for r in summary["tensors"]}["blk.1.ffn_down.weight"] == \
        "*.ffn_down.weight=b2"


def test_kmeans_takes_tensor_type_rules():
    from ditto_quant_kmeans import KMeansQuantizer, plan_tensors as kmeans_plan

    plan = kmeans_plan({"blk.0.attn_q.weight": (64, 64), "blk.1.attn_q.weight": (64, 64)},
                       QuantOptions(bits=3, group_size=64, tensor_types=("blk.0.*=b5",)))
    assert plan == {"blk.0.attn_q.weight": ("codebook", (5, 64, "f16")),
                    "blk.1.attn_q.weight": ("codebook", (3, 64, "f16"))}
    with pytest.raises(DittoError, match=r"^kmeans: --tensor-type 'x=b0': bit width"):
        KMeansQuantizer().check_options(QuantOptions(tensor_types=("x=b0",)))


class Grid(CodebookQuantizer):
    """min..max uniform grid per sub-block (a test quantizer)."""

    name = "grid"

    def quantize_matrix(self, weights, bits, group_size, options):
        rows, cols = weights.shape
        k = 1 << bits
        x = weights.reshape(rows, cols // group_size, group_size)
        lo, hi = x.min(-1, keepdims=True), x.max(-1, keepdims=True)
        cb = lo + (hi - lo) * np.linspace(0.0, 1.0, k)
        idx = np.abs(x[..., None] - cb[:, :, None, :]).argmin(-1)
        return idx.reshape(rows, cols).astype(np.uint8), cb


def test_patterns_that_match_no_tensor_are_reported(capsys):
    from ditto_core.base.types import Checkpoint

    W = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    shapes = {"blk.0.attn_norm.weight": (32,), "blk.0.ffn_up.weight": (8, 32)}
    ck = Checkpoint(config=None, tokenizer=None,
                    tensors={"blk.0.attn_norm.weight": lambda: W[0],
                             "blk.0.ffn_up.weight": lambda: W},
                    shapes=shapes, source=Path("x"))
    opts = QuantOptions(bits=2, group_size=16, keep_fp32=("model.layers.*", "blk.0.ffn_up*"),
                        tensor_types=("*.ffn_upp.weight=b3", "blk.*=G32"))
    q = Grid().quantize(ck, opts)
    assert q.report["unmatched_patterns"] == ["--tensor-type '*.ffn_upp.weight=b3'",
                                              "--keep-fp32 'model.layers.*'"]
    assert capsys.readouterr().err.splitlines() == [
        "warning: --tensor-type '*.ffn_upp.weight=b3' matches no tensor of this model, so it "
        "changes nothing (this model's tensors are named like 'blk.0.ffn_up.weight')",
        "warning: --keep-fp32 'model.layers.*' matches no tensor of this model, so it changes "
        "nothing (this model's tensors are named like 'blk.0.ffn_up.weight')"]
    assert dict(q.tensors())["blk.0.ffn_up.weight"].group_size == 32  # the matching rule holds
    Grid().quantize(ck, QuantOptions(bits=2, group_size=16, keep_fp32=("blk.0.ffn_up*",)))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("cb_type", ["f32", "f16", "int8"])
def test_kit_rounds_codebooks_to_their_storage_type(cb_type):
    from ditto_core.base.types import Checkpoint

    W = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    ck = Checkpoint(config=None, tokenizer=None, tensors={"blk.0.ffn_up.weight": lambda: W},
                    shapes={"blk.0.ffn_up.weight": (8, 32)}, source=Path("x"))
    q = Grid().quantize(ck, QuantOptions(bits=2, group_size=16, codebook_type=cb_type))
    [(name, t)] = list(q.tensors())
    assert t.codebooks.shape == (8, 2, 4) and t.codebook_type == cb_type
    if cb_type == "int8":
        ints = t.codebooks / t.scales[..., None]
        np.testing.assert_array_equal(ints, np.rint(ints))
        assert np.abs(ints).max() == 127
        np.testing.assert_array_equal(t.scales, t.scales.astype(np.float16))
    else:
        assert t.scales is None
        np.testing.assert_array_equal(t.codebooks,
                                      t.codebooks.astype(np.float16 if cb_type == "f16"
                                                         else np.float32))
    W_hat = t.codebooks[np.arange(8)[:, None], np.arange(32)[None, :] // 16, t.indices]
    W64 = W.astype(np.float64)
    rel = float(((W64 - W_hat) ** 2).sum() / (W64 ** 2).sum())
    assert t.rel_error == pytest.approx(rel, rel=1e-9) and 0 < rel < 0.2
    assert q.report["tensors"][name]["rule"] == "default"


def test_cli_bad_tensor_type_is_a_usage_error(tmp_path):
    """ditto build checks every --tensor-type before anything runs: a bad one is a usage error
    (exit 2) naming the option and the rule."""
    from click.testing import CliRunner

    from ditto_core.cli.main import cli
    r = CliRunner().invoke(cli, ["build", "tinycoder", "--quantizer", "kmeans", "--blas",
                                 "openblas", "-o", str(tmp_path / "b"), "--tensor-type",
                                 "*.ffn_down.weight=b5", "--tensor-type", "*=b4,b5"])
    assert r.exit_code == 2 and not (tmp_path / "b").exists()
    assert ("Invalid value for '--tensor-type': '*=b4,b5': 'b5' sets bits a second time"
            in r.stderr), r.stderr
