"""Benchmark: build and run the synthetic Code Llama-7B-shaped model; writes JSON.

    python bench/bench_scale.py [--layers 32] [--dim 4096] [--ffn 11008]
        [--ablation-layers 4] [--no-ablation] [--tokens 32] [--workdir DIR]
        [-o bench/results/bench_scale.json]

1. ``bench/synth_checkpoint.py`` writes the checkpoint (reused from ``--workdir`` when it was
   already written there with the same arguments).
2. ``ditto build MODEL --quantizer kmeans --blas openblas --no-cache`` runs as a child process
   (b = 4, G = 256, optimal): build seconds, per-stage seconds and peak RSS (build.json
   ``stages`` and ``peak_rss``), the model file size, bpw, and quantization seconds per 1B
   quantized weights.
3. The built executable generates ``--tokens`` tokens (greedy, ``--ignore-eos``) after a code
   prompt of ~70 tokens, twice: decode tok/s and prompt (prefill) tok/s from its ``stats`` line
   (native/README.md), and its peak RSS.
With ``--rate-only`` none of that runs: one tensor of each kind of the model (q/k/v/o,
gate/up, down at b = 4, G = 256; the embedding and classifier at b = 6, one codebook per row)
is drawn as the checkpoint would hold it and quantized with ``quantize_matrix`` (the build's
default int8 codebooks), timed in wall and CPU seconds, and the whole model's quantization time
extrapolated from the per-kind rates. ``--isa avx2`` times the kmeans kernels built for
x86-64-v3 (AVX2 + FMA, no AVX-512) on this CPU: the rate an AVX2-only machine's code gets here.

4. The RQ3 ablation on a ``--ablation-layers`` variant (same dims; fp32 fits in memory there):
   fp32 naive (``--quantizer none --no-rewrite``), BLAS only (``--quantizer none``),
   quantization only (``--quantizer kmeans --no-rewrite``) and full Ditto, each built and run
   the same way.

The machine's load average is recorded before and after the whole run and around every build
and run, with each build's CPU seconds (all threads): on a shared machine the wall seconds are
upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth_checkpoint as S  # noqa: E402

from ditto_core.runtime.run import run_stats  # noqa: E402

#: what /proc/cpuinfo lists for the x86-64-v3 level that ``--isa avx2`` compiles for
X86_64_V3 = {"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm"}

PROMPT = ('import os\nimport sys\n\n\ndef read_lines(path):\n    """Return the lines of a text '
          'file without their newlines."""\n    with open(path, encoding="utf-8") as f:\n'
          '        return [line.rstrip("\\n") for line in f]\n\n\ndef main(argv):\n')

ABLATION = {
    "fp32_naive": ["--quantizer", "none", "--no-rewrite"],
    "blas_only": ["--quantizer", "none"],
    "quant_only": ["--quantizer", "kmeans", "--no-rewrite"],
    "full": ["--quantizer", "kmeans"],
}


def synth(workdir: Path, layers: int, dim: int, ffn: int, log) -> Path:
    """The synthetic checkpoint for these arguments, written once per workdir."""
    d = workdir / f"synth-L{layers}-d{dim}-f{ffn}"
    stamp = d / ".synth_args.json"
    args = {"layers": layers, "dim": dim, "ffn": ffn, "seed": 0}
    if stamp.is_file() and json.loads(stamp.read_text()) == args:
        log(f"reusing {d}")
        return d
    shutil.rmtree(d, ignore_errors=True)
    t0 = time.perf_counter()
    S.write_checkpoint(d, layers, dim, ffn, S.CODE_LLAMA_7B["heads"], S.CODE_LLAMA_7B["vocab"],
                       seed=0, log=log)
    stamp.write_text(json.dumps(args))
    log(f"synthesised {d} in {time.perf_counter() - t0:.0f} s")
    return d


def build(model: Path, out: Path, extra: list[str], log) -> dict:
    """Run ``ditto build`` as a child; return its figures (build.json + wall time). The
    child's own ``ru_maxrss`` is not used: the per-stage resets of the high-water mark lower
    it too (docs/BUILD.md, "Memory and disk")."""
    cmd = [sys.executable, "-m", "ditto_core.cli.main", "build", str(model), "-o", str(out),
           "--blas", "openblas", "--no-cache", "-q", *extra]
    log(" ".join(cmd[2:]))
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    c0 = os.times()
    proc = subprocess.run(cmd)
    wall = time.perf_counter() - t0
    c1 = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"ditto build failed ({proc.returncode}): {' '.join(cmd)}")
    rec = json.loads((out / "build.json").read_text())
    quantized = rec.get("pack", {}).get("n_weights")
    qweights = sum(t["shape"][0] * t["shape"][1] for t in rec["tensors"].values()
                   if t.get("encoding") == "codebook")
    file_bytes = (out / "model.ditto").stat().st_size
    res = {"command": "ditto " + " ".join(cmd[3:]), "wall_s": wall,
           "cpu_s": (c1.children_user - c0.children_user) + (c1.children_system
                                                             - c0.children_system),
           "load_average_before": load0, "load_average_after": os.getloadavg(),
           "stages_s": rec["stages"], "total_s": rec.get("total_seconds"),
           "peak_rss": rec.get("peak_rss"),
           "file_bytes": file_bytes, "bpw": rec.get("bpw"), "n_weights": quantized,
           "quantized_weights": qweights}
    if qweights:
        res["quantize_s_per_1B_quantized"] = rec["stages"]["quantize"] / qweights * 1e9
    return res


def quant_rate(layers: int, dim: int, ffn: int, vocab: int, log) -> dict:
    """Quantize one tensor of each kind of the synthetic model; per-kind and extrapolated
    whole-model seconds (wall and CPU of all threads)."""
    import numba

    from ditto_quant_kmeans import native, quantize_matrix

    hidden = S.HiddenOutliers(0, dim)
    kinds = [  # (a tensor of the kind, shape, how many the model has, b, G)
        ("model.layers.0.self_attn.q_proj.weight", (dim, dim), 4 * layers, 4, 256),
        ("model.layers.0.mlp.gate_proj.weight", (ffn, dim), 2 * layers, 4, 256),
        ("model.layers.0.mlp.down_proj.weight", (dim, ffn), layers, 4, 256),
        ("model.embed_tokens.weight", (vocab, dim), 2, 6, max(256, dim)),
    ]
    out = {"dp_kernel": "numba" if native.load() is None else "c",
           "threads": numba.get_num_threads(), "kinds": {}}
    tot_w = tot_c = n_all = 0.0
    for name, shape, count, bits, g in kinds:
        W = S.synth_tensor(name, shape, 0, hidden)
        quantize_matrix(W[:4], bits, g, "optimal", "int8", 0, name)  # JIT caches, kernel load
        load0 = os.getloadavg()
        t0, c0 = time.perf_counter(), time.process_time()
        quantize_matrix(W, bits, g, "optimal", "int8", 0, name)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        n = W.size
        out["kinds"][name] = {"shape": list(shape), "count": count, "bits": bits,
                              "group_size": g, "wall_s": wall, "cpu_s": cpu,
                              "s_per_1B_wall": wall / n * 1e9, "cpu_s_per_1B": cpu / n * 1e9,
                              "load_average_before": load0,
                              "load_average_after": os.getloadavg()}
        log(f"{name} {shape}: {wall:.1f} s wall, {cpu:.1f} s CPU, load {load0[0]:.1f}")
        tot_w += wall * count
        tot_c += cpu * count
        n_all += n * count
        del W
    out.update({"model_weights_quantized": n_all, "model_wall_s": tot_w, "model_cpu_s": tot_c,
                "model_s_per_1B_wall": tot_w / n_all * 1e9,
                "model_cpu_s_per_1B": tot_c / n_all * 1e9,
                "model_s_per_1B_two_free_cores": tot_c / 2 / n_all * 1e9})
    return out


def run(build_dir: Path, tokens: int, threads: int, rounds: int = 2) -> dict:
    """Decode and prompt tok/s (median of ``rounds``) and peak RSS of the built executable."""
    samples = []
    load0 = os.getloadavg()
    for _ in range(rounds):
        st = run_stats(build_dir, ["-p", PROMPT, "-n", str(tokens), "--temp", "0",
                                   "--ignore-eos", "--threads", str(threads)], timeout=7200)
        samples.append(st)
    samples.sort(key=lambda s: s["tok_per_s"])
    mid = samples[len(samples) // 2]
    return {"decode_tok_per_s": mid["tok_per_s"],
            "prompt_tok_per_s": 1000.0 * mid["prompt_tokens"] / mid["prompt_ms"],
            "prompt_tokens": mid["prompt_tokens"], "load_ms": mid["load_ms"],
            "peak_rss_bytes": mid["peak_rss_kib"] * 1024, "threads": threads,
            "load_average_before": load0, "load_average_after": os.getloadavg(),
            "samples": samples}


def main(argv=None) -> int:
    c = S.CODE_LLAMA_7B
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=c["layers"])
    ap.add_argument("--dim", type=int, default=c["dim"])
    ap.add_argument("--ffn", type=int, default=c["ffn"])
    ap.add_argument("--ablation-layers", type=int, default=4)
    ap.add_argument("--no-ablation", action="store_true")
    ap.add_argument("--no-main", action="store_true", help="only the ablation")
    ap.add_argument("--rate-only", action="store_true",
                    help="only the per-tensor quantization rate and its whole-model estimate")
    ap.add_argument("--isa", choices=("native", "avx2"), default="native",
                    help="with --rate-only: quantize with the kmeans kernels built for this "
                         "CPU (native) or for x86-64-v3 (avx2: AVX2 + FMA, no AVX-512), the "
                         "rate an AVX2-only CPU gets from this core (default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ditto-bench-scale"))
    ap.add_argument("-o", "--out", type=Path, default=HERE / "results" / "bench_scale.json")
    args = ap.parse_args(argv)
    if args.isa != "native":
        if not args.rate_only:
            ap.error("--isa applies to --rate-only (builds compile their runtime for this CPU)")
        from bench_llamacpp import cpu_flags
        missing = X86_64_V3 - cpu_flags()
        if missing:
            ap.error(f"--isa {args.isa}: this CPU does not list {', '.join(sorted(missing))}")
        from ditto_quant_kmeans import native
        try:
            kernels = native.use_march("x86-64-v3")
        except (OSError, subprocess.CalledProcessError) as exc:
            ap.error(f"--isa {args.isa}: the kmeans kernels for x86-64-v3 are unavailable "
                     f"({(getattr(exc, 'stderr', None) or exc)!s:.500})")
    else:
        kernels = None

    def log(s):
        print(f"[bench_scale] {s}", file=sys.stderr, flush=True)

    args.workdir.mkdir(parents=True, exist_ok=True)
    result = {"bench": "bench_scale", "load_average_before": os.getloadavg(),
              "cpu_count": os.cpu_count(), "tokens": args.tokens, "threads": args.threads,
              "prompt": PROMPT}
    if args.rate_only:
        args.no_main = args.no_ablation = True
        result["isa"] = args.isa
        if kernels:
            log(f"kmeans kernels for x86-64-v3: {kernels}")
        result["quant_rate"] = quant_rate(args.layers, args.dim, args.ffn, c["vocab"], log)
    if not args.no_main:
        model = synth(args.workdir, args.layers, args.dim, args.ffn, log)
        out = args.workdir / f"build-L{args.layers}"
        main_res = {"model": {"layers": args.layers, "dim": args.dim, "ffn": args.ffn,
                              "checkpoint_bytes": sum(p.stat().st_size
                                                      for p in model.glob("*.safetensors"))}}
        main_res["build"] = build(model, out, ["--quantizer", "kmeans"], log)
        main_res["run"] = run(out, args.tokens, args.threads)
        result["full_ditto"] = main_res
        log(json.dumps({k: main_res["build"][k] for k in ("wall_s", "file_bytes", "bpw")}))
    if not args.no_ablation:
        model = synth(args.workdir, args.ablation_layers, args.dim, args.ffn, log)
        abl = {}
        for name, extra in ABLATION.items():
            out = args.workdir / f"ablation-L{args.ablation_layers}-{name}"
            abl[name] = {"build": build(model, out, extra, log),
                         "run": run(out, args.tokens, args.threads)}
            shutil.rmtree(out, ignore_errors=True)  # fp32 files are large
            log(f"{name}: {abl[name]['run']['decode_tok_per_s']:.2f} tok/s")
        base = abl["fp32_naive"]["run"]["decode_tok_per_s"]
        result["ablation"] = {"layers": args.ablation_layers, "configs": abl,
                              "decode_speedup_vs_fp32_naive": {
                                  k: v["run"]["decode_tok_per_s"] / base
                                  for k, v in abl.items()}}
    result["load_average_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
