"""bench/bench_llamacpp.py: the --isa refusal and the line it writes above an --isa run's table."""

import json
import os
import re
from pathlib import Path

import pytest

from tests.script_module import load_script

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bl():
    return load_script(ROOT / "bench" / "bench_llamacpp.py")


@pytest.mark.parametrize("isa,flags,missing", [
    ("avx2", {"sse2", "avx"}, "avx2, f16c, fma"),
    # an AVX2-only CPU (Zen 3) asked for the AVX-512 VNNI comparison
    ("avx512vnni", {"sse2", "avx", "avx2", "fma", "f16c"},
     "avx512_vnni, avx512bw, avx512cd, avx512dq, avx512f, avx512vl")])
def test_isa_refused_on_a_cpu_without_it(bl, tmp_path, monkeypatch, capsys, isa, flags,
                                         missing):
    """--isa ISA where the CPU lacks some of its flags: exit 2 naming what is missing, before
    any directory is made or DITTO_KERNEL is set."""
    monkeypatch.setattr(bl, "cpu_flags", lambda: flags)
    monkeypatch.delenv("DITTO_KERNEL", raising=False)
    work = tmp_path / "work"
    with pytest.raises(SystemExit) as exc:
        bl.main(["--isa", isa, "--configs", "ditto-default", "--work", str(work)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(  # after argparse's prog name
        f": error: --isa {isa}: this CPU does not list {missing}")
    assert not work.exists()
    assert "DITTO_KERNEL" not in os.environ


def test_isa_run_rendered_with_its_flag_and_peer_build(bl, tmp_path, monkeypatch):
    """An --isa avx2 run's line names the flag in the command and says how both engines ran."""
    written = {}
    monkeypatch.setattr(bl, "write_results",
                        lambda md, text, key: written.update(md=md, text=text, key=key))
    samples = {"tg@1": [10.0, 12.0], "pp@1": [100.0, 110.0]}
    res = {"ditto-default": {"label": "Ditto default build (`ditto build smollm2`)",
                             "bytes": 88_400_000, "bpw": 5.26, "samples": samples,
                             "median": {"tg@1": 11.0, "pp@1": 105.0}}}
    out = {"date": "2026-12-06T01:49:00+00:00", "load_average": [1.25, 1.0, 1.0],
           "cpu": "Some CPU", "rounds": 2, "model": "smollm2", "threads": [1],
           "prompt_tokens": 512, "gen_tokens": 128, "isa": "avx2",
           "llama_ggml_cpu": "/x/llama-avx2/bin/libggml-cpu.so", "results": res}
    path = tmp_path / "bench_llamacpp_smollm2_x_avx2.json"
    md = bl.render(out, path, True)
    assert written["key"] == "smollm2_x_avx2"
    assert written["text"].splitlines()[0] == (
        "`python bench/bench_llamacpp.py --model smollm2 --rounds 2 --isa avx2 --configs "
        "ditto-default` (2026-12-06T01:49 UTC, Some CPU, load average 1.2 at the end; medians "
        f"of 2 interleaved rounds, tok/s; JSON in {path}); avx2 only: Ditto with "
        "DITTO_KERNEL=avx2, llama.cpp with a libggml-cpu.so built from the same source for "
        "avx2/f16c/fma:")
    # a JSON inside the repository is named from its root, as the docs keep them
    assert bl.run_note(out, bl.ROOT / "bench" / "results" / path.name).endswith(
        f"JSON in bench/results/{path.name}); avx2 only: Ditto with DITTO_KERNEL=avx2, "
        "llama.cpp with a libggml-cpu.so built from the same source for avx2/f16c/fma:\n\n")
    assert "| Ditto default build (`ditto build smollm2`) | 88.4 | 5.26 | 11.0 | 105.0 |" in md


def test_depth_run_has_decode_columns_only(bl, tmp_path, monkeypatch):
    """A --depth run: the headers name the depth, there is no prompt column, the command line
    carries the flag, and the ratio is of the decode medians."""
    written = {}
    monkeypatch.setattr(bl, "write_results",
                        lambda md, text, key: written.update(md=md, text=text, key=key))
    res = {"ditto-default": {"label": "Ditto default build (`ditto build smollm2`)",
                             "bytes": 88_400_000, "bpw": 5.26, "samples": {"tg@2": [150.0, 160.0]},
                             "median": {"tg@2": 155.0}},
           "llama-Q4_0": {"label": "llama.cpp Q4_0", "bytes": 91_700_000, "bpw": 5.46,
                          "samples": {"tg@2": [100.0, 125.0]}, "median": {"tg@2": 112.5}}}
    out = {"date": "2026-12-06T19:30:00+00:00", "load_average": [1.0, 1.0, 1.0],
           "cpu": "Some CPU", "rounds": 2, "model": "smollm2", "threads": [2],
           "prompt_tokens": 512, "gen_tokens": 128, "depth": 1000, "isa": "native",
           "llama_ggml_cpu": "peer build", "results": res}
    md = bl.render(out, tmp_path / "bench_llamacpp_smollm2_depth.json", True)
    lines = md.splitlines()
    assert lines[0] == "| SmolLM2-135M | file MB | bpw | decode tg128 at depth 1000, 2 threads |"
    assert lines[2] == "| Ditto default build (`ditto build smollm2`) | 88.4 | 5.26 | 155.0 |"
    assert ("| Ditto default build / llama.cpp Q4_0 | 1.38× [1.28-1.50] |") in lines
    assert written["text"].startswith("`python bench/bench_llamacpp.py --model smollm2 --rounds 2 "
                                      "--depth 1000 --configs ditto-default,llama-Q4_0` (")
    assert written["key"] == "smollm2_depth"
    # a depth run's table never replaces the short-context one, whatever the JSON is called
    bl.render(out, tmp_path / "bench_llamacpp.json", True)
    assert written["key"] == "smollm2_depth1000"


def test_negative_depth_refused(bl, tmp_path, capsys):
    """--depth below 0: exit 2 naming the flag, before any directory is made."""
    work = tmp_path / "work"
    with pytest.raises(SystemExit) as exc:
        bl.main(["--depth", "-1", "--configs", "ditto-default", "--work", str(work)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(": error: --depth must be >= 0")
    assert not work.exists()


def test_f16kv_config_runs_the_default_build_with_the_cache_flags(bl, monkeypatch, tmp_path):
    """ditto-default-f16kv is the default build's directory run with -ctk f16 -ctv f16 on every
    ditto-run call (decode and prompt)."""
    calls = []

    def fake_stats(build, args):
        calls.append((build, list(args)))
        return {"tok_per_s": 10.0, "prompt_ms": 100.0}

    monkeypatch.setattr(bl, "run_stats", fake_stats)
    build, extra = bl.RUN_AS["ditto-default-f16kv"]
    assert build == "ditto-default" and extra == ["-ctk", "f16", "-ctv", "f16"]
    assert bl.ditto_bench(tmp_path, tmp_path / "p.json", 2, 512, 128, None,
                          tuple(extra)) == {"pp": 5120.0, "tg": 10.0}
    assert len(calls) == 2 and all(a[-4:] == extra for _, a in calls)
    bl.ditto_bench(tmp_path, tmp_path / "p.json", 1, 512, 128, tmp_path / "d.json", tuple(extra))
    assert calls[-1][1][:2] == ["--ids", str(tmp_path / "d.json")] and calls[-1][1][-4:] == extra


def test_render_prints_the_run_line_and_reads_runs_from_before_model(bl, tmp_path, capsys):
    """--render prints the line naming the command, date and CPU above the tables; a JSON
    from before --model existed (no "model") is SmolLM2's."""
    res = {"ditto-default": {"label": "Ditto default build", "bytes": 88_400_000, "bpw": 5.26,
                             "samples": {"tg@1": [10.0]}, "median": {"tg@1": 10.0}}}
    old = {"date": "2026-12-02T02:09:00+00:00", "load_average": [1.4, 1.0, 1.0],
           "cpu": "AMD EPYC", "rounds": 1, "threads": [1], "prompt_tokens": 512,
           "gen_tokens": 128, "results": res}
    path = tmp_path / "bench_llamacpp_old.json"
    path.write_text(json.dumps(old))
    assert bl.main(["--render", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("`python bench/bench_llamacpp.py --model smollm2 --rounds 1 --configs "
                        "ditto-default` (2026-12-02T02:09 UTC, AMD EPYC, load average 1.4 at the "
                        f"end; medians of 1 interleaved rounds, tok/s; JSON in {path}):")
    assert lines[2].startswith("| SmolLM2-135M | file MB | bpw | decode tg128, 1 thread |")


@pytest.mark.parametrize("content,message", [
    (None, "cannot read: No such file or directory"),
    ("{not json", "not JSON: "),
    ('{"rows": 1}', "not a bench_llamacpp.py run (no date, cpu, load_average, rounds, threads, "
                    "prompt_tokens, gen_tokens, results)"),
    ("[1, 2]", "not a bench_llamacpp.py run (no date, cpu, load_average, rounds, threads, "
               "prompt_tokens, gen_tokens, results)")])
def test_render_of_a_bad_file_is_a_usage_error_naming_it(bl, tmp_path, capsys, content,
                                                         message):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as exc:
        bl.main(["--render", str(path)])
    assert exc.value.code == 2
    assert f": error: --render {path}: {message}" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("damage", [
    {"isa": "sse2"}, {"load_average": []}, {"results": []}, {"date": 12345},
    {"threads": "1,2"}, {"results": {"ditto-default": {"bytes": 1}}}])
def test_render_of_a_damaged_run_is_a_usage_error(bl, tmp_path, capsys, damage):
    """A file with a run's keys but damaged values: exit 2 naming the file, no traceback."""
    res = {"ditto-default": {"label": "Ditto default build", "bytes": 88_400_000, "bpw": 5.26,
                             "samples": {"tg@1": [10.0]}, "median": {"tg@1": 10.0}}}
    run = {"date": "2026-12-02T02:09:00+00:00", "load_average": [1.4, 1.0, 1.0],
           "cpu": "AMD EPYC", "rounds": 1, "threads": [1], "prompt_tokens": 512,
           "gen_tokens": 128, "model": "smollm2", "results": res}
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**run, **damage}))
    with pytest.raises(SystemExit) as exc:
        bl.main(["--render", str(path)])
    assert exc.value.code == 2
    assert f": error: --render {path}: not a well-formed bench_llamacpp.py run (" in \
        capsys.readouterr().err.splitlines()[-1]


def test_unknown_config_names_the_known_ones(bl, tmp_path, capsys):
    """--configs with a name no configuration has: exit 2 listing the names there are."""
    work = tmp_path / "work"
    with pytest.raises(SystemExit) as exc:
        bl.main(["--configs", "ditto-default,nosuch", "--work", str(work)])
    assert exc.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith(": error: --configs: unknown 'nosuch' (known: llama-F32, llama-Q8_0, "
                         "llama-Q4_0, llama-IQ4_NL, llama-Q4_K_M, llama-shipped, ditto-default, "
                         "ditto-f16-codebook, ditto-fp32-blas, ditto-fp32-naive, ditto-fp32-mkl, "
                         "ditto-calibrated, ditto-default-f16kv)")
    assert not work.exists()


@pytest.mark.parametrize("tied", [True, False])
def test_decode_read_bytes_counts_one_row_of_an_untied_embedding(bl, tmp_path, tied):
    """The bytes one decoded token reads: every tensor's payload, but one row of an embedding
    table that is not also the classifier; the same rule for a Ditto model file and a GGUF."""
    import gguf
    import numpy as np

    from ditto_core.base.types import ModelConfig
    from ditto_core.model.modelfile import TensorInfo, expected_shapes, write_model
    from tests.test_modelfile import tiny_tokenizer

    cfg = ModelConfig(dim=64, hidden_dim=96, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=32,
                      vocab_size=8, max_seq_len=16, rope_theta=10000.0, norm_eps=1e-5,
                      tied_embeddings=tied)
    shapes = expected_shapes(cfg)
    assert ("output.weight" in shapes) == (not tied)
    infos = [TensorInfo(n, "f32", s) for n, s in shapes.items()]
    rng = np.random.default_rng(0)
    arrays = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in infos}
    out = tmp_path / "m.ditto"
    write_model(out, cfg, tiny_tokenizer(), infos, arrays.items())
    every = sum(a.nbytes for a in arrays.values())
    row = 64 * 4  # one f32 row of the 8 x 64 embedding table
    want = every if tied else every - 8 * 64 * 4 + row
    assert bl.decode_read_bytes(out) == want
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    for name, a in arrays.items():
        w.add_tensor(name, a)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
    w.close()
    assert bl.decode_read_bytes(tmp_path / "m.gguf") == want


def test_table_shows_the_bytes_read_per_token_when_the_run_has_them(bl):
    """A run with ``read_bytes`` shows them beside the file size, and its decode cells' share
    of the read ceiling is the stored ``ceiling``; a run without them keeps the old columns."""
    r = {"label": "Ditto default build", "bytes": 435_754_880, "read_bytes": 319_572_962,
         "bpw": 5.53, "median": {"tg@1": 68.7}, "ceiling": {"tg@1": 0.81}}
    md = bl.table({"ditto-default": r}, [1], 512, 128, "qwen2.5-coder-0.5b", depth=1000)
    assert md.splitlines()[0] == ("| Qwen2.5-Coder-0.5B | file MB | MB read per token | bpw | "
                                  "decode tg128 at depth 1000, 1 thread |")
    assert md.splitlines()[2] == "| Ditto default build | 435.8 | 319.6 | 5.53 | 68.7 (81 %) |"
    old = {k: v for k, v in r.items() if k != "read_bytes"}
    assert bl.table({"ditto-default": old}, [1], 512, 128, "qwen2.5-coder-0.5b",
                    depth=1000).splitlines()[2] == (
        "| Ditto default build | 435.8 | 5.53 | 68.7 (81 %) |")


def test_decode_read_bytes_refuses_a_file_of_neither_kind(bl, tmp_path):
    """Neither a GGUF nor a Ditto model file: the model file reader's refusal, naming it."""
    from ditto_core.base.errors import DittoError

    bad = tmp_path / "notes.txt"
    bad.write_bytes(b"not a model at all, just some text" * 4)
    with pytest.raises(DittoError, match=re.escape(f"{bad}: not a Ditto model file (magic")):
        bl.decode_read_bytes(bad)
