"""Perplexity and KL divergence of a build against a baseline build on the corpus chunks
(``ditto eval``; method: llama.cpp ``llama-perplexity --kl-divergence``, see corpus.py).

Each chunk is evaluated by each build's executable with ``--ids CHUNK --dump-logits FILE``
(native/README.md: raw float32 ``[n_tokens, vocab_size]``, row i = logits after token i); only
the rows ``n_ctx // 2 .. n_ctx - 2`` are read, and metrics.KLAccumulator scores them in float64.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from ditto_core.base.errors import DittoError
from ditto_core.model.modelfile import ModelFile
from ditto_core.runtime.run import find_build
from . import corpus as corpus_mod
from .metrics import KLAccumulator


def build_vocab(build_dir: Path) -> tuple[int, object]:
    """(vocab_size, TokenizerSpec) of a build's model file (header only, no CRC pass)."""
    _, model, _ = find_build(build_dir)
    with ModelFile.open(model, verify=False) as mf:
        return mf.config.vocab_size, mf.tokenizer


def dump_logits(build_dir: Path, ids: list[int], workdir: Path, *, threads: int | None = None,
                rows: slice | None = None) -> np.ndarray:
    """Logits of ``ids`` (one forward pass per token, no BOS added) by the build's executable.

    Returns float32 ``[len(ids), vocab_size]``, or only ``rows`` of it. Raises DittoError naming
    the build when the executable fails or writes a file of the wrong size."""
    exe, model, _ = find_build(build_dir)
    vocab, _ = build_vocab(build_dir)
    ids_file = workdir / "chunk.ids"
    out = workdir / "logits.f32"
    ids_file.write_text(" ".join(map(str, ids)))
    cmd = [str(exe), "-m", str(model), "--ids", str(ids_file), "--dump-logits", str(out)]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DittoError(f"{build_dir}: --dump-logits failed (exit {proc.returncode}): "
                         f"{proc.stderr.strip()}")
    try:
        n = len(ids)
        if out.stat().st_size != n * vocab * 4:
            raise DittoError(f"{out}: {out.stat().st_size} bytes, expected {n}×{vocab}×4")
        start, stop = (0, n) if rows is None else rows.indices(n)[:2]
        with open(out, "rb") as f:
            f.seek(start * vocab * 4)
            data = np.fromfile(f, dtype="<f4", count=(stop - start) * vocab)
        return data.reshape(stop - start, vocab)
    finally:
        out.unlink(missing_ok=True)


class LogitsCache:
    """Rows ``n_ctx // 2 .. n_ctx - 2`` of a build's logits per chunk, as raw float32 files in
    ``<cache root>/eval-logits/`` (``$DITTO_CACHE_DIR`` or ~/.cache/ditto; ``DITTO_NO_CACHE=1``
    turns it off), keyed by the model file's SHA-256, the executable's compile key, the
    thread count (it changes the float summation order) and the chunk's token ids. The baseline of a sweep is then computed once."""

    def __init__(self, build_dir: Path, enabled: bool = True, threads: int | None = None):
        from ditto_core.base.cache import default_root, file_hash

        self.enabled = enabled and os.environ.get("DITTO_NO_CACHE") != "1"
        if self.enabled:
            _, model, meta = find_build(build_dir)
            # the thread count changes the float summation order, so it is part of the key
            self.ident = {"model": file_hash(model), "exe": meta.get("compile_key"),
                          "threads": threads}
            self.root = default_root() / "eval-logits"

    def path(self, chunk: list[int], rows: slice) -> Path:
        from ditto_core.base.cache import make_key

        return self.root / (make_key({**self.ident, "ids": chunk,
                                      "rows": [rows.start, rows.stop]}) + ".f32")

    def get(self, chunk: list[int], rows: slice, vocab: int) -> np.ndarray | None:
        if not self.enabled:
            return None
        p = self.path(chunk, rows)
        n = rows.stop - rows.start
        try:
            if p.stat().st_size != n * vocab * 4:
                return None
            return np.fromfile(p, dtype="<f4").reshape(n, vocab)
        except OSError:
            return None

    def put(self, chunk: list[int], rows: slice, logits: np.ndarray) -> None:
        if not self.enabled:
            return
        p = self.path(chunk, rows)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".logits-", dir=p.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(np.ascontiguousarray(logits, "<f4").tobytes())
            os.replace(tmp, p)
        except OSError:  # a full or read-only cache costs time, not results
            pass


def evaluate_fidelity(build_dir: Path, baseline_dir: Path, *, n_chunks: int | None = None,
                      n_ctx: int = corpus_mod.N_CTX, threads: int | None = None,
                      text: bytes | None = None, cache_baseline: bool = True,
                      progress: Callable[[int, int], None] | None = None) -> dict:
    """Perplexity of both builds and KL divergence of ``build_dir`` from ``baseline_dir`` on the
    first ``n_chunks`` chunks of the corpus (default: all; ``text`` replaces the corpus in tests).
    The baseline's logits are kept in a LogitsCache unless ``cache_baseline`` is False.

    Returns metrics.KLAccumulator.summary() plus ``chunks``, ``n_ctx``, ``corpus_sha256``.
    Raises DittoError when the two builds' tokenizers or vocabularies differ (their logits are
    not comparable) or a run fails. ``progress(done, total)`` is called after each chunk."""
    import hashlib

    v1, tok1 = build_vocab(build_dir)
    v2, tok2 = build_vocab(baseline_dir)
    if v1 != v2 or tok1.tokens != tok2.tokens:
        raise DittoError(f"{build_dir} and {baseline_dir}: different vocabularies "
                         f"({v1} vs {v2} tokens); KL divergence needs the same tokenizer")
    data = corpus_mod.corpus_bytes() if text is None else text
    exe, model, _ = find_build(build_dir)
    tokens = corpus_mod.tokenize(exe, model, data, tok1.add_bos)
    chunk_list = corpus_mod.chunks(tokens, n_ctx, n_chunks,
                                   bos_id=tok1.bos_id if tok1.add_bos else None)
    first = n_ctx // 2
    rows = slice(first, n_ctx - 1)
    acc = KLAccumulator()
    base_cache = LogitsCache(baseline_dir, enabled=cache_baseline, threads=threads)
    with tempfile.TemporaryDirectory(prefix="ditto-eval-") as tmp:
        work = Path(tmp)
        for i, chunk in enumerate(chunk_list):
            base = base_cache.get(chunk, rows, v1)
            if base is None:
                base = dump_logits(baseline_dir, chunk, work, threads=threads, rows=rows)
                base_cache.put(chunk, rows, base)
            test = dump_logits(build_dir, chunk, work, threads=threads, rows=rows)
            acc.add(base, test, chunk[first + 1:])
            if progress:
                progress(i + 1, len(chunk_list))
    out = acc.summary()
    out.update(chunks=len(chunk_list), n_ctx=n_ctx,
               corpus_sha256=hashlib.sha256(data).hexdigest(), corpus_tokens=len(tokens))
    return out


def default_threads() -> int:
    """Threads for evaluation runs: all cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
