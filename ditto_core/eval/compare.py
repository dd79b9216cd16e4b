"""``ditto compare``: build, evaluate and benchmark several configurations of one model, and
write a table and plots (docs/RESULTS.md).

Output directory layout::

    DIR/builds/<label>/        one build per configuration (reused when its options, its
                               components' resolved options and their code match)
    DIR/builds/baseline/       the fp32 reference build (--quantizer none) for KL divergence
    DIR/results/<label>.json   one finished configuration (its presence makes a rerun skip it)
    DIR/results.json, DIR/results.csv, DIR/bpw_vs_kld.png, DIR/bpw_vs_tok_s.png

The configuration ``torch-int8`` is the PyTorch dynamic-int8 baseline (torch_int8.py),
evaluated and benchmarked the same way without a build. Each configuration is one task
``run_config`` (build → eval → bench), so a sweep resumes after
an interruption without redoing finished configurations, and tasks can run on a local process
pool (default, ``jobs`` workers) or on a Ray cluster (``executor="ray"``, ``address`` of a
running cluster or None for a local instance; every node needs this package installed). The
benchmark figures of tasks that run concurrently on one machine disturb each other: use one
job (the default) for speed figures.
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import tempfile
from pathlib import Path
from typing import Callable

from ditto_core.base.errors import DittoError
from ditto_core.base.outputs import input_files, output_target
from . import builds as builds_mod

#: The configuration name of the PyTorch dynamic-int8 baseline (torch_int8.py).
TORCH_INT8 = "torch-int8"
RESULT_FIELDS = ["config", "source", "quantizer", "bits", "group_size", "file_bytes", "bpw",
                 "mean_kld", "kld_stderr", "kld_p99", "same_top1", "ppl", "ppl_baseline",
                 "tokens_scored", "decode_tok_per_s", "prompt_tok_per_s", "ttft_ms",
                 "peak_rss_mib", "threads", "load_average", "pass@1", "pass@1_sampled", "pass@5_sampled",
                 "humaneval_p_vs_fp32"]


#: The files ``compare`` writes at the top of its output directory.
RESULT_FILES = ("results.json", "results.csv", "bpw_vs_kld.png", "bpw_vs_tok_s.png")


def write_json_atomic(path: Path, data) -> None:
    """Write JSON to ``path`` through a temporary file and a rename (a symlink at ``path`` is
    written through; a special file is refused: ``outputs.output_target``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path = output_target(path, "result file")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def run_config(model: str, spec: str, out_dir: str, baseline: str, settings: dict) -> dict:
    """One configuration: build (reused if present), eval against ``baseline``, bench; the
    result is written to ``out_dir/results/<label>.json`` and returned. Runs in a worker
    process (local pool or Ray), so it takes and returns plain data only."""
    from .bench import bench_build
    from .fidelity import evaluate_fidelity

    out = Path(out_dir)
    label = builds_mod.config_label(spec)
    if spec == TORCH_INT8:
        return _run_torch_int8(model, out, baseline, settings)
    options = builds_mod.parse_config(spec)
    build_dir = builds_mod.ensure_build(model, out / "builds" / label, options)
    meta = json.loads((build_dir / "build.json").read_text())
    result = {"config": spec, "label": label, "source": "ditto", "build": str(build_dir),
              "quantizer": options.quantizer, "bits": options.quant.bits,
              "group_size": options.quant.group_size, "settings": settings,
              "build_options": _plain(builds_mod.options_record(options)),
              "components": meta.get("components"),
              "components_code": meta.get("components_code"),
              "build_seconds": meta.get("total_seconds")}
    if settings.get("eval", True):
        result["eval"] = evaluate_fidelity(build_dir, Path(baseline),
                                           n_chunks=settings.get("chunks"),
                                           threads=settings.get("eval_threads"))
    if settings.get("humaneval"):
        from .humaneval import evaluate

        result["humaneval"] = evaluate(build_dir, limit=settings.get("limit"),
                                       threads=settings.get("eval_threads"))
    if settings.get("bench", True):
        result["bench"] = bench_build(build_dir, threads=settings["threads"],
                                      repeat=settings.get("repeat", 3),
                                      tokens=settings.get("tokens", 128))
    write_json_atomic(out / "results" / f"{label}.json", result)
    return result


def _run_torch_int8(model: str, out: Path, baseline: str, settings: dict) -> dict:
    """run_config for the PyTorch int8 baseline (torch_int8.py): no build, same measures."""
    from . import torch_int8

    result = {"config": TORCH_INT8, "label": TORCH_INT8, "source": "pytorch",
              "quantizer": TORCH_INT8, "bits": 8, "group_size": None, "settings": settings}
    if settings.get("eval", True):
        result["eval"] = torch_int8.evaluate(model, Path(baseline),
                                             n_chunks=settings.get("chunks"),
                                             threads=settings.get("eval_threads"))
    if settings.get("bench", True):
        result["bench"] = torch_int8.bench(model, Path(baseline), threads=settings["threads"],
                                           repeat=settings.get("repeat", 3),
                                           tokens=settings.get("tokens", 128))
    write_json_atomic(out / "results" / f"{TORCH_INT8}.json", result)
    return result


def _plain(record: dict):
    """``record`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(record))


def finished(out_dir: Path, spec: str, settings: dict, model=None) -> dict | None:
    """The saved result of ``spec`` when it was made with the same settings and (for a Ditto
    build) the same build options as ``spec`` gives now and, when ``model`` is given, by the
    same components (resolved options and code, ``pipeline.chosen_components``), else None: a
    result made under other defaults (e.g. another default codebook type) or before a plugin
    changed is run again."""
    path = Path(out_dir) / "results" / f"{builds_mod.config_label(spec)}.json"
    try:
        r = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if r.get("config") != spec or r.get("settings") != settings:
        return None
    if spec != TORCH_INT8 and r.get("build_options") != _plain(
            builds_mod.options_record(builds_mod.parse_config(spec))):
        return None
    if spec != TORCH_INT8 and model is not None:
        from ditto_core.stages import pipeline

        components, code = pipeline.chosen_components(model, builds_mod.parse_config(spec))
        if (r.get("components") != _plain(components)
                or r.get("components_code") != code):
            return None
    return r


def _local_executor(jobs: int):
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawned, not forked: a fork of a process whose numba/OpenMP thread pools already ran
    # (an earlier in-process build) dies when the child quantizes in parallel
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))

    def submit_all(calls):
        from concurrent.futures.process import BrokenProcessPool

        futs = {pool.submit(run_config, *args): args[1] for args in calls}
        for f in as_completed(futs):
            try:
                yield futs[f], f.result()
            except BrokenProcessPool:
                raise DittoError(f"the worker running config {futs[f]!r} died (killed, or out "
                                 "of memory); finished configurations are kept: run the "
                                 "command again to resume") from None

    return submit_all, lambda: pool.shutdown(wait=False, cancel_futures=True)


def _ray_executor(address: str | None, jobs: int):
    try:
        import ray
    except ImportError:
        raise DittoError("--executor ray needs the ray package (pip install ray)") from None
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(run_config)

    def submit_all(calls):
        refs = {remote.remote(*args): args[1] for args in calls}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield refs[done[0]], ray.get(done[0])

    def close():
        if started:
            ray.shutdown()

    return submit_all, close


def compare(model: str, specs: list[str], out_dir: Path, settings: dict, *,
            executor: str = "local", address: str | None = None, jobs: int = 1,
            peers: list[dict] | None = None,
            progress: Callable[[int, int, str], None] | None = None) -> list[dict]:
    """Run every configuration not finished yet (module docstring) and write the tables and
    plots. Returns the result rows (one per configuration, then the llama.cpp ``peers``).
    Raises DittoError for a bad configuration (before any work) or a failed task."""
    out_dir = Path(out_dir)
    labels = {}
    for spec in specs:
        if spec != TORCH_INT8:  # bad keys and values fail now, not in a worker an hour later
            from ditto_core.stages import pipeline

            try:
                pipeline.chosen_components(model, builds_mod.parse_config(spec))
            except DittoError as exc:
                msg = str(exc)
                raise DittoError(msg if msg.startswith(f"config {spec!r}")
                                 else f"config {spec!r}: {msg}") from None
        label = builds_mod.config_label(spec)
        if label in labels:
            raise DittoError(f"configs {labels[label]!r} and {spec!r} have the same label {label}")
        labels[label] = spec
    if out_dir.exists() and not out_dir.is_dir():
        raise DittoError(f"{out_dir}: exists and is not a directory")
    for name in RESULT_FILES:  # refuse special files / inputs before hours of work
        output_target(out_dir / name, "result file", input_files(model) if
                      Path(model).exists() else ())
    out_dir.mkdir(parents=True, exist_ok=True)
    baseline = ""
    if settings.get("eval", True) or TORCH_INT8 in specs:
        from ditto_core.stages.pipeline import BuildOptions

        baseline = str(builds_mod.ensure_build(model, out_dir / "builds" / "baseline",
                                               BuildOptions(quantizer="none", blas="openblas")))
    results = {s: finished(out_dir, s, settings, model) for s in specs}
    todo = [s for s in specs if results[s] is None]
    done = len(specs) - len(todo)
    if progress:
        progress(done, len(specs), "")
    if todo:
        if executor == "ray":
            submit_all, close = _ray_executor(address, jobs)
        elif executor == "local":
            submit_all, close = _local_executor(jobs)
        else:
            raise DittoError(f"--executor {executor}: expected local or ray")
        try:
            for spec, res in submit_all([(str(model), s, str(out_dir), baseline, settings)
                                         for s in todo]):
                results[spec] = res
                done += 1
                if progress:
                    progress(done, len(specs), spec)
        finally:
            close()
    rows = [result_row(results[s]) for s in specs] + list(peers or [])
    ref = (results.get("none") or {}).get("humaneval")
    if ref:  # Mann–Whitney U of each configuration's per-seed pass rates against fp32
        from .humaneval import mann_whitney

        for spec, row in zip(specs, rows):
            he = (results[spec] or {}).get("humaneval")
            if he and spec != "none":
                row["humaneval_p_vs_fp32"] = mann_whitney(
                    he["humaneval"]["per_seed"], ref["humaneval"]["per_seed"])["p_value"]
    write_tables(out_dir, rows)
    plot(out_dir, rows)
    return rows


def result_row(r: dict) -> dict:
    """The flat table row of one configuration's result (fastest thread count's speed)."""
    row = dict.fromkeys(RESULT_FIELDS)
    row.update({k: r.get(k) for k in ("config", "source", "quantizer", "bits", "group_size")})
    b = r.get("bench")
    ev = r.get("eval") or {}
    for k in ("mean_kld", "kld_stderr", "kld_p99", "same_top1", "ppl", "ppl_baseline",
              "tokens_scored"):
        row[k] = ev.get(k)
    if b:
        row.update(file_bytes=b["file_bytes"], bpw=b["bpw"])
        best = max(b["threads"], key=lambda t: b["threads"][t]["decode_tok_per_s"]["median"])
        v = b["threads"][best]
        row.update(threads=int(best), decode_tok_per_s=v["decode_tok_per_s"]["median"],
                   prompt_tok_per_s=v["prompt_tok_per_s"]["median"],
                   ttft_ms=v["ttft_ms"]["median"], peak_rss_mib=v["peak_rss_mib"])
        if b.get("load_average"):  # the highest 1-minute load average around the runs
            row["load_average"] = max(b["load_average"])
    elif r.get("build"):
        build = Path(r["build"])
        meta = json.loads((build / "build.json").read_text())
        size = (build / meta.get("model_file", "model.ditto")).stat().st_size
        n = (meta.get("pack") or {}).get("n_weights")
        row.update(file_bytes=size, bpw=8.0 * size / n if n else None)
    he = r.get("humaneval") or {}
    for k in ("pass@1", "pass@1_sampled", "pass@5_sampled"):
        row[k] = he.get(k)
    return row


def write_tables(out_dir: Path, rows: list[dict]) -> None:
    """``results.json`` (every row) and ``results.csv`` (RESULT_FIELDS columns)."""
    write_json_atomic(out_dir / "results.json", rows)
    target = output_target(out_dir / "results.csv", "result file")
    fd, tmp = tempfile.mkstemp(prefix=".results.csv.", dir=target.parent)
    with os.fdopen(fd, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RESULT_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if r.get(k) is None else r.get(k) for k in RESULT_FIELDS})
    os.replace(tmp, target)


def plot(out_dir: Path, rows: list[dict]) -> list[Path]:
    """``bpw_vs_kld.png`` and ``bpw_vs_tok_s.png``: one point per configuration (Ditto: circles,
    llama.cpp formats: squares, PyTorch int8: triangle), each labelled. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for y, ylabel, name in (("mean_kld", "mean KL divergence vs fp32 (nats)", "bpw_vs_kld.png"),
                            ("decode_tok_per_s", "decode tok/s", "bpw_vs_tok_s.png")):
        pts = [r for r in rows if r.get("bpw") is not None and r.get(y) is not None]
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for source, marker in (("ditto", "o"), ("llama.cpp", "s"), ("pytorch", "^")):
            sel = [r for r in pts if r.get("source") == source]
            if sel:
                ax.scatter([r["bpw"] for r in sel], [r[y] for r in sel], marker=marker,
                           label=source)
                for r in sel:
                    ax.annotate(r["config"], (r["bpw"], r[y]), fontsize=7,
                                xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("bits per weight (model file)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        target = output_target(out_dir / name, "plot")
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".png", dir=target.parent)
        os.close(fd)
        fig.savefig(tmp, dpi=120)
        plt.close(fig)
        os.replace(tmp, target)
        written.append(out_dir / name)
    return written
