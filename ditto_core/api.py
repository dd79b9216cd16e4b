"""Ditto's Python API, for notebooks and scripts; ``ditto build`` / ``ditto run`` / ``ditto
inspect`` are thin layers over the same functions (docs/PYTHON.md).

    >>> import ditto_core
    >>> b = ditto_core.build("tinycoder", quantizer="kmeans", blas="openblas", bits=4,
    ...                      options={"gemv-blas.omp_threads": "single"}, out="out/tiny")
    >>> b.run("def fib(n):", n=16)          # generated text (greedy by default)
    >>> b.logits([1, 822, 18755])            # float32 [3, vocab_size]
    >>> b.inspect()["bpw_file"]
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs
import numpy as np

from ditto_core.base.errors import DittoError
from ditto_core.kit.components import QuantOptions
from ditto_core.stages.pipeline import DEFAULT_CODEBOOK_TYPE
from ditto_core.stages.plugins import Registry


@attrs.frozen
class Build:
    """A finished build directory: ``path`` holds the executable, the model file and
    ``build.json`` (``record``, docs/BUILD.md)."""

    path: Path
    record: dict = attrs.field(eq=False, repr=False)

    @classmethod
    def open(cls, path: str | os.PathLike) -> "Build":
        """The build in directory ``path``. Raises DittoError naming what is missing."""
        from ditto_core.runtime.run import find_build

        _, _, meta = find_build(Path(path))
        return cls(Path(path), meta)

    @property
    def executable(self) -> Path:
        return self.path / self.record.get("executable", "ditto-run")

    @property
    def model_file(self) -> Path:
        return self.path / self.record.get("model_file", "model.ditto")

    def _run(self, args: Sequence[str], timeout: float | None) -> subprocess.CompletedProcess:
        from ditto_core.runtime.run import run_build

        try:
            proc = run_build(self.path, list(args), capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DittoError(f"{self.executable}: did not finish within {timeout:g} s; "
                             "stopped") from None
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()
            raise DittoError(f"{self.executable}: exit {proc.returncode}: {err}")
        return proc

    def run(self, prompt: str, *, n: int = 64, temperature: float = 0.0,
            seed: int | None = None, threads: int | None = None,
            args: Sequence[str] = (), timeout: float | None = 600) -> str:
        """Generate up to ``n`` tokens after ``prompt`` and return the generated text (the
        prompt not included, nor the newline ``ditto-run`` ends its output with).
        ``temperature`` 0 is greedy argmax (deterministic); ``seed`` the sampler's PRNG seed;
        ``threads`` OpenMP threads (default: all cores); ``args``: more ``ditto-run`` flags
        (native/README.md). Raises DittoError with the executable's message when it fails."""
        argv = ["-p", prompt, "-n", str(int(n)), "--temp", repr(float(temperature))]
        if seed is not None:
            argv += ["--seed", str(int(seed))]
        if threads is not None:
            argv += ["--threads", str(int(threads))]
        out = self._run([*argv, *args], timeout).stdout
        return out.removesuffix(b"\n").decode("utf-8", "replace")

    def logits(self, token_ids: Sequence[int], *, threads: int | None = None,
               timeout: float | None = 600) -> np.ndarray:
        """Logits of the model after each token of ``token_ids`` (used verbatim: no BOS is
        added): float32 ``[len(token_ids), vocab_size]``, row i = the scores of token i + 1.
        Computed by the executable (``--dump-logits``), so they are exactly what ``run``
        samples from. Raises DittoError for an empty list or an id out of range."""
        ids = [int(t) for t in token_ids]
        if not ids:
            raise DittoError("logits: token_ids is empty")
        with tempfile.TemporaryDirectory(prefix="ditto-logits-") as tmp:
            ids_file, out = Path(tmp) / "ids.json", Path(tmp) / "logits.f32"
            ids_file.write_text(json.dumps(ids))
            argv = ["--ids", str(ids_file), "--dump-logits", str(out)]
            if threads is not None:
                argv += ["--threads", str(int(threads))]
            self._run(argv, timeout)
            return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)

    def inspect(self, *, verify: bool = True) -> dict:
        """What ``ditto inspect --json`` prints for the model file: config, tokenizer, tensor
        table, sizes, bits per weight, the quantize rules (``summary.inspect_summary``)."""
        from ditto_core.model.modelfile import ModelFile
        from ditto_core.model.summary import inspect_summary

        with ModelFile.open(self.model_file, verify=verify) as mf:
            return inspect_summary(mf, self.record)


def build(model: str | os.PathLike, *, quantizer: str = "kmeans", blas: str = "openblas",
          out: str | os.PathLike | None = None, bits: int = 4, group_size: int = 256,
          keep_fp32: Sequence[str] = (), tensor_types: Sequence[str] = (),
          method: str | None = None,
          codebook_type: str | None = None, seed: int = 0, exporter: str | None = None,
          packer: str | None = None, emitter: str | None = None,
          passes: Sequence[str] | None = None, linker: str | None = None,
          options: Mapping[str, Any] | None = None, rewrite: bool = True,
          openmp: bool = True, cache: bool = True, progress: bool = False,
          registry: Registry | None = None, calibration: str | os.PathLike | None = None,
          importance: str | os.PathLike | None = None, target_bpw: float | None = None,
          max_size_of: str | os.PathLike | None = None,
          speed_aware: str | None = "auto") -> Build:
    """Build ``model`` (an HF directory, a .gguf file, or a bundled name: ``"smollm2"``,
    ``"tinycoder"``, ``"qwen2.5-coder-0.5b"``, ``"qwen2.5-coder-1.5b"``; the Qwen ones are
    downloaded into the cache on first use, docs/INPUTS.md) into the directory ``out``
    (default: a new temporary directory) and return the Build.

    The arguments are ``ditto build``'s flags: the quantize options (``bits`` b in 1..8,
    ``group_size`` G, ``keep_fp32`` globs, ``tensor_types`` ``GLOB=SPEC`` rules, ``method``,
    ``codebook_type`` (None: the quantizer's default in ``DEFAULT_CODEBOOK_TYPE``, else f16),
    ``seed``), a
    component per stage by name (None: the default), ``passes`` in run order, ``options`` of
    components as ``{"COMPONENT": {"KEY": value}}`` or ``{"COMPONENT.KEY": value}``
    (docs/PLUGINS.md), ``rewrite`` False for no pass, ``registry`` the plugins to use
    (default: the installed ones). ``calibration``: a calibration text (path, or ``"stdlib"``
    for the shipped one) or ``importance``: an importance file (``ditto calibrate``) whose
    per-channel activation statistics weight the quantizer's error (docs/QUANT.md);
    ``target_bpw`` or ``max_size_of`` (a file whose size is the budget): per-tensor b and G
    chosen under that file-size budget (``ditto_core.kit.allocate``), with ``speed_aware``
    (``"auto"``: this CPU's kernel table, none on ``generic``; ``"off"`` or None; or a table
    name) holding the plan's modelled GEMV time on that table within ``allocate.SPEED_SLACK``
    of the default plan's (``allocate.resolve_speed_table``, ``allocate.speed_limited``); a
    table named without a budget changes nothing and says so (a warning). Raises DittoError
    (PluginError, OptionError) before any
    work for an unknown component or option, and for a model that does not load or a stage
    that fails; nothing is left at ``out`` then."""
    from ditto_core.kit.allocate import resolve_speed_table
    from ditto_core.eval.calibration import cached_importance
    from ditto_core.stages.pipeline import BuildOptions
    from ditto_core.stages.pipeline import build as run_pipeline

    if codebook_type is None:
        codebook_type = DEFAULT_CODEBOOK_TYPE.get(quantizer, "f16")
    # one name where a sequence is expected is that one name, not its characters
    passes, keep_fp32, tensor_types = ([v] if isinstance(v, str) else v
                                       for v in (passes, keep_fp32, tensor_types))
    if max_size_of is not None and not Path(max_size_of).is_file():
        what = ("is not a regular file" if Path(max_size_of).exists() else "does not exist")
        raise DittoError(f"{max_size_of}: max_size_of must name an existing file (its size is "
                         f"the budget); this one {what}")
    if max_size_of is not None and Path(max_size_of).stat().st_size == 0:
        raise DittoError(f"{max_size_of}: max_size_of names an empty file (its size, 0 bytes, "
                         f"is the budget)")
    budget = target_bpw is not None or max_size_of is not None
    if not budget and speed_aware not in (None, "auto", "off"):
        resolve_speed_table(speed_aware)  # an unknown name is refused all the same
        warnings.warn(f"ditto: --speed-aware {speed_aware} has no effect without a size budget "
                      f"(--target-bpw or --max-size-of): every tensor keeps its layout",
                      stacklevel=2)
    if out is None:
        out = tempfile.mkdtemp(prefix="ditto-build-")
    opts = BuildOptions(
        quantizer=quantizer, blas=blas, exporter=exporter, packer=packer, emitter=emitter,
        passes=passes, linker=linker, options=options or {}, rewrite=rewrite, openmp=openmp,
        cache=cache, calibration=None if calibration is None else str(calibration),
        quant=QuantOptions(bits=bits, group_size=group_size, keep_fp32=tuple(keep_fp32),
                           tensor_types=tuple(tensor_types), method=method,
                           codebook_type=codebook_type, seed=seed,
                           importance=None if importance is None else str(importance),
                           target_bpw=target_bpw,
                           max_size_of=None if max_size_of is None else str(max_size_of),
                           speed_table=resolve_speed_table(speed_aware) if budget else None))
    record = run_pipeline(model, Path(out), opts, registry, show_progress=progress,
                          calibrate=cached_importance)
    return Build(Path(out), record)
