"""The held-out code corpus of ``ditto eval`` and its 512-token chunks.

The corpus is ten CPython 3.11.7 standard-library modules (argparse, functools, textwrap, shlex,
fractions, heapq, bisect, dataclasses, enum, statistics, in that order) joined with ``"\\n"``:
411,098 bytes, SHA-256 ``CORPUS_SHA256``. On Python 3.11.7 it is read from the running
interpreter's stdlib; elsewhere (or if that stdlib was patched) from the gzipped copy shipped in
``ditto_core/eval/data`` (the same bytes; CPython is under the PSF license). Either way the hash
is checked.

Chunking follows llama.cpp's ``llama-perplexity`` (tools/perplexity/perplexity.cpp,
``perplexity`` and ``kl_divergence``): the text is tokenized once (BOS prepended only if the
model's tokenizer adds BOS), cut into ``len(tokens) // n_ctx`` chunks of ``n_ctx`` tokens (the
first token of each chunk replaced by BOS when the model adds BOS), and in each chunk the logits
at positions ``first = n_ctx // 2`` .. ``n_ctx - 2`` score tokens ``first + 1`` .. ``n_ctx - 1``:
``n_ctx - 1 - n_ctx // 2`` scored tokens per chunk (255 for n_ctx = 512).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
import sysconfig
import tempfile
from importlib import resources
from pathlib import Path

from ditto_core.base.errors import DittoError

CORPUS_MODULES = ("argparse", "functools", "textwrap", "shlex", "fractions", "heapq", "bisect",
                  "dataclasses", "enum", "statistics")
CORPUS_BYTES = 411_098
CORPUS_SHA256 = "edf99747046f6a2a4bb480c2549a0f922cce2f299cc72721e2727351a1ec4c35"
PACKAGED = "cpython-3.11.7-stdlib-corpus.py.gz"
N_CTX = 512


def _check(data: bytes, where: str) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != CORPUS_BYTES or digest != CORPUS_SHA256:
        raise DittoError(f"{where}: the evaluation corpus is {len(data):,} bytes with sha256 "
                         f"{digest}, expected {CORPUS_BYTES:,} bytes with sha256 {CORPUS_SHA256}")
    return data


def stdlib_corpus() -> bytes | None:
    """The corpus read from this interpreter's stdlib, or None when it is not CPython 3.11.7 or
    its sources differ (a patched distribution)."""
    if sys.implementation.name != "cpython" or sys.version_info[:3] != (3, 11, 7):
        return None
    d = Path(sysconfig.get_path("stdlib"))
    try:
        data = b"\n".join((d / f"{m}.py").read_bytes() for m in CORPUS_MODULES)
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == CORPUS_SHA256 else None


def packaged_corpus() -> bytes:
    """The corpus from the package data, hash-checked. Raises DittoError if damaged."""
    ref = resources.files("ditto_core.eval") / "data" / PACKAGED
    try:
        data = gzip.decompress(ref.read_bytes())
    except (OSError, EOFError) as exc:
        raise DittoError(f"{ref}: cannot read the packaged evaluation corpus: {exc}") from None
    return _check(data, str(ref))


def corpus_bytes() -> bytes:
    """The 411,098-byte evaluation corpus (module docstring)."""
    return stdlib_corpus() or packaged_corpus()


def tokenize(exe: Path, model: Path, text: bytes, add_bos: bool) -> list[int]:
    """Token ids of ``text`` by the build's own tokenizer (``ditto-run --tokens``), with BOS
    first when ``add_bos``. Raises DittoError with the executable's message if it fails."""
    with tempfile.NamedTemporaryFile(prefix="ditto-corpus-", suffix=".txt") as f:
        f.write(text)
        f.flush()
        proc = subprocess.run([str(exe), "-m", str(model), "-f", f.name, "--tokens",
                               "--bos" if add_bos else "--no-bos"],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise DittoError(f"{exe}: tokenizing the corpus failed (exit {proc.returncode}): "
                         f"{proc.stderr.strip()}")
    return json.loads(proc.stdout)


def chunks(tokens: list[int], n_ctx: int = N_CTX, n_chunks: int | None = None,
           bos_id: int | None = None) -> list[list[int]]:
    """The first ``n_chunks`` (default all) ``n_ctx``-token chunks of ``tokens``; the first
    token of each is replaced by ``bos_id`` when given (llama.cpp does so when the model adds
    BOS). Raises DittoError when there are fewer than two chunks' worth of tokens (llama.cpp's
    own minimum) or ``n_chunks`` is out of range."""
    n_max = len(tokens) // n_ctx
    if len(tokens) < 2 * n_ctx:
        raise DittoError(f"the corpus tokenizes to {len(tokens)} tokens; at least {2 * n_ctx} "
                         f"are needed for {n_ctx}-token chunks")
    if n_chunks is None:
        n_chunks = n_max
    if not 1 <= n_chunks <= n_max:
        raise DittoError(f"--chunks {n_chunks}: the corpus has {n_max} chunks of {n_ctx} tokens")
    out = []
    for i in range(n_chunks):
        c = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if bos_id is not None:
            c[0] = bos_id
        out.append(c)
    return out
