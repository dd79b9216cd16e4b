"""Benchmark: ``ditto serve`` beside llama-server, an editor replay and an edit workload.

One command (the real measurement, on a quiet machine; ~15-25 min):

    python bench/bench_serve.py --write-results

Smoke run (a few minutes): ``python bench/bench_serve.py --quick``.

Both servers are started by this script on free loopback ports with the same model at about
the same file size and the same threads (``--threads``, default 2), one slot each and a context
of ``--ctx`` (4096) positions:

- **Ditto**: the default build of the bundled model (``ditto build qwen2.5-coder-0.5b
  --quantizer kmeans --blas openblas``: b = 4, G = 256, int8 codebooks), ``ditto serve BUILD
  --slots 1 --ctx 4096 --threads T``;
- **llama.cpp**: ``llama-server`` from the same llama.cpp source as bench_llamacpp.py, on the
  Q4_0 file ``llama-quantize --allow-requantize`` makes from the GGUF the bundled package ships,
  ``llama-server -m Q4_0.gguf -np 1 -c 4096 -t T -tb T`` (its other options at their defaults).

Requests go to the servers in turn (the first server alternates from step to step), so a load
change hits both alike.

**Editor replay** (``editor``): a real source file (bench/data/serve/allocate.py.txt, a copy of
ditto_core/allocate.py) revisited line by line as llama.vim (autoload/llama.vim, ``llama#fim``)
asks for a completion at each line: at step k the user has typed the first word of line k (the
cursor after it), so ``input_prefix`` is the up to 256 lines before line k (llama.vim's
``n_prefix``), ``prompt`` the current line up to the cursor, ``input_suffix`` the rest of the
line (empty) and the next 64 lines (``n_suffix``); a blank line is sent as llama.vim sends a
whitespace-only line (empty ``prompt``, ``n_indent`` 0). ``input_extra`` holds llama.vim's ring
buffer of 32-line chunks of other files (bench/data/serve/types.py.txt, resources.py.txt): two
at the start and one more every ``--ring-every`` steps (up to four), each change announced
first by llama.vim's warm-up request (``n_predict`` 0, empty prefix and suffix, ``samplers`` []).
Every field of llama.vim's request is sent (``n_indent``, ``top_k``, ``top_p``, ``samplers``,
``stream`` false, ``cache_prompt`` true, ``t_max_prompt_ms``, ``t_max_predict_ms``,
``response_fields``) with three changes so that both servers do the same work and outputs can
be compared: ``n_predict`` 32, greedy (``temperature`` 0, ``top_k`` 1), and the time limits 0
(off; llama-server does not implement ``t_max_prompt_ms``, and a time-limited completion's
length depends on speed). Per request: the wall latency seen by the client, the prompt tokens
evaluated (``timings/prompt_n``) and taken from the cache (``timings/cache_n``), the text.
Reported: p50 and p95 latency, mean prompt tokens evaluated, and how many completions are the
same text on both servers (different 4-bit weights: agreement is not expected everywhere).

**Edit workload** (``edit``): "rewrite this function with one small change" — six functions of
this repository (bench/data/serve/edit_functions.py.txt) each with an instruction, as a chat
(the model's ChatML template with Qwen's default system prompt, tokenized once by Ditto's
``/tokenize`` and sent to every server as the same token ids to ``/completion``), greedy,
``n_predict`` 256, ``return_tokens``. Servers: Ditto ``--spec none`` and ``--spec ngram``,
llama-server without speculation and with its n-gram lookup (``--spec-type ngram-simple
--spec-draft-n-max 64``, the setting its docs/speculative.md gives for rewriting code).
Decode tok/s = ``timings.predicted_n / predicted_ms``; median over rounds per prompt, then the
median over prompts; each speculating server's tokens are checked against its plain twin.

**Fresh text** (``fresh``): six chat prompts asking for new code (FRESH_TASKS: nothing in the
prompt to copy, so prompt-lookup drafts mostly miss), on Ditto ``--spec none`` and ``--spec
ngram`` only, measured as the edit workload: the speculating server must not be slower
(issue #24: at least 0.95×) and must give the same tokens.

Results: JSON in bench/results/serve_qwen2.5-coder-0.5b.json (every sample, date, CPU, load
average before and after), markdown tables on stdout, with ``--write-results`` also in
docs/RESULTS.md between the ``bench_serve`` markers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
DATA = ROOT / "bench" / "data" / "serve"
REPLAY_FILE = DATA / "allocate.py.txt"
EXTRA_FILES = [DATA / "types.py.txt", DATA / "resources.py.txt"]
EDIT_FILE = DATA / "edit_functions.py.txt"
#: llama.vim's defaults: lines before / after the cursor, ring-buffer chunk size (lines)
N_PREFIX, N_SUFFIX, RING_CHUNK = 256, 64, 64
RING_MAX = 4
DEFAULT_LLAMA_BIN = Path("/root/.cache/ditto-peers/llama-cpp-python-0.3.36/build/bin")
LLAMA_SPEC = ["--spec-type", "ngram-simple", "--spec-draft-n-max", "64"]
#: the instruction for each function of EDIT_FILE, in its order
EDIT_INSTRUCTIONS = {
    "common_prefix": "rename the parameters a and b to left and right",
    "find_stop": "rename the variable best to first",
    "partial_stop": "return 0 at once when stops is empty",
    "ngram_draft": "make n_max default to 4",
    "select_fields": "rename the variable cur to node",
    "calibration_text": "name the variable digest sha256_hex",
}
SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

#: The fresh-text workload: requests for new code, with nothing in the prompt to copy, where
#: prompt-lookup drafts mostly miss (issue #24: speculation must not slow these down).
FRESH_TASKS = {
    "parse_duration": "Write a Python function parse_duration(text) that turns strings such "
                      "as '1h30m', '45s' or '2d4h' into a number of seconds.",
    "lru_cache": "Write a Python class LRUCache with a fixed capacity and get(key) and "
                 "put(key, value) methods that evict the least recently used entry.",
    "palindrome": "Write a Python function that returns the longest palindromic substring "
                  "of a string.",
    "merge_intervals": "Write a Python function merge_intervals(intervals) that merges "
                       "overlapping closed intervals given as (start, end) pairs.",
    "csv_mean": "Write a Python function that reads a CSV file and returns the mean of the "
                "numbers in a column given by its header name, skipping empty cells.",
    "toposort": "Write a Python function topological_sort(graph) for a dict that maps each "
                "node to the list of nodes it depends on; raise ValueError on a cycle.",
}
MARK_BEGIN, MARK_END = "<!-- bench_serve:begin -->", "<!-- bench_serve:end -->"


# ----------------------------------------------------------------------------- the servers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(name: str, cmd: list[str], port: int, log: Path, env: dict | None = None,
                 timeout: float = 300) -> SimpleNamespace:
    """Start ``cmd`` (a server listening on ``port``) with its output in ``log`` and wait until
    ``/health`` answers 200 (llama-server answers 503 while it loads)."""
    fh = open(log, "w")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                            env=dict(os.environ, **(env or {})))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fh.close()
            sys.exit(f"error: {name} exited {proc.returncode}; see {log}:\n"
                     + log.read_text()[-2000:])
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return SimpleNamespace(name=name, proc=proc, url=url, log=fh, cmd=cmd,
                                       client=httpx.Client(base_url=url, timeout=600))
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    sys.exit(f"error: {name} did not answer /health within {timeout:.0f} s; see {log}")


def stop_server(srv) -> None:
    srv.client.close()
    if srv.proc.poll() is None:
        srv.proc.send_signal(signal.SIGTERM)
        try:
            srv.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait()
    srv.log.close()


def ditto_server(name: str, build: Path, threads: int, ctx: int, work: Path,
                 spec: str = "none"):
    port = free_port()
    cmd = [sys.executable, "-c", "from ditto_core.cli.main import main; main()", "serve", str(build),
           "--port", str(port), "--threads", str(threads), "--ctx", str(ctx), "--slots", "1",
           "--spec", spec]
    env = {"OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    return start_server(name, cmd, port, work / f"{name}.log", env)


def llama_server(name: str, bin_dir: Path, gguf: Path, threads: int, ctx: int, work: Path,
                 spec: bool = False, lib_dir: Path | None = None, cache_reuse: int = 0):
    """llama-server on ``gguf``; ``lib_dir`` goes first on LD_LIBRARY_PATH (the binaries'
    RUNPATH gives way to it) to load its libggml-cpu.so instead of the peer build's;
    ``cache_reuse`` > 0 passes ``--cache-reuse`` (KV chunks of at least that many tokens
    reused by shifting them, as llama.vim's README recommends)."""
    port = free_port()
    cmd = [str(bin_dir / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port",
           str(port), "-np", "1", "-c", str(ctx), "-t", str(threads), "-tb", str(threads)]
    if spec:
        cmd += LLAMA_SPEC
    if cache_reuse > 0:
        cmd += ["--cache-reuse", str(cache_reuse)]
    from bench_llamacpp import llama_env

    return start_server(name, cmd, port, work / f"{name}.log", llama_env(lib_dir))


def post(srv, path: str, body: dict) -> tuple[dict, float]:
    """POST ``body`` as JSON; (the response's JSON, wall seconds). Exits on an HTTP error."""
    t0 = time.perf_counter()
    r = srv.client.post(path, json=body)
    dt = time.perf_counter() - t0
    if r.status_code != 200:
        sys.exit(f"error: {srv.name} {path} answered {r.status_code}: {r.text[:500]}")
    return r.json(), dt


# --------------------------------------------------------------------------- editor replay

def vim_context(lines: list[str], k: int) -> dict:
    """llama.vim's local context (``s:fim_ctx_local``) with the cursor after the first word of
    line ``k`` (0-based) and the rest of that line not typed yet."""
    line = lines[k]
    m = re.match(r"\s*\S+", line)
    if m is None:  # whitespace only: llama.vim starts at the beginning of the line
        cur_prefix, indent = "", 0
    else:
        cur_prefix, indent = m.group(0), len(line) - len(line.lstrip())
    return {"prefix": "".join(s + "\n" for s in lines[max(0, k - N_PREFIX):k]),
            "middle": cur_prefix,
            "suffix": "" + "\n" + "\n".join(lines[k + 1:k + 1 + N_SUFFIX]) + "\n",
            "indent": indent, "expected": line[len(cur_prefix):]}


def ring_chunk(i: int) -> dict:
    """The i-th chunk of llama.vim's ring buffer: ``RING_CHUNK / 2`` lines of one of the other
    files (``s:pick_chunk``), as ``input_extra`` sends it."""
    path = EXTRA_FILES[i % len(EXTRA_FILES)]
    lines = path.read_text().splitlines()
    n = RING_CHUNK // 2
    start = (i // len(EXTRA_FILES)) * n % max(1, len(lines) - n)
    text = "".join(s + "\n" for s in lines[start:start + n])
    return {"text": text, "time": [1700000000 + i, 0], "filename": path.name.removesuffix(".txt")}


def infill_request(ctx: dict, extra: list[dict], n_predict: int) -> dict:
    """llama.vim's FIM request (``llama#fim``), greedy and without time limits."""
    return {"input_prefix": ctx["prefix"], "input_suffix": ctx["suffix"], "input_extra": extra,
            "prompt": ctx["middle"], "n_predict": n_predict, "n_indent": ctx["indent"],
            "temperature": 0.0, "top_k": 1, "top_p": 0.90, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
            "t_max_prompt_ms": 0, "t_max_predict_ms": 0,
            "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms",
                                "timings/prompt_per_token_ms", "timings/prompt_per_second",
                                "timings/predicted_n", "timings/predicted_ms",
                                "timings/predicted_per_token_ms",
                                "timings/predicted_per_second", "truncated",
                                "timings/cache_n"]}


def warmup_request(extra: list[dict]) -> dict:
    """llama.vim's ring-buffer update (``s:ring_update``): the extra context alone into the
    cache."""
    return {"input_prefix": "", "input_suffix": "", "input_extra": extra, "prompt": "",
            "n_predict": 0, "temperature": 0.0, "stream": False, "samplers": [],
            "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
            "response_fields": [""]}


def editor_replay(servers: list, first: int, steps: int, n_predict: int,
                  ring_every: int) -> dict:
    """Replay ``steps`` lines from line ``first`` on every server; {server: [sample]}."""
    lines = REPLAY_FILE.read_text().splitlines()
    steps = min(steps, len(lines) - first)
    out = {s.name: {"requests": [], "warmups": []} for s in servers}
    n_ring = 0
    extra: list[dict] = []
    for step in range(steps):
        k = first + step
        order = servers if step % 2 == 0 else servers[::-1]
        if n_ring < RING_MAX and (step == 0 or step % ring_every == 0):
            while True:  # two chunks at the start, one at each later update
                extra.append(ring_chunk(n_ring))
                n_ring += 1
                if n_ring >= 2:
                    break
            for s in order:
                _, dt = post(s, "/infill", warmup_request(extra))
                out[s.name]["warmups"].append({"step": step, "n_extra": len(extra),
                                               "latency_s": dt})
        ctx = vim_context(lines, k)
        body = infill_request(ctx, extra, n_predict)
        for s in order:
            r, dt = post(s, "/infill", body)
            out[s.name]["requests"].append({
                "line": k + 1, "latency_s": dt, "prompt_n": r.get("timings/prompt_n"),
                "prompt_ms": r.get("timings/prompt_ms"),
                "predicted_n": r.get("timings/predicted_n"),
                "predicted_ms": r.get("timings/predicted_ms"),
                "cache_n": r.get("timings/cache_n"), "truncated": r.get("truncated"),
                "content": r.get("content", "")})
        print(f"editor {step + 1}/{steps} line {k + 1}: " + "  ".join(
            f"{s.name} {out[s.name]['requests'][-1]['latency_s'] * 1e3:.0f} ms "
            f"(p {out[s.name]['requests'][-1]['prompt_n']})" for s in servers),
            file=sys.stderr)
    return out


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics."""
    ys = sorted(xs)
    if len(ys) == 1:
        return ys[0]
    pos = (len(ys) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


def editor_summary(samples: dict) -> dict:
    names = list(samples)
    reqs = {n: samples[n]["requests"] for n in names}
    summ = {}
    for n in names:
        lat = [r["latency_s"] * 1e3 for r in reqs[n]]
        summ[n] = {"n": len(lat), "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95),
                   "mean_ms": statistics.fmean(lat),
                   "mean_prompt_n": statistics.fmean(r["prompt_n"] or 0 for r in reqs[n]),
                   "mean_cache_n": statistics.fmean(r["cache_n"] or 0 for r in reqs[n]),
                   "mean_predicted_n": statistics.fmean(r["predicted_n"] or 0
                                                        for r in reqs[n]),
                   "warmup_mean_ms": statistics.fmean(w["latency_s"] * 1e3
                                                      for w in samples[n]["warmups"])
                   if samples[n]["warmups"] else None}
    if len(names) == 2:
        a, b = reqs[names[0]], reqs[names[1]]
        same = sum(x["content"] == y["content"] for x, y in zip(a, b))
        first_line = sum(x["content"].split("\n", 1)[0] == y["content"].split("\n", 1)[0]
                         for x, y in zip(a, b))
        summ["agreement"] = {"same_text": same, "same_first_line": first_line, "of": len(a)}
    return summ


# --------------------------------------------------------------------------- edit workload

def edit_tasks() -> list[tuple[str, str, str]]:
    """(function name, instruction, source) of every function in EDIT_FILE."""
    src = EDIT_FILE.read_text()
    out = []
    for chunk in src.split("\n\n\n"):
        name = re.match(r"def (\w+)", chunk).group(1)
        out.append((name, EDIT_INSTRUCTIONS[name], chunk.rstrip("\n") + "\n"))
    return out


def chat_text(instruction: str, source: str) -> str:
    """The ChatML prompt of Qwen2.5-Coder's template (its default system prompt) asking for
    the rewritten function."""
    user = (f"Rewrite this Python function with one change: {instruction}. Answer with the "
            f"whole rewritten function in one ```python block and nothing else.\n\n"
            f"```python\n{source}```")
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n")


def fresh_chat_text(instruction: str) -> str:
    """The ChatML prompt (Qwen's default system prompt) asking for new code."""
    user = f"{instruction} Answer with the code in one ```python block and nothing else."
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n")


def edit_workload(servers: list, prompts: list[tuple[str, list[int]]], n_predict: int,
                  rounds: int, label: str = "edit") -> dict:
    """Every prompt (token ids) on every server, ``rounds`` times; {server: {prompt: [run]}}."""
    out = {s.name: {name: [] for name, _ in prompts} for s in servers}
    i = 0
    for rnd in range(rounds):
        for name, ids in prompts:
            order = servers[i % len(servers):] + servers[:i % len(servers)]
            i += 1
            for s in order:
                body = {"prompt": ids, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
                        "return_tokens": True, "cache_prompt": True, "stream": False}
                r, dt = post(s, "/completion", body)
                t = r["timings"]
                run = {"latency_s": dt, "predicted_n": t["predicted_n"],
                       "predicted_ms": t["predicted_ms"],
                       "tok_per_s": t["predicted_n"] / t["predicted_ms"] * 1e3,
                       "prompt_n": t["prompt_n"], "tokens": r.get("tokens", []),
                       "content": r["content"]}
                for k in ("draft_n", "draft_n_accepted"):
                    if k in t:
                        run[k] = t[k]
                out[s.name][name].append(run)
                print(f"{label} round {rnd + 1}/{rounds} {name} {s.name}: "
                      f"{run['predicted_n']} tok, {run['tok_per_s']:.1f} tok/s"
                      + (f", drafts {run['draft_n_accepted']}/{run['draft_n']}"
                         if "draft_n" in run else ""), file=sys.stderr)
    return out


def edit_summary(samples: dict, pairs: dict) -> dict:
    """Per server: median tok/s per prompt and over prompts; per speculating server: the
    speed-up over its plain twin and whether every run's tokens equal the twin's."""
    summ = {}
    for n, per in samples.items():
        med = {p: statistics.median(r["tok_per_s"] for r in runs) for p, runs in per.items()}
        drafts = [(r.get("draft_n", 0), r.get("draft_n_accepted", 0))
                  for runs in per.values() for r in runs]
        summ[n] = {"tok_per_s_by_prompt": med, "tok_per_s": statistics.median(med.values()),
                   "tokens_by_prompt": {p: runs[0]["predicted_n"] for p, runs in per.items()},
                   "draft_n": sum(d for d, _ in drafts),
                   "draft_n_accepted": sum(a for _, a in drafts)}
    for spec, plain in pairs.items():
        if spec in samples and plain in samples:
            same = all(r["tokens"] == samples[plain][p][0]["tokens"]
                       for p, runs in samples[spec].items() for r in runs)
            ratios = [summ[spec]["tok_per_s_by_prompt"][p] / summ[plain]["tok_per_s_by_prompt"][p]
                      for p in samples[spec]]
            summ[spec]["speedup"] = summ[spec]["tok_per_s"] / summ[plain]["tok_per_s"]
            summ[spec]["speedup_by_prompt"] = dict(zip(samples[spec], ratios))
            summ[spec]["identical_to"] = {plain: same}
    return summ


# -------------------------------------------------------------------------------- reporting

LABELS = {"ditto": "Ditto `ditto serve` (default build)",
          "llama": "llama-server (Q4_0)",
          "ditto-spec": "Ditto `--spec ngram`",
          "llama-spec": "llama-server `--spec-type ngram-simple`"}


def decode_rows(s: dict, names: tuple[str, ...]) -> list[str]:
    """The markdown rows of a decode workload's summary ``s`` (edit_summary) for the servers
    ``names`` that ran, with the header."""
    rows = ["| server | decode tok/s (median of prompts) | per prompt | draft tokens "
            "accepted / proposed | speed-up | same tokens as without speculation |",
            "|---|---|---|---|---|---|"]
    for n in names:
        if n not in s:
            continue
        x = s[n]
        per = ", ".join(f"{v:.1f}" for v in x["tok_per_s_by_prompt"].values())
        acc = (f"{x['draft_n_accepted']} / {x['draft_n']}" if x["draft_n"] else "—")
        sp = f"{x['speedup']:.2f}×" if "speedup" in x else "—"
        same = ("yes" if all(x["identical_to"].values()) else "**no**") \
            if "identical_to" in x else "—"
        rows.append(f"| {LABELS[n]} | {x['tok_per_s']:.1f} | {per} | {acc} | {sp} | {same} |")
    return rows


def tables(out: dict) -> str:
    parts = []
    e = out.get("editor")
    if e:
        s = e["summary"]
        # runs before timings/cache_n was read kept tokens_cached, which the two servers
        # filled differently then (Ditto: prompt tokens reused; llama-server: tokens held)
        key, head = (("mean_cache_n", "mean prompt tokens from the cache")
                     if "mean_cache_n" in (s.get("ditto") or s.get("llama") or {})
                     else ("mean_tokens_cached", "mean tokens cached"))
        rows = ["| server | file MB | requests | p50 ms | p95 ms | mean ms | mean prompt tokens "
                f"evaluated | {head} | mean tokens generated |",
                "|---|---|---|---|---|---|---|---|---|"]
        for n in ("ditto", "llama"):
            if n in s:
                x = s[n]
                rows.append(f"| {LABELS[n]} | {out['files'][n]['bytes'] / 1e6:.0f} | {x['n']} | "
                            f"{x['p50_ms']:.0f} | {x['p95_ms']:.0f} | {x['mean_ms']:.0f} | "
                            f"{x['mean_prompt_n']:.0f} | {x[key]:.0f} | "
                            f"{x['mean_predicted_n']:.1f} |")
        ag = s.get("agreement")
        parts.append("Editor replay (llama.vim `/infill` requests, one per line, "
                     f"n_predict {e['n_predict']}, greedy):\n\n" + "\n".join(rows)
                     + (f"\n\nSame completion text on both servers: {ag['same_text']} of "
                        f"{ag['of']} requests (same first line: {ag['same_first_line']})."
                        if ag else ""))
    d = out.get("edit")
    if d:
        s = d["summary"]
        rows = decode_rows(s, ("ditto", "ditto-spec", "llama", "llama-spec"))
        parts.append(f"Edit workload ({len(d['prompts'])} \"rewrite this function with one "
                     f"change\" chat prompts, greedy, n_predict {d['n_predict']}, "
                     f"{d['rounds']} round(s)):\n\n" + "\n".join(rows))
    f = out.get("fresh")
    if f:
        s = f["summary"]
        rows = decode_rows(s, ("ditto", "ditto-spec"))
        parts.append(f"Fresh text ({len(f['prompts'])} chat prompts asking for new code, "
                     f"nothing to copy; greedy, n_predict {f['n_predict']}, {f['rounds']} "
                     f"round(s)):\n\n" + "\n".join(rows))
    t = targets(out)
    if t:
        parts.append("Targets: " + "; ".join(f"{k}: {'met' if v else '**not met**'}"
                                             for k, v in t.items()) + ".")
    return "\n\n".join(parts)


def targets(out: dict) -> dict:
    """Issue #24's targets, each True when met: editor p50 and p95 latency at most
    llama-server's; ``--spec ngram`` at least 1.5x ``--spec none`` on the edit workload with
    the same tokens."""
    t = {}
    e = out.get("editor", {}).get("summary", {})
    if "ditto" in e and "llama" in e:
        for q in ("p50", "p95"):
            t[f"editor {q} ≤ llama-server's"] = e["ditto"][f"{q}_ms"] <= e["llama"][f"{q}_ms"]
    d = out.get("edit", {}).get("summary", {}).get("ditto-spec")
    if d and "speedup" in d:
        t["--spec ngram ≥ 1.5× with identical output"] = (d["speedup"] >= 1.5
                                                          and all(d["identical_to"].values()))
    f = out.get("fresh", {}).get("summary", {}).get("ditto-spec")
    if f and "speedup" in f:
        t["--spec ngram ≥ 0.95× on fresh text with identical output"] = (
            f["speedup"] >= 0.95 and all(f["identical_to"].values()))
    return t


def write_results(md: Path, text: str) -> None:
    """Replace the block between the bench_serve markers in ``md`` (appended when absent)."""
    doc = md.read_text()
    block = f"{MARK_BEGIN}\n{text}\n{MARK_END}"
    if MARK_BEGIN in doc:
        pre, rest = doc.split(MARK_BEGIN, 1)
        doc = pre + block + rest.split(MARK_END, 1)[1]
    else:
        doc = (doc.rstrip("\n") + "\n\n## `ditto serve` vs llama-server on Qwen2.5-Coder-0.5B "
               "(bench/bench_serve.py)\n\n" + block + "\n")
    md.write_text(doc)


def cpu_info() -> dict:
    """CPU model name, the SIMD flags that matter to the kernels, and the cores this process
    may use."""
    from ditto_core.eval.bench import cpu_name

    from bench_llamacpp import cpu_flags

    flags = cpu_flags()
    keep = ["avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni",
            "avx512vbmi", "avx512_bf16", "avx512_fp16", "amx_int8", "amx_bf16"]
    return {"name": cpu_name(), "flags": [f for f in keep if f in flags],
            "cores": len(os.sched_getaffinity(0))}


def llama_version(bin_dir: Path) -> str:
    p = subprocess.run([str(bin_dir / "llama-server"), "--version"], capture_output=True,
                       text=True)
    return " ".join((p.stdout + p.stderr).split())[-300:]


# -------------------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="editor,edit,fresh",
                    help="comma-separated: editor, edit, fresh")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--first-line", type=int, default=1, help="first replayed line (1-based)")
    ap.add_argument("--steps", type=int, default=224, help="editor steps (lines replayed)")
    ap.add_argument("--n-predict", type=int, default=32, help="editor: tokens per completion")
    ap.add_argument("--ring-every", type=int, default=32,
                    help="editor: a new ring-buffer chunk (and warm-up) every N steps")
    ap.add_argument("--edit-tokens", type=int, default=256, help="edit: n_predict")
    ap.add_argument("--edit-prompts", type=int, default=len(EDIT_INSTRUCTIONS))
    ap.add_argument("--rounds", type=int, default=2, help="edit: rounds over the prompts")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 6 editor steps, 2 edit prompts of 48 tokens, 1 round")
    ap.add_argument("--llama-bin", type=Path, default=DEFAULT_LLAMA_BIN)
    ap.add_argument("--llama-cache-reuse", type=int, default=0, metavar="N",
                    help="run llama-server with --cache-reuse N (0: without, as by default)")
    ap.add_argument("--ggml-cpu", default="noamx",
                    help="noamx: load libggml-cpu.so built without AMX (ggml_cpu_for_isa); "
                         "peer: the one of --llama-bin")
    ap.add_argument("--work", type=Path, default=ROOT / "bench" / ".cache" / "serve",
                    help="builds, GGUF files and server logs")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON results [default: bench/results/serve_MODEL.json; with --quick "
                         "WORK/quick.json]")
    ap.add_argument("--write-results", action="store_true",
                    help="also write the tables into docs/RESULTS.md")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.first_line, args.edit_tokens = 6, 40, 48
        args.edit_prompts, args.rounds, args.ring_every = 2, 1, 3
    parts = args.parts.split(",")
    args.work.mkdir(parents=True, exist_ok=True)
    out_path = args.out or (args.work / "quick.json" if args.quick else
                            ROOT / "bench" / "results" / f"serve_{args.model}.json")

    from bench_llamacpp import ggml_cpu_for_isa, llama_models

    from ditto_core.api import build as ditto_build

    build_dir = args.work / f"{args.model}-ditto-default"
    t0 = time.perf_counter()
    rec = ditto_build(args.model, out=build_dir, quantizer="kmeans", blas="openblas").record
    print(f"ditto build: {time.perf_counter() - t0:.0f} s, bpw {rec['bpw']:.3f}",
          file=sys.stderr)
    gguf = llama_models(args.llama_bin, args.work, ["Q4_0"], args.model)["Q4_0"]
    files = {"ditto": {"path": str(build_dir / "model.ditto"), "bpw": rec["bpw"],
                       "bytes": (build_dir / "model.ditto").stat().st_size},
             "llama": {"path": str(gguf), "bytes": gguf.stat().st_size}}
    th, ctx = args.threads, args.ctx
    lib_dir = ggml_cpu_for_isa(args.llama_bin, args.work) if args.ggml_cpu == "noamx" \
        else None
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "load_average_start": os.getloadavg(), "cpu": cpu_info(), "model": args.model,
           "threads": th, "ctx": ctx, "quick": args.quick, "files": files,
           "llama_server_version": llama_version(args.llama_bin),
           "llama_ggml_cpu": str(lib_dir / "libggml-cpu.so") if lib_dir else "peer build",
           "command": "python bench/bench_serve.py " + " ".join(argv if argv is not None
                                                                else sys.argv[1:])}
    servers = {}
    try:
        servers["ditto"] = ditto_server("ditto", build_dir, th, ctx, args.work)
        servers["llama"] = llama_server("llama", args.llama_bin, gguf, th, ctx, args.work,
                                        lib_dir=lib_dir, cache_reuse=args.llama_cache_reuse)
        out["server_commands"] = {n: s.cmd for n, s in servers.items()}
        if "editor" in parts:
            samples = editor_replay([servers["ditto"], servers["llama"]], args.first_line - 1,
                                    args.steps, args.n_predict, args.ring_every)
            out["editor"] = {"file": str(REPLAY_FILE.relative_to(ROOT)),
                             "first_line": args.first_line, "steps": args.steps,
                             "n_predict": args.n_predict, "ring_every": args.ring_every,
                             "n_prefix": N_PREFIX, "n_suffix": N_SUFFIX,
                             "summary": editor_summary(samples), "samples": samples}
        def token_prompts(texts: list[tuple[str, str]]) -> list[tuple[str, list[int]]]:
            """(name, ids) of each chat text, the same ids on both servers (checked)."""
            out_ids = []
            for name, text in texts:
                ids, _ = post(servers["ditto"], "/tokenize",
                              {"content": text, "parse_special": True})
                lids, _ = post(servers["llama"], "/tokenize",
                               {"content": text, "parse_special": True})
                if ids["tokens"] != lids["tokens"]:
                    sys.exit(f"error: the servers tokenize the {name} prompt differently")
                out_ids.append((name, ids["tokens"]))
            return out_ids

        if "edit" in parts or "fresh" in parts:
            servers["ditto-spec"] = ditto_server("ditto-spec", build_dir, th, ctx, args.work,
                                                 spec="ngram")
            props = servers["ditto-spec"].client.get("/props").json()["speculative"]
        if "fresh" in parts:
            names = list(FRESH_TASKS)[:args.edit_prompts]
            fprompts = token_prompts([(n, fresh_chat_text(FRESH_TASKS[n])) for n in names])
            samples = edit_workload([servers["ditto"], servers["ditto-spec"]], fprompts,
                                    args.edit_tokens, args.rounds, label="fresh")
            out["fresh"] = {"n_predict": args.edit_tokens, "rounds": args.rounds,
                            "prompts": {n: {"instruction": FRESH_TASKS[n],
                                            "prompt_tokens": len(ids)}
                                        for n, ids in fprompts},
                            "ditto_spec_props": props,
                            "summary": edit_summary(samples, {"ditto-spec": "ditto"}),
                            "samples": samples}
        if "edit" in parts:
            servers["llama-spec"] = llama_server("llama-spec", args.llama_bin, gguf, th, ctx,
                                                 args.work, spec=True, lib_dir=lib_dir)
            out["server_commands"] = {n: s.cmd for n, s in servers.items()}
            tasks = edit_tasks()[:args.edit_prompts]
            prompts = token_prompts([(name, chat_text(instr, src)) for name, instr, src in tasks])
            order = [servers[n] for n in ("ditto", "ditto-spec", "llama", "llama-spec")]
            samples = edit_workload(order, prompts, args.edit_tokens, args.rounds)
            out["edit"] = {"n_predict": args.edit_tokens, "rounds": args.rounds,
                           "prompts": {n: {"instruction": i, "prompt_tokens": len(ids)}
                                       for (n, i, _), (_, ids) in zip(tasks, prompts)},
                           "ditto_spec_props": props, "llama_spec_args": LLAMA_SPEC,
                           "summary": edit_summary(samples, {"ditto-spec": "ditto",
                                                             "llama-spec": "llama"}),
                           "samples": samples}
    finally:
        for s in servers.values():
            stop_server(s)
    out["load_average_end"] = os.getloadavg()
    out["targets"] = targets(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    md = tables(out)
    print(md)
    print(f"\nJSON: {out_path}", file=sys.stderr)
    if args.write_results:
        cpu = out["cpu"]
        note = (f"`{out['command']}` ({out['date'][:16]} UTC; {cpu['name']}, "
                f"{', '.join(cpu['flags'])}; {th} threads per server, {cpu['cores']} cores, "
                f"the servers taking turns; load average {out['load_average_start'][0]:.2f} at "
                f"the start, {out['load_average_end'][0]:.2f} at the end; JSON in "
                f"bench/results/{out_path.name}). Ditto: `ditto build {args.model} "
                f"--quantizer kmeans --blas openblas`, `ditto serve --slots 1 --ctx {ctx} "
                f"--threads {th}`; llama.cpp: `llama-server -np 1 -c {ctx} -t {th} -tb {th}` "
                f"on the Q4_0 requantization of the shipped GGUF"
                + (" with a libggml-cpu.so built from the same source without AMX (the peer "
                   "build's AMX kernels fault here)" if lib_dir else "") + ".\n\n")
        write_results(ROOT / "docs" / "RESULTS.md", note + md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
