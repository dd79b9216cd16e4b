"""Benchmark: the plain build of the native runtime (native/Makefile: clang-22 -O3 -fopenmp, the
naive fp32 GEMV loop, no BLAS) on SmolLM2-135M fp32. Prints one JSON object.

    python bench/bench_runtime.py [--model FILE.ditto] [--tokens 128] [--threads 1,2] [--rounds 3]
                                  [--variants plain,reassoc]

For each thread count: decode tok/s of tg128 (greedy, ``--ignore-eos`` so exactly --tokens
tokens are generated; the runtime's own ``stats`` line: (generated - 1) / decode seconds),
time to first token (prompt evaluation + first sample, model load excluded; load time is given
separately), and the peak RSS of the process (its VmHWM, from the stats line), checked against
the bound file size + KV cache + 64 MiB. Without --model, SmolLM2's GGUF is exported to an
all-f32 .ditto in a temporary directory first. Rounds alternate builds and thread counts so
machine noise hits all alike; the JSON gives every sample and the medians. Reference on this
machine (shared/README.md): llama2.c run.c fp32 16 / 27 tok/s at 1 / 2 threads (built -Ofast).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "def fibonacci(n):"


#: build variants: extra make variables (native/Makefile)
VARIANTS = {"plain": [], "reassoc": ["REASSOC=1"]}


def build(out_dir: Path, variant: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), f"BUILD={out_dir}", "all",
                    *VARIANTS[variant]], check=True)
    return out_dir / "ditto-run"


def export_f32(out: Path) -> Path:
    from ditto_core.stages import pipeline
    from ditto_core.stages.bundled import bundled_model

    pipeline.write_f32(pipeline.export(bundled_model("smollm2")), out, show_progress=False)
    return out


def run_once(exe: Path, model: Path, tokens: int, threads: int) -> dict:
    """One generation; returns the stats line's fields plus peak RSS in bytes."""
    args = [str(exe), "-m", str(model), "-p", PROMPT, "-n", str(tokens), "--temp", "0",
            "--threads", str(threads), "--ignore-eos"]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{exe}: exit {proc.returncode}:\n{stderr}")
    line = next(ln for ln in stderr.splitlines() if ln.startswith("stats "))
    stats = json.loads(line[len("stats "):])
    # the program's own VmHWM (wait4's ru_maxrss would also count the pre-exec fork of this
    # Python process); fall back to ru_maxrss where /proc is missing
    kib = stats.get("peak_rss_kib", -1)
    stats["peak_rss_bytes"] = (kib if kib > 0 else usage.ru_maxrss) * 1024
    return stats


def kv_cache_bytes(model: Path, ctx: int) -> int:
    from ditto_core.model.modelfile import ModelFile

    c = ModelFile(model, verify=False).config
    return 2 * c.n_layers * ctx * c.n_kv_heads * c.head_dim * 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="an all-f32 .ditto (default: export SmolLM2)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="plain",
                    help="comma list of builds: plain (the naive loop as is), reassoc "
                         "(REASSOC=1: float reassociation lets clang vectorise the reduction)")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    variants = args.variants.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        tmp = Path(tmp)
        exes = {v: build(tmp / v, v) for v in variants}
        model = args.model or export_f32(tmp / "smollm2_f32.ditto")
        file_size = model.stat().st_size
        samples = {(v, t): [] for v in variants for t in threads}
        for _ in range(args.rounds):
            for v in variants:
                for t in threads:
                    samples[(v, t)].append(run_once(exes[v], model, args.tokens, t))
        results = {}
        for (v, t), runs in samples.items():
            ctx = runs[0]["ctx"]
            kv = kv_cache_bytes(model, ctx)
            bound = file_size + kv + 64 * 2**20
            peak = max(r["peak_rss_bytes"] for r in runs)
            results[f"{v}/threads_{t}"] = {
                "tok_per_s_median": statistics.median(r["tok_per_s"] for r in runs),
                "ttft_ms_median": statistics.median(r["ttft_ms"] for r in runs),
                "load_ms_median": statistics.median(r["load_ms"] for r in runs),
                "peak_rss_mib": peak / 2**20, "rss_bound_mib": bound / 2**20,
                "rss_within_bound": peak <= bound, "kv_cache_mib": kv / 2**20, "ctx": ctx,
                "samples": [{k: r[k] for k in ("tok_per_s", "ttft_ms", "load_ms",
                                               "peak_rss_bytes")} for r in runs],
            }
        out = {"benchmark": "runtime_plain_fp32", "model": str(model),
               "model_bytes": file_size, "build": {v: "clang-22 -O3 -fopenmp " + " ".join(VARIANTS[v]) for v in variants},
               "prompt": PROMPT, "tokens": args.tokens, "rounds": args.rounds,
               "reference_llama2c_runc_tok_per_s": {"threads_1": 16, "threads_2": 27},
               "results": results}
        if len(threads) == 2:
            for v in variants:
                a, b = (results[f"{v}/threads_{t}"]["tok_per_s_median"] for t in threads)
                out[f"{v}/speedup_{threads[1]}_vs_{threads[0]}_threads"] = b / a if a else None
        json.dump(out, sys.stdout, indent=2)
        print()


if __name__ == "__main__":
    main()
