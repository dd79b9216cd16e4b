"""int8 vs f16 codebooks on SmolLM2-135M, end to end: KL divergence of the built executables'
next-token distributions from the fp32 build's, on the same text. Prints one JSON object.

    python bench/bench_codebook_type.py [--tokens 256] [--types f16,int8] [--out-dir DIR]

Builds ``ditto build --quantizer kmeans --blas openblas smollm2`` once per codebook type (b = 4,
G = 256, the default embedding policy) and the fp32 reference (``--quantizer none``), runs
each executable with ``--dump-logits`` over the same token ids (SmolLM2 tokenizer golden
texts, tests/data/smollm2_tokenizer_golden.jsonl, BOS first), and reports per type:
mean KL(p_fp32 ‖ p_type) over the positions, top-1 agreement with fp32, perplexity of the text,
the file's bits per weight, and the quantizer's total relative weight error
Σ‖W − Ŵ‖² / Σ‖W‖² (from build.json). The int8 build runs the integer kernels (activation
quantization included), the f16 build the float-lookup kernels: this is the whole difference a
user sees. ``kl_int8_minus_f16`` compares it with the spread of KL over positions
(``kl_sem``: standard error of the mean KL) to say whether the difference is within noise.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def text_ids(n_tokens: int) -> list[int]:
    path = ROOT / "tests" / "data" / "smollm2_tokenizer_golden.jsonl"
    ids = [1]  # <|im_start|>, SmolLM2's BOS
    for line in path.read_text().splitlines():
        ids += json.loads(line)["ids_plain"]
        if len(ids) >= n_tokens:
            break
    return ids[:n_tokens]


def build(out: Path, *opts: str) -> dict:
    subprocess.run(["ditto", "build", "--blas", "openblas", "smollm2", "-o", str(out), "-q",
                    *opts], check=True, stdout=subprocess.DEVNULL)  # stdout: the JSON alone
    return json.loads((out / "build.json").read_text())


def log_softmax_of_run(build_dir: Path, ids: list[int], tmp: Path) -> np.ndarray:
    ids_file = tmp / "ids.json"
    ids_file.write_text(json.dumps(ids))
    out = tmp / f"{build_dir.name}.f32"
    subprocess.run([str(build_dir / "ditto-run"), "-m", str(build_dir / "model.ditto"),
                    "--ids", str(ids_file), "--dump-logits", str(out)], check=True,
                   capture_output=True)
    z = np.fromfile(out, "<f4").reshape(len(ids), -1).astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--types", default="f16,int8")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="keep the builds here (default: a temporary directory)")
    args = ap.parse_args(argv)
    ids = text_ids(args.tokens)
    types = [t for t in args.types.split(",") if t]
    with tempfile.TemporaryDirectory(prefix="bench-cbt-") as tmp_s:
        tmp = Path(tmp_s)
        root = args.out_dir or tmp
        root.mkdir(parents=True, exist_ok=True)
        build(root / "fp32", "--quantizer", "none")
        ref = log_softmax_of_run(root / "fp32", ids, tmp)
        p_ref = np.exp(ref)
        out = {"bench": "bench_codebook_type", "model": "smollm2", "tokens": len(ids),
               "bits": 4, "group_size": 256, "types": {}}
        for t in types:
            rec = build(root / t, "--quantizer", "kmeans", "--codebook-type", t)
            logp = log_softmax_of_run(root / t, ids, tmp)
            kl = np.sum(p_ref * (ref - logp), axis=-1)
            nll = -float(np.mean(logp[np.arange(len(ids) - 1), ids[1:]]))
            out["types"][t] = {
                "kl_vs_fp32": float(kl.mean()),
                "kl_sem": float(kl.std(ddof=1) / math.sqrt(len(kl))),
                "top1_agreement": float(np.mean(logp.argmax(-1) == ref.argmax(-1))),
                "perplexity": math.exp(nll), "bpw": rec.get("bpw"),
                "file_bytes": (root / t / "model.ditto").stat().st_size,
                "total_rel_error": rec.get("pack", {}).get("total_rel_error"),
                "kl_per_position": kl}
        nll_ref = -float(np.mean(ref[np.arange(len(ids) - 1), ids[1:]]))
        out["fp32_perplexity"] = math.exp(nll_ref)
        if {"f16", "int8"} <= set(types):
            d = out["types"]["int8"]["kl_per_position"] - out["types"]["f16"]["kl_per_position"]
            out["kl_int8_minus_f16"] = float(d.mean())
            out["kl_int8_minus_f16_sem"] = float(d.std(ddof=1) / math.sqrt(len(d)))
        for t in types:
            del out["types"][t]["kl_per_position"]
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
