"""Correctness of a bundled model's fp32 build against transformers, which reads the same GGUF.

    python bench/bench_correctness.py --model qwen2.5-coder-0.5b [--out JSON]

- Logits: for each of ``PROMPTS`` (code; the ids are transformers' tokenizer's), the fp32 build
  (``ditto build MODEL --quantizer none``: the shipped file dequantized) dumps the logits of
  every prompt position (``ditto-run --ids FILE --dump-logits OUT``); transformers'
  ``AutoModelForCausalLM`` loaded from the GGUF (float32) gives the reference. Reported per
  prompt: tokens, max |Δlogit| over positions and vocabulary, the largest |logit|, and the
  positions whose top-1 token agrees.
- Tokenizer: the ids of the whole ``ditto eval`` corpus (``ditto_core.eval.corpus``, 411,098
  bytes) from the build's C tokenizer (``ditto-run --tokens``) against transformers'
  ``AutoTokenizer`` read from the same GGUF.

Prints a markdown table and writes JSON (default bench/results/correctness_MODEL.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ditto_core.api import build as ditto_build  # noqa: E402
from ditto_core.eval import corpus  # noqa: E402
from ditto_core.runtime.run import find_build, run_build  # noqa: E402
from ditto_core.stages.bundled import bundled_model  # noqa: E402

#: short code prompts: a function body, a class, a docstring, a fill-in-the-middle request and
#: a chat turn (control tokens parsed, as transformers' tokenizer does)
PROMPTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "import numpy as np\n\nclass Matrix:\n    def __init__(self, rows",
    'def parse_csv(path: str) -> list[dict]:\n    """Read a CSV file into a list of dicts."""\n',
    "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n<|fim_middle|>",
    "<|im_start|>user\nWrite a quicksort in Python.<|im_end|>\n<|im_start|>assistant\n",
)


def ditto_logits(build: Path, ids: list[int], tmp: Path) -> np.ndarray:
    """float32 [len(ids), vocab] logits of every position from the build's executable."""
    ids_path, out = tmp / "ids.json", tmp / "logits.f32"
    ids_path.write_text(json.dumps(ids))
    p = run_build(build, ["--ids", str(ids_path), "--dump-logits", str(out), "--threads",
                          str(os.cpu_count() or 1)], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{build}: --dump-logits failed: {p.stderr}")
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="bundled model name")
    ap.add_argument("--work", type=Path, default=ROOT / "bench" / ".cache" / "correctness")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out_path = args.out or ROOT / "bench" / "results" / f"correctness_{args.model}.json"

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    gguf = bundled_model(args.model, progress=True)
    build = args.work / args.model / "fp32"
    ditto_build(args.model, out=build, quantizer="none")
    exe, model_file, _ = find_build(build)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)

    text = corpus.corpus_bytes()
    ours = corpus.tokenize(exe, model_file, text, add_bos=False)
    theirs = tok(text.decode("utf-8"), add_special_tokens=False)["input_ids"]
    first_diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                      None if len(ours) == len(theirs) else min(len(ours), len(theirs)))
    tokenizer_row = {"corpus_bytes": len(text), "tokens_ditto": len(ours),
                     "tokens_transformers": len(theirs), "equal": ours == theirs,
                     "first_difference": first_diff}

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32).eval()
    torch.set_num_threads(os.cpu_count() or 1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ditto-correctness-") as tmp:
        for prompt in PROMPTS:
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            got = ditto_logits(build, ids, Path(tmp)).astype(np.float64)
            with torch.no_grad():
                ref = model(torch.tensor([ids])).logits[0].double().numpy()
            rows.append({"prompt": prompt, "tokens": len(ids),
                         "max_abs_dlogit": float(np.abs(got - ref).max()),
                         "max_abs_logit": float(np.abs(ref).max()),
                         "same_top1": int((got.argmax(-1) == ref.argmax(-1)).sum())})
    doc = {"model": args.model, "gguf": gguf.name,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "cpu": next((ln.split(":", 1)[1].strip() for ln in
                        Path("/proc/cpuinfo").read_text().splitlines()
                        if ln.startswith("model name")), "unknown"),
           "command": "python bench/bench_correctness.py --model " + args.model,
           "seconds": round(time.time() - t0), "logits": rows, "tokenizer": tokenizer_row}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=1) + "\n")

    print(f"| prompt ({args.model}) | tokens | max \\|Δlogit\\| | max \\|logit\\| | same top-1 |")
    print("|---|---|---|---|---|")
    for r in rows:
        shown = json.dumps(r["prompt"])[1:-1].replace("|", "\\|")
        shown = shown if len(shown) <= 48 else shown[:45] + "..."
        print(f"| `{shown}` | {r['tokens']} | {r['max_abs_dlogit']:.2g} | "
              f"{r['max_abs_logit']:.1f} | {r['same_top1']} / {r['tokens']} |")
    t = tokenizer_row
    print(f"\ntokenizer on the eval corpus ({t['corpus_bytes']:,} bytes): Ditto "
          f"{t['tokens_ditto']:,} ids, transformers {t['tokens_transformers']:,}, "
          f"equal: {t['equal']}")
    ok = t["equal"] and all(r["same_top1"] == r["tokens"] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
