"""Bit allocation (ditto_core/kit/allocate.py): the hull and the greedy choice on hand-checked
cases, the budget from --target-bpw / --max-size-of, and a tinycoder build that respects it
with explicit rules winning."""

import json

import pytest

from ditto_core.base.errors import DittoError
from ditto_core.kit import allocate as A


def C(bits, nbytes, error, g=256):
    return A.Choice(bits, g, nbytes, error)


def test_hull_drops_dominated_and_concave_points():
    pts = [C(3, 100, 10.0), C(4, 200, 4.0), C(5, 300, 3.5), C(6, 400, 1.0), C(7, 500, 1.0),
           C(8, 250, 9.0)]
    # (250, 9) is above the segment (100,10)-(200,4)... and costs more than (200,4): dominated;
    # (300, 3.5) lies above the segment (200,4)-(400,1) (3.5 > 2.5): concave; (500,1) no gain
    assert [c.bits for c in A.hull(pts)] == [3, 4, 6]


def test_greedy_hand_checked():
    """Two tensors. a: 100 B err 10 | 200 B err 4 | 300 B err 3 (slopes 0.06, 0.01);
    b: 100 B err 5 | 150 B err 2 (slope 0.06) | 400 B err 1.9 (slope 0.0004).
    Budget 350: start 200 B; a's first step (0.06/B, 100 B) and b's (0.06/B, 50 B) tie on
    slope, a first by name: 300 B, then b's: 350 B. Total error 4 + 2 = 6.
    Budget 320: a's step fits (300), b's 50 B does not (350 > 320); a's next step (+100) does
    not either: errors 4 + 5 = 9."""
    opts = {"a": [C(3, 100, 10.0), C(4, 200, 4.0), C(5, 300, 3.0)],
            "b": [C(3, 100, 5.0), C(4, 150, 2.0), C(6, 400, 1.9)]}
    got = A.greedy(opts, 350)
    assert (got["a"].bits, got["b"].bits) == (4, 4)
    got = A.greedy(opts, 320)
    assert (got["a"].bits, got["b"].bits) == (4, 3)
    got = A.greedy(opts, 10_000)
    assert (got["a"].bits, got["b"].bits) == (5, 6)
    with pytest.raises(DittoError, match="below their smallest plan"):
        A.greedy(opts, 199)


def test_greedy_is_optimal_at_hull_breakpoints():
    """When the budget is exactly the bytes after the first k steps in slope order, the greedy
    plan is the exact optimum over every combination of candidates (exhaustive search): the
    Lagrangian solution is optimal at its own spend."""
    import itertools
    import random

    rnd = random.Random(4)
    for _ in range(200):
        opts = {}
        for t in "abc":
            nb = sorted(rnd.sample(range(10, 200), 4))
            errs = sorted((rnd.uniform(0, 10) for _ in range(4)), reverse=True)
            opts[t] = [C(i + 3, b, e) for i, (b, e) in enumerate(zip(nb, errs))]
        hulls = {t: A.hull(o) for t, o in opts.items()}
        steps = sorted(((h[i - 1].error - h[i].error) / (h[i].nbytes - h[i - 1].nbytes), t, i)
                       for t, h in hulls.items() for i in range(1, len(h)))[::-1]
        k = rnd.randint(0, len(steps))
        pick = {t: 0 for t in hulls}
        for _, t, i in steps[:k]:
            pick[t] = max(pick[t], i)
        budget = sum(hulls[t][i].nbytes for t, i in pick.items())
        got = A.greedy(opts, budget)
        assert sum(c.nbytes for c in got.values()) <= budget
        best = min(sum(c.error for c in combo) for combo in itertools.product(*opts.values())
                   if sum(c.nbytes for c in combo) <= budget)
        assert sum(c.error for c in got.values()) == pytest.approx(best, rel=1e-12)


def test_budget_bytes(tmp_path):
    assert A.budget_bytes(4.5, None, 1000) == 562
    f = tmp_path / "x.gguf"
    f.write_bytes(b"\0" * 1234)
    assert A.budget_bytes(None, str(f), 1000) == 1234
    with pytest.raises(DittoError, match="exactly one of --target-bpw and --max-size-of"):
        A.budget_bytes(None, None, 1000)
    with pytest.raises(DittoError, match="must be a positive number"):
        A.budget_bytes(-1.0, None, 1000)
    with pytest.raises(DittoError, match="nope.gguf: cannot read its size for --max-size-of"):
        A.budget_bytes(None, str(tmp_path / "nope.gguf"), 1000)


def test_tinycoder_build_respects_the_budget_and_rules(tmp_path):
    """tinycoder at --target-bpw 36.6 (its default file is 36.47 bpw, most of it f32
    embedding): the file is within the budget, every default-rule matrix is allocated, the
    --tensor-type rule's tensor keeps its rule, and build.json/inspect show the plan."""
    from ditto_core import build
    from ditto_core.model.modelfile import ModelFile
    from ditto_core.model.summary import inspect_summary

    b = build("tinycoder", quantizer="kmeans", blas="openblas", out=tmp_path / "a",
              target_bpw=36.6, tensor_types=["blk.0.ffn_down.weight=b3"])
    rec = json.loads((tmp_path / "a" / "build.json").read_text())
    alloc = rec["allocation"]
    size = (tmp_path / "a" / "model.ditto").stat().st_size
    assert size == alloc["planned_bytes"] <= alloc["budget_bytes"]
    weights = 8 * size / rec["bpw"]
    assert abs(alloc["budget_bytes"] - 36.6 * weights / 8) <= 1
    assert "blk.0.ffn_down.weight" not in alloc["tensors"]
    assert "blk.1.ffn_down.weight" in alloc["tensors"]
    with ModelFile.open(tmp_path / "a" / "model.ditto") as mf:
        s = inspect_summary(mf, b.record)
    rows = {t["name"]: t for t in s["tensors"]}
    assert rows["blk.0.ffn_down.weight"]["bits"] == 3
    assert rows["blk.0.ffn_down.weight"]["rule"] == "blk.0.ffn_down.weight=b3"
    c = alloc["tensors"]["blk.1.attn_q.weight"]
    assert rows["blk.1.attn_q.weight"]["rule"] == f"allocated b{c['bits']},G{c['group_size']}"
    assert (rows["blk.1.attn_q.weight"]["bits"], rows["blk.1.attn_q.weight"]["group_size"]) == \
        (c["bits"], c["group_size"])


def test_speed_cost_model():
    """The modelled GEMV cost: b = 4, G = 256 is the unit on every table; the measured compute
    cost of a slower layout; the classifier decoded at load and every layout on generic cost
    1; a layout that falls to the scalar reference costs GENERIC_COST; the modelled time is
    the larger of compute and bytes (b = 6, G = 256 on 576 columns: 63,040 payload bytes per
    100 rows against b = 4's 34,240, above its compute cost 1.50)."""
    from ditto_core.model import kernel_paths as KP

    avx2, vbmi, gen = KP.table("avx2"), KP.table("avx512vbmi"), KP.table("generic")
    assert KP.gemv_cost(vbmi, 4, 256, 576) == KP.gemv_cost(avx2, 4, 256, 576) == 1.0
    assert KP.gemv_cost(vbmi, 5, 256, 576) == 1.53 and KP.gemv_cost(avx2, 5, 256, 576) == 2.38
    assert KP.gemv_cost(vbmi, 4, 96, 576) == 1.28  # G < 128: the G = 128 column
    assert KP.gemv_cost(vbmi, 5, 4096, 576) == 1.28  # a whole row of 576: the "other" column
    assert KP.gemv_cost(avx2, 7, 576, 576, classifier=True) == 1.0  # decoded at load
    assert KP.gemv_cost(gen, 7, 256, 576) == 1.0
    assert KP.gemv_cost(vbmi, 4, 48, 576) == KP.GENERIC_COST  # G % 32 != 0: the reference
    assert A.modelled_time(vbmi, 100, 576, 6, 256, False) == \
        pytest.approx(100 * 576 * 63040 / 34240)
    assert A.modelled_time(vbmi, 100, 576, 5, 128, False) == pytest.approx(100 * 576 * 1.88)
    assert A.modelled_time(avx2, 100, 576, 7, 576, True) == 100 * 576  # decoded: compute only
    assert A.resolve_speed_table("auto", avx2) == "avx2"
    assert A.resolve_speed_table("auto", vbmi) == "avx512vbmi"
    assert A.resolve_speed_table("auto", gen) is None
    assert A.resolve_speed_table("off") is None and A.resolve_speed_table("neon") == "neon"
    with pytest.raises(DittoError, match="avx9"):
        A.resolve_speed_table("avx9")


def test_speed_limited_hand_checked():
    """Two tensors, each 100 B / time 100 at b = 4 or 150 B / time 150 at b = 5; b = 5 saves
    a 8 of error and b 5. Bytes allow both upgrades (300). Time budget 300: both (mu 0);
    250: only one fits, a's (more error saved); 200: neither."""
    def T(bits, nbytes, error, time):
        return A.Choice(bits, 256, nbytes, error, time)

    opts = {"a": [T(4, 100, 10.0, 100.0), T(5, 150, 2.0, 150.0)],
            "b": [T(4, 100, 10.0, 100.0), T(5, 150, 5.0, 150.0)]}

    def bits(p):
        return {n: c.bits for n, c in p.items()}

    plan, mu = A.speed_limited(opts, 300, 300.0)
    assert bits(plan) == {"a": 5, "b": 5} and mu == 0.0
    plan, mu = A.speed_limited(opts, 300, 250.0)
    assert bits(plan) == {"a": 5, "b": 4} and mu > 0
    # the plan holds the candidates given, with their measured errors (not error + mu * time)
    assert plan["a"] is opts["a"][1] and plan["b"] is opts["b"][0]
    assert (plan["a"].error, plan["b"].error) == (2.0, 10.0)
    plan, mu = A.speed_limited(opts, 300, 200.0)
    assert bits(plan) == {"a": 4, "b": 4}


def test_speed_aware_allocation_holds_the_time_budget():
    """A small synthetic model (vocab 8, so the tied classifier saves nothing and stays f32)
    whose error falls with b: under a budget 6 % above the all-b = 4 file the plain plan takes
    b = 5 or 6 somewhere and is modelled slower than the default; the speed-aware plans keep
    their modelled time within SPEED_SLACK of the default plan's (avx2, where b = 5 costs
    2.3x: b = 4 only) and within the byte budget, and record it."""
    from types import SimpleNamespace

    import numpy as np

    from ditto_core.model import kernel_paths as KP
    from ditto_core.model.modelfile import expected_shapes
    from ditto_core.base.types import ModelConfig
    from tests.test_modelfile import tiny_tokenizer

    cfg = ModelConfig(dim=256, hidden_dim=512, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=64,
                      vocab_size=8, max_seq_len=16, rope_theta=10000.0, norm_eps=1e-5,
                      tied_embeddings=True)
    shapes = expected_shapes(cfg)
    rng = np.random.default_rng(0)
    W = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
    ck = SimpleNamespace(config=cfg, tokenizer=tiny_tokenizer(), shapes=shapes,
                         tensors={n: (lambda n=n: W[n]) for n in shapes})
    mats = [n for n, s in shapes.items() if len(s) == 2 and n != "token_embd.weight"]
    plan = {n: ("codebook", (4, 256, "int8")) if n in mats else ("f32", None) for n in shapes}
    reasons = {n: {"rule": "default" if n in mats else "f32"} for n in shapes}

    def quantize(S, b, g, name, imp):  # error 2^-b, a little more for larger G
        return S * (1 + 2.0 ** -b * (1 + g / 1024))

    base = A.file_bytes(cfg, ck.tokenizer, shapes, plan)
    budget = int(base * 1.06)
    run = {t: A.allocate(ck, plan, reasons, budget, "int8", quantize, lambda n, c: None,
                         ["token_embd.weight"], speed_table=t)[1] for t in (None, "avx2",
                                                                            "avx512vbmi")}
    bits = {t: {c["bits"] for c in r["tensors"].values()} for t, r in run.items()}
    assert bits[None] - {3, 4}, bits  # the plain plan spends the budget on b = 5 or 6
    assert bits["avx2"] == {4} and run["avx2"]["speed_table"] == "avx2"
    for t in ("avx2", "avx512vbmi"):
        kt, sp = KP.table(t), run[t]["speed"]
        default = sum(A.modelled_time(kt, *shapes[n], 4, 256, False) for n in mats)
        planned = sum(A.modelled_time(kt, *shapes[n], c["bits"], c["group_size"], False)
                      for n, c in run[t]["tensors"].items())
        assert sp["default_time"] == pytest.approx(default)
        assert sp["planned_time"] == pytest.approx(planned)
        assert planned <= default * (1 + A.SPEED_SLACK) == pytest.approx(sp["time_budget"])
        assert run[t]["planned_bytes"] <= budget
        plain = sum(A.modelled_time(kt, *shapes[n], c["bits"], c["group_size"], False)
                    for n, c in run[None]["tensors"].items())
        assert plain > default * (1 + A.SPEED_SLACK)  # so the budget did bind
    assert "speed" not in run[None]
    for t in ("avx2", "avx512vbmi"):
        assert run[t]["speed"]["time_budget_met"] is True
        for n, c in run[t]["tensors"].items():  # the measured error of the chosen candidate
            measured = [m for m in run[t]["candidates"][n]
                        if (m["bits"], m["group_size"]) == (c["bits"], c["group_size"])]
            assert [m["error"] for m in measured] == [c["error"]]
            assert c["error"] < 0.1

    # a byte budget only b = 3 meets: no plan is modelled as fast as the default (avx2: b = 3
    # costs 3.9x), so the fastest one is taken, recorded as such, and the build warns
    small = int(base * 0.85)
    with pytest.warns(UserWarning, match=r"no plan within the size budget is modelled as fast "
                                         r"as the default layouts on kernel table avx2: the "
                                         r"fastest found is \d+\.\d % slower"):
        rec = A.allocate(ck, plan, reasons, small, "int8", quantize, lambda n, c: None,
                         ["token_embd.weight"], speed_table="avx2")[1]
    sp = rec["speed"]
    assert sp["time_budget_met"] is False and sp["planned_time"] > sp["time_budget"]
    assert rec["planned_bytes"] <= small


def test_speed_aware_allocation_gives_the_untied_embedding_no_time():
    """An untied model (Qwen2.5-Coder-0.5B's layout): token_embd is read one row per token, so
    shrinking it (b = 6 -> 5 frees bytes) must not also free modelled GEMV time for the
    matrices. With the file budget of the default plan, the plain plan trades the embedding's
    bytes for b = 5 matrices; the avx2 speed-aware plan may shrink the embedding too but keeps
    every matrix at b = 4, and its default time counts the matrices and the classifier only."""
    from types import SimpleNamespace

    import attrs
    import numpy as np

    from ditto_core.model import kernel_paths as KP
    from ditto_core.model.modelfile import expected_shapes
    from ditto_core.base.types import ModelConfig
    from tests.test_modelfile import tiny_tokenizer

    cfg = ModelConfig(dim=256, hidden_dim=512, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=64,
                      vocab_size=512, max_seq_len=16, rope_theta=10000.0, norm_eps=1e-5,
                      tied_embeddings=False)
    shapes = expected_shapes(cfg)
    assert "output.weight" in shapes
    rng = np.random.default_rng(0)
    W = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
    tok = tiny_tokenizer()
    tok = attrs.evolve(tok, tokens=tok.tokens + tuple(b"t%d" % i for i in range(504)),
                       scores=np.zeros(512, np.float32),
                       token_types=np.concatenate([tok.token_types, np.ones(504, np.uint32)]))
    ck = SimpleNamespace(config=cfg, tokenizer=tok, shapes=shapes,
                         tensors={n: (lambda n=n: W[n]) for n in shapes})
    emb = ["token_embd.weight", "output.weight"]
    mats = [n for n, s in shapes.items() if len(s) == 2 and n not in emb]
    plan = {n: ("codebook", (4, 256, "int8")) if n in mats else
            ("codebook", (6, 256, "int8")) if n in emb else ("f32", None) for n in shapes}
    reasons = {n: {"rule": "default" if n in mats else "embedding" if n in emb else "f32"}
               for n in shapes}

    def quantize(S, b, g, name, imp):  # error 2^-b, a little more for larger G
        return S * (1 + 2.0 ** -b * (1 + g / 1024))

    budget = A.file_bytes(cfg, ck.tokenizer, shapes, plan)
    run = {t: A.allocate(ck, plan, reasons, budget, "int8", quantize, lambda n, c: None,
                         emb, speed_table=t)[1] for t in (None, "avx2")}
    plain, fast = run[None]["tensors"], run["avx2"]["tensors"]
    assert plain["token_embd.weight"]["bits"] == 5
    assert any(plain[n]["bits"] == 5 for n in mats)  # the embedding's bytes bought b = 5
    assert {fast[n]["bits"] for n in mats} == {4}
    kt = KP.table("avx2")
    default = sum(A.modelled_time(kt, *shapes[n], 4, 256, False) for n in mats) + \
        A.modelled_time(kt, *shapes["output.weight"], 6, 256, True)
    assert run["avx2"]["speed"]["default_time"] == pytest.approx(default)
    assert A.tensor_time(kt, "token_embd.weight", "output.weight", 512, 256, 6, 256) == 0.0
    assert A.tensor_time(kt, "token_embd.weight", "token_embd.weight", 512, 256, 6, 256) == \
        A.modelled_time(kt, 512, 256, 6, 256, True)  # tied: it is the classifier
