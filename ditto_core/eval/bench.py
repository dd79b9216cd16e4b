"""``ditto bench``: speed, latency, memory, size and energy of a build, as llama-bench reports
them (pp512 prompt processing, tg128 text generation).

Per thread count and repetition, two runs of the build's executable, each read from its
``stats`` JSON line on stderr (native/README.md):

- **prompt** (pp): the first ``prompt_tokens`` (512) tokens of the evaluation corpus as token
  ids, one token generated; prompt tok/s = prompt tokens / ``prompt_ms``; ``ttft_ms`` of this
  run is the time to first token after a 512-token prompt;
- **decode** (tg): a short prompt, ``tokens`` (128) greedy tokens with ``--ignore-eos``;
  decode tok/s = the runtime's ``tok_per_s`` ((generated − 1) / decode time); ``ttft_ms``.

Repetitions alternate the thread counts so that machine noise hits them alike; each figure is
reported as median, min, max and spread ((max − min) / median). Peak RSS is the largest
``peak_rss_kib`` seen. Energy per generated token comes from Linux RAPL
(``/sys/class/powercap/*/energy_uj``, package domains, the whole package including other
processes) read around the decode runs; where no domain is readable it is "not available".
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

from ditto_core.base.errors import DittoError
from ditto_core.runtime.run import find_build, run_stats

POWERCAP = Path("/sys/class/powercap")
DECODE_PROMPT = "def fibonacci(n):"


def cpu_name() -> str:
    """The CPU model name (Linux ``/proc/cpuinfo``; else platform's guess)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def rapl_domains(root: Path = POWERCAP) -> list[Path]:
    """Readable RAPL package domains (``intel-rapl:N`` with an ``energy_uj`` file; AMD CPUs
    report through the same driver). Empty when there are none or they are not readable."""
    out = []
    for d in sorted(root.glob("intel-rapl:*")) if root.is_dir() else []:
        if d.name.count(":") != 1:  # sub-domains (core, uncore, dram) are inside the package
            continue
        try:
            int((d / "energy_uj").read_text())
        except (OSError, ValueError):
            continue
        out.append(d)
    return out


def read_energy_uj(domains: list[Path]) -> list[tuple[int, int]]:
    """(energy_uj, max_energy_range_uj) of each domain now."""
    vals = []
    for d in domains:
        e = int((d / "energy_uj").read_text())
        try:
            m = int((d / "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            m = 0
        vals.append((e, m))
    return vals


def energy_joules(before: list[tuple[int, int]], after: list[tuple[int, int]]) -> float:
    """Joules between two readings, summed over domains; a counter that wrapped around adds its
    ``max_energy_range_uj``."""
    total = 0
    for (e0, m), (e1, _) in zip(before, after):
        total += e1 - e0 if e1 >= e0 else e1 + m - e0
    return total / 1e6


def spread(values: list[float]) -> dict:
    """median, min, max, spread = (max − min) / median, and the samples."""
    med = statistics.median(values)
    return {"median": med, "min": min(values), "max": max(values),
            "spread": (max(values) - min(values)) / med if med else 0.0,
            "samples": list(values)}


def bench_build(build_dir: Path, *, threads: list[int], repeat: int = 3, tokens: int = 128,
                prompt_tokens: int = 512, powercap: Path = POWERCAP, progress=None,
                cache_type_k: str = "f32", cache_type_v: str = "f32") -> dict:
    """Benchmark a build (module docstring). Returns a JSON-ready dict: ``build``, ``file_bytes``,
    ``n_weights``, ``bpw``, ``prompt_tokens``, ``tokens``, ``repeat``, ``energy`` (a note when
    not available) and ``threads``: {T: {``prompt_tok_per_s``, ``decode_tok_per_s``,
    ``ttft_ms``, ``ttft_prompt_ms`` (each median/min/max/spread), ``peak_rss_mib``,
    ``joules_per_token`` (or None)}} and ``load_average`` (the 1-minute load average before
    and after the runs: other jobs on the machine make the speed figures lower bounds).
    ``cache_type_k``, ``cache_type_v``: the KV cache element types of every run ("f32",
    "f16": ditto-run's -ctk/-ctv), also in the result. Raises DittoError if a run fails."""
    from . import corpus

    exe, model, meta = find_build(build_dir)
    file_bytes = model.stat().st_size
    n_weights = (meta.get("pack") or {}).get("n_weights")
    if not n_weights:
        from ditto_core.model.modelfile import ModelFile

        with ModelFile.open(model, verify=False) as mf:
            n_weights = sum(t.n_weights for t in mf.tensors.values())
    from .fidelity import build_vocab

    _, tok = build_vocab(build_dir)
    ids = corpus.tokenize(exe, model, corpus.corpus_bytes(), tok.add_bos)[:prompt_tokens]
    domains = rapl_domains(powercap)
    samples = {t: {"pp": [], "tg": [], "joules": []} for t in threads}
    total = repeat * len(threads)
    kv = [] if (cache_type_k, cache_type_v) == ("f32", "f32") else [
        "-ctk", cache_type_k, "-ctv", cache_type_v]  # a build before -ctk/-ctv runs the default
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ditto-bench-") as tmp:
        ids_file = Path(tmp) / "prompt.ids"
        ids_file.write_text(" ".join(map(str, ids)))
        done = 0
        for _ in range(repeat):
            for t in threads:
                pp = run_stats(build_dir, ["--ids", str(ids_file), "-n", "1", "--temp", "0",
                                           "--threads", str(t), *kv])
                e0 = read_energy_uj(domains) if domains else None
                tg = run_stats(build_dir, ["-p", DECODE_PROMPT, "-n", str(tokens), "--temp", "0",
                                           "--ignore-eos", "--threads", str(t), *kv])
                if e0 is not None:
                    j = energy_joules(e0, read_energy_uj(domains))
                    samples[t]["joules"].append(j / max(tg["generated_tokens"], 1))
                samples[t]["pp"].append(pp)
                samples[t]["tg"].append(tg)
                done += 1
                if progress:
                    progress(done, total)
    per_thread = {}
    for t, s in samples.items():
        if any(r["prompt_tokens"] != len(ids) for r in s["pp"]):
            raise DittoError(f"{build_dir}: the prompt run did not evaluate {len(ids)} tokens")
        if any((r.get("cache_type_k", "f32"), r.get("cache_type_v", "f32")) !=
               (cache_type_k, cache_type_v) for r in s["pp"] + s["tg"]):
            raise DittoError(f"{build_dir}: a run did not use the KV cache types "
                             f"{cache_type_k}/{cache_type_v}")
        per_thread[str(t)] = {
            "prompt_tok_per_s": spread([1000.0 * r["prompt_tokens"] / r["prompt_ms"]
                                        for r in s["pp"]]),
            "decode_tok_per_s": spread([r["tok_per_s"] for r in s["tg"]]),
            "ttft_ms": spread([r["ttft_ms"] for r in s["tg"]]),
            "ttft_prompt_ms": spread([r["ttft_ms"] for r in s["pp"]]),
            "load_ms": spread([r["load_ms"] for r in s["tg"]]),
            "peak_rss_mib": max(r["peak_rss_kib"] for r in s["pp"] + s["tg"]) / 1024,
            "joules_per_token": spread(s["joules"]) if s["joules"] else None,
        }
    return {
        "build": str(build_dir), "cpu": cpu_name(), "quantizer": meta.get("quantizer"),
        "options": meta.get("options"), "file_bytes": file_bytes, "n_weights": n_weights,
        "bpw": 8.0 * file_bytes / n_weights, "prompt_tokens": len(ids), "tokens": tokens,
        "decode_prompt": DECODE_PROMPT, "repeat": repeat, "cache_type_k": cache_type_k,
        "cache_type_v": cache_type_v,
        "energy": (f"RAPL: {', '.join(d.name for d in domains)} (whole package)" if domains
                   else "not available (no readable /sys/class/powercap RAPL domain)"),
        "threads": per_thread,
        "load_average": [load_before, os.getloadavg()[0]],
    }
