"""The ``ditto`` command line: export, inspect, plugins, build (and commands other modules add).

Every command has ``--help``. A DittoError is printed as ``error: <message>`` on stderr with
exit code 1; Ctrl-C exits with 130, SIGTERM with 143 (after the same cleanup). Long steps show a rich progress bar on stderr.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from ditto_core import __version__
from ditto_core.base import signals
from ditto_core.base.errors import DittoError
from ditto_core.base.options import parse_assignments
from ditto_core.model import codebook
from ditto_core.model import format as F
from ditto_core.model.summary import inspect_summary
from ditto_core.stages.bundled import MODEL_HELP
from .common import _stdout, compile_stage_options, reports_errors  # noqa: F401


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ditto")
def cli():
    """Ditto compiles a Llama-family LLM checkpoint into a standalone CPU executable:
    export → quantize → pack → emit IR → rewrite → link."""


# --------------------------------------------------------------------------------------------
@cli.command("export", epilog=MODEL_HELP)
@click.argument("model")
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="Model file to write (.ditto); written atomically.")
@click.option("--exporter", default=None, help="Exporter name (default: detected).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@reports_errors
def export_cmd(model, out, exporter, quiet):
    """Export MODEL to a Ditto model file with every tensor in fp32."""
    from ditto_core.base.outputs import input_files, output_target
    from ditto_core.stages import pipeline

    path = pipeline.resolve_model(model)
    target = output_target(out, "model file", input_files(path))
    ck = pipeline.export(path, exporter)
    laid = pipeline.write_f32(ck, target, show_progress=not quiet)
    c = ck.config
    click.echo(f"{out}: {c.n_layers} layers, dim {c.dim}, {len(laid)} tensors, "
               f"{sum(t.n_weights for t in laid):,} weights, {out.stat().st_size:,} bytes")


# --------------------------------------------------------------------------------------------
@cli.command("inspect")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--no-verify", is_flag=True, help="Skip the CRC-32 check (faster).")
@click.option("--kernel", "kernel", default=None, metavar="TABLE",
              help="Show the kernel paths of this kernel table (avx512vbmi, avx512vnni, avxvnni, "
                   "avx2, neon, generic) instead of the one this CPU runs.")
@reports_errors
def inspect_cmd(file, as_json, no_verify, kernel):
    """Show a model file's config, tokenizer, tensor table, sizes and bits per weight.

    "theoretical" is the size with no padding: b-bit indices plus the codebooks (4 bytes per
    weight for fp32 tensors); the overhead % compares the tensor payloads (without the
    fixed header/metadata) to it. "kernel" is the GEMV path the runtime takes for each tensor
    on this CPU's kernel table (as ditto-run chooses it, DITTO_KERNEL included), e.g.
    avx512vbmi:i8_b4, avx2:i8_b4-tiled (indices put in row tiles at load), avx2:i8_any,
    generic (the scalar reference), decoded-int8 (the classifier decoded at load), lookup (an
    embedding read row by row)."""
    from ditto_core.model import kernel_paths as KP
    from ditto_core.model.modelfile import ModelFile

    try:
        kt = KP.table(kernel) if kernel else None
    except KeyError as exc:  # a bad flag value: a usage error (exit 2), as click's own
        raise click.BadParameter(str(exc.args[0]), param_hint="'--kernel'") from None

    if file.is_dir():
        hint = ""
        if (file / "model.ditto").is_file():
            hint = f"; did you mean {file / 'model.ditto'}?"
        raise DittoError(f"{file}: is a directory, not a model file{hint}")
    record = None
    beside = file.parent / "build.json"
    if beside.is_file():  # a build's model file: show the rules that planned its tensors
        try:
            record = json.loads(beside.read_text())
        except (OSError, ValueError):
            record = None
        if not isinstance(record, dict) or record.get("model_file") != file.name:
            record = None
    with ModelFile.open(file, verify=not no_verify) as mf:
        s = inspect_summary(mf, record, kt)
    if as_json:
        click.echo(json.dumps(s, indent=2))
        return
    con = _stdout()
    c = s["config"]
    con.print(Text.assemble((str(file), "bold"),
                            f"  Ditto format v{s['version']}, {s['file_bytes']:,} bytes"))
    con.print("config: " + ", ".join(f"{k}={v}" for k, v in c.items()))
    t = s["tokenizer"]
    con.print(f"tokenizer: {t['kind']}, {t['n_tokens']} tokens, {t['n_merges']} merges, "
              f"pre={t['pre']}, bos={t['bos_id']}, eos={t['eos_id']}, add_bos={t['add_bos']}, "
              f"chat={t['chat_format']}")
    con.print(f"end of generation: {t['eog_ids']}; fill in the middle: "
              + (", ".join(f"{k}={v}" for k, v in t["fim_ids"].items()) or "none"))
    if "rules" in s:
        con.print("rules (--tensor-type, first match wins): "
                  + ("; ".join(s["rules"]) or "none")
                  + "; then --keep-fp32, the embedding rule, the options' b and G")
    table = Table("tensor", "enc", "shape", "b", "G", "cb", "bytes", "bpw", "kernel",
                  *(["rule"] if "rules" in s else []))
    for r in s["tensors"]:
        table.add_row(r["name"], r["encoding"], "×".join(map(str, r["shape"])),
                      str(r["bits"] or "-"), str(r["group_size"] or "-"),
                      r["codebook_type"] or "-", f"{r['bytes']:,}", f"{r['bpw']:.3f}",
                      r["kernel"] or "-", *([r.get("rule") or "-"] if "rules" in s else []))
    con.print(table)
    con.print(f"layouts on kernel table {s['kernel_table']}: " + "; ".join(
        f"b{e['bits']},G{e['group_size']}"
        + (f",{e['codebook_type']}" if e["codebook_type"] != "int8" else "")
        + _whole_rows(e)
        + f" → {e['kernel']}" + (" (the classifier, decoded at load)"
                                 if (e["kernel"] or "").endswith(":decoded-int8") else "")
        + f" ({e['tensors']} tensor{'s' if e['tensors'] != 1 else ''}, {e['weights']:,} weights)"
        for e in s["layouts"]))
    con.print(f"{s['n_tensors']} tensors, {s['n_weights']:,} weights; "
              f"bpw {s['bpw_file']:.3f} (whole file), {s['bpw_payload']:.3f} (payloads)")
    con.print(f"payloads {s['payload_bytes']:,} bytes vs theoretical {s['theoretical_bytes']:,}"
              f" (indices at b bits + codebooks): {s['overhead_percent']:+.2f}%; "
              f"header+metadata {s['meta_bytes']:,} bytes")


# --------------------------------------------------------------------------------------------
@cli.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.option("--options", "with_options", is_flag=True,
              help="Also list every component's options (-O COMPONENT.KEY=VALUE) with their "
                   "type, default and meaning.")
@reports_errors
def plugins_cmd(as_json, with_options):
    """List installed plugins (entry-point group ``ditto``), their distribution and version,
    and the components each registers per stage; BLAS targets say whether they are usable."""
    from ditto_core.base import options as opt
    from ditto_core.stages.plugins import STAGES, get_registry
    from ditto_core.stages.selection import default_passes

    reg = get_registry()
    defaults = default_passes(reg)
    rows = []
    for ep, dist, version in reg.plugins:
        comps = {}
        for stage in STAGES:
            for name, r in reg.components[stage].items():
                if r.plugin == ep:
                    entry = {"name": name}
                    if stage == "blas":
                        try:
                            ok, why = r.component.available()
                        except Exception as exc:  # a plugin bug must not hide the others
                            ok, why = False, f"available() raised {exc!r}"
                        entry.update(available=ok, reason=why)
                    if stage == "pass" and name in defaults:
                        entry["default_order"] = r.component.default_order
                    if with_options:
                        entry["options"] = opt.describe(r.component)
                    comps.setdefault(stage, []).append(entry)
        rows.append({"plugin": ep, "distribution": dist, "version": version,
                     "components": comps})
    failed = [{"plugin": ep, "error": err} for ep, err in reg.failed]
    conflicts = [{"kind": stage, "name": name, "error": msg}
                 for stage, names in reg.conflicts.items() for name, msg in names.items()]
    if as_json:
        click.echo(json.dumps({"plugins": rows, "failed": failed, "conflicts": conflicts},
                              indent=2))
        return
    con = _stdout()
    table = Table("plugin", "distribution", "version", "components")
    for r in rows:
        parts = []
        for stage, comps in r["components"].items():
            names = []
            for c in comps:
                if "available" in c:
                    names.append(f"{c['name']} ({'available' if c['available'] else 'unavailable: ' + c['reason']})")
                elif "default_order" in c:
                    names.append(f"{c['name']} (default, order {c['default_order']})")
                else:
                    names.append(c["name"])
            parts.append(f"{STAGES[stage][1]}: {', '.join(names)}")
        table.add_row(r["plugin"], r["distribution"], r["version"],
                      "\n".join(parts) or "(none)")
    con.print(table)
    for f in failed:
        con.print(Text.assemble(("skipped", "red"), f" {f['plugin']}: {f['error']}"))
    for c in conflicts:
        con.print(Text.assemble(("unusable name", "red"), f" {c['error']}"))
    if with_options:
        table = Table("option (-O)", "type", "default", "meaning")
        for r in rows:
            for stage, comps in r["components"].items():
                for c in comps:
                    for o in c["options"]:
                        doc = o["doc"] + (f" (deprecated: ${o['env']})" if o["env"] else "")
                        table.add_row(f"{c['name']}.{o['key']}", o["type"], str(o["default"]),
                                      doc)
        con.print(table)


# --------------------------------------------------------------------------------------------
def _speed_table_name(ctx, param, value):
    """--speed-aware: auto, off or a kernel table's name; another is a usage error."""
    if value in (None, "auto", "off"):
        return value
    from ditto_core.model import kernel_paths as KP

    try:
        return KP.table(value).name
    except KeyError as exc:
        raise click.BadParameter(str(exc.args[0])) from None


def _check_rules(rules: tuple[str, ...]) -> tuple[str, ...]:
    """``--tensor-type`` values as given, each checked by ``quantkit.TensorRule.parse``: a bad
    one is a usage error (exit 2) naming it."""
    from ditto_core.kit.quantkit import TensorRule

    for rule in rules:
        try:
            TensorRule.parse(rule)
        except DittoError as exc:
            raise click.BadParameter(str(exc).removeprefix("--tensor-type ")) from None
    return rules


@cli.command("build", epilog=MODEL_HELP)
@click.argument("model")
@click.option("--quantizer", required=True, help="Quantizer name (see `ditto plugins`).")
@click.option("--blas", required=True, help="BLAS target name (see `ditto plugins`).")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Output directory (model.ditto, build.json, the executable).")
@click.option("--bits", type=click.IntRange(1, 8), default=4, show_default=True,
              help="Bit width b of the codebook indices.")
@click.option("--group-size", type=click.IntRange(F.MIN_GROUP_SIZE, F.MAX_GROUP_SIZE), default=256,
              show_default=True,
              help="Group size G: weights per sub-block sharing one codebook.")
@click.option("--keep-fp32", multiple=True, metavar="PATTERN",
              help="Glob over tensor names kept in fp32 (repeatable); norms always are.")
@click.option("--tensor-type", "tensor_types", multiple=True, metavar="GLOB=SPEC",
              callback=lambda ctx, param, value: _check_rules(value),
              help="Rule for the tensors matching GLOB (repeatable, first match wins): f32, "
                   "or bN,GN,cb:TYPE, e.g. '*.ffn_down.weight=b5', 'blk.0.*=f32'.")
@click.option("--method", default=None, help="Quantizer-specific method (kmeans: optimal|lloyd).")
@click.option("--codebook-type", type=click.Choice(list(codebook.TYPES)), default=None,
              help="Storage type of codebook centroids: int8 (int8 centroids and one f16 "
                   "scale per sub-block, run by the integer GEMV kernels; the default with "
                   "kmeans), f16 (the default with other quantizers) or f32.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option("--calibration", default=None, metavar="FILE",
              help="Calibration text (or 'stdlib': the shipped CPython modules): the fp32 model "
                   "runs over it and the mean squared activation of each input channel weights "
                   "the k-means error (docs/QUANT.md); the importance file is cached.")
@click.option("--importance", type=click.Path(path_type=Path, dir_okay=False), default=None,
              metavar="FILE.npz", help="A saved importance file (`ditto calibrate`) instead of "
                                       "--calibration.")
@click.option("--target-bpw", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="Choose each tensor's bit width and group size from its measured "
                   "sensitivity so that the whole model file is at most B bits per weight "
                   "(explicit --tensor-type rules and --keep-fp32 win; docs/QUANT.md).")
@click.option("--max-size-of", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              default=None, metavar="FILE",
              help="As --target-bpw, with the byte size of FILE (e.g. a llama.cpp GGUF) as "
                   "the budget.")
@click.option("--speed-aware", "speed_aware", default="auto", show_default=True,
              metavar="auto|off|TABLE", callback=_speed_table_name,
              help="With a budget, also hold the plan's modelled GEMV time on this kernel table "
                   "to at most the default plan's (`ditto inspect` shows each tensor's "
                   "path): auto = this CPU's table, off = the byte budget alone (the most "
                   "faithful file), or a table name (e.g. avx2; docs/QUANT.md).")
@click.option("--rewrite/--no-rewrite", default=True, show_default=True,
              help="Run the IR passes (--no-rewrite: none, the naive GEMV loops stay).")
@click.option("--exporter", default=None, help="Exporter (default: the one that reads MODEL).")
@click.option("--packer", default=None, help="Packer (default: bits).")
@compile_stage_options
@click.option("--openmp/--no-openmp", default=True, show_default=True,
              help="Compile the runtime with OpenMP (threads over GEMV rows).")
@click.option("--cache/--no-cache", default=True, show_default=True,
              help="Reuse cached stage outputs ($DITTO_CACHE_DIR or ~/.cache/ditto).")
@click.option("-q", "--quiet", is_flag=True, help="No progress output.")
@reports_errors
def build_cmd(model, quantizer, blas, out_dir, bits, group_size, keep_fp32, tensor_types, method,
              codebook_type, seed, calibration, importance, target_bpw, max_size_of, speed_aware,
              rewrite, exporter, packer, emitter, passes, linker,
              component_options, openmp, cache, quiet):
    """Build MODEL into DIR: export → quantize → pack → emit IR → rewrite → link.

    DIR gets ditto-run (the executable), model.ditto and build.json (docs/BUILD.md); run it
    with `ditto run DIR -p "def fib(n):"`. The build is atomic: a failure leaves no DIR."""
    if quantizer == "none":  # it keeps every tensor in fp32: say so if quantize options were given
        ctx = click.get_current_context()
        given = [f"--{n.replace('_', '-')}".replace("--tensor-types", "--tensor-type")
                 for n in ("bits", "group_size", "keep_fp32", "tensor_types", "method",
                           "codebook_type", "seed", "calibration", "importance",
                           "target_bpw", "max_size_of")
                 if ctx.get_parameter_source(n) is not click.core.ParameterSource.DEFAULT]
        if given:
            click.echo(f"warning: {', '.join(given)} ignored with --quantizer none "
                       "(every tensor stays fp32)", err=True)
    if calibration is not None and importance is not None:
        raise click.UsageError("give --calibration or --importance, not both")
    if target_bpw is not None and max_size_of is not None:
        raise click.UsageError("give --target-bpw or --max-size-of, not both")
    if passes and not rewrite:
        raise click.UsageError("give --pass or --no-rewrite, not both (--no-rewrite runs no "
                               "pass)")
    from ditto_core.api import build

    record = build(model, quantizer=quantizer, blas=blas, out=out_dir, bits=bits,
                   group_size=group_size, keep_fp32=keep_fp32, tensor_types=tensor_types,
                   method=method,
                   codebook_type=codebook_type, seed=seed, exporter=exporter, packer=packer,
                   emitter=emitter, passes=passes or None, linker=linker,
                   options=parse_assignments(component_options), rewrite=rewrite,
                   openmp=openmp, cache=cache, progress=not quiet,
                   calibration=calibration, importance=importance, target_bpw=target_bpw,
                   max_size_of=max_size_of, speed_aware=speed_aware).record
    if not quiet:
        cached = [k for k, v in record["cached"].items() if v]
        for stage, sec in record["stages"].items():
            click.echo(f"{stage:>10}: {sec:8.2f} s", err=True)
        click.echo(f"{'total':>10}: {record['total_seconds']:8.2f} s"
                   + (f" (cached: {', '.join(cached)})" if cached else ""), err=True)
        click.echo(f"bpw {record['bpw']:.3f}, {record['pack']['file_bytes']:,} bytes", err=True)
        for line in record["pass_summary"]:
            click.echo(line, err=True)
    click.echo(str(out_dir))


def _whole_rows(e: dict) -> str:
    """The suffix ' (whole rows of N, M)' of a ``ditto inspect`` layout entry whose G is
    longer than some of its tensors' rows (the kernels see G clamped to the row), else ''."""
    short = [g for g in e["effective_group_sizes"] if g != e["group_size"]]
    return f" (whole rows of {', '.join(map(str, short))})" if short else ""


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings (a plugin that failed to load, a deprecated environment variable) as one line
    ``warning: <message>`` on stderr, like the CLI's errors (a message's own "ditto: " prefix,
    which it carries for Python callers, dropped)."""
    click.echo(f"warning: {str(message).removeprefix('ditto: ')}", err=True)


def main(argv=None):
    """Console-script entry point ``ditto``."""
    signals.install()
    warnings.showwarning = _show_warning
    try:
        from . import cc as cli_cc
        cli_cc.register(cli)
    except ImportError:
        pass
    from ditto_core.runtime import run
    run.register(cli)
    from . import eval as cli_eval
    cli_eval.register(cli)
    try:
        from . import serve
        serve.register(cli)
    except ImportError:  # the server's packages (fastapi, uvicorn) are not installed
        pass
    return cli.main(args=argv, prog_name="ditto")


if __name__ == "__main__":
    main()
