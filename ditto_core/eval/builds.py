"""Build configurations as ``ditto compare`` spells them, and cached builds for evaluation.

A configuration string is ``QUANTIZER[:key=value,...]``, e.g. ``kmeans:bits=4,group_size=256``,
``rtn:bits=4``, ``none``, ``none:rewrite=false``. Keys: the quantize options of ``ditto build``
(``bits``, ``group_size``, ``method``, ``codebook_type``, ``seed``, ``keep_fp32`` with several
patterns joined by ``|``) and the build options ``blas`` (default openblas), ``rewrite`` and
``openmp`` (true/false). Any installed quantizer plugin works the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from ditto_core.base.errors import DittoError
from ditto_core.kit.components import QuantOptions

QUANT_KEYS = {"bits": int, "group_size": int, "method": str, "codebook_type": str, "seed": int,
              "keep_fp32": lambda v: tuple(p for p in v.split("|") if p)}
BUILD_KEYS = {"blas": str, "rewrite": "bool", "openmp": "bool"}


def _bool(key: str, v: str) -> bool:
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise DittoError(f"config key {key}={v}: expected true or false")


def parse_config(spec: str):
    """``QUANTIZER[:key=value,...]`` → pipeline.BuildOptions, with ``ditto build``'s defaults
    (a ``COMPONENT.KEY=value`` item is a component option, ``ditto build -O``'s)
    for what the string leaves out (the codebook type: ``pipeline.DEFAULT_CODEBOOK_TYPE``, so
    ``kmeans:bits=4`` is the same build as ``ditto build --quantizer kmeans --bits 4``). Raises
    DittoError naming the configuration for an unknown key or a bad value."""
    from ditto_core.stages.pipeline import DEFAULT_CODEBOOK_TYPE, BuildOptions

    name, _, rest = spec.partition(":")
    if not name:
        raise DittoError(f"config {spec!r}: no quantizer name before ':'")
    quant, build, component = {}, {"blas": "openblas"}, {}
    seen = set()
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq:
            raise DittoError(f"config {spec!r}: {item!r} is not key=value")
        if key in seen:
            raise DittoError(f"config {spec!r}: {key!r} is given twice")
        seen.add(key)
        try:
            if "." in key:  # COMPONENT.KEY: a component option, as ditto build -O takes it
                component[key] = value
            elif key in QUANT_KEYS:
                quant[key] = QUANT_KEYS[key](value)
            elif key in BUILD_KEYS:
                build[key] = _bool(key, value) if BUILD_KEYS[key] == "bool" else value
            else:
                raise DittoError(f"config {spec!r}: unknown key {key!r} (known: "
                                 f"{', '.join([*QUANT_KEYS, *BUILD_KEYS])}, or "
                                 "COMPONENT.KEY for a component option)")
        except ValueError:
            raise DittoError(f"config {spec!r}: {key}={value} is not a valid value") from None
    quant.setdefault("codebook_type", DEFAULT_CODEBOOK_TYPE.get(name, "f16"))
    try:
        return BuildOptions(quantizer=name, quant=QuantOptions(**quant), options=component,
                            **build)
    except (ValueError, TypeError) as exc:  # QuantOptions' validators (b, G, ...)
        raise DittoError(f"config {spec!r}: {exc}") from None


def config_label(spec: str) -> str:
    """A file-name-safe label of a configuration string (``kmeans_bits=4_group_size=256``)."""
    return "".join(c if c.isalnum() or c in "=.-+" else "_" for c in spec).strip("_")


def options_record(options) -> dict:
    """The build options that decide a build's bytes: the fields of build.json a cached build
    must match, also saved with each ``ditto compare`` result, which is reused only under the
    same record."""
    return {"quantizer": options.quantizer, "blas": options.blas, "rewrite": options.rewrite,
            "openmp": options.openmp, "options": attrs.asdict(options.quant)}


def build_matches(out_dir: Path, options, model=None) -> bool:
    """True when ``out_dir`` holds a complete build made with ``options`` and, when ``model``
    is given, by the components a build of it would take now: the same resolved component
    options and the same component code (``pipeline.chosen_components``), so a build made
    before a plugin changed is not reused."""
    try:
        meta = json.loads((Path(out_dir) / "build.json").read_text())
    except (OSError, ValueError):
        return False
    rec = json.loads(json.dumps(options_record(options)))  # as build.json holds it
    if meta.get("status") != "complete" or {k: meta.get(k) for k in rec} != rec:
        return False
    if model is None:
        return True
    from ditto_core.stages import pipeline

    components, code = pipeline.chosen_components(model, options)
    return (json.loads(json.dumps(components)) == meta.get("components")
            and code == meta.get("components_code"))


def ensure_build(model, out_dir: Path, options, *, show_progress: bool = False) -> Path:
    """Build ``model`` with ``options`` into ``out_dir`` unless a matching complete build is
    already there (the pipeline's stage cache makes a rebuild of known stages cheap too)."""
    from ditto_core.stages import pipeline

    out_dir = Path(out_dir)
    if not build_matches(out_dir, options, model):
        pipeline.build(model, out_dir, options, show_progress=show_progress)
    return out_dir


def baseline_for(build_dir: Path, *, show_progress: bool = False) -> Path:
    """The fp32 build (``--quantizer none``, same BLAS) of the model ``build_dir`` was built
    from, built once into ``<cache root>/eval-baselines/`` and reused. Raises DittoError when
    build.json does not say which model (or that model is gone)."""
    from ditto_core.base.cache import default_root
    from ditto_core.runtime.run import find_build
    from ditto_core.stages import pipeline

    _, _, meta = find_build(build_dir)
    model = meta.get("model_path") or meta.get("model")
    if not model or not Path(model).exists() and model not in ("smollm2", "tinycoder"):
        raise DittoError(f"{build_dir}/build.json: the source model {model!r} is not available;"
                         " give a baseline build with --baseline BUILD")
    options = pipeline.BuildOptions(quantizer="none", blas=meta.get("blas", "openblas"))
    sha = (meta.get("model_sha256") or "unknown")[:16]
    out = default_root() / "eval-baselines" / f"{sha}-none-{options.blas}"
    out.parent.mkdir(parents=True, exist_ok=True)
    return ensure_build(model, out, options, show_progress=show_progress)
