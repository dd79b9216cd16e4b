"""The build pipeline as plain stage functions: export → quantize → pack → emit IR → rewrite →
link (docs/ARCHITECTURE.md).

Each stage takes the previous stage's artifact (ditto_core.base.types) and the component chosen by
name (``ditto_core.stages.selection``) from the plugin registry, and is timed by ``build`` into
``Timings``. ``build`` resolves every component and option first, then runs the stages in
order; with no exporter installed at all, ``MissingStage`` says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import attrs
import numpy as np

from ditto_core.base.errors import DittoError
from ditto_core.base.outputs import file_kind
from ditto_core.base.options import normalize
from ditto_core.base.progress import progress_bar
from ditto_core.base.signals import deferred, pid_tag, sweep_stale
from ditto_core.base.types import Checkpoint, QuantizedModel
from ditto_core.kit.components import QuantOptions
from ditto_core.model import codebook
from ditto_core.model.modelfile import TensorInfo, write_model
from .bundled import BUNDLED, bundled_model
from .plugins import Registry, get_registry
from .resources import StagePeaks, check_resources
from .selection import DEFAULT_PACKER, Chosen, check_all_used, choose, choose_compile


class MissingStage(DittoError):
    """A pipeline stage has no component registered at all."""

    def __init__(self, stage: str, detail: str):
        super().__init__(f"stage '{stage}' is not available: {detail}")
        self.stage = stage


@attrs.define
class Timings:
    """Wall-clock seconds per stage, in the order the stages ran."""

    seconds: dict[str, float] = attrs.field(factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - t0


# --------------------------------------------------------------------------------------------
# Stage 1: export
# --------------------------------------------------------------------------------------------

def resolve_model(model: str | os.PathLike) -> Path:
    """Path of MODEL: an existing path (HF directory or .gguf file), else a bundled model name
    (a key of ``bundled.BUNDLED``; the Qwen ones are downloaded into the cache on first use).
    Raises DittoError if it is neither, or when a bundled model cannot be had."""
    p = Path(model)
    if p.exists():
        return p
    if str(model) in BUNDLED:
        return bundled_model(str(model))
    raise DittoError(f"{model}: no such file or directory, and not a bundled model name "
                     f"({', '.join(BUNDLED)})")


def choose_exporter(path: Path, name: str | None = None, registry: Registry | None = None):
    """The exporter called ``name``, or the first whose ``can_load(path)`` is true."""
    registry = registry or get_registry()
    if name is not None:
        return registry.get("exporter", name)
    exporters = registry.all("exporter")
    if not exporters:
        raise MissingStage("export", "no exporter plugin is installed")
    for exp in exporters:
        if exp.can_load(path):
            return exp
    names = ", ".join(e.name for e in exporters)
    mode = path.stat().st_mode if path.exists() else None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise DittoError(f"{path}: not a regular file ({file_kind(mode)})")
    if path.is_dir():
        raise DittoError(f"{path}: not a model directory any exporter reads ({names}); an HF "
                         f"directory needs config.json")
    what = ""
    if path.suffix.lower() == ".gguf":  # say what is wrong with the file it claims to be
        try:
            with open(path, "rb") as f:
                head = f.read(4)
            what = (": it is empty" if not head else
                    f": it does not start with the GGUF magic (b'GGUF'; it starts with {head!r})"
                    if head != b"GGUF" else "")
        except OSError as exc:
            what = f": {exc.strerror or exc}"
    raise DittoError(f"{path}: not a model file any exporter reads ({names}){what}")


def export(model: str | os.PathLike, exporter: str | None = None,
           registry: Registry | None = None) -> Checkpoint:
    """Stage 1. MODEL (path or bundled name) → Checkpoint (tensors loaded lazily)."""
    path = resolve_model(model)
    return load_checkpoint(choose_exporter(path, exporter, registry), path)


#: Exceptions an exporter may let slip on a malformed file; they become DittoErrors naming it.
_MALFORMED = (ArithmeticError, AttributeError, IndexError, KeyError, LookupError, TypeError,
              ValueError, struct.error, UnicodeError)


def load_checkpoint(exporter, path: Path) -> Checkpoint:
    """``exporter.load(path)``, with every tensor loader checked: a NaN/Inf weight is a
    DittoError naming the file, the tensor and the (row, col) (``untrusted.check_finite``).
    An exception an exporter lets slip on a malformed file (a TypeError, ValueError, ...)
    becomes ``<file>: cannot read it: ...``, never a traceback; exporters validate metadata
    with ``ditto_core.base.untrusted`` so this is only the last line of defence."""
    from ditto_core.base.untrusted import check_finite

    try:
        ck = exporter.load(path)
    except _MALFORMED as exc:
        raise DittoError(f"{path}: cannot read it: malformed or unsupported model "
                         f"({type(exc).__name__}: {exc})") from None
    where = str(ck.source)

    def checked(name, load):
        def load_checked():
            try:
                w = load()
            except _MALFORMED as exc:
                raise DittoError(f"{where}: tensor {name!r} could not be read "
                                 f"({type(exc).__name__}: {exc})") from None
            check_finite(w, name, where)
            return w
        return load_checked

    return attrs.evolve(ck, tensors={n: checked(n, f) for n, f in ck.tensors.items()})


def checkpoint_infos(checkpoint: Checkpoint) -> list[TensorInfo]:
    """An all-f32 tensor table for ``checkpoint``, in checkpoint order."""
    return [TensorInfo(n, "f32", s) for n, s in checkpoint.shapes.items()]


def write_f32(checkpoint: Checkpoint, out: Path, show_progress: bool = True) -> list[TensorInfo]:
    """Write ``checkpoint`` to a model file with every tensor in f32 (``ditto export``),
    atomically; returns the tensor table. Shows a progress bar counting weights."""
    infos = checkpoint_infos(checkpoint)
    total = sum(t.n_weights for t in infos)
    with progress_bar("export", total, enabled=show_progress) as advance:
        def payloads():
            for t in infos:
                yield t.name, np.ascontiguousarray(checkpoint.tensors[t.name](), np.float32)

        return write_model(out, checkpoint.config, checkpoint.tokenizer, infos, payloads(),
                           progress=lambda info: advance(info.n_weights, info.name))


# --------------------------------------------------------------------------------------------
# Stages 2 and 3: quantize, pack
# --------------------------------------------------------------------------------------------

def quantize(checkpoint: Checkpoint, quantizer: str, options: QuantOptions,
             registry: Registry | None = None) -> QuantizedModel:
    """Stage 2. Plan (now) and quantize (lazily, as the packer pulls tensors)."""
    registry = registry or get_registry()
    return registry.get("quantizer", quantizer).quantize(checkpoint, options)


def pack(model: QuantizedModel, out: Path, packer: str | None = None,
         registry: Registry | None = None) -> dict:
    """Stage 3. Write the model file at ``out`` atomically; returns the packer's summary."""
    registry = registry or get_registry()
    return registry.get("packer", packer or DEFAULT_PACKER).pack(model, out)


# --------------------------------------------------------------------------------------------
# Stages 4-6: emit IR, rewrite, link (ditto_core.stages.compile), and `ditto build`
# --------------------------------------------------------------------------------------------

#: Name of the executable inside a build directory.
EXECUTABLE = "ditto-run"
MODEL_FILE = "model.ditto"
#: The runtime as a shared library (the C API of native/runtime/ditto.h; ``ditto serve`` loads it).
LIBRARY = "libditto.so"

#: The codebook type a build uses when none is given, by quantizer (any other: f16). kmeans:
#: int8, measured on SmolLM2-135M at b = 4, G = 256 (docs/QUANT.md "int8 vs f16 codebooks"):
#: next-token KL from the fp32 build 0.261 against 0.256 with f16 centroids (paired difference
#: 0.005 +- 0.003, within noise), a 10 % smaller file, and the integer GEMV kernels.
DEFAULT_CODEBOOK_TYPE = {"kmeans": "int8"}


@attrs.frozen
class BuildOptions:
    """Everything ``ditto build`` takes besides MODEL and the output directory.

    One component name per stage (None: the default — the exporter that reads MODEL, packer
    ``bits``, emitter ``clang``, passes ``("gemv-blas",)``, linker ``llvm``); ``passes`` run
    in the given order. ``rewrite`` False runs no pass at all (``--no-rewrite`` keeps the
    naive GEMV loops, the RQ3 ablation). ``options``: component options, ``{"gemv-blas":
    {"omp_threads": "region"}}`` or ``{"gemv-blas.omp_threads": "region"}``
    (``ditto_core.base.options``). ``openmp``: compile the runtime with OpenMP; ``cache``: reuse
    cached stage outputs (docs/BUILD.md, "Cache"). ``calibration``: a calibration text (path,
    or ``"stdlib"``) whose importance file (``ditto_core.eval.calibration``, cached; ``build``'s
    ``calibrate``) becomes ``quant.importance``; give either this or ``quant.importance``."""

    quantizer: str
    blas: str
    quant: QuantOptions = QuantOptions()
    exporter: str | None = None
    packer: str | None = None
    emitter: str | None = None
    passes: tuple[str, ...] | None = attrs.field(
        default=None, converter=lambda p: None if p is None else tuple(p))
    linker: str | None = None
    options: dict = attrs.field(factory=dict, converter=normalize)
    rewrite: bool = True
    openmp: bool = True
    cache: bool = True
    calibration: str | None = None


def _write_json_atomic(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def model_fingerprint(path: Path, exporter=None) -> str:
    """SHA-256 of a model's bytes: the file, or every file under an HF directory plus every
    file the exporter says it reads (``exporter.input_files(path)``, optional: files reached
    through a symlinked subdirectory are not under the directory's walk)."""
    from ditto_core.base.cache import file_hash, make_key

    path = Path(path)
    if path.is_dir():
        files = {str(p.relative_to(path)): p for p in path.rglob("*") if p.is_file()}
        read = getattr(exporter, "input_files", None)
        for p in (read(path) if read is not None else ()):
            files.setdefault(os.path.relpath(p, path), Path(p))
        return make_key({name: file_hash(p) for name, p in sorted(files.items())})
    return file_hash(path)


def pack_summary_problem(meta: dict) -> str | None:
    """Why a model cache entry's meta dict cannot stand for the packer's summary (what
    build.json and the CLI print use from it), or None: ``pack`` an object with a numeric
    ``bpw``, an integer ``file_bytes`` and, if present, a ``tensors`` object."""
    pack = meta.get("pack")
    if not isinstance(pack, dict):
        return "meta.json has no 'pack' summary object"
    bpw, size = pack.get("bpw"), pack.get("file_bytes")
    if isinstance(bpw, bool) or not isinstance(bpw, (int, float)):
        return f"meta.json 'pack.bpw' is not a number ({bpw!r})"
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return f"meta.json 'pack.file_bytes' is not a byte count ({size!r})"
    if not isinstance(pack.get("tensors", {}), dict):
        return "meta.json 'pack.tensors' is not an object"
    return None


def model_key(path: Path, exporter: Chosen, quantizer: Chosen, packer: Chosen,
              options: QuantOptions) -> str:
    """Cache key of the export+quantize+pack stages: the model's bytes, the component names
    and their resolved options, the quantize options, and the code of the three plugins and of
    the model-file writer."""
    from ditto_core.base.cache import file_hash, make_key, tree_hash
    from ditto_core.model import format as fmt
    from ditto_core.model import modelfile
    from ditto_core.model import kernel_paths
    from ditto_core.kit import allocate
    from .compile import plugin_fingerprint

    return make_key({
        "model": model_fingerprint(path, exporter.component), "exporter": exporter.record(),
        "quantizer": quantizer.record(), "packer": packer.record(),
        # speed_table only when set, so builds without it keep their cached entries
        "options": attrs.asdict(options, filter=lambda a, v: a.name != "speed_table"
                                or v is not None),
        **({"importance_sha256": file_hash(Path(options.importance))}
           if options.importance else {}),
        **({"max_size_bytes": os.stat(options.max_size_of).st_size}
           if options.max_size_of else {}),
        "code": [plugin_fingerprint(c.component) for c in (exporter, quantizer, packer)]
                + [tree_hash([Path(fmt.__file__), Path(modelfile.__file__)])],
        # the bit allocation's code (and its kernel cost model) only for budgeted builds, so
        # the others keep their cached entries
        **({"allocation_code": tree_hash([Path(allocate.__file__), Path(kernel_paths.__file__)])}
           if options.target_bpw is not None or options.max_size_of else {}),
    })


def _components_record(exporter, quantizer, packer, compile_stages) -> tuple[dict, list]:
    """build.json's ``components`` (each stage's name and resolved options) and
    ``components_code`` (the sorted code fingerprints of every chosen component,
    ``compile.plugin_fingerprint``)."""
    from .compile import plugin_fingerprint

    chosen = [exporter, quantizer, packer, *compile_stages.all()]
    return ({"exporter": exporter.record(), "quantizer": quantizer.record(),
             "packer": packer.record(), **compile_stages.record()},
            sorted({plugin_fingerprint(c.component) for c in chosen}))


def choose_components(model, options: "BuildOptions", registry: Registry):
    """Every component a build of ``model`` with ``options`` takes, configured, with every
    check ``build`` makes before any work: unknown or unusable components, bad component
    options (or options no chosen component takes), b, G or codebook type out of the model
    file's range, the quantizer's own option checks (bad --method etc.). Returns (model path,
    exporter, quantizer, packer, compile stages)."""
    given = normalize(options.options)
    compile_stages = choose_compile(registry, blas=options.blas, emitter=options.emitter,
                                    passes=options.passes, linker=options.linker,
                                    rewrite=options.rewrite, options=given)
    quantizer = choose(registry, "quantizer", options.quantizer, given)
    if options.quantizer != "none":  # b, G, codebook type: the model file's own limits
        codebook.check_params(options.quant.bits, options.quant.group_size,
                              options.quant.codebook_type)
    check_options = getattr(quantizer.component, "check_options", None)
    if check_options is not None:
        check_options(options.quant)
    path = resolve_model(model)
    exp = choose_exporter(path, options.exporter, registry)
    exporter = choose(registry, "exporter", exp.name, given)
    packer = choose(registry, "packer", options.packer or DEFAULT_PACKER, given)
    check_all_used(registry, given, [exporter, quantizer, packer, *compile_stages.all()])
    return path, exporter, quantizer, packer, compile_stages


def chosen_components(model, options: "BuildOptions", registry: Registry | None = None
                      ) -> tuple[dict, list]:
    """What a build of ``model`` with ``options`` would record as ``components`` and
    ``components_code`` in build.json, without building: the components the registry gives
    now, their resolved options and code. A finished build whose record differs was made by
    other code or other component defaults. Raises what ``build`` raises before any work
    (``choose_components``)."""
    _, exporter, quantizer, packer, stages = choose_components(model, options,
                                                               registry or get_registry())
    return _components_record(exporter, quantizer, packer, stages)


#: What a build directory holds; only a directory holding nothing else is replaced.
BUILD_OUTPUTS = frozenset({EXECUTABLE, LIBRARY, MODEL_FILE, "build.json"})


def _check_replaceable(out_dir: Path) -> None:
    """Raise DittoError unless ``out_dir`` is absent, empty, or an earlier build holding only
    the build's own outputs (``BUILD_OUTPUTS``); the message lists the unexpected entries, and
    nothing is touched."""
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if out_dir.is_symlink():
        raise DittoError(f"{out_dir}: is a symbolic link; refusing to replace it (give the "
                         "directory it points to as -o)")
    if not out_dir.is_dir():
        raise DittoError(f"{out_dir}: exists and is not a directory")
    try:
        entries = sorted(out_dir.iterdir())
    except OSError as exc:
        raise DittoError(f"{out_dir}: cannot list it: {exc.strerror or exc}") from None
    if not entries:
        return
    if not (out_dir / "build.json").is_file():
        raise DittoError(f"{out_dir}: exists, is not empty and is not a Ditto build "
                         "directory (no build.json); refusing to replace it")
    extra = [p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in entries
             if p.name not in BUILD_OUTPUTS or not (p.is_file() and not p.is_symlink())]
    if extra:
        raise DittoError(f"{out_dir}: holds files that are not build outputs "
                         f"({', '.join(extra)}); refusing to replace it (move them away or "
                         "use another -o)")


def _prepare_out_dir(out_dir: Path) -> Path:
    """Check that ``out_dir`` may be (re)placed and return a fresh temp dir beside it.
    Raises DittoError for the current directory (or one holding it), a non-directory, a
    directory holding anything besides an earlier build's outputs, or an unwritable parent."""
    try:
        here = Path.cwd().resolve()
    except OSError:  # the current directory was deleted: it cannot be the target
        here = None
    target = out_dir.resolve()
    if here is not None and (target == here or target in here.parents):
        raise DittoError(f"{out_dir}: cannot replace the current directory (or one holding "
                         "it); use another -o")
    _check_replaceable(out_dir)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(target.parent, f"{target.name}.tmp-")  # left by killed builds
        return Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-{pid_tag()}",
                                     dir=target.parent))
    except OSError as exc:
        for anc in (out_dir.parent, *out_dir.parent.parents):  # e.g. -o afile/sub
            if anc.exists() or anc.is_symlink():
                if not anc.is_dir():
                    raise DittoError(f"{anc}: is not a directory, so -o {out_dir} cannot be "
                                     "created") from None
                break
        raise DittoError(f"{out_dir}: cannot create the output directory: "
                         f"{exc.strerror or exc}") from None


def _publish(tmp: Path, out_dir: Path) -> None:
    """Move the finished build ``tmp`` to ``out_dir`` (replacing an older build there, checked
    again: files added to it during the build are never deleted). Raises DittoError."""
    _check_replaceable(out_dir)
    old = None
    try:
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
            os.rename(out_dir, old)
        try:
            os.rename(tmp, out_dir)
        except BaseException:
            if old is not None:
                os.rename(old, out_dir)
            raise
    except OSError as exc:
        raise DittoError(f"{out_dir}: cannot replace it with the new build: "
                         f"{exc.strerror or exc}") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _normal_permissions(d: Path) -> None:
    """mkdtemp/mkstemp create 0700/0600: give the build directory and its files the modes a
    plain mkdir/open would (0777/0666 minus the umask), keeping the executable bits."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(d, 0o777 & ~umask)
    for f in d.iterdir():
        mode = 0o777 if os.access(f, os.X_OK) else 0o666
        os.chmod(f, mode & ~umask)


class _StageLog:
    """Stage progress on stderr. On a terminal: a rich bar ``build [####  ] 4/6 emit IR``,
    paused while the packer draws its own weights bar; otherwise one line per stage
    (``[3/6] pack``). ``close()`` removes the bar."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total, self.k = enabled, total, 0
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn)
            self.bar = Progress(TextColumn("build", style="bold"), BarColumn(),
                                MofNCompleteColumn(),
                                TextColumn("{task.description}", markup=False),  # file names
                                TimeElapsedColumn(),
                                console=Console(file=sys.stderr), transient=True)
            self.task = self.bar.add_task("", total=total)
            self.bar.start()

    def __call__(self, name: str, note: str = "") -> None:
        if not self.enabled:
            return
        text = f"{name}{(' — ' + note) if note else ''}"
        if self.bar is None:
            self.k += 1
            print(f"[{self.k}/{self.total}] {text}", file=sys.stderr, flush=True)
            return
        if self.k:
            self.bar.update(self.task, advance=1)
        self.k += 1
        self.bar.update(self.task, description=f"{self.k}/{self.total} {text}")
        if name == "pack" and not note.startswith("cached"):
            self.bar.stop()  # one live display at a time: the packer's bar takes over
        elif not self.bar.live.is_started:
            self.bar.start()

    def close(self) -> None:
        if self.bar is not None and self.bar.live.is_started:
            self.bar.stop()


def planned_model_bytes(model: QuantizedModel) -> int:
    """Payload bytes of the model file ``model.plan`` describes (FORMAT.md sizes: f32, or
    codebooks + packed indices; tensors of an encoding unknown here counted as f32), plus
    64-byte alignment per tensor. The header, tensor table and tokenizer are left to the
    pre-flight check's margin."""
    from ditto_core.model.modelfile import f32_nbytes

    total = 0
    for name, (encoding, params) in model.plan.items():
        shape = tuple(int(x) for x in model.shapes[name])
        n = f32_nbytes(shape)
        if encoding == "codebook" and len(shape) == 2:
            try:
                n = codebook.payload_bytes(shape[0], shape[1], *params[:3])
            except (DittoError, KeyError, TypeError, ValueError):
                pass
        total += n + 64
    return total


def largest_tensor(model: QuantizedModel) -> int:
    """Weights of the largest tensor in ``model`` (what one quantization step holds)."""
    import math

    return max((math.prod(int(x) for x in s) for s in model.shapes.values()), default=0)


def _timed_tensors(model: QuantizedModel) -> tuple[QuantizedModel, list[float]]:
    """``model`` with its lazy tensor iterator timed: the returned list's one element
    accumulates the wall seconds spent producing tensors (quantization, and the lazy loading
    of the checkpoint tensors it reads), so build.json can book them to the quantize stage."""
    pulled = [0.0]

    def tensors():
        it = iter(model.tensors())
        while True:
            t0 = time.perf_counter()
            try:
                with deferred():  # numba kernels run here: stop signals wait for the tensor
                    item = next(it)
            except StopIteration:
                pulled[0] += time.perf_counter() - t0
                return
            pulled[0] += time.perf_counter() - t0
            yield item

    return attrs.evolve(model, tensors=tensors), pulled


def build(model: str | os.PathLike, out_dir: Path, options: BuildOptions,
          registry: Registry | None = None, *, cache_root: Path | None = None,
          show_progress: bool = False, calibrate=None) -> dict:
    """Run the six stages and write the build directory ``out_dir`` (docs/BUILD.md):
    ``ditto-run`` (the executable), ``libditto.so`` (the runtime's C API, native/runtime/ditto.h,
    for ``ditto serve``), ``model.ditto`` and ``build.json`` (per-stage seconds, bpw, pass report,
    options).

    Atomic: everything is built in ``<out_dir>.tmp-*`` beside it and renamed at the end, so a
    failed build leaves no half-written ``out_dir`` (an older build there stays intact until
    the new one is complete). Stage outputs are cached by content hash (``cache.Cache``):
    model file by (model bytes, components, quantize options), executable by (runtime sources,
    flags, BLAS, passes, host CPU). Returns the build.json record. Raises DittoError for
    unknown components (PluginError listing the choices), an unavailable BLAS target, a model
    that does not load, a compile or link failure.

    ``calibrate``: the step that turns ``options.calibration`` into an importance file,
    ``calibrate(model, path, exporter, calibration, blas, cache, show_progress=...) -> Path``
    (``ditto_core.eval.calibration.cached_importance``, which ``ditto_core.build`` passes). It is a
    parameter because calibration runs the fp32 model (a build of its own, torch), a layer
    above this module; a calibration text without it raises DittoError."""
    from ditto_core.base.cache import Cache
    from .compile import build_runtime

    registry = registry or get_registry()
    out_dir = Path(out_dir)
    t_start = time.perf_counter()
    # fail early, before any work: unknown or unusable components, unknown or bad options
    path, exporter, quantizer, packer, compile_stages = choose_components(model, options,
                                                                          registry)
    cache = Cache(root=cache_root, enabled=None if options.cache else False)

    timings = Timings()
    components, code = _components_record(exporter, quantizer, packer, compile_stages)
    record: dict = {"model": str(model), "model_path": str(path), "executable": EXECUTABLE,
                    "library": LIBRARY, "model_file": MODEL_FILE, "quantizer": quantizer.name,
                    "exporter": exporter.name, "packer": packer.name,
                    "blas": options.blas, "rewrite": options.rewrite,
                    "openmp": options.openmp, "options": attrs.asdict(options.quant),
                    "components": components, "components_code": code,
                    "stages": timings.seconds, "cached": {}}
    quant = options.quant
    if options.calibration is not None and options.quantizer != "none":
        if quant.importance:
            raise DittoError("give either a calibration text or an importance file, not both")
        if calibrate is None:
            raise DittoError("a calibration text needs the calibration step: pass "
                             "calibrate=ditto_core.eval.calibration.cached_importance to "
                             "pipeline.build (ditto_core.build and `ditto build` do)")
        quant = attrs.evolve(quant, importance=str(calibrate(
            model, path, exporter.component, options.calibration, options.blas, cache,
            show_progress=show_progress)))
    if quant.importance:
        from ditto_core.kit.importance import importance_record
        record["importance"] = importance_record(quant.importance)
        record["calibration"] = record["importance"]["calibration"]
    tmp = _prepare_out_dir(out_dir)
    log = _StageLog(show_progress, 6)
    peaks = StagePeaks()
    try:
        # ---- stages 1-3: export, quantize, pack (cached as one unit) ---------------------
        key = model_key(path, exporter, quantizer, packer, quant)
        record["model_sha256"] = model_fingerprint(path, exporter.component)
        hit = cache.fetch("model", key, {MODEL_FILE: tmp / MODEL_FILE},
                          validate=pack_summary_problem)
        if hit is not None:
            for name in ("export", "quantize", "pack"):
                log(name, "cached")
                timings.seconds[name] = 0.0
            summary = hit["pack"]
            record["cached"]["model"] = True
        else:
            log("export", f"{path.name} with {exporter.name}")
            peaks.start("export")
            with timings.stage("export"):
                checkpoint = load_checkpoint(exporter.component, path)
            log("quantize", quantizer.name)
            peaks.start("quantize")
            with timings.stage("quantize"):
                qmodel = quantizer.component.quantize(checkpoint, quant)
            # the plan fixes the model file's size: check disk and memory before any tensor
            record["resources"] = check_resources(
                out_dir, planned_model_bytes(qmodel), largest_tensor(qmodel),
                cache.root if cache.enabled else None)
            log("pack", f"{packer.name} (quantization runs as the packer pulls tensors)")
            peaks.start("pack")
            qmodel, pulled = _timed_tensors(qmodel)
            with timings.stage("pack"):
                summary = packer.component.pack(qmodel, tmp / MODEL_FILE)
            # the lazy quantization ran inside the packer: book its seconds to "quantize"
            timings.seconds["quantize"] += pulled[0]
            timings.seconds["pack"] -= pulled[0]
            summary = {k: v for k, v in summary.items() if k != "path"}
            cache.put("model", key, {MODEL_FILE: tmp / MODEL_FILE}, {"pack": summary})
            record["cached"]["model"] = False
        record["pack"] = {k: v for k, v in summary.items() if k not in ("tensors", "report")}
        record["bpw"] = summary.get("bpw")
        allocation = (summary.get("report") or {}).get("allocation")
        if allocation:
            record["allocation"] = {k: v for k, v in allocation.items() if k != "candidates"}
        record["tensors"] = summary.get("tensors", {})

        # ---- stages 4-6: emit IR, rewrite, link (cached as one unit) ---------------------
        doing = {"emit IR": compile_stages.emitter.name,
                 "rewrite": ", ".join(p.name for p in compile_stages.passes) or "no pass",
                 "link": compile_stages.linker.name
                 + (f" + {compile_stages.blas.name}" if compile_stages.blas else "")}

        def on_stage(st):
            peaks.start(st)
            log(st, doing[st])

        peaks.stop()
        res = build_runtime(tmp / EXECUTABLE, stages=compile_stages, openmp=options.openmp,
                            cache=cache, on_stage=on_stage, library=tmp / LIBRARY)
        peaks.stop()
        if res.cached:
            for st in res.seconds:
                log(st, "cached")
        timings.seconds.update(res.seconds)
        record["cached"]["compile"] = res.cached
        record["compile_key"] = res.key
        record["passes"] = list(res.passes)
        record["pass_summary"] = list(res.summary)
        record["total_seconds"] = time.perf_counter() - t_start
        record["peak_rss"] = peaks.record()
        record["status"] = "complete"
        _write_json_atomic(tmp / "build.json", record)
        _normal_permissions(tmp)
        _publish(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        log.close()
    return record
