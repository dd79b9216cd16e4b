"""Benchmark: what `ditto build` produces for SmolLM2-135M-Instruct, end to end. Prints JSON.

    python bench/bench_e2e.py [--tokens 128] [--rounds 3] [--threads 1,2]
                              [--configs kmeans,none,none-norewrite]

Configurations (the paper's RQ3 ablations): ``kmeans`` (default quantizer b = 4, G = 256,
rewritten), ``none`` (fp32, rewritten: fp32 GEMVs go to cblas_sgemv), ``none-norewrite`` (fp32,
naive loops kept). Each is built once with ``ditto build`` (cache off, so stage seconds are
real), then decode tok/s (tg``--tokens``, greedy, ``--ignore-eos``; the runtime's own stats line),
time to first token and peak RSS are measured, the builds alternating within each round so
machine noise hits all alike. Reported: samples, medians, ratios of medians against
``none-norewrite``, model file bytes, bpw and per-stage build seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ditto_core.runtime.run import run_stats
from ditto_core.stages import pipeline

PROMPT = "def fibonacci(n):"
CONFIGS = {
    "kmeans": dict(quantizer="kmeans", rewrite=True),
    "none": dict(quantizer="none", rewrite=True),
    "none-norewrite": dict(quantizer="none", rewrite=False),
}


def measure(build_dir: Path, tokens: int, threads: int) -> dict:
    """tok/s, TTFT (ms) and peak RSS (KiB) from the executable's ``stats`` line."""
    return run_stats(build_dir, ["-p", PROMPT, "-n", str(tokens), "--temp", "0", "--ignore-eos",
                                 "--threads", str(threads)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    configs = args.configs.split(",")

    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        builds, info = {}, {}
        for name in configs:
            opts = pipeline.BuildOptions(blas="openblas", cache=False, **CONFIGS[name])
            t0 = time.perf_counter()
            rec = pipeline.build("smollm2", Path(tmp) / name, opts)
            info[name] = {"build_s": time.perf_counter() - t0, "stages_s": rec["stages"],
                          "bpw": rec["bpw"], "pass_summary": rec["pass_summary"],
                          "model_bytes": (Path(tmp) / name / "model.ditto").stat().st_size}
            builds[name] = Path(tmp) / name
        samples: dict[str, list[dict]] = {f"{n}@{t}": [] for t in threads for n in builds}
        for _ in range(args.rounds):
            for t in threads:
                for name, d in builds.items():
                    samples[f"{name}@{t}"].append(measure(d, args.tokens, t))

    def med(key, field):
        return statistics.median(s[field] for s in samples[key])

    medians = {k: {"tok_per_s": med(k, "tok_per_s"), "ttft_ms": med(k, "ttft_ms"),
                   "peak_rss_mib": med(k, "peak_rss_kib") / 1024} for k in samples}
    base = "none-norewrite"
    ratios = {k: v["tok_per_s"] / medians[f"{base}@{k.split('@')[1]}"]["tok_per_s"]
              for k, v in medians.items() if f"{base}@{k.split('@')[1]}" in medians}
    json.dump({"bench": "bench_e2e", "model": "SmolLM2-135M-Instruct", "prompt": PROMPT,
               "tokens": args.tokens, "rounds": args.rounds, "builds": info,
               "median": medians, "tok_s_ratio_vs_" + base: ratios,
               "samples": {k: [s["tok_per_s"] for s in v] for k, v in samples.items()}},
              sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
