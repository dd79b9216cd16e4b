"""native/runtime/attention.c: the SIMD attention of one head equals the scalar loops (to float
rounding) and both equal softmax(q·K / sqrt(d)) V computed in float64 NumPy."""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest

from ditto_native import SOURCE_DIR

P = ctypes.c_void_p


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("attn") / "libattn.so"
    p = subprocess.run(["clang-22", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC",
                        "-shared", "-o", str(out), str(SOURCE_DIR / "runtime" / "attention.c"),
                        "-lm"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    L = ctypes.CDLL(str(out))
    L.attend_for.restype = P
    L.attend_for.argtypes = [ctypes.c_int]
    L.attend_scalar.argtypes = [P, P, P, P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                ctypes.c_float, P]
    return L


FN = ctypes.CFUNCTYPE(None, P, P, P, P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_float, P)


@pytest.mark.parametrize("d", [64, 128, 72, 60, 8])
@pytest.mark.parametrize("n_keys", [1, 3, 4, 5, 37, 300])
def test_attend_matches_float64_softmax(lib, d, n_keys):
    rng = np.random.default_rng(d * 1000 + n_keys)
    stride = 3 * d  # one KV head of three, as in the cache rows
    K = rng.normal(size=(n_keys, stride)).astype(np.float32)
    V = rng.normal(size=(n_keys, stride)).astype(np.float32)
    q = (rng.normal(size=d) * 2).astype(np.float32)
    scale = np.float32(1 / np.sqrt(d))
    s = (K[:, :d].astype(np.float64) @ q) * scale
    p = np.exp(s - s.max())
    want = (p / p.sum()) @ V[:, :d].astype(np.float64)
    for fn in (FN(lib.attend_for(d)), lib.attend_scalar):
        out = np.full(d, np.nan, np.float32)
        att = np.zeros(n_keys, np.float32)
        fn(out.ctypes.data, q.ctypes.data, K.ctypes.data, V.ctypes.data, stride, n_keys, d,
           scale, att.ctypes.data)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_simd_form_is_chosen_on_avx2_cpus(lib):
    flags = set(open("/proc/cpuinfo").read().split())
    scalar = ctypes.cast(lib.attend_scalar, P).value
    assert lib.attend_for(60) == scalar  # d % 8 != 0: the scalar loops
    assert (lib.attend_for(64) != scalar) == ({"avx2", "fma"} <= flags)


GROUP_FN = ctypes.CFUNCTYPE(None, P, P, ctypes.c_size_t, ctypes.c_int, P, P, ctypes.c_size_t,
                            ctypes.c_int, ctypes.c_int, ctypes.c_float, P, ctypes.c_size_t)


@pytest.mark.parametrize("d", [64, 128, 72, 8, 60])
@pytest.mark.parametrize("nq", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n_keys", [1, 5, 8, 37])
def test_group_form_equals_one_head_at_a_time(lib, d, nq, n_keys):
    """attend_group_for(d) (the prefill's grouped-query form: nq heads on one KV head) gives
    each head exactly attend_for(d)'s bits, and both the float64 softmax to float rounding."""
    lib.attend_group_for.restype = P
    lib.attend_group_for.argtypes = [ctypes.c_int]
    rng = np.random.default_rng(d * 100 + nq * 10 + n_keys)
    stride = 2 * d
    K = rng.normal(size=(n_keys, stride)).astype(np.float32)
    V = rng.normal(size=(n_keys, stride)).astype(np.float32)
    Q = (rng.normal(size=(nq, d)) * 2).astype(np.float32)
    scale = np.float32(1 / np.sqrt(d))
    ld = n_keys + 3
    out = np.full((nq, d), np.nan, np.float32)
    att = np.zeros((nq, ld), np.float32)
    GROUP_FN(lib.attend_group_for(d))(out.ctypes.data, Q.ctypes.data, d, nq, K.ctypes.data,
                                      V.ctypes.data, stride, n_keys, d, scale, att.ctypes.data,
                                      ld)
    one = FN(lib.attend_for(d))
    for j in range(nq):
        want = np.full(d, np.nan, np.float32)
        a1 = np.zeros(n_keys, np.float32)
        one(want.ctypes.data, Q[j].ctypes.data, K.ctypes.data, V.ctypes.data, stride, n_keys,
            d, scale, a1.ctypes.data)
        np.testing.assert_array_equal(out[j], want)
        s = (K[:, :d].astype(np.float64) @ Q[j]) * scale
        p = np.exp(s - s.max())
        np.testing.assert_allclose(out[j], (p / p.sum()) @ V[:, :d].astype(np.float64),
                                   rtol=1e-4, atol=1e-5)


class _Steps(ctypes.Structure):
    _fields_ = [("scores", P), ("softmax", P), ("wsum_acc", P)]


SCORES_FN = ctypes.CFUNCTYPE(None, P, ctypes.c_size_t, P, ctypes.c_size_t, ctypes.c_int, P,
                             ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_float)
SOFTMAX_FN = ctypes.CFUNCTYPE(None, P, ctypes.c_int)
WSUM_FN = ctypes.CFUNCTYPE(None, P, ctypes.c_size_t, ctypes.c_int, P, ctypes.c_size_t,
                           ctypes.c_int, P, ctypes.c_size_t, ctypes.c_int)


@pytest.mark.parametrize("d", [64, 60])
@pytest.mark.parametrize("nq", [1, 7])
def test_steps_by_key_blocks_equal_one_pass(lib, d, nq):
    """attend_steps_for(d) run as prefill runs it, over the keys in blocks of 512 (scores per
    block, one softmax, weighted sums accumulated block after block), gives every head the
    bits of attend_for(d) over all keys at once (one head's whole attention), at 1,100 keys."""
    lib.attend_steps_for.restype = ctypes.POINTER(_Steps)
    lib.attend_steps_for.argtypes = [ctypes.c_int]
    st = lib.attend_steps_for(d).contents
    scores, softmax, wsum = SCORES_FN(st.scores), SOFTMAX_FN(st.softmax), WSUM_FN(st.wsum_acc)
    n_keys, block, stride = 1100, 512, 2 * d
    rng = np.random.default_rng(d + nq)
    K = rng.normal(size=(n_keys, stride)).astype(np.float32)
    V = rng.normal(size=(n_keys, stride)).astype(np.float32)
    Q = (rng.normal(size=(nq, d)) * 2).astype(np.float32)
    scale = np.float32(1 / np.sqrt(d))
    att = np.zeros((nq, n_keys), np.float32)
    out = np.zeros((nq, d), np.float32)
    for k0 in range(0, n_keys, block):
        nk = min(block, n_keys - k0)
        scores(att[:, k0:].ctypes.data, n_keys, Q.ctypes.data, d, nq, K[k0:].ctypes.data,
               stride, nk, d, scale)
    for j in range(nq):
        softmax(att[j].ctypes.data, n_keys)
    for k0 in range(0, n_keys, block):
        nk = min(block, n_keys - k0)
        wsum(out.ctypes.data, d, nq, V[k0:].ctypes.data, stride, nk, att[:, k0:].ctypes.data,
             n_keys, d)
    one = FN(lib.attend_for(d))
    scratch = np.zeros(n_keys, np.float32)
    for j in range(nq):
        want = np.full(d, np.nan, np.float32)
        one(want.ctypes.data, Q[j].ctypes.data, K.ctypes.data, V.ctypes.data, stride, n_keys,
            d, scale, scratch.ctypes.data)
        np.testing.assert_array_equal(out[j], want)


@pytest.mark.parametrize("d", [64, 60])  # the AVX2 steps (on AVX2 CPUs) and the scalar ones
@pytest.mark.parametrize("nq,n_keys", [(1, 5), (3, 37), (7, 300)])
@pytest.mark.parametrize("f16_k,f16_v", [(1, 1), (1, 0), (0, 1)])
def test_f16_rows_give_the_float32_bits_of_their_widened_values(lib, d, nq, n_keys, f16_k,
                                                                f16_v):
    """attend_group_steps over an f16 KV cache (--cache-type-k/-v f16) equals the float32
    steps on the same rows widened to float32, bit for bit."""
    L = lib
    L.attend_steps_for.restype = P
    L.attend_steps_for.argtypes = [ctypes.c_int]
    L.attend_group_steps.argtypes = [P, P, P, ctypes.c_size_t, ctypes.c_int, P, ctypes.c_int,
                                     P, ctypes.c_int, ctypes.c_size_t, ctypes.c_int,
                                     ctypes.c_int, ctypes.c_float, P, ctypes.c_size_t]
    rng = np.random.default_rng(d + 10 * nq + n_keys)
    stride = 2 * d
    K = rng.normal(size=(n_keys, stride)).astype(np.float16)
    V = rng.normal(size=(n_keys, stride)).astype(np.float16)
    q = rng.normal(size=(nq, d)).astype(np.float32)
    steps = L.attend_steps_for(d)

    def run(Kr, kf, Vr, vf):
        out = np.full((nq, d), np.nan, np.float32)
        att = np.zeros((nq, n_keys), np.float32)
        L.attend_group_steps(steps, out.ctypes.data, q.ctypes.data, d, nq, Kr.ctypes.data, kf,
                             Vr.ctypes.data, vf, stride, n_keys, d, ctypes.c_float(0.125),
                             att.ctypes.data, n_keys)
        return out

    want = run(K.astype(np.float32), 0, V.astype(np.float32), 0)
    got = run(K if f16_k else K.astype(np.float32), f16_k, V if f16_v else V.astype(np.float32),
              f16_v)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
