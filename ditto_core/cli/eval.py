"""``ditto eval``, ``ditto bench`` and ``ditto compare``: the research comparisons
(docs/RESULTS.md). ``register(group)`` adds them to the ``ditto`` click group."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ditto_core.base.errors import DittoError
from ditto_core.base.progress import progress_callback
from ditto_core.stages.bundled import MODEL_HELP
from .common import _stdout, check_kernel_env, reports_errors


def _fmt(v, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


# --------------------------------------------------------------------------------------------
@click.command("eval")
@click.argument("build", type=click.Path(path_type=Path))
@click.option("--baseline", type=click.Path(path_type=Path), default=None,
              help="Reference build for KL divergence (default: the fp32 build of the same "
                   "model, `--quantizer none`, built once and cached).")
@click.option("--chunks", type=click.IntRange(min=1), default=None,
              help="Evaluate the first N 512-token chunks of the corpus (default: all of them; "
                   "how many depends on the model's tokenizer).")
@click.option("--humaneval", is_flag=True, help="Also run HumanEval (pass@1 greedy, pass@1 / "
              "pass@5 over 5 sampling seeds).")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="HumanEval: only the first N problems.")
@click.option("--seeds", type=click.IntRange(min=1), default=5, show_default=True,
              help="HumanEval: sampling seeds (one sample per problem and seed).")
@click.option("--peer-gguf", "peer_gguf", multiple=True, type=click.Path(path_type=Path),
              help="A llama.cpp GGUF of the same model to score on the same chunks with "
                   "llama-perplexity (repeatable).")
@click.option("--peer-base", type=click.Path(path_type=Path), default=None,
              help="The llama.cpp base GGUF for --peer-gguf (default: the build's source GGUF "
                   "converted to F32 by llama-quantize, cached).")
@click.option("--llama-cpp", "llama_cpp", type=click.Path(path_type=Path), default=None,
              help="Directory holding llama-perplexity (default: found on PATH).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Threads per run (default: all cores).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with every figure.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@reports_errors
def eval_cmd(build, baseline, chunks, humaneval, limit, seeds, peer_gguf, peer_base, llama_cpp,
             threads, as_json, quiet):
    """Evaluate BUILD: perplexity and KL divergence against a baseline build on the held-out
    code corpus (CPython 3.11 stdlib sources, 512-token chunks scored on their second half, as
    llama.cpp's `llama-perplexity --kl-divergence`), optionally HumanEval and llama.cpp peers."""
    from ditto_core.eval import builds, fidelity
    from ditto_core.runtime.run import find_build

    find_build(build)
    check_kernel_env()
    if limit is not None and not humaneval:
        raise click.UsageError("--limit applies to --humaneval only")
    for g in peer_gguf:  # before the long runs
        if not g.is_file():
            raise DittoError(f"{g}: no such GGUF file")
    if baseline is None:
        if not quiet:
            click.echo("baseline: the fp32 build of the same model (cached)", err=True)
        baseline = builds.baseline_for(build, show_progress=not quiet)
    find_build(baseline)
    update, stop = progress_callback("KL divergence", quiet)
    try:
        result = fidelity.evaluate_fidelity(build, baseline, n_chunks=chunks, threads=threads,
                                            progress=update)
    finally:
        stop()
    result = {"build": str(build), "baseline": str(baseline), **result}
    if humaneval:
        from ditto_core.eval import humaneval as he

        update, stop = progress_callback("HumanEval", quiet)
        try:
            result.update(he.evaluate(build, limit=limit, seeds=seeds, threads=threads,
                                      progress=update))
        finally:
            stop()
    if peer_gguf:
        from ditto_core.eval import llamacpp

        result["peers"] = llamacpp.evaluate_peers(
            build, list(peer_gguf), base_gguf=peer_base, bin_dir=llama_cpp,
            n_chunks=result["chunks"], threads=threads, quiet=quiet)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    print_eval(result)


def print_eval(r: dict) -> None:
    """The readable form of ``ditto eval``'s result."""
    from rich.table import Table

    con = _stdout()
    n = r["chunks"]
    con.print(f"{r['build']} vs baseline {r['baseline']}: {n} chunk{'s' * (n != 1)} of "
              f"{r['n_ctx']} tokens, {r['tokens_scored']:,} tokens scored", soft_wrap=True)
    t = Table("model", "PPL", "mean KLD", "99% KLD", "same top-1")
    t.add_row("baseline", f"{r['ppl_baseline']:.4f} ± {r['ppl_baseline_stderr']:.4f}", "-", "-",
              "-")
    t.add_row(r["build"], f"{r['ppl']:.4f} ± {r['ppl_stderr']:.4f}",
              f"{r['mean_kld']:.6f} ± {r['kld_stderr']:.6f}", f"{r['kld_p99']:.6f}",
              f"{100 * r['same_top1']:.2f} ± {100 * r['same_top1_stderr']:.2f} %")
    for p in r.get("peers", []):
        t.add_row(f"llama.cpp {p['name']}", f"{p['ppl']:.4f} ± {p['ppl_stderr']:.4f}",
                  f"{p['mean_kld']:.6f} ± {p['kld_stderr']:.6f}", f"{p['kld_p99']:.6f}",
                  f"{100 * p['same_top1']:.2f} ± {100 * p['same_top1_stderr']:.2f} %")
    con.print(t)
    if "pass@1" in r:
        he = r["humaneval"]
        k = he["seeds"]
        pass_k = r[f"pass@{k}_sampled"]
        line = (f"HumanEval ({he['problems']} problems): pass@1 greedy "
                f"{100 * r['pass@1']:.2f} %; over {k} sampling seed{'s' if k > 1 else ''} "
                f"(temperature {he['temperature']}, top-p {he['top_p']}): pass@1 "
                f"{100 * r['pass@1_sampled']:.2f} %")
        con.print(line + (f", pass@{k} {100 * pass_k:.2f} %" if k > 1 else ""))


# --------------------------------------------------------------------------------------------
def parse_threads(value: str) -> list[int]:
    """``"1,2"`` → [1, 2]; raises click.BadParameter for anything but a comma-separated list
    of positive integers (an empty item, ``1,,2``, included)."""
    try:
        out = [int(v) for v in value.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise click.BadParameter(f"{value!r}: expected thread counts like 1,2")
    return out


@click.command("bench")
@click.argument("build", type=click.Path(path_type=Path))
@click.option("--threads", "threads", default="1,2", show_default=True,
              callback=lambda ctx, param, value: parse_threads(value),
              help="Comma-separated thread counts.")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Runs per thread count (median and spread are reported).")
@click.option("-n", "--tokens", type=click.IntRange(min=2), default=128, show_default=True,
              help="Generated tokens per decode run (tg).")
@click.option("--prompt-tokens", type=click.IntRange(min=2), default=512, show_default=True,
              help="Prompt tokens per prompt-processing run (pp), from the eval corpus.")
@click.option("-ctk", "--cache-type-k", "cache_type_k", type=click.Choice(["f32", "f16"]),
              default="f32", show_default=True, help="KV cache type for keys (as llama-bench).")
@click.option("-ctv", "--cache-type-v", "cache_type_v", type=click.Choice(["f32", "f16"]),
              default="f32", show_default=True, help="KV cache type for values.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@reports_errors
def bench_cmd(build, threads, repeat, tokens, prompt_tokens, cache_type_k, cache_type_v,
              as_json, quiet):
    """Benchmark BUILD: decode tok/s (tg), prompt tok/s (pp, 512-token prompt), time to first
    token, peak RSS, file size and bpw per thread count, repeated (median and spread); energy
    per token from Linux RAPL where readable, else "not available"."""
    from ditto_core.eval import bench
    from ditto_core.runtime.run import find_build

    find_build(build)
    check_kernel_env()
    update, stop = progress_callback("bench", quiet)
    try:
        r = bench.bench_build(build, threads=threads, repeat=repeat, tokens=tokens,
                              prompt_tokens=prompt_tokens, progress=update,
                              cache_type_k=cache_type_k, cache_type_v=cache_type_v)
    finally:
        stop()
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    print_bench(r)


def print_bench(r: dict) -> None:
    """The readable form of ``ditto bench``'s result."""
    from rich.table import Table

    con = _stdout()
    con.print(f"{r['build']}: {r['file_bytes']:,} bytes, {r['bpw']:.3f} bpw; pp{r['prompt_tokens']}"
              f", tg{r['tokens']}, {r['repeat']} runs each (median [min-max]); KV cache "
              f"{r.get('cache_type_k', 'f32')}/{r.get('cache_type_v', 'f32')}", soft_wrap=True)

    def m(x, spec=".1f"):
        return "-" if x is None else (f"{x['median']:{spec}} [{x['min']:{spec}}-"
                                      f"{x['max']:{spec}}]")

    t = Table("threads", "prompt tok/s", "decode tok/s", "TTFT ms", "TTFT pp ms", "peak RSS MiB",
              "J/token")
    for th, v in r["threads"].items():
        t.add_row(th, m(v["prompt_tok_per_s"]), m(v["decode_tok_per_s"]), m(v["ttft_ms"]),
                  m(v["ttft_prompt_ms"]), f"{v['peak_rss_mib']:.1f}",
                  m(v["joules_per_token"], ".3f") if v["joules_per_token"] else "n/a")
    con.print(t)
    con.print(f"energy: {r['energy']}", soft_wrap=True)


# --------------------------------------------------------------------------------------------
@click.command("compare", epilog=MODEL_HELP)
@click.argument("model")
@click.option("--config", "configs", multiple=True, required=True, metavar="SPEC",
              help="QUANTIZER[:key=value,...], e.g. kmeans:bits=4,group_size=256, rtn:bits=4, "
                   "none (repeatable; keys: bits, group_size, method, codebook_type, seed, "
                   "keep_fp32, blas, rewrite, openmp).")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Directory for builds, per-configuration results, results.csv/json, plots.")
@click.option("--chunks", type=click.IntRange(min=1), default=20, show_default=True,
              help="Corpus chunks for perplexity / KL divergence.")
@click.option("--threads", default="1,2", show_default=True,
              callback=lambda ctx, param, value: parse_threads(value),
              help="Bench thread counts.")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Bench runs per thread count.")
@click.option("-n", "--tokens", type=click.IntRange(min=2), default=128, show_default=True,
              help="Bench: generated tokens per decode run.")
@click.option("--humaneval", is_flag=True, help="Also run HumanEval on every configuration.")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="HumanEval: only the first N problems.")
@click.option("--no-eval", is_flag=True, help="Skip perplexity / KL divergence.")
@click.option("--no-bench", is_flag=True, help="Skip the benchmark.")
@click.option("--peer-gguf", "peer_gguf", multiple=True, type=click.Path(path_type=Path),
              help="llama.cpp GGUF of the same model, scored as a reference point (repeatable).")
@click.option("--peer-base", type=click.Path(path_type=Path), default=None,
              help="llama.cpp base GGUF for --peer-gguf (default: MODEL converted to F32).")
@click.option("--llama-cpp", "llama_cpp", type=click.Path(path_type=Path), default=None,
              help="Directory holding llama-perplexity (default: found on PATH).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
              show_default=True, help="Run configurations on a local process pool or on Ray.")
@click.option("--address", default=None,
              help="Ray cluster address (default: start a local Ray instance).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Configurations run at once (more than 1 disturbs the speed figures).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@reports_errors
def compare_cmd(model, configs, out_dir, chunks, threads, repeat, tokens, humaneval, limit,
                no_eval, no_bench, peer_gguf, peer_base, llama_cpp, executor, address, jobs,
                quiet):
    """Build, evaluate and benchmark MODEL in every --config, and write DIR/results.csv,
    DIR/results.json and the plots bpw vs KL divergence and bpw vs tok/s. Finished
    configurations are kept in DIR/results/ and not redone when the command is run again."""
    from ditto_core.eval import compare

    if address and executor != "ray":
        raise click.UsageError("--address needs --executor ray")
    if not no_bench or not no_eval or humaneval:
        check_kernel_env()
    settings = {"eval": not no_eval, "chunks": chunks, "bench": not no_bench,
                "threads": threads, "repeat": repeat, "tokens": tokens,
                "humaneval": humaneval, "limit": limit}
    peers = []
    if peer_gguf:
        from ditto_core.eval import llamacpp

        peers = llamacpp.peer_rows(model, list(peer_gguf), out_dir, base_gguf=peer_base,
                                   bin_dir=llama_cpp, n_chunks=chunks, quiet=quiet)
    prog = None
    if not quiet:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        prog = Progress("configurations", BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), "{task.description}",
                        console=Console(stderr=True, markup=False))
        task = prog.add_task("", total=len(configs))
        prog.start()

    def update(done, total, spec):
        if prog is not None:
            prog.update(task, completed=done, description=f"done: {spec}" if spec else "")

    try:
        rows = compare.compare(model, list(configs), out_dir, settings, executor=executor,
                               address=address, jobs=jobs, peers=peers, progress=update)
    finally:
        if prog is not None:
            prog.stop()
    print_compare(rows, out_dir)


def print_compare(rows: list[dict], out_dir: Path) -> None:
    """The readable table of ``ditto compare``."""
    from rich.table import Column, Table

    con = _stdout()
    t = Table("bpw", "mean KLD", "same top-1 %", "PPL", "decode tok/s", "prompt tok/s",
              "peak RSS MiB")
    t.columns.insert(0, Column("config", no_wrap=True,
                               min_width=max(len(str(r["config"])) for r in rows)))
    for r in rows:
        t.add_row(r["config"], _fmt(r.get("bpw"), ".3f"), _fmt(r.get("mean_kld"), ".6f"),
                  _fmt(None if r.get("same_top1") is None else 100 * r["same_top1"], ".2f"),
                  _fmt(r.get("ppl"), ".4f"), _fmt(r.get("decode_tok_per_s"), ".1f"),
                  _fmt(r.get("prompt_tok_per_s"), ".1f"), _fmt(r.get("peak_rss_mib"), ".1f"))
    con.print(t)
    con.print(f"written: {out_dir}/results.csv, results.json, bpw_vs_kld.png, bpw_vs_tok_s.png",
              soft_wrap=True)


@click.command("calibrate", epilog=MODEL_HELP)
@click.argument("model")
@click.option("--calibration", default="stdlib", show_default=True, metavar="FILE",
              help="Calibration text ('stdlib': the shipped CPython 3.11.7 modules that are not "
                   "in the evaluation corpus).")
@click.option("-o", "--output", "out", required=True,
              type=click.Path(path_type=Path, dir_okay=False), help="Importance file (.npz).")
@click.option("--blas", default="openblas", show_default=True,
              help="BLAS of the fp32 build that tokenizes the text.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="PyTorch threads (default: all cores).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@reports_errors
def calibrate_cmd(model, calibration, out, blas, threads, quiet):
    """Run MODEL's fp32 model over a calibration text and save, per linear layer, the mean
    squared activation of each input channel (llama.cpp's imatrix statistic) as an importance
    file for `ditto build --importance FILE.npz` (docs/QUANT.md)."""
    from ditto_core.base.outputs import input_files, output_target
    from ditto_core.eval import calibration as cal

    # the output is checked before the (long) run, as export and build check theirs
    inputs = [*(input_files(model) if Path(model).exists() else []),
              *([calibration] if Path(calibration).is_file() else [])]
    target = output_target(out, "importance file", inputs)
    if not target.parent.is_dir():
        raise DittoError(f"{out}: the directory {target.parent} does not exist")
    update, stop = progress_callback("calibration", quiet)
    try:
        imp = cal.calibrate(model, calibration, blas=blas, threads=threads, progress=update)
    finally:
        stop()
    cal.save_importance(imp, target)
    m = imp.meta
    click.echo(f"{out}: {len(imp.vectors)} tensors, {m['chunks']} chunks of {m['n_ctx']} tokens "
               f"of {m['calibration']['name']} (sha256 {m['calibration']['sha256'][:16]}…)",
               err=True)
    click.echo(str(out))


def register(group: click.Group) -> None:
    """Add ``ditto eval``, ``ditto bench``, ``ditto compare`` and ``ditto calibrate`` to
    ``group``."""
    group.add_command(calibrate_cmd)
    group.add_command(eval_cmd)
    group.add_command(bench_cmd)
    group.add_command(compare_cmd)
