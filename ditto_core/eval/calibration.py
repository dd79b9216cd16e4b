"""Calibration: per-input-channel importance of every linear layer, from the fp32 model run
over a calibration text (docs/QUANT.md "Activation-aware codebooks").

For a linear layer y = W x the importance of input channel c is the mean of x_c² over the
calibration tokens — the diagonal of XᵀX / T, the statistic llama.cpp's ``llama-imatrix``
stores. ``kmeans`` then weights each weight's squared error by its channel's importance
(``quantkit.importance_weights``).

The calibration text is tokenized by the model's own fp32 Ditto build (``ditto-run --tokens``,
the build ``ditto eval`` uses as its baseline, built once and cached) and cut into 512-token
chunks as ``llama-imatrix`` does (BOS first in each chunk when the tokenizer adds BOS); the
forward pass is the transformers ``LlamaForCausalLM`` (``Qwen2ForCausalLM`` for a Qwen2 model,
with its q/k/v biases) built from Ditto's own export
(``eval.torch_int8.fp32_model_from_checkpoint``: the weights of the fp32 build), with a hook
on every ``nn.Linear`` summing x² per input channel in float64.

The shipped default text (``--calibration stdlib``) is six CPython 3.11.7 standard-library
modules that are *not* in the evaluation corpus (``CALIBRATION_MODULES``; PSF license).

The importance file (``.npz``) and its reader are ``ditto_core.kit.importance``: the quantizer kit
reads it without loading this module (torch, the evaluation harness).
"""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path
from typing import Callable

from ditto_core.base.errors import DittoError
from ditto_core.kit.importance import (FORMAT, STATISTIC, VERSION, Importance, load_importance,
                                       save_importance)

#: ``--calibration stdlib``: the shipped text, these modules joined with "\n"
STDLIB = "stdlib"
CALIBRATION_MODULES = ("contextlib", "string", "copy", "queue", "json/decoder", "json/encoder")
CALIBRATION_FILE = "calibration-cpython-3.11.7-stdlib.txt"
CALIBRATION_SHA256 = "556cc69efac78958d293f70af68ebceceb0009e51be71dfb0932411593dab184"
N_CTX = 512


def stdlib_calibration_path() -> Path:
    """Path of the shipped calibration text (``--calibration stdlib``)."""
    return Path(str(resources.files("ditto_core.eval") / "data" / CALIBRATION_FILE))


def calibration_text(spec: str | os.PathLike) -> tuple[bytes, dict]:
    """The calibration text ``spec`` (a file path, or ``"stdlib"`` for the shipped one) and
    its identity ``{"name", "bytes", "sha256"}`` (``name``: the file name, or
    ``stdlib:<modules>``). Raises DittoError for an unreadable or empty file, or a shipped
    text that does not match its recorded hash."""
    if str(spec) == STDLIB:
        path, name = stdlib_calibration_path(), "stdlib:" + ",".join(CALIBRATION_MODULES)
    else:
        path, name = Path(spec), Path(spec).name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DittoError(f"{path}: cannot read the calibration text: "
                         f"{exc.strerror or exc}") from None
    if not data.strip():
        raise DittoError(f"{path}: the calibration text is empty")
    try:  # checked here, so that the message names this file and not a tokenizer's input
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DittoError(f"{path}: the calibration text is not UTF-8 (invalid byte at offset "
                         f"{exc.start})") from None
    digest = hashlib.sha256(data).hexdigest()
    if str(spec) == STDLIB and digest != CALIBRATION_SHA256:
        raise DittoError(f"{path}: the shipped calibration text has sha256 {digest}, expected "
                         f"{CALIBRATION_SHA256} (damaged installation)")
    return data, {"name": name, "bytes": len(data), "sha256": digest}


def linear_inputs(model, tied: bool) -> dict:
    """transformers module name of every ``nn.Linear`` of ``model`` → the Ditto tensor names
    it multiplies (q/k/v share one input; ``lm_head`` is ``token_embd.weight`` when the
    embeddings are tied, else ``output.weight``)."""
    import torch

    from .torch_int8 import LAYER

    back = {v: k for k, v in LAYER.items()}
    out = {}
    for mname, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        if mname == "lm_head":
            out[mname] = "token_embd.weight" if tied else "output.weight"
            continue
        parts = mname.split(".")  # model.layers.N.self_attn.q_proj
        key = ".".join(parts[3:]) + ".weight"
        if parts[:2] != ["model", "layers"] or key not in back:
            raise DittoError(f"calibration: no Ditto tensor for the layer {mname}")
        out[mname] = f"blk.{parts[2]}.{back[key]}"
    return out


def collect_importance(checkpoint, chunks: list[list[int]], *, threads: int | None = None,
                       progress: Callable[[int, int], None] | None = None) -> dict:
    """Run the fp32 model of ``checkpoint`` over each token chunk (one forward pass per
    chunk) and return Ditto tensor name → float64 [in_features], the mean of x² per input
    channel over all positions of all chunks. Raises DittoError when torch or transformers is
    missing."""
    from .torch_int8 import fp32_model_from_checkpoint

    model = fp32_model_from_checkpoint(checkpoint)  # DittoError when torch is missing
    import torch

    if threads:
        torch.set_num_threads(threads)
    names = linear_inputs(model, checkpoint.config.tied_embeddings)
    sums = {n: None for n in names.values()}
    count = [0]
    hooks = []

    def hook_for(tensor):
        def hook(_mod, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).double()
            s = (x * x).sum(dim=0)
            sums[tensor] = s if sums[tensor] is None else sums[tensor] + s
        return hook

    for mname, mod in model.named_modules():
        if mname in names:
            hooks.append(mod.register_forward_pre_hook(hook_for(names[mname])))
    try:
        with torch.inference_mode():
            for i, chunk in enumerate(chunks):
                model(torch.tensor([chunk]))
                count[0] += len(chunk)
                if progress:
                    progress(i + 1, len(chunks))
    finally:
        for h in hooks:
            h.remove()
    return {n: (s / count[0]).numpy() for n, s in sums.items() if s is not None}


def tokenize_with_fp32_build(model, model_path: Path, model_sha: str, text: bytes,
                             blas: str) -> tuple[list[int], object]:
    """Token ids of ``text`` (BOS first when the tokenizer adds it) by the fp32 build of the
    model (``<cache root>/eval-baselines/``, shared with ``ditto eval``; built when absent),
    and that build's tokenizer record."""
    from ditto_core.base.cache import default_root
    from ditto_core.runtime.run import find_build
    from ditto_core.stages import pipeline
    from . import builds, corpus
    from .fidelity import build_vocab

    opts = pipeline.BuildOptions(quantizer="none", blas=blas)
    out = default_root() / "eval-baselines" / f"{model_sha[:16]}-none-{blas}"
    out.parent.mkdir(parents=True, exist_ok=True)
    builds.ensure_build(model, out, opts)
    _, tok = build_vocab(out)
    exe, mfile, _ = find_build(out)
    return corpus.tokenize(exe, mfile, text, tok.add_bos), tok


def calibrate(model, calibration, *, blas: str = "openblas", exporter=None,
              threads: int | None = None,
              progress: Callable[[int, int], None] | None = None) -> Importance:
    """The importance of every linear layer of ``model`` (path or bundled name) over the
    calibration text ``calibration`` (path or ``"stdlib"``). Raises DittoError for an
    unreadable text or a text shorter than two chunks (``eval.corpus.chunks``)."""
    from ditto_core.stages import pipeline
    from . import corpus

    text, ident = calibration_text(calibration)
    path = pipeline.resolve_model(model)
    exp = exporter or pipeline.choose_exporter(path)
    sha = pipeline.model_fingerprint(path, exp)
    tokens, tok = tokenize_with_fp32_build(model, path, sha, text, blas)
    try:
        chunks = corpus.chunks(tokens, N_CTX, None, bos_id=tok.bos_id if tok.add_bos else None)
    except DittoError as exc:  # too short: name the text
        raise DittoError(f"{calibration}: {exc}") from None
    ck = pipeline.load_checkpoint(exp, path)
    vectors = collect_importance(ck, chunks, threads=threads, progress=progress)
    meta = {"format": FORMAT, "version": VERSION, "statistic": STATISTIC,
            "calibration": ident, "model_sha256": sha, "tokens": len(chunks) * N_CTX,
            "chunks": len(chunks), "n_ctx": N_CTX}
    return Importance(vectors, meta)


def cached_importance(model, path: Path, exporter, calibration, blas: str, cache, *,
                      show_progress: bool = False) -> Path:
    """The importance file of ``model`` over the calibration text ``calibration``, computed
    once (``calibrate``) and kept in the cache (``<cache root>/importance/<key>.npz``, key: the
    model's bytes, the text's sha256, the chunk length and this module's code); with the cache
    disabled, computed into a fresh temporary directory."""
    import tempfile

    from ditto_core.base.cache import file_hash, make_key
    from ditto_core.stages.pipeline import model_fingerprint

    _, ident = calibration_text(calibration)
    key = make_key({"model": model_fingerprint(path, exporter), "calibration": ident["sha256"],
                    "n_ctx": N_CTX, "code": file_hash(Path(__file__))})
    if cache.enabled:
        out = Path(cache.root) / "importance" / f"{key}.npz"
        if out.is_file():
            try:
                load_importance(out)
                return out
            except DittoError:
                out.unlink(missing_ok=True)  # damaged entry: compute it again
        out.parent.mkdir(parents=True, exist_ok=True)
    else:
        out = Path(tempfile.mkdtemp(prefix="ditto-importance-")) / f"{key}.npz"
    progress, stop = None, lambda: None
    if show_progress:
        from ditto_core.base.progress import progress_callback
        progress, stop = progress_callback("calibration", False)
    try:
        imp = calibrate(model, calibration, blas=blas, exporter=exporter, progress=progress)
    finally:
        stop()
    save_importance(imp, out)
    return out
