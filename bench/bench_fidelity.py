"""Fidelity on the evaluation corpus: Ditto builds vs llama.cpp's formats of the same weights.

For one bundled model, every row is scored on the same first N 512-token chunks of ``ditto
eval``'s corpus (default 20) against the fp32 model: mean KL divergence of the next-token
distributions ± its standard error, same top-1 token (%), perplexity. One command per model:

    python bench/bench_fidelity.py --model qwen2.5-coder-0.5b --chunks 20 --write-results
    python bench/bench_fidelity.py --model qwen2.5-coder-1.5b --chunks 20 --write-results

What it runs (``$W`` = ``--work``, default bench/.cache/fidelity; ``$LLAMA`` = llama.cpp's bin
directory, ``--llama-bin`` or what build-llama-cpp.sh prints; M = the model name):

    # fp32 = the shipped GGUF dequantized: `ditto eval`'s default baseline, built once and
    # cached (in ~/.cache/ditto/eval-baselines/SHA-none-openblas)
    ditto build M --quantizer none --blas openblas -o FP32
    # llama.cpp files (bench_llamacpp.llama_models; SRC = the shipped GGUF, F32 = SRC converted by
    # llama-quantize as `ditto eval --peer-gguf` does: the same weights as the fp32 build)
    $LLAMA/llama-quantize --allow-requantize SRC $W/M-T.gguf T        # T = Q4_0 IQ4_NL Q4_K_M
    $LLAMA/llama-imatrix -m F32 -f CAL -c 512 -t 2 -o $W/M-stdlib.imatrix.gguf
    $LLAMA/llama-quantize --imatrix $W/M-stdlib.imatrix.gguf F32 $W/M-IQ4_NL-imatrix.gguf IQ4_NL
    # (CAL = ditto_core.eval.calibration.stdlib_calibration_path(), the text --calibration stdlib uses)
    # Ditto builds
    ditto build M --quantizer kmeans --blas openblas -o $W/M/ditto-default
    ditto build M --quantizer kmeans --blas openblas --calibration stdlib \\
        --max-size-of $W/M-Q4_0.gguf --speed-aware off -o $W/M/ditto-calibrated
    # only for models with rows G = 256 does not divide (0.5B: 896): those matrices at G = 128
    # (7 sub-blocks, larger) and G = 224 (4 equal sub-blocks, the default's size)
    ditto build M --quantizer kmeans --blas openblas --tensor-type 'blk.*.attn_*.weight=G128' \\
        --tensor-type 'blk.*.ffn_gate.weight=G128' --tensor-type 'blk.*.ffn_up.weight=G128' \\
        -o $W/M/ditto-896-g128                                      # likewise G224
    # scores
    ditto eval $W/M/ditto-CONFIG --baseline FP32 --chunks N --json    # each Ditto build
    LLAMA_ARG_REPACK=0 ditto eval $W/M/ditto-default --chunks N --llama-cpp $LLAMA \
        --peer-gguf $W/M-T.gguf ...          # (no repacking: see llama_row)

The Ditto rows call ``ditto_core.api.build`` and ``ditto_core.eval.fidelity.evaluate_fidelity``
(what ``ditto eval`` runs; baseline ``eval.builds.baseline_for``); the llama.cpp rows call
``ditto_core.eval.llamacpp`` (``f32_gguf``, ``base_logits``, ``score_peer``: ``llama-perplexity
--kl-divergence-base`` on the F32 GGUF, then ``--kl-divergence`` per file). Each finished row is
saved in ``$W/M/rows/CONFIG-nN.json`` and not recomputed while its recipe is the same (delete
the file to redo it). ``--configs`` picks rows (default: all that apply to the model). The
result JSON (``--out``, default bench/results/fidelity_M.json) holds every row with its wall
times; ``--write-results`` puts the markdown table into docs/RESULTS.md between the
``bench_fidelity:M`` markers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_llamacpp as bl  # noqa: E402

from ditto_core.api import build as ditto_build  # noqa: E402
from ditto_core.stages.bundled import bundled_model  # noqa: E402
from ditto_core.eval.calibration import stdlib_calibration_path  # noqa: E402
from ditto_core.eval import builds, fidelity, llamacpp  # noqa: E402

ROOT = bl.ROOT
#: rows G = 256 does not divide: the matrices whose input dimension is the hidden size
ROWS_896 = ["blk.*.attn_*.weight", "blk.*.ffn_gate.weight", "blk.*.ffn_up.weight"]
#: config → (label, ditto_core.api.build kwargs or None for llama.cpp rows)
DITTO = {
    "ditto-default": ("Ditto default (kmeans b=4, G=256, int8 codebooks)", {}),
    "ditto-calibrated": ("Ditto `--calibration stdlib --max-size-of` Q4_0 file",
                         dict(calibration="stdlib")),  # + max_size_of, speed_aware (ditto_row)
    "ditto-896-g128": ("Ditto default, rows of 896 at G=128 (7 sub-blocks)",
                       dict(tensor_types=[f"{g}=G128" for g in ROWS_896])),
    "ditto-896-g224": ("Ditto default, rows of 896 at G=224 (4 equal sub-blocks)",
                       dict(tensor_types=[f"{g}=G224" for g in ROWS_896])),
}
LLAMA = ["Q4_0", "IQ4_NL", "IQ4_NL-imatrix", "Q4_K_M"]
HIDDEN = {"smollm2": 576, "qwen2.5-coder-0.5b": 896, "qwen2.5-coder-1.5b": 1536}


def default_configs(model: str) -> list[str]:
    """Every row that applies to ``model`` (the G variants only when 256 ∤ hidden size)."""
    out = ["ditto-default", "ditto-calibrated"]
    if HIDDEN.get(model, 256) % 256:
        out += ["ditto-896-g128", "ditto-896-g224"]
    return out + [f"llama-{t}" for t in LLAMA]


def imatrix_gguf(bin_dir: Path, work: Path, model: str, t: str, f32: Path) -> Path:
    """``$W/M-T-imatrix.gguf``: F32 quantized to T with the imatrix of the shipped calibration
    text (``llama-imatrix``, made once into ``$W/M-stdlib.imatrix.gguf``)."""
    imat = work / f"{model}-stdlib.imatrix.gguf"
    if not imat.exists():
        tmp = imat.with_name(imat.name + ".tmp.gguf")
        subprocess.run([str(bin_dir / "llama-imatrix"), "-m", str(f32), "-f",
                        str(stdlib_calibration_path()), "-c", "512", "-t", "2", "-o", str(tmp)],
                       check=True, capture_output=True)
        tmp.rename(imat)
    dst = work / f"{model}-{t}-imatrix.gguf"
    if not dst.exists():
        tmp = dst.with_suffix(".tmp")
        subprocess.run([str(bin_dir / "llama-quantize"), "--imatrix", str(imat), str(f32),
                        str(tmp), t], check=True, capture_output=True)
        tmp.rename(dst)
    return dst


def ditto_row(model: str, config: str, work: Path, chunks: int, bin_dir: Path | None) -> dict:
    label, kw = DITTO[config]
    kw = dict(kw)
    if config == "ditto-calibrated":
        kw["max_size_of"] = bl.llama_models(bin_dir, work, ["Q4_0"], model)["Q4_0"]
        # the byte budget alone: the most faithful plan, the same on every CPU (the
        # speed-aware plan depends on the kernel table; bench_llamacpp measures that one)
        kw["speed_aware"] = "off"
    out = work / model / config
    t0 = time.time()
    rec = ditto_build(model, quantizer="kmeans", blas="openblas", out=out, **kw).record
    t1 = time.time()
    base = builds.baseline_for(out)
    res = fidelity.evaluate_fidelity(out, base, n_chunks=chunks)
    row = {"label": label, "build": str(out), "baseline": str(base),
           "file_bytes": (out / "model.ditto").stat().st_size, "bpw": rec["bpw"],
           "build_s": round(t1 - t0, 1), "eval_s": round(time.time() - t1, 1), **res}
    if "allocation" in rec:
        a = rec["allocation"]
        row["allocation"] = {k: a.get(k) for k in ("max_size_of", "budget_bytes",
                                                     "planned_bytes")}
    return row


def llama_row(model: str, config: str, work: Path, chunks: int, bin_dir: Path) -> dict:
    t = config.removeprefix("llama-")
    # llama.cpp's AMX matmul (taken for Q4_0 etc. when the CPU lists amx_int8) dies with SIGILL
    # where the kernel does not grant the tile state (this VM); no repacking = no AMX buffers,
    # the same formats run by the AVX-512 kernels
    os.environ.setdefault("LLAMA_ARG_REPACK", "0")
    f32 = llamacpp.f32_gguf(bundled_model(model), bin_dir)
    t0 = time.time()
    if t.endswith("-imatrix"):
        gguf = imatrix_gguf(bin_dir, work, model, t.removesuffix("-imatrix"), f32)
        how = "llama-quantize --imatrix (llama-imatrix, stdlib text) from F32"
    else:
        gguf = bl.llama_models(bin_dir, work, [t], model)[t]
        how = "llama-quantize --allow-requantize from the shipped GGUF"
    t1 = time.time()
    base = llamacpp.base_logits(f32, chunks, bin_dir=bin_dir)
    t2 = time.time()
    r = llamacpp.score_peer(gguf, base, bin_dir=bin_dir)
    return {"label": f"llama.cpp {t}", "how": how, "base_gguf": str(f32), **r,
            "quantize_s": round(t1 - t0, 1), "base_s": round(t2 - t1, 1),
            "eval_s": round(time.time() - t2, 1)}


def recipe(model: str, config: str, chunks: int) -> dict:
    """What decides a row's figures (a saved row is reused only under the same recipe)."""
    spec = DITTO[config][1] if config in DITTO else config
    return {"model": model, "config": config, "spec": spec, "chunks": chunks}


def table(model: str, rows: dict) -> str:
    title = bl.MODEL_TITLES.get(model, model)
    lines = [f"| model file ({title}) | MB | bpw | mean KLD ± s.e. | same top-1 | PPL |",
             "|---|---|---|---|---|---|"]
    ppl = {src: r["ppl_baseline"] for c, r in rows.items()
           for src in ["llama" if c.startswith("llama-") else "ditto"]}
    if ppl:
        cell = " / ".join(f"{v:.3f}" + (" (llama.cpp F32)" if k == "llama" else "")
                          for k, v in sorted(ppl.items()))
        lines.append("| fp32 (the shipped GGUF dequantized: `--quantizer none`; llama.cpp: its "
                     f"F32 GGUF) | | 32 | 0 | 100 % | {cell} |")
    for r in rows.values():
        lines.append(f"| {r['label']} | {r['file_bytes'] / 1e6:.1f} | {r['bpw']:.2f} | "
                     f"{r['mean_kld']:.4f} ± {r['kld_stderr']:.4f} | "
                     f"{100 * r['same_top1']:.1f} % | {r['ppl']:.3f} |")
    return "\n".join(lines)


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return [f for f in line.split(":", 1)[1].split()
                        if f.startswith(("avx", "amx", "fma", "f16c"))]
    except OSError:
        pass
    return []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="bundled model name")
    ap.add_argument("--chunks", type=int, default=20, help="corpus chunks of 512 tokens")
    ap.add_argument("--configs", default=None,
                    help="comma-separated rows (default: all that apply to the model): "
                         + ", ".join(list(DITTO) + [f"llama-{t}" for t in LLAMA]))
    ap.add_argument("--llama-bin", help="llama.cpp bin directory (default: build-llama-cpp.sh)")
    ap.add_argument("--work", type=Path, default=ROOT / "bench" / ".cache" / "fidelity",
                    help="cache of GGUF files, builds and finished rows")
    ap.add_argument("--out", type=Path, default=None,
                    help="result JSON (default: bench/results/fidelity_MODEL.json)")
    ap.add_argument("--write-results", action="store_true",
                    help="also write the table into docs/RESULTS.md")
    args = ap.parse_args(argv)
    configs = args.configs.split(",") if args.configs else default_configs(args.model)
    unknown = [c for c in configs if c not in DITTO and c.removeprefix("llama-") not in LLAMA]
    if unknown:
        ap.error(f"unknown configs {unknown}")
    out_path = args.out or ROOT / "bench" / "results" / f"fidelity_{args.model}.json"
    bin_dir = bl.llama_bin(args.llama_bin)
    rows_dir = args.work / args.model / "rows"
    rows_dir.mkdir(parents=True, exist_ok=True)
    rows = {}
    for c in configs:
        saved = rows_dir / f"{c}-n{args.chunks}.json"
        key = recipe(args.model, c, args.chunks)
        try:
            r = json.loads(saved.read_text())
            if r.get("recipe") != json.loads(json.dumps(key)):
                raise ValueError("another recipe")
            print(f"{c}: saved row {saved}", file=sys.stderr)
        except (OSError, ValueError):
            print(f"{c}: running ({datetime.datetime.now(datetime.timezone.utc):%H:%M} UTC)",
                  file=sys.stderr)
            make = ditto_row if c in DITTO else llama_row
            r = {**make(args.model, c, args.work, args.chunks, bin_dir), "recipe": key,
                 "finished": datetime.datetime.now(datetime.timezone.utc)
                 .isoformat(timespec="seconds")}
            tmp = saved.with_suffix(".tmp")
            tmp.write_text(json.dumps(r, indent=2) + "\n")
            os.replace(tmp, saved)
        rows[c] = r
        print(f"{c}: mean KLD {r['mean_kld']:.4f} ± {r['kld_stderr']:.4f}, top-1 "
              f"{100 * r['same_top1']:.1f} %, PPL {r['ppl']:.3f}", file=sys.stderr)
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "cpu": bl._cpu(), "cpu_flags": cpu_flags(), "load_average": os.getloadavg(),
           "model": args.model, "chunks": args.chunks, "results": rows}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    md = table(args.model, rows)
    print(md)
    if args.write_results:
        first = min(r["finished"] for r in rows.values())
        last = max(r["finished"] for r in rows.values())
        n_tok = next(iter(rows.values()))["tokens_scored"]
        flags = [f for f in out["cpu_flags"] if f in ("avx2", "avx512f", "avx512_vnni",
                                                       "amx_int8")]
        note = (f"`python bench/bench_fidelity.py --model {args.model} --chunks {args.chunks}` "
                f"(rows finished {first[:16]} – {last[11:16]} UTC, {out['cpu']} with "
                f"{', '.join(flags)}; "
                f"{args.chunks} chunks, {n_tok:,} scored tokens; JSON in "
                f"bench/results/{out_path.name}):\n\n")
        bl.write_results(ROOT / "docs" / "RESULTS.md", note + md, args.model,
                         tag="bench_fidelity",
                         heading=f"Fidelity on {bl.MODEL_TITLES.get(args.model, args.model)}: "
                                 "Ditto vs llama.cpp (bench/bench_fidelity.py)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
