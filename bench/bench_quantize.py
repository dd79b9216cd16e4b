"""Benchmark the quantizers on SmolLM2-135M's linear layers; prints one JSON object.

    python bench/bench_quantize.py [--bits 4] [--group-size 256] [--quality]
        [--methods optimal,lloyd,rtn,q4_0,q4_1]

Weights come straight from the bundled SmolLM2 GGUF (``gguf.quants.dequantize``, fp32 [out, in]);
the q/k row permutation of GGUF files is not undone because it permutes whole rows and every
method here works within a row, so errors and times are unchanged. Only quantization is
timed (loading is not); numba kernels are compiled (or loaded from cache) before timing.

Reported per method: ``seconds`` (wall) for all 210 linear matrices, ``cpu_seconds`` (process
CPU time, all threads: on a machine shared with other jobs, cpu_seconds / 2 is what 2 free
cores would take), ``seconds_per_1B_params``,
``total_rel_error`` = Σ‖W − Ŵ‖² / Σ‖W‖² over those matrices, ``bpw`` (payload bits per
weight), and ``token_embd_rel_error`` (the tied embedding/classifier, for the default policy in
docs/QUANT.md). ``q4_0``/``q4_1`` are GGUF's own Q4_0 (symmetric, blocks of 32) and Q4_1
(scale + min, blocks of 32) via ``gguf.quants.quantize``, as an independent reference.

``--quality`` adds an end-to-end check of the embedding policy: the NumPy reference forward
pass (tests/native_reference.py) over ~256 tokens of real text (the token ids of
tests/data/smollm2_tokenizer_golden.jsonl), with the weights of the GGUF exporter
either as they are (reference) or quantized (every matrix; every matrix but token_embd), and
reports the mean KL divergence of the next-token distributions from the reference, top-1
agreement and the text's perplexity.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import gguf
import numba
import numpy as np
from gguf import quants

from ditto_core.model import codebook
from ditto_core.stages.bundled import bundled_model
from ditto_quant_kmeans import quantize_matrix

LINEAR = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def load_matrices(path):
    """name → fp32 [out, in] loader for the linear matrices and token_embd of a GGUF file."""
    reader = gguf.GGUFReader(path)
    out = {}
    for t in reader.tensors:
        if t.name == "token_embd.weight" or any(f".{p}." in t.name for p in LINEAR):
            out[t.name] = (lambda t=t: np.ascontiguousarray(
                quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
    return out


def _gguf_method(kind):
    qtype = getattr(gguf.GGMLQuantizationType, kind)

    def run(W, bits, group_size, name):
        t0, c0 = time.perf_counter(), time.process_time()
        q = quants.quantize(W, qtype)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        Wh = quants.dequantize(q, qtype)
        d = W.astype(np.float64) - Wh
        return float((d * d).sum()), 8.0 * q.nbytes / W.size, dt, dc
    return run


def _kmeans_method(method, cbt):
    def run(W, bits, group_size, name):
        t0, c0 = time.perf_counter(), time.process_time()
        q = quantize_matrix(W, bits, group_size, method, cbt, 0, name)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        norm2 = float(np.dot(W.ravel().astype(np.float64), W.ravel().astype(np.float64)))
        nbytes = codebook.theoretical_bytes(*W.shape, bits, group_size, cbt)
        return q.rel_error * norm2, 8.0 * nbytes / W.size, dt, dc
    return run


def _rtn_method(cbt):
    from ditto_quant_rtn import rtn_matrix

    def run(W, bits, group_size, name):
        t0, c0 = time.perf_counter(), time.process_time()
        q = rtn_matrix(W, bits, group_size, cbt, name)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        norm2 = float((W.astype(np.float64) ** 2).sum())
        nbytes = codebook.theoretical_bytes(*W.shape, bits, group_size, cbt)
        return q.rel_error * norm2, 8.0 * nbytes / W.size, dt, dc
    return run


def _text_ids(n_tokens=256):
    path = Path(__file__).resolve().parents[1] / "tests" / "data" / \
        "smollm2_tokenizer_golden.jsonl"
    ids = [1]  # <|im_start|> is SmolLM2's BOS
    for line in path.read_text().splitlines():
        ids += json.loads(line)["ids_plain"]
        if len(ids) >= n_tokens:
            break
    return np.array(ids[:n_tokens])


def quality(args):
    """KL(p_ref ‖ p_q), top-1 agreement and perplexity of quantized SmolLM2 variants."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ditto_core.stages.plugins import build_registry
    from tests.native_reference import reference_logits

    reg = build_registry()
    ck = reg.get("exporter", "gguf").load(bundled_model("smollm2"))
    ids = _text_ids()
    ref_w = {n: f() for n, f in ck.tensors.items()}

    def run(w):
        w = dict(w, **{"output.weight": w["token_embd.weight"]})  # tied classifier
        logits = reference_logits(ck.config, w, ids).astype(np.float64)
        logits -= logits.max(axis=-1, keepdims=True)
        return logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))  # log-softmax

    ref = run(ref_w)
    p_ref = np.exp(ref)

    def metrics(logp):
        kl = float(np.mean(np.sum(p_ref * (ref - logp), axis=-1)))
        top1 = float(np.mean(logp.argmax(-1) == ref.argmax(-1)))
        nll = -float(np.mean(logp[np.arange(len(ids) - 1), ids[1:]]))
        return {"kl_vs_f32": kl, "top1_agreement": top1, "perplexity": math.exp(nll)}

    def rebuild(q):
        rows, cols = q.indices.shape
        return q.codebooks[np.arange(rows)[:, None], np.arange(cols)[None, :] // q.group_size,
                           q.indices]

    out = {"tokens": int(len(ids)), "f32": metrics(ref)}
    quantizers = {"kmeans_optimal": lambda W, n: quantize_matrix(W, args.bits, args.group_size,
                                                                 "optimal", args.codebook_type,
                                                                 0, n)}
    try:
        from ditto_quant_rtn import rtn_matrix
        quantizers["rtn"] = lambda W, n: rtn_matrix(W, args.bits, args.group_size,
                                                    args.codebook_type, n)
    except ImportError:
        pass
    embd = ref_w["token_embd.weight"]
    for label, fn in quantizers.items():
        w = {n: (rebuild(fn(v, n)) if v.ndim == 2 and n != "token_embd.weight" else v)
             for n, v in ref_w.items()}
        out[f"{label}_keep_token_embd"] = metrics(run(w))
        w["token_embd.weight"] = rebuild(fn(embd, "token_embd.weight"))
        out[f"{label}_all"] = metrics(run(w))
    # the embedding policy: linear layers at b, token_embd at other bit widths (optimal)
    w = {n: (rebuild(quantizers["kmeans_optimal"](v, n)) if v.ndim == 2 else v)
         for n, v in ref_w.items()}
    for b in [int(x) for x in args.embd_bits.split(",") if x]:
        w["token_embd.weight"] = rebuild(quantize_matrix(embd, b, args.group_size, "optimal",
                                                         args.codebook_type, 0, "e"))
        out[f"kmeans_optimal_token_embd_b{b}"] = metrics(run(w))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=256)
    ap.add_argument("--codebook-type", default="f16")
    ap.add_argument("--methods", default="optimal,lloyd,rtn,q4_0,q4_1")
    ap.add_argument("--embd-bits", default="4,5,6",
                    help="bit widths at which to report token_embd's error (optimal)")
    ap.add_argument("--quality", action="store_true",
                    help="also measure KL / top-1 / perplexity of quantized models (slow)")
    ap.add_argument("--quality-only", action="store_true", help="only the --quality part")
    args = ap.parse_args(argv)

    if args.quality_only:
        json.dump({"quality": quality(args)}, sys.stdout, indent=2)
        print()
        return
    mats = load_matrices(bundled_model("smollm2"))
    names = [n for n in mats if n != "token_embd.weight"]
    makers = {"optimal": lambda: _kmeans_method("optimal", args.codebook_type),
              "lloyd": lambda: _kmeans_method("lloyd", args.codebook_type),
              "rtn": lambda: _rtn_method(args.codebook_type),  # needs the test plugin rtn
              "q4_0": lambda: _gguf_method("Q4_0"), "q4_1": lambda: _gguf_method("Q4_1")}
    methods = [m for m in args.methods.split(",") if m]
    runners = {m: makers[m]() for m in methods}
    warm = np.random.default_rng(0).standard_normal((4, 608)).astype(np.float32)
    for m in methods:  # compile / load numba caches outside the timed region
        runners[m](warm, args.bits, args.group_size, "warmup")

    result = {"model": "SmolLM2-135M-Instruct (bundled GGUF)", "bits": args.bits,
              "group_size": args.group_size, "codebook_type": args.codebook_type,
              "numba_threads": numba.get_num_threads(), "cpu_count": os.cpu_count(),
              "n_matrices": len(names), "load_average_before": os.getloadavg(),
              "methods": {}}
    totals = {m: [0.0, 0.0, 0.0, 0.0, 0.0] for m in methods}  # s, sse, bits, weights, cpu s
    norm2 = 0.0
    n_params = 0
    for name in names:
        W = mats[name]()
        norm2 += float(np.dot(W.ravel().astype(np.float64), W.ravel().astype(np.float64)))
        n_params += W.size
        for m in methods:
            sse, bpw, dt, dc = runners[m](W, args.bits, args.group_size, name)
            totals[m][0] += dt
            totals[m][1] += sse
            totals[m][2] += bpw * W.size
            totals[m][3] += W.size
            totals[m][4] += dc
    E = mats["token_embd.weight"]()
    e2 = float(np.dot(E.ravel().astype(np.float64), E.ravel().astype(np.float64)))
    for m in methods:
        sec, sse, bits, nw, cpu = totals[m]
        row = {"seconds": round(sec, 3), "seconds_per_1B_params": round(sec / n_params * 1e9, 1),
               "cpu_seconds": round(cpu, 3), "total_rel_error": sse / norm2, "bpw": bits / nw}
        esse = runners[m](E, args.bits, args.group_size, "token_embd.weight")[0]
        row["token_embd_rel_error"] = esse / e2
        result["methods"][m] = row
    if "optimal" in methods:
        opt = result["methods"]["optimal"]["total_rel_error"]
        for m in methods:
            result["methods"][m]["error_vs_optimal"] = result["methods"][m]["total_rel_error"] / opt
    result["load_average_after"] = os.getloadavg()
    result["linear_params"] = n_params
    result["token_embd_params"] = E.size
    embd = {}
    for b in [int(x) for x in args.embd_bits.split(",") if x]:
        sse, bpw, _, _ = _kmeans_method("optimal", args.codebook_type)(E, b, args.group_size,
                                                                        "e")
        embd[f"b{b}"] = {"rel_error": sse / e2, "bpw": bpw}
    result["token_embd_optimal_by_bits"] = embd
    if args.quality:
        result["quality"] = quality(args)
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
