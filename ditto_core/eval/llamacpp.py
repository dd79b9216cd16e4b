"""llama.cpp's formats as reference points: ``llama-perplexity --kl-divergence`` on the same
corpus and chunks as ``ditto eval`` (``--peer-gguf``).

Steps (llama.cpp tools/perplexity/README.md): the base GGUF (by default the build's source GGUF
converted to F32 with ``llama-quantize --allow-requantize ... F32``, i.e. the same weights
Ditto's fp32 baseline holds) is run once with ``--kl-divergence-base FILE`` over the first N
512-token chunks of the corpus, saving its tokens and log-probabilities; each peer GGUF is then
run with ``--kl-divergence-base FILE --kl-divergence``, and its statistics are read from the
output (``parse_kld_output``). The F32 GGUF and the base file are cached under
``<cache root>/llama-cpp/``. llama.cpp is not a dependency of Ditto: the tools are found on
PATH or in ``--llama-cpp DIR``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ditto_core.base.errors import DittoError
from . import corpus as corpus_mod

N_CTX = corpus_mod.N_CTX
_NUM = r"([-+]?[0-9.]+(?:e[-+]?\d+)?|nan|inf)"


def find_tool(name: str, bin_dir: Path | None = None) -> Path:
    """The llama.cpp executable ``name`` in ``bin_dir`` or on PATH. Raises DittoError saying
    how to get it."""
    if bin_dir is not None:
        p = Path(bin_dir) / name
        if p.is_file() and os.access(p, os.X_OK):
            return p
        raise DittoError(f"{p}: no such executable (--llama-cpp names the directory holding "
                         f"llama.cpp's {name})")
    found = shutil.which(name)
    if found is None:
        raise DittoError(f"{name}: not found on PATH; build llama.cpp's tools and put them on "
                         "PATH or give their directory with --llama-cpp DIR")
    return Path(found)


def _grab(text: str, label: str, pair: bool = True) -> tuple[float, float] | float:
    pat = re.escape(label) + r"\s*:\s*" + _NUM + (r"\s*±\s*" + _NUM if pair else "")
    m = re.search(pat, text)
    if m is None:
        raise DittoError(f"llama-perplexity output has no '{label}' line")
    return (float(m.group(1)), float(m.group(2))) if pair else float(m.group(1))


def parse_kld_output(text: str) -> dict:
    """The statistics of a ``llama-perplexity --kl-divergence`` run (its stdout), with the keys
    of metrics.KLAccumulator.summary(): ``mean_kld``, ``kld_stderr``, ``kld_p99``,
    ``kld_median``, ``kld_max``, ``same_top1`` (fraction), ``same_top1_stderr``, ``ppl``,
    ``ppl_stderr``, ``ppl_baseline``, ``ppl_baseline_stderr``, plus ``chunks`` and
    ``tokens_scored`` (chunks × 255). Raises DittoError naming a missing line."""
    ppl, ppl_se = _grab(text, "Mean PPL(Q)")
    base, base_se = _grab(text, "Mean PPL(base)")
    kld, kld_se = _grab(text, "Mean    KLD")
    top, top_se = _grab(text, "Same top p")
    rows = re.findall(r"^\s*(\d+)\s+[0-9.]+\s+±", text, flags=re.M)
    if not rows:
        raise DittoError("llama-perplexity output has no per-chunk table")
    chunks = int(rows[-1])
    return {"mean_kld": kld, "kld_stderr": kld_se, "kld_p99": _grab(text, "99.0%   KLD", False),
            "kld_median": _grab(text, "Median  KLD", False),
            "kld_max": _grab(text, "Maximum KLD", False),
            "same_top1": top / 100, "same_top1_stderr": top_se / 100,
            "ppl": ppl, "ppl_stderr": ppl_se, "ppl_baseline": base,
            "ppl_baseline_stderr": base_se, "chunks": chunks,
            "tokens_scored": chunks * (N_CTX - 1 - N_CTX // 2)}


def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise DittoError(f"{what}: {Path(cmd[0]).name} exited with {proc.returncode}:\n{tail}")
    return proc.stdout


def _cache_dir() -> Path:
    from ditto_core.base.cache import default_root

    d = default_root() / "llama-cpp"
    d.mkdir(parents=True, exist_ok=True)
    return d


def f32_gguf(source: Path, bin_dir: Path | None = None) -> Path:
    """``source`` (a GGUF) converted to F32 by llama-quantize, cached by the source's hash."""
    from ditto_core.base.cache import file_hash

    source = Path(source)
    if source.suffix != ".gguf":
        raise DittoError(f"{source}: llama.cpp peers need a GGUF base; give one with --peer-base")
    out = _cache_dir() / f"{file_hash(source)[:16]}-F32.gguf"
    if not out.is_file():
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        try:
            _run([str(find_tool("llama-quantize", bin_dir)), "--allow-requantize", str(source),
                  str(tmp), "F32"], f"{source} → F32")
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return out


def base_logits(base_gguf: Path, n_chunks: int, *, bin_dir: Path | None = None,
                threads: int | None = None) -> Path:
    """The ``--kl-divergence-base`` file of ``base_gguf`` over the first ``n_chunks`` chunks of
    the corpus (cached by the GGUF's hash and N)."""
    from ditto_core.base.cache import file_hash

    out = _cache_dir() / f"{file_hash(base_gguf)[:16]}-c{N_CTX}-n{n_chunks}.kld"
    if out.is_file():
        return out
    with tempfile.TemporaryDirectory(prefix="ditto-llamacpp-") as tmp:
        text = Path(tmp) / "corpus.txt"
        text.write_bytes(corpus_mod.corpus_bytes())
        part = Path(tmp) / "base.kld"
        cmd = [str(find_tool("llama-perplexity", bin_dir)), "-m", str(base_gguf), "-f", str(text),
               "-c", str(N_CTX), "-b", str(N_CTX), "--chunks", str(n_chunks),
               "--kl-divergence-base", str(part)]
        if threads:
            cmd += ["-t", str(threads)]
        _run(cmd, f"{base_gguf}: base logits")
        shutil.move(part, out)
    return out


def gguf_bpw(path: Path) -> tuple[int, int, float]:
    """(file bytes, weights, bits per weight of the whole file) of a GGUF."""
    from gguf import GGUFReader

    n = sum(int(t.n_elements) for t in GGUFReader(str(path)).tensors)
    size = Path(path).stat().st_size
    return size, n, 8.0 * size / n


def score_peer(gguf: Path, base_file: Path, *, bin_dir: Path | None = None,
               threads: int | None = None) -> dict:
    """KL divergence statistics of one peer GGUF against a base file (parse_kld_output), with
    ``name`` (file stem), ``gguf``, ``file_bytes``, ``n_weights``, ``bpw``."""
    cmd = [str(find_tool("llama-perplexity", bin_dir)), "-m", str(gguf), "-c", str(N_CTX),
           "-b", str(N_CTX), "--kl-divergence-base", str(base_file), "--kl-divergence"]
    if threads:
        cmd += ["-t", str(threads)]
    stats = parse_kld_output(_run(cmd, f"{gguf}: KL divergence"))
    size, n, bpw = gguf_bpw(gguf)
    return {"name": Path(gguf).stem, "gguf": str(gguf), "file_bytes": size, "n_weights": n,
            "bpw": bpw, **stats}


def _check_ggufs(ggufs: list[Path]) -> None:
    for g in ggufs:
        if not Path(g).is_file():
            raise DittoError(f"{g}: no such GGUF file")


def evaluate_peers(build_dir: Path, ggufs: list[Path], *, base_gguf: Path | None = None,
                   bin_dir: Path | None = None, n_chunks: int, threads: int | None = None,
                   quiet: bool = True) -> list[dict]:
    """score_peer for each GGUF against the base of ``build_dir``'s source model (or
    ``base_gguf``) on the first ``n_chunks`` chunks."""
    from ditto_core.runtime.run import find_build

    _check_ggufs(ggufs)
    if base_gguf is None:
        _, _, meta = find_build(build_dir)
        base_gguf = f32_gguf(Path(meta.get("model_path", "")), bin_dir)
    base = base_logits(Path(base_gguf), n_chunks, bin_dir=bin_dir, threads=threads)
    return [score_peer(Path(g), base, bin_dir=bin_dir, threads=threads) for g in ggufs]


def peer_rows(model: str, ggufs: list[Path], out_dir: Path, *, base_gguf: Path | None = None,
              bin_dir: Path | None = None, n_chunks: int, threads: int | None = None,
              quiet: bool = True) -> list[dict]:
    """Rows for ``ditto compare``'s table (``source`` "llama.cpp", ``config`` "llama.cpp NAME")
    of each GGUF, scored against MODEL's F32 (or ``base_gguf``); each is saved in
    ``out_dir/peers/NAME-nN.json`` and reused while the GGUF and the base are the same."""
    from ditto_core.stages.pipeline import resolve_model

    _check_ggufs(ggufs)
    if base_gguf is None:
        base_gguf = f32_gguf(resolve_model(model), bin_dir)
    base = base_logits(Path(base_gguf), n_chunks, bin_dir=bin_dir, threads=threads)
    rows = []
    for g in ggufs:
        from ditto_core.base.cache import file_hash

        saved = Path(out_dir) / "peers" / f"{Path(g).stem}-n{n_chunks}.json"
        key = {"gguf": file_hash(g), "base": base.name}
        try:
            r = json.loads(saved.read_text())
            if r.get("key") != key:
                raise ValueError("another GGUF or base")
        except (OSError, ValueError):
            r = {**score_peer(Path(g), base, bin_dir=bin_dir, threads=threads), "key": key}
            from .compare import write_json_atomic

            write_json_atomic(saved, r)
        rows.append({**r, "config": f"llama.cpp {r['name']}", "source": "llama.cpp",
                     "quantizer": "llama.cpp"})
    return rows
