"""The C kernels of the kmeans quantizer against the numba reference kernels they replace: the
``optimal`` method (plugins/quant_kmeans/optimal_dp.c vs ``kmeans1d._matrix_centroids`` →
``_optimal_ws``, the implementation whose output tests/test_quant_pinned.py pins) — the same
centroid and SSE bytes on many thousands of sub-blocks of bf16-like, Q4_1-grid, few-valued and
tie-heavy weights, at b = 1..8 and G from 3 to a whole row — and the nearest-centroid
assignment (assign_nearest.c vs ``kmeans1d.assign_nearest``) — the same indices, per-row SSE
and norm bytes; independent of the thread count; compiled warning-free."""

import subprocess

import numpy as np
import pytest

from ditto_quant_kmeans import kmeans1d, native
from ditto_quant_kmeans.quantizer import METHODS

OPT = METHODS["optimal"]


def to_bf16(W):
    """float32 → the nearest bfloat16 (round to nearest even), as float32."""
    u = np.asarray(W, np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return u.view(np.float32)


def student_bf16(rng, rows, cols, nu=5.0):
    """Student-t weights in bf16 with a few ×8..×20 outlier columns (the synthetic 7B's)."""
    W = rng.standard_t(nu, size=(rows, cols)) / np.sqrt(cols)
    W[:, rng.choice(cols, min(6, cols), replace=False)] *= rng.uniform(8, 20, min(6, cols))
    return to_bf16(W)


def q41_grid(rng, rows, cols):
    """Every 32 weights on a 16-level grid with f16 scale and minimum (SmolLM2's GGUF)."""
    c32 = -(-cols // 32)
    lo = rng.normal(-0.5, 0.1, size=(rows, c32, 1)).astype(np.float16).astype(np.float32)
    sc = rng.uniform(0.05, 0.08, size=(rows, c32, 1)).astype(np.float16).astype(np.float32)
    q = rng.integers(0, 16, size=(rows, c32, 32))
    return (lo + sc * q).reshape(rows, c32 * 32)[:, :cols].astype(np.float32)


def small_ints(rng, rows, cols, levels):
    """Evenly spaced values from ``levels`` levels: many exact SSE ties in the DP."""
    return (rng.integers(-(levels // 2), levels - levels // 2, size=(rows, cols))
            * 0.125).astype(np.float32)


def both(W, group_size, k, threads=2, fn=None):
    """(C kernel ``fn`` — default: the one the quantizer loads —, numba reference) centroids
    and SSE of every sub-block of W."""
    fn = fn or native.load()
    assert fn is not None, "the C kernel did not compile (clang-22 missing?)"
    Ws = kmeans1d.sort_sub_blocks(np.ascontiguousarray(W, np.float32), group_size)
    S = -(-Ws.shape[1] // group_size)
    c_c = np.empty((Ws.shape[0], S, k))
    c_n = np.empty((Ws.shape[0], S, k))
    s_c = native.optimal_matrix(fn, Ws, group_size, k, c_c, threads)
    s_n = kmeans1d._matrix_centroids(Ws, group_size, k, OPT, np.uint64(0), 4, 100, 1e-6, c_n)
    return (c_c, s_c), (c_n, s_n)


def assert_same(a, b):
    (c1, s1), (c2, s2) = a, b
    bad = np.argwhere((c1.view(np.uint64) != c2.view(np.uint64)).any(axis=2))
    assert bad.size == 0, f"centroids differ in {len(bad)} sub-blocks, first {bad[0]}"
    assert np.array_equal(s1.view(np.uint64), s2.view(np.uint64))


@pytest.mark.parametrize("kind,rows,cols,bits,g", [
    ("bf16", 96, 4096, 4, 256),      # 1,536 sub-blocks like the synthetic 7B's matrices
    ("bf16", 64, 1000, 3, 64),
    ("bf16", 16, 4096, 6, 4096),     # the embedding policy: 64 centroids per row of 4096
    ("q41", 96, 4096, 4, 256),       # 1,536 Q4_1-grid sub-blocks (~100 distinct values)
    ("q41", 64, 576, 2, 128),
    ("ints", 64, 1024, 4, 256),      # 41 levels: ties everywhere
    ("ints", 64, 300, 5, 100),
])
def test_c_kernel_equals_reference(kind, rows, cols, bits, g):
    rng = np.random.default_rng([rows, cols, bits, g])
    W = {"bf16": student_bf16, "q41": q41_grid,
         "ints": lambda r, a, b: small_ints(r, a, b, 41)}[kind](rng, rows, cols)
    c, n = both(W, g, 1 << bits)
    assert_same(c, n)


def test_c_kernel_equals_reference_random_shapes():
    """Many small random cases: every b, odd G, tails, duplicates, constant runs."""
    rng = np.random.default_rng(2024)
    for case in range(60):
        bits = int(rng.integers(1, 9))
        g = int(rng.integers(3, 300))
        rows, cols = int(rng.integers(1, 12)), int(rng.integers(2, 700))
        W = student_bf16(rng, rows, cols, nu=float(rng.uniform(2.5, 30)))
        if case % 3 == 1:
            W = small_ints(rng, rows, cols, int(rng.integers(2, 60)))
        elif case % 3 == 2:
            W[:, : cols // 2] = W[0, 0]  # half of each row one repeated value
        c, n = both(W, g, 1 << bits)
        assert_same(c, n)


@pytest.fixture(scope="module")
def portable_kernel_path(tmp_path_factory):
    """The kernels built without -march=native: the plain-C lanes (no AVX2), as on a CPU
    without AVX2 or another architecture."""
    out = tmp_path_factory.mktemp("kernel") / "portable.so"
    native.compile_kernel(native.find_clang(), out,
                          tuple(f for f in native.FLAGS if not f.startswith("-march")))
    return out


@pytest.fixture(scope="module")
def portable_kernel(portable_kernel_path):
    """The portable build's optimal kernel."""
    return native.load_library(portable_kernel_path)


@pytest.mark.parametrize("kind", ["bf16", "q41", "ints"])
def test_portable_kernel_equals_reference(portable_kernel, kind):
    rng = np.random.default_rng(11)
    W = {"bf16": student_bf16, "q41": q41_grid,
         "ints": lambda r, a, b: small_ints(r, a, b, 41)}[kind](rng, 48, 2048)
    c, n = both(W, 256, 16, fn=portable_kernel)
    assert_same(c, n)


@pytest.fixture(scope="module")
def avx2_kernel(tmp_path_factory):
    """The kernels built for x86-64-v3 (AVX2 + FMA, no AVX-512): the four- and eight-lane AVX2
    scans with consecutive-table reciprocals and divisions, without the AVX-512 permute, as on
    an AVX2 CPU without AVX-512. None on other architectures."""
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    out = tmp_path_factory.mktemp("kernel") / "avx2.so"
    native.compile_kernel(native.find_clang(), out,
                          tuple("-march=x86-64-v3" if f.startswith("-march") else f
                                for f in native.FLAGS))
    return native.load_library(out)


@pytest.mark.parametrize("kind,cols,bits,g", [
    ("bf16", 2048, 4, 256), ("q41", 2048, 4, 256), ("ints", 2048, 4, 256),
    ("bf16", 4096, 6, 4096), ("ints", 1000, 5, 100),
])
def test_avx2_kernel_equals_reference(avx2_kernel, kind, cols, bits, g):
    """The AVX2-only build (no table-permute reciprocals) gives the reference's bytes; the
    -march=native build on an AVX-512 CPU runs the permute path too."""
    if avx2_kernel is None:
        pytest.skip("not x86-64")
    rng = np.random.default_rng([cols, bits, g])
    W = {"bf16": student_bf16, "q41": q41_grid,
         "ints": lambda r, a, b: small_ints(r, a, b, 41)}[kind](rng, 16 if g > 1000 else 48,
                                                                cols)
    c, n = both(W, g, 1 << bits, fn=avx2_kernel)
    assert_same(c, n)


def test_c_kernel_thread_count_independent():
    rng = np.random.default_rng(7)
    W = student_bf16(rng, 64, 2048)
    Ws = kmeans1d.sort_sub_blocks(W, 256)
    fn = native.load()
    out = []
    for threads in (1, 2, 5):
        cent = np.empty((64, 8, 16))
        sse = native.optimal_matrix(fn, Ws, 256, 16, cent, threads)
        out.append((cent.tobytes(), sse.tobytes()))
    assert out[0] == out[1] == out[2]


def test_kernel_choice(monkeypatch):
    """``DITTO_KMEANS_KERNEL=numba`` selects the reference; matrix_centroids gives the same
    bytes either way."""
    rng = np.random.default_rng(3)
    W = kmeans1d.sort_sub_blocks(student_bf16(rng, 8, 512), 256)
    outs = []
    for env in ("", "numba"):
        monkeypatch.setenv(native.ENV, env)
        assert (native.load() is None) == (env == "numba")
        cent = np.empty((8, 2, 16))
        sse = kmeans1d.matrix_centroids(W, 256, 16, OPT, np.uint64(0), 4, 100, 1e-6, cent)
        outs.append((cent.tobytes(), sse.tobytes()))
    assert outs[0] == outs[1]


def test_kernel_unavailable_warns_and_falls_back(monkeypatch, capsys):
    """No clang-22: a warning naming the cause, and the numba kernel (same bytes)."""
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setattr(native, "find_clang", lambda: None)
    monkeypatch.delenv(native.ENV, raising=False)
    assert native.load() is None
    err = capsys.readouterr().err
    assert ("warning: kmeans: the C kernels (optimal DP, assignment) are unavailable (clang-22 "
            "not found on PATH); using the numba kernels") in err
    rng = np.random.default_rng(5)
    W = kmeans1d.sort_sub_blocks(student_bf16(rng, 4, 512), 256)
    cent = np.empty((4, 2, 16))
    sse = kmeans1d.matrix_centroids(W, 256, 16, OPT, np.uint64(0), 4, 100, 1e-6, cent)
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.undo()
    c, n = both(W, 256, 16)
    assert cent.tobytes() == c[0].tobytes() and sse.tobytes() == c[1].tobytes()


def test_kernel_compiles_warning_free(tmp_path):
    clang = native.find_clang()
    assert clang is not None
    proc = subprocess.run([clang, *native.FLAGS, "-Wall", "-Wextra", "-Werror", "-o",
                           str(tmp_path / "k.so"), *map(str, native.SOURCES)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def both_assign(W, group_size, cb, threads=2, fn=None):
    """(C kernel ``fn`` — default: the one the quantizer loads —, numba reference) indices,
    SSE per row and ‖row‖² per row of W against the codebooks cb."""
    fn = fn or native.load_assign()
    assert fn is not None, "the C kernels did not compile (clang-22 missing?)"
    W = np.ascontiguousarray(W, np.float32)
    i_c = np.empty(W.shape, np.uint8)
    i_n = np.empty(W.shape, np.uint8)
    s_c = native.assign_nearest(fn, W, group_size, cb, i_c, threads)
    s_n = kmeans1d.assign_nearest(W, group_size, cb, i_n)
    return (i_c, *s_c), (i_n, *s_n)


def assert_same_assign(a, b):
    (i1, s1, n1), (i2, s2, n2) = a, b
    bad = np.argwhere(i1 != i2)
    assert bad.size == 0, f"indices differ at {len(bad)} weights, first {bad[0]}"
    assert np.array_equal(s1.view(np.uint64), s2.view(np.uint64))
    assert np.array_equal(n1.view(np.uint64), n2.view(np.uint64))


@pytest.mark.parametrize("kind,rows,cols,bits,g,cbtype", [
    ("bf16", 96, 4096, 4, 256, "int8"),
    ("bf16", 64, 1000, 3, 64, "f16"),
    ("bf16", 16, 4096, 6, 4096, "int8"),
    ("q41", 96, 4096, 4, 256, "f16"),
    ("ints", 64, 1024, 4, 256, "f32"),   # weights exactly on midpoints and centroids
    ("ints", 64, 300, 1, 100, "int8"),
    ("bf16", 8, 777, 8, 50, "f16"),
])
def test_c_assign_equals_reference(kind, rows, cols, bits, g, cbtype):
    """Nearest stored centroid, per-row SSE and norm: the C kernel's bytes are the numba
    reference's, on the codebooks the quantizer stores (optimal centroids rounded to the type),
    at b = 1..8 and tails."""
    from ditto_core.kit import quantkit
    rng = np.random.default_rng([rows, cols, bits, g, 1])
    W = {"bf16": student_bf16, "q41": q41_grid,
         "ints": lambda r, a, b: small_ints(r, a, b, 41)}[kind](rng, rows, cols)
    k = 1 << bits
    (cent, _), _ = both(W, g, k)
    cb, _ = quantkit.round_codebooks(cent, cbtype)
    c, n = both_assign(W, g, cb)
    assert_same_assign(c, n)
    # ties: every weight of a sub-block exactly on one of its codebook's midpoints (in float32)
    mids = (0.5 * (cb[:, :, :-1].astype(np.float64) + cb[:, :, 1:])).astype(np.float32)
    Wm = np.empty_like(W)
    for s in range(cb.shape[1]):
        a, b = s * g, min(s * g + g, cols)
        Wm[:, a:b] = np.tile(mids[:, s], (1, -(-(b - a) // (k - 1))))[:, : b - a]
    c, n = both_assign(Wm, g, cb)
    assert_same_assign(c, n)


def test_c_assign_portable_and_threads(portable_kernel_path):
    """The portable build (no -march) and thread counts 1, 2, 5 give the reference's bytes."""
    rng = np.random.default_rng(12)
    W = student_bf16(rng, 48, 2048)
    (cent, _), _ = both(W, 256, 16)
    cb = cent.astype(np.float16).astype(np.float32)
    ref = both_assign(W, 256, cb)[1]
    portable = native.load_assign_library(portable_kernel_path)
    for fn, threads in ((None, 1), (None, 2), (None, 5), (portable, 2)):
        assert_same_assign(both_assign(W, 256, cb, threads, fn)[0], ref)


def test_quantizer_assignment_kernel_choice(monkeypatch):
    """``quantize_matrix`` gives the same indices, codebooks and rel_error with the C kernels
    and with ``DITTO_KMEANS_KERNEL=numba``."""
    from ditto_quant_kmeans import quantize_matrix
    rng = np.random.default_rng(9)
    W = student_bf16(rng, 32, 1024)
    outs = []
    for env in ("", "numba"):
        monkeypatch.setenv(native.ENV, env)
        assert (native.load_assign() is None) == (env == "numba")
        q = quantize_matrix(W, 4, 256, "optimal", "int8", 0, "w")
        outs.append((q.indices.tobytes(), q.codebooks.tobytes(), q.scales.tobytes(),
                     q.rel_error))
    assert outs[0] == outs[1]


def test_use_march_runs_the_portable_kernels(monkeypatch):
    """native.use_march("x86-64-v3") (bench_scale.py --isa avx2) puts the AVX2-only build in
    this process's place of the host's: load() returns it, its library is cached under the
    portable flags' own name, and it gives the reference's bytes."""
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 only")
    monkeypatch.setattr(native, "_STATE", {})  # the host's kernels come back after the test
    clang = native.find_clang()
    path = native.use_march("x86-64-v3")
    assert path == native.library_path(clang, native.flags_for("x86-64-v3"))
    assert path != native.library_path(clang)
    assert "-march=x86-64-v3" in native.flags_for("x86-64-v3")
    fn = native.load()
    assert fn is native._STATE["fn"]
    rng = np.random.default_rng(5)
    c, n = both(student_bf16(rng, 32, 2048), 256, 16, fn=fn)
    assert_same(c, n)
