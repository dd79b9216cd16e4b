"""Session fixtures of the GEMV→BLAS pass tests: the generated C corpus (tests/corpus/
gen_corpus.py) built once per configuration with and without the ``gemv-blas`` pass through
``ditto_core.stages.cc.compile_c`` (clang-22 -O1 → pass → O3 host → link scipy-openblas32), and its
outputs parsed into numpy arrays."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ditto_core.stages.cc import compile_c

CORPUS_DIR = Path(__file__).parent / "corpus"
sys.path.insert(0, str(CORPUS_DIR))
import gen_corpus  # noqa: E402

#: (source key, openmp) built by the fixtures
CONFIGS = [("float", False), ("double", False), ("float", True), ("double", True),
           ("negatives", False), ("polybench", False), ("random", False)]


def parse_output(text: str) -> dict:
    """``name m n v...`` lines → {(name, m, n): float64 array}; ``calls name m n C`` lines →
    {("calls", name, m, n): C} (BLAS calls the kernel made)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if parts[0] == "calls":
            out[("calls", parts[1], int(parts[2]), int(parts[3]))] = int(parts[4])
            continue
        out[(parts[0], int(parts[1]), int(parts[2]))] = np.array(parts[3:], dtype=np.float64)
    return out


def split_calls(outputs: dict) -> tuple[dict, dict]:
    """(vectors, calls) of a parse_output dict."""
    vecs = {k: v for k, v in outputs.items() if k[0] != "calls"}
    calls = {k[1:]: v for k, v in outputs.items() if k[0] == "calls"}
    return vecs, calls


def run_exe(exe: Path, threads: int = 2) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return parse_output(proc.stdout)


@pytest.fixture(scope="session")
def corpus_sources(tmp_path_factory) -> dict:
    """The corpus regenerated into a temp dir: {"float"|"double"|"negatives": path}."""
    return gen_corpus.write_all(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def corpus_builds(corpus_sources, tmp_path_factory) -> dict:
    """{(key, openmp): {"plain": outputs, "blas": outputs, "report": PassReport, "ir": text}}
    — every configuration compiled without and with the pass and run once."""
    work = tmp_path_factory.mktemp("corpus_build")
    builds = {}
    for key, omp in CONFIGS:
        tag = f"{key}{'_omp' if omp else ''}"
        plain, _ = compile_c(corpus_sources[key], blas="openblas", out=work / f"{tag}_plain",
                             openmp=omp, rewrite=False)
        ir = work / f"{tag}.ll"
        blas, report = compile_c(corpus_sources[key], blas="openblas",
                                 out=work / f"{tag}_blas", openmp=omp, passes=["gemv-blas"],
                                 ir_out=ir)
        builds[(key, omp)] = {"plain": run_exe(plain), "blas": run_exe(blas),
                              "report": report, "ir": ir.read_text()}
    return builds
