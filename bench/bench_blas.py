"""Benchmark: fp32 SmolLM2-135M decode speed, naive GEMV loops vs the GEMV→BLAS rewrite, and
the build pipeline's time except quantization. Prints one JSON object.

    python bench/bench_blas.py [--tokens 64] [--rounds 3] [--threads 1,2] [--blas openblas]

Both executables are built by ``ditto build smollm2 --quantizer none`` (``--no-rewrite`` for
the naive one) with the cache disabled, so the stage timings are real. Decode tok/s is the
runtime's own measurement (``stats`` line: generated tokens / decode seconds, greedy). The two
builds run alternately within each round (naive, rewritten, naive, ...) so machine noise hits
both alike; the JSON gives every sample, the median per configuration and the ratio of medians.
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


def decode_tok_s(build_dir: Path, tokens: int, threads: int) -> float:
    """Decode tok/s reported by the executable's ``stats`` JSON line on stderr."""
    return float(run_stats(build_dir, ["-p", PROMPT, "-n", str(tokens), "--temp", "0",
                                       "--threads", str(threads)])["tok_per_s"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--blas", default="openblas")
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]

    with tempfile.TemporaryDirectory(prefix="bench-blas-") as tmp:
        tmp = Path(tmp)
        builds, build_info = {}, {}
        for label, rewrite in (("naive", False), ("rewritten", True)):
            opts = pipeline.BuildOptions(quantizer="none", blas=args.blas, rewrite=rewrite,
                                         cache=False)
            t0 = time.perf_counter()
            rec = pipeline.build("smollm2", tmp / label, opts)
            wall = time.perf_counter() - t0
            stages = rec["stages"]
            build_info[label] = {
                "stages_s": stages,
                # quantize is the identity here (fp32); the pack stage is export's f32 write
                "pipeline_s_except_quantization": wall - stages.get("quantize", 0.0),
                "compile_s": sum(stages[s] for s in ("emit IR", "rewrite", "link")),
                "pass_summary": rec["pass_summary"],
                "executable_bytes": (tmp / label / "ditto-run").stat().st_size,
            }
            builds[label] = tmp / label

        samples = {f"{label}@{t}": [] for t in threads for label in builds}
        for _ in range(args.rounds):
            for t in threads:
                for label, d in builds.items():
                    samples[f"{label}@{t}"].append(decode_tok_s(d, args.tokens, t))

    medians = {k: statistics.median(v) for k, v in samples.items()}
    result = {
        "bench": "bench_blas",
        "model": "SmolLM2-135M-Instruct fp32 (--quantizer none)",
        "blas": args.blas, "tokens": args.tokens, "rounds": args.rounds, "prompt": PROMPT,
        "decode_tok_s_samples": samples,
        "decode_tok_s_median": medians,
        "speedup_rewritten_over_naive": {
            str(t): medians[f"rewritten@{t}"] / medians[f"naive@{t}"] for t in threads},
        "build": build_info,
        "pipeline_target_s": 60,
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
