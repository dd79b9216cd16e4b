"""bench/results_tables.py: the markdown it writes into docs/RESULTS.md."""

from pathlib import Path

import pytest

from tests.script_module import load_script

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def rt():
    return load_script(ROOT / "bench" / "results_tables.py")


def row(config, source="ditto", **kw):
    base = dict.fromkeys(["bpw", "ppl", "mean_kld", "kld_stderr", "kld_p99", "same_top1",
                          "file_bytes", "decode_tok_per_s", "prompt_tok_per_s", "ttft_ms",
                          "peak_rss_mib"])
    return {**base, "config": config, "source": source, **kw}


def test_tables_and_markers(rt, tmp_path):
    rows = [row("none", bpw=32.08, ppl=5.1234, mean_kld=0.0, kld_stderr=0.0, kld_p99=0.0,
                same_top1=1.0, file_bytes=539_400_000, decode_tok_per_s=48.5,
                prompt_tok_per_s=60.0, ttft_ms=122.0, peak_rss_mib=529.0, load_average=1.26),
            row("kmeans:bits=4,group_size=256", bpw=5.87, ppl=5.3, mean_kld=0.1234567,
                kld_stderr=0.0012, kld_p99=0.9, same_top1=0.8312),
            row("llama.cpp Q4_0", source="llama.cpp", bpw=5.5, ppl=5.6, mean_kld=0.226,
                kld_stderr=0.002, kld_p99=1.2, same_top1=0.802)]
    he = {"none": {"pass@1": 0.1, "pass@1_sampled": 0.08, "pass@5_sampled": 0.2,
                   "humaneval": {"problems": 20, "per_seed": [0.1, 0.05, 0.1, 0.1, 0.05]}},
          "kmeans:bits=4,group_size=256": {
              "pass@1": 0.05, "pass@1_sampled": 0.04, "pass@5_sampled": 0.1,
              "humaneval": {"problems": 20, "per_seed": [0.0, 0.05, 0.05, 0.0, 0.05]}}}
    meta = {"command": "python bench/results_tables.py", "date": "2026-12-01", "cpu": "cpu",
            "commit": "abc", "chunks": 20, "tokens_scored": 5100, "threads": "1,2",
            "repeat": 3, "out": "bench/results/compare"}
    text = rt.tables(rows, he, meta)
    assert "| `kmeans:bits=4,group_size=256` | 5.87 | 5.3000 | 0.12346 ± 0.00120 | 0.9000 | " \
           "83.12 % | 5.0 % | 4.0 / 10.0 % | 0." in text
    assert "| `none` | fp32 naive" not in text and "| `none` | BLAS only (fp32) | 539.4 MB | " \
           "32.08 | 48.5 | 60.0 | 122 ms | 529 MiB | 1.3 |" in text
    assert "| llama.cpp Q4_0 | 5.50 | 5.6000 | 0.22600 ± 0.00200 | 1.2000 | 80.20 % |" in text
    assert "HumanEval on the first 20 problems (`--limit 20`)." in text
    md = tmp_path / "RESULTS.md"
    md.write_text("# Measured results\n\nhand-written part\n")
    rt.write_results_md(md, text)
    rt.write_results_md(md, text.replace("5.3000", "5.4000"))  # replaced, not appended twice
    doc = md.read_text()
    assert doc.startswith("# Measured results\n\nhand-written part\n")
    assert doc.count(rt.BEGIN) == 1 and "5.4000" in doc and "5.3000" not in doc
