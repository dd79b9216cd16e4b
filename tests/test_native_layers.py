"""native/ without circles between translation units nor between its folders
(docs/ARCHITECTURE.md "Layers").

What is checked: the call graph between the runtime's .c files at link level. Every runtime
source (``native/<folder>/**/*.c``, the files ``ditto build`` compiles) is compiled on its own (clang-22 -O0 -c, the runtime's flags) for x86-64 and for
AArch64 (so the NEON files, empty on x86, count too), and ``nm`` lists the external symbols
each object defines and the ones it uses; A.c → B.c when A uses a function or table that B
defines. That graph must have no cycle: every dependency between files points one way (the
dispatch table in kernels.c above the kernels, the scalar references in codebook_ref.c and
qgemv_generic.c below them), whatever the headers declare. Nor the graph between native/'s
folders (app, io, model, runtime, kernels with its arch/ sub-folders, tokenizer with its
tables): app → runtime → kernels, tokenizer → model → io.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ditto_core.stages.compile import runtime_sources
from ditto_native import KERNEL_SOURCES

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native"
FLAGS = ("-std=c11", "-D_POSIX_C_SOURCE=200809L", "-O0", "-fopenmp", "-w")
TARGETS = ("x86_64-linux-gnu", "aarch64-linux-gnu")


def _symbols(src: Path, target: str, out_dir: Path) -> tuple[set, set]:
    """(defined, undefined) external symbols of ``src`` compiled for ``target``."""
    obj = out_dir / f"{src.stem}.{target}.o"
    p = subprocess.run(["clang-22", f"--target={target}", *FLAGS, "-c", str(src), "-o", str(obj)],
                       capture_output=True, text=True)
    assert p.returncode == 0, f"{src.name} ({target}): {p.stderr}"
    nm = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in nm.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRCVW":
            defined.add(parts[2])
    return defined, used


def call_graph(out_dir: Path) -> dict[tuple[str, str], set[str]]:
    """(A.c, B.c) → the symbols of B.c that A.c uses, over both targets."""
    jobs = [(src, t) for t in TARGETS for src in runtime_sources(NATIVE)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda j: (j, _symbols(j[0], j[1], out_dir)), jobs))
    edges: dict[tuple[str, str], set[str]] = {}
    for target in TARGETS:
        owner = {}
        for (src, t), (defined, _) in results:
            if t == target:
                for s in defined:
                    owner.setdefault(s, src.name)
        for (src, t), (_, used) in results:
            if t == target:
                for s in used:
                    if s in owner and owner[s] != src.name:
                        edges.setdefault((src.name, owner[s]), set()).add(s)
    return edges


def find_cycle(edges) -> list[str] | None:
    """One cycle of the directed graph ``edges`` (pairs) as [a, b, ..., a], or None."""
    succ: dict[str, list[str]] = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(succ.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(succ):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_find_cycle_catches_the_circles_of_a_tangled_runtime():
    """The two circles the runtime had: gemm.c ↔ gemm_avx2.c (dispatch one way, the scalar
    fallback the other) and kernels.c → qgemv_generic.c → matmul.c → kernels.c."""
    assert find_cycle({("gemm.c", "gemm_avx2.c"), ("gemm_avx2.c", "gemm.c"),
                       ("main.c", "gemm.c")}) == ["gemm.c", "gemm_avx2.c", "gemm.c"]
    assert find_cycle({("kernels.c", "qgemv_generic.c"), ("qgemv_generic.c", "matmul.c"),
                       ("matmul.c", "kernels.c")}) == [
        "kernels.c", "qgemv_generic.c", "matmul.c", "kernels.c"]
    assert find_cycle({("main.c", "kernels.c"), ("kernels.c", "codebook_ref.c"),
                       ("matmul.c", "codebook_ref.c")}) is None


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return call_graph(tmp_path_factory.mktemp("native-layers"))


def test_native_call_graph_has_no_cycle(graph):
    cycle = find_cycle(graph)
    detail = "" if cycle is None else "; ".join(
        f"{a} -> {b} ({', '.join(sorted(graph[(a, b)]))})" for a, b in zip(cycle, cycle[1:]))
    assert cycle is None, f"native/ has a circle between translation units: {detail}"


def test_native_call_graph_points_down(graph):
    """The edges that make the layers: the program above the model, the dispatchers above the
    kernel table, the table above the kernels of every ISA (NEON included), the kernels above
    the scalar references, which call no other runtime file; no kernel calls back into the
    table."""
    for edge, symbol in [(("main.c", "model.c"), "model_open"),
                         (("matmul.c", "kernels.c"), "gemv_i8"),
                         (("gemm.c", "gemm_avx2.c"), "codebook_gemm_avx2"),
                         (("kernels.c", "qgemv_avx2.c"), "i8cb_b4_rows_avx2"),
                         (("kernels.c", "qgemv_neon.c"), "i8cb_b4_rows_neon"),
                         (("gemm_avx2.c", "codebook_ref.c"), "codebook_gemm_ref"),
                         (("qgemv_generic.c", "codebook_ref.c"), "f16_to_f32")]:
        assert symbol in graph.get(edge, set()), (edge, symbol)
    assert sorted(b for a, b in graph if a == "codebook_ref.c") == []
    kernel_files = {Path(f).name for f in KERNEL_SOURCES} - {"matmul.c", "gemm.c", "kernels.c"}
    assert sorted(a for a, b in graph if b == "kernels.c" and a in kernel_files) == []


def folder(name: str) -> str:
    """The top folder of native/ that holds the runtime source ``name`` (kernels/arch/x86 counts
    as kernels, tokenizer/unicode as tokenizer)."""
    (path,) = [f for f in runtime_sources(NATIVE) if f.name == name]
    return path.relative_to(NATIVE).parts[0]


def test_native_folders_have_no_cycle(graph):
    """The calls between folders point one way too, the folders named in ditto_native's
    RUNTIME_DIRS each on its own layer."""
    from ditto_native import RUNTIME_DIRS

    edges = {(folder(a), folder(b)) for a, b in graph if folder(a) != folder(b)}
    assert find_cycle(edges) is None, sorted(edges)
    assert {f for e in edges for f in e} <= set(RUNTIME_DIRS)
    for edge in [("app", "runtime"), ("runtime", "kernels"), ("runtime", "tokenizer"),
                 ("app", "io")]:
        assert edge in edges, (edge, sorted(edges))
