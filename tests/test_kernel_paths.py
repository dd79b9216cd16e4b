"""ditto_core/model/kernel_paths.py, the Python mirror of the runtime's kernel choice, agrees with the
C rule (native/kernels/kernels.c kernel_path / kernel_pick_i8 / decodes) on every x86 table, bit width
and a grid of group sizes and row lengths, picks the table the runtime picks on this CPU, and
`ditto inspect --json` reports each tensor's path and the file's layouts."""

import ctypes
import re
import json
import os
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner

from ditto_core.base.errors import DittoError
from ditto_core.model import kernel_paths as KP
from ditto_core.cli.main import cli
from ditto_core.model.modelfile import TensorInfo, expected_shapes, write_model
from ditto_core.base.types import ModelConfig
from ditto_native import KERNEL_SOURCES
from tests.test_kernels_int import NATIVE, STD, WARN
from tests.test_modelfile import tiny_tokenizer

GROUPS = (2, 7, 32, 48, 64, 96, 100, 128, 192, 256, 320, 512, 576, 640, 896, 1024, 4160)
LENGTHS = (32, 100, 576, 896, 1536, 4864)


@pytest.fixture(scope="module")
def clib(tmp_path_factory):
    """The kernel sources as a shared library (-O0: only the table rule runs)."""
    out = tmp_path_factory.mktemp("kpaths") / "libkpaths.so"
    p = subprocess.run(["nice", "clang-22", *STD, "-O0", *WARN, "-fopenmp", "-fPIC", "-shared",
                        "-o", str(out), *(str(NATIVE / f) for f in KERNEL_SOURCES), "-lm"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    L = ctypes.CDLL(str(out))
    L.kernel_path_with.argtypes = [ctypes.c_char_p] + [ctypes.c_int] * 4
    L.kernel_path_with.restype = ctypes.c_char_p
    L.kernel_name_at.restype = ctypes.c_char_p
    L.kernel_features_at.restype = ctypes.c_char_p
    L.kernel_active_name.restype = ctypes.c_char_p
    return L


def c_tables(clib):
    names, i = [], 0
    while (n := clib.kernel_name_at(i)) is not None:
        names.append(n.decode())
        i += 1
    return names


def test_mirror_lists_the_compiled_tables_in_order(clib):
    assert [t.name for t in KP.tables()] == c_tables(clib)
    # each table's features in the C table's order, the order both refusals list them in
    assert [" ".join(t.features) for t in KP.tables()] == [
        clib.kernel_features_at(i).decode() for i in range(len(c_tables(clib)))]
    assert clib.kernel_features_at(len(c_tables(clib))) is None


def test_python_paths_equal_the_c_rule(clib):
    n = 0
    for name in c_tables(clib):
        t = KP.table(name)
        for bits in range(1, 9):
            for G in GROUPS:
                for cols in LENGTHS:
                    for cls in (0, 1):
                        want = clib.kernel_path_with(name.encode(), bits, G, cols, cls).decode()
                        assert KP.kernel_path(t, bits, G, cols, bool(cls)) == want, \
                            (name, bits, G, cols, cls)
                        n += 1
    assert n == len(c_tables(clib)) * 8 * len(GROUPS) * len(LENGTHS) * 2
    assert clib.kernel_path_with(b"no-such-table", 4, 256, 576, 0) is None


def test_active_table_is_the_runtimes_choice(clib):
    assert KP.active_table().name == clib.kernel_active_name().decode()
    flags = KP.cpu_flags()
    names = ", ".join(t.name for t in KP.tables())
    for t in KP.tables():  # DITTO_KERNEL forces a table this CPU runs; ditto-run refuses others
        if set(t.features) <= flags:
            assert KP.active_table(env={"DITTO_KERNEL": t.name}).name == t.name
        else:
            with pytest.raises(DittoError, match=re.escape(
                    f"DITTO_KERNEL: kernel '{t.name}' needs CPU features this CPU lacks: "
                    f"{', '.join(f for f in t.features if f not in flags)}")):
                KP.active_table(env={"DITTO_KERNEL": t.name})
    with pytest.raises(DittoError, match=re.escape(
            f"DITTO_KERNEL: unknown kernel 'sse9' (this program has: {names})")):
        KP.active_table(env={"DITTO_KERNEL": "sse9"})
    no_avx2 = frozenset({"fma"})
    with pytest.raises(DittoError, match=r"kernel 'avx2' needs CPU features this CPU lacks: "
                                         r"avx2, f16c, bmi2$"):
        KP.active_table(no_avx2, env={"DITTO_KERNEL": "avx2"}, machine="x86_64")
    assert KP.active_table(frozenset(), env={}).name == "generic"
    assert KP.cpu_flags("processor : 0\nflags : avx2 fma\n") == {"avx2", "fma"}


def test_inspect_json_reports_kernel_paths(tmp_path):
    cfg = ModelConfig(dim=64, hidden_dim=96, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=32,
                      vocab_size=8, max_seq_len=16, rope_theta=10000.0, norm_eps=1e-5,
                      tied_embeddings=True)
    layout = {"blk.0.ffn_down.weight": (5, 96), "blk.0.ffn_up.weight": (4, 32),
              "blk.0.attn_q.weight": (3, 7), "blk.0.attn_v.weight": (7, 32),
              "blk.0.attn_output.weight": (4, 64), "token_embd.weight": (6, 128)}
    infos = [TensorInfo(n, "codebook", s, *layout[n], "int8") if n in layout
             else TensorInfo(n, "f32", s) for n, s in expected_shapes(cfg).items()]
    rng = np.random.default_rng(0)
    payloads = ((t.name, rng.standard_normal(t.shape).astype(np.float32) if t.encoding == "f32"
                 else bytes(t.expected_nbytes())) for t in infos)
    out = tmp_path / "m.ditto"
    write_model(out, cfg, tiny_tokenizer(), infos, payloads)
    r = CliRunner().invoke(cli, ["inspect", "--json", "--kernel", "avx2", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    got = {t["name"]: t["kernel"] for t in s["tensors"]}
    assert s["kernel_table"] == "avx2"
    assert got["blk.0.ffn_down.weight"] == "avx2:i8_b5"  # G = 96
    assert got["blk.0.ffn_up.weight"] == "avx2:i8_b4"  # G = 32: not whole 64-column chunks
    assert got["blk.0.attn_output.weight"] == "avx2:i8_b4-tiled"  # 64 x 64, G = 64
    assert got["blk.0.attn_q.weight"] == "generic"  # G = 7
    assert got["blk.0.attn_v.weight"] == "avx2:i8_any"
    assert got["token_embd.weight"] == "avx2:decoded-int8"  # the tied classifier, b = 6
    assert got["blk.0.attn_k.weight"] is None and got["output_norm.weight"] is None
    lay = {(e["bits"], e["group_size"]): (e["kernel"], e["tensors"]) for e in s["layouts"]}
    assert lay[(4, 32)] == ("avx2:i8_b4", 1) and lay[(3, 7)] == ("generic", 1)
    assert lay[(4, 64)] == ("avx2:i8_b4-tiled", 1)
    eff = {(e["bits"], e["group_size"]): e["effective_group_sizes"] for e in s["layouts"]}
    assert eff[(6, 128)] == [64] and eff[(4, 64)] == [64]  # G past the row: whole rows of 64
    r = CliRunner().invoke(cli, ["inspect", "--kernel", "avx2", str(out)])
    assert r.exit_code == 0
    assert ("b6,G128 (whole rows of 64) → avx2:decoded-int8 (the classifier, decoded at load) "
            "(1 tensor, 512 weights)") in " ".join(r.output.split())
    r = CliRunner().invoke(cli, ["inspect", "--kernel", "avx9", str(out)])
    assert r.exit_code == 2  # a usage error, as README says of a bad flag value
    assert "Invalid value for '--kernel': no kernel table 'avx9' (the runtimes have: " \
        "avx512vbmi, avx512vnni, avxvnni, avx2, generic, neon)" in r.output
    env = {k: v for k, v in os.environ.items() if k != "DITTO_KERNEL"}
    p = subprocess.run(["ditto", "inspect", "--json", str(out)], capture_output=True, text=True,
                       env=env, check=True)
    assert json.loads(p.stdout)["kernel_table"] == KP.active_table(env={}).name
    # a DITTO_KERNEL ditto-run would refuse: inspect refuses it too (its default column is
    # the runtime's choice), and --kernel, which names the table itself, still works
    p = subprocess.run(["ditto", "inspect", str(out)], capture_output=True, text=True,
                       env={**env, "DITTO_KERNEL": "sse9"})
    assert p.returncode == 1 and p.stdout == ""
    assert "DITTO_KERNEL: unknown kernel 'sse9' (this program has: avx512vbmi" in p.stderr
    r = CliRunner().invoke(cli, ["inspect", "--json", "--kernel", "avx2", str(out)],
                           env={"DITTO_KERNEL": "sse9"})
    assert r.exit_code == 0 and json.loads(r.output)["kernel_table"] == "avx2"


def test_the_embedding_is_never_tiled_even_as_the_tied_classifier():
    """matmul.c tile_weights leaves token_embd in file order (tensor_row reads it by row), also
    where it is the tied classifier's matrix: inspect's path says so; output.weight of the
    same layout is tiled."""
    avx2 = KP.table("avx2")
    emb = TensorInfo("token_embd.weight", "codebook", (8, 64), 4, 64, "int8")
    out = TensorInfo("output.weight", "codebook", (8, 64), 4, 64, "int8")
    assert KP.tensor_path(avx2, emb, "token_embd.weight") == "avx2:i8_b4"
    assert KP.tensor_path(avx2, out, "output.weight") == "avx2:i8_b4-tiled"
    assert KP.tensor_path(avx2, emb, "output.weight") == "lookup"


def test_ditto_tiles_decides_the_tiled_paths_and_is_checked_as_ditto_run_does(tmp_path):
    """DITTO_TILES=0 keeps file order, so inspect shows no tiled path; a value but 0 or 1 is
    refused with ditto-run's message (kernels.c kernels_tiles_env_check)."""
    vbmi = KP.table("avx512vbmi")
    out = TensorInfo("output.weight", "codebook", (8, 128), 4, 128, "int8")
    assert KP.tensor_path(vbmi, out, "output.weight") == "avx512vbmi:i8_b4-tiled"
    assert KP.tensor_path(vbmi, out, "output.weight", tiles=False) == "avx512vbmi:i8_b4"
    assert [KP.tiles_enabled({"DITTO_TILES": v}) for v in ("", "1", "0")] == [True, True, False]
    assert KP.tiles_enabled({}) is True
    with pytest.raises(DittoError, match=re.escape(
            "DITTO_TILES must be 1 (b = 4 weight matrices in row tiles where the kernel table "
            "reads them) or 0 (file order), got '2'")):
        KP.tiles_enabled({"DITTO_TILES": "2"})
    cfg = ModelConfig(dim=64, hidden_dim=96, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=32,
                      vocab_size=8, max_seq_len=16, rope_theta=10000.0, norm_eps=1e-5,
                      tied_embeddings=True)
    infos = [TensorInfo(n, "codebook", s, 4, 64, "int8") if len(s) == 2 else
             TensorInfo(n, "f32", s) for n, s in expected_shapes(cfg).items()]
    payloads = ((t.name, np.ones(t.shape, np.float32) if t.encoding == "f32"
                 else bytes(t.expected_nbytes())) for t in infos)
    path = tmp_path / "m.ditto"
    write_model(path, cfg, tiny_tokenizer(), infos, payloads)
    got = {}
    for v in ("1", "0"):
        r = CliRunner().invoke(cli, ["inspect", "--json", "--kernel", "avx2", str(path)],
                               env={"DITTO_TILES": v})
        assert r.exit_code == 0, r.output
        got[v] = {t["name"]: t["kernel"] for t in json.loads(r.output)["tensors"]}
    assert got["1"]["blk.0.attn_output.weight"] == "avx2:i8_b4-tiled"
    assert got["0"]["blk.0.attn_output.weight"] == "avx2:i8_b4"
    r = CliRunner().invoke(cli, ["inspect", str(path)], env={"DITTO_TILES": "yes"})
    assert r.exit_code == 1 and "DITTO_TILES must be 1" in r.output and "got 'yes'" in r.output


def test_layout_entries_group_by_kernel_and_list_the_clamped_g():
    """One layout entry per (b, G, codebook type, kernel): tensors whose rows are shorter
    than G by different amounts but take the same kernel share it, with every G the kernels
    see listed."""
    from ditto_core.model.summary import layouts

    def t(rows, cols, kernel):
        return {"encoding": "codebook", "bits": 4, "group_size": 256, "codebook_type": "int8",
                "shape": [rows, cols], "bytes": rows * cols // 2, "kernel": kernel}
    got = layouts([t(16, 16, "generic"), t(16, 64, "generic"), t(8, 512, "generic"),
                   t(4, 256, "avx2:i8_b4")])
    assert [(e["kernel"], e["effective_group_sizes"], e["tensors"]) for e in got] == [
        ("generic", [16, 64, 256], 3), ("avx2:i8_b4", [256], 1)]


def test_build_checks_the_budget_arguments_before_work(tmp_path, monkeypatch):
    """An empty --max-size-of file is refused before any work (its 0-byte budget would only
    fail after every tensor was measured); a speed table named without a budget warns that it
    changes nothing, and the build goes on."""
    from ditto_core import api
    from ditto_core.stages import pipeline

    class Started(Exception):
        pass

    def no_work(*a, **k):
        raise Started

    monkeypatch.setattr(pipeline, "_prepare_out_dir", no_work)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(DittoError, match=re.escape(
            f"{empty}: max_size_of names an empty file (its size, 0 bytes, is the budget)")):
        api.build("tinycoder", max_size_of=empty, out=tmp_path / "b")
    with pytest.warns(UserWarning, match=re.escape(
            "ditto: --speed-aware avx2 has no effect without a size budget (--target-bpw or "
            "--max-size-of): every tensor keeps its layout")):
        with pytest.raises(Started):
            api.build("tinycoder", speed_aware="avx2", out=tmp_path / "b")


def test_build_refuses_unknown_speed_table_before_work(tmp_path, monkeypatch):
    """`ditto build --speed-aware TABLE` with a table no runtime has: a usage error (exit 2)
    naming the flag, the value and the tables there are, with or without a budget, and no
    output directory."""
    from ditto_core.stages import pipeline

    def no_work(*a, **k):
        raise AssertionError("the build started")

    monkeypatch.setattr(pipeline, "_prepare_out_dir", no_work)
    for budget in (["--target-bpw", "5"], []):
        r = CliRunner().invoke(cli, ["build", "tinycoder", "--quantizer", "kmeans", "--blas",
                                     "openblas", *budget, "--speed-aware", "avx9",
                                     "-o", str(tmp_path / "b")])
        assert r.exit_code == 2
        assert "Invalid value for '--speed-aware': no kernel table 'avx9' (the runtimes " \
            "have: avx512vbmi, avx512vnni, avxvnni, avx2, generic, neon)" in r.stderr
        assert not (tmp_path / "b").exists()
