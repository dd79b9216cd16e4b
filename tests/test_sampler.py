"""native/runtime/sampler.c against a float64 reference (scipy.special.softmax of logits / T, which
cannot overflow for float32 logits and any float32 T > 0): every temperature > 0 gives a valid
distribution, a T so small that logits / T overflows float32 behaves as its limit (greedy
argmax), and top-p draws only from the reference nucleus. Property tests over extreme T and
top-p (issue 12 "Runtime"; reliability/run-tiny-temperature-token0 and
tiny-temperature-overflow: T = 1e-38 / 1e-40 gave NaN probabilities and token 0 or the last id).
"""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.special import softmax

from tests.fixtures_native import NATIVE

F32_TINY = float(np.finfo(np.float32).smallest_subnormal)  # 1.4e-45
F32_MAX = float(np.finfo(np.float32).max)


class Sampler(ctypes.Structure):  # native/runtime/sampler.h
    _fields_ = [("vocab_size", ctypes.c_int), ("temperature", ctypes.c_float),
                ("topp", ctypes.c_float), ("rng", ctypes.c_uint64),
                ("candidates", ctypes.c_void_p)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    so = tmp_path_factory.mktemp("sampler") / "libsampler.so"
    subprocess.run(["clang-22", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC",
                    "-shared", "-o", str(so), str(NATIVE / "runtime" / "sampler.c"), "-lm"],
                   check=True)
    lib = ctypes.CDLL(str(so))
    lib.softmax_temperature.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_int,
                                        ctypes.c_float]
    lib.sampler_init.argtypes = [ctypes.POINTER(Sampler), ctypes.c_int, ctypes.c_float,
                                 ctypes.c_float, ctypes.c_uint64]
    lib.sampler_sample.argtypes = [ctypes.POINTER(Sampler), ctypes.POINTER(ctypes.c_float)]
    lib.sampler_free.argtypes = [ctypes.POINTER(Sampler)]
    lib.sample_argmax.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_int]
    return lib


def c_probs(lib, logits: np.ndarray, T: float) -> np.ndarray:
    x = np.ascontiguousarray(logits, dtype=np.float32).copy()
    lib.softmax_temperature(x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), x.size, T)
    return x


def reference(logits: np.ndarray, T: float) -> np.ndarray:
    """softmax(logits / T) in float64 (T as the float32 the program holds)."""
    return softmax(logits.astype(np.float64) / float(np.float32(T)))


def c_sample(lib, logits: np.ndarray, T: float, topp: float, seed: int) -> int:
    s = Sampler()
    assert lib.sampler_init(ctypes.byref(s), logits.size, T, topp, seed) == 0
    x = np.ascontiguousarray(logits, dtype=np.float32).copy()
    try:
        return lib.sampler_sample(ctypes.byref(s), x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
    finally:
        lib.sampler_free(ctypes.byref(s))


EXTREME_T = [F32_TINY, 1e-40, 1e-38, 1e-37, 1e-30, 1e-6, 0.01, 1.0, 100.0, 1e30, F32_MAX]
temperatures = st.one_of(st.sampled_from(EXTREME_T),
                         st.floats(min_value=F32_TINY, max_value=F32_MAX, width=32,
                                   allow_subnormal=True))
logit_arrays = st.integers(2, 64).flatmap(lambda n: st.lists(
    st.one_of(st.floats(-50, 50, width=32), st.floats(-F32_MAX / 2, F32_MAX / 2, width=32),
              st.sampled_from([31.0, 30.5, -2.0, 0.0])), min_size=n, max_size=n))


@settings(max_examples=400, deadline=None)
@given(logits=logit_arrays, T=temperatures)
def test_every_temperature_gives_the_reference_distribution(lib, logits, T):
    logits = np.array(logits, np.float32)
    got = c_probs(lib, logits, T)
    assert np.all(np.isfinite(got)) and np.all(got >= 0)
    assert abs(got.astype(np.float64).sum() - 1.0) <= 1e-5
    np.testing.assert_allclose(got, reference(logits, T), rtol=0, atol=2e-6)


@pytest.mark.parametrize("T", [F32_TINY, 1e-40, 1e-38, 1e-37])
def test_tiny_temperature_is_greedy(lib, T):
    logits = np.array([31.0, 30.5, -2.0] * 100 + [31.25, 0.0], np.float32)  # argmax 300
    probs = c_probs(lib, logits, T)
    assert probs[300] == 1.0 and probs.sum() == 1.0
    for topp in (1.0, 0.9, 0.5):
        assert {c_sample(lib, logits, T, topp, seed) for seed in range(20)} == {300}


def test_ties_at_the_top_share_the_mass_in_the_limit(lib):
    logits = np.array([5.0, 1.0, 5.0, -3.0], np.float32)
    np.testing.assert_array_equal(c_probs(lib, logits, 1e-40), [0.5, 0.0, 0.5, 0.0])
    assert {c_sample(lib, logits, 1e-40, 1.0, seed) for seed in range(64)} == {0, 2}


def test_non_finite_logits_still_give_a_distribution(lib):
    np.testing.assert_array_equal(
        c_probs(lib, np.array([1.0, np.inf, 3.0], np.float32), 0.7), [0, 1, 0])
    np.testing.assert_array_equal(
        c_probs(lib, np.array([-np.inf, -np.inf], np.float32), 0.7), [1, 0])
    got = c_probs(lib, np.array([np.nan, 1.0, 1.0], np.float32), 1.0)
    np.testing.assert_allclose(got, [0, 0.5, 0.5])
    huge_t = c_probs(lib, np.array([3.0, -np.inf, 1.0], np.float32), np.inf)
    np.testing.assert_array_equal(huge_t, [0.5, 0.0, 0.5])


@settings(max_examples=300, deadline=None)
@given(logits=st.lists(st.floats(-20, 20, width=32), min_size=2, max_size=40),
       T=temperatures, topp=st.floats(0.01, 0.99), seed=st.integers(0, 2**63))
def test_top_p_draws_from_the_reference_nucleus(lib, logits, T, topp, seed):
    logits = np.array(logits, np.float32)
    p = reference(logits, T)
    order = np.argsort(-p, kind="stable")
    mass = np.cumsum(p[order])
    k = int(np.searchsorted(mass, topp, side="right")) + 1  # smallest prefix with mass > topp
    floor = p[order[min(k, p.size) - 1]]
    tok = c_sample(lib, logits, T, topp, seed)
    assert 0 <= tok < logits.size
    assert p[tok] >= floor - 1e-6, (tok, p[tok], floor)  # inside the nucleus (up to rounding)


@pytest.mark.parametrize("temp", ["1e-37", "1e-38", "1e-40", "1e-45"])
@pytest.mark.parametrize("topp", ["1", "0.9"])
def test_ditto_run_tiny_temperature_equals_greedy(native_build, native_synth, temp, topp):
    from tests.fixtures_native import run_native

    def ids(*extra):
        p = run_native(native_build.asan, "-m", native_synth.quant_untied.path, "-p",
                       "hello world", "-n", "12", "--ignore-eos", "--print-ids", *extra)
        assert p.returncode == 0, p.stderr.decode()
        return p.stdout.decode()

    greedy = ids("--temp", "0")
    assert len(set(greedy.strip("[]\n").split(", "))) > 1  # not one token repeated
    assert ids("--temp", temp, "--top-p", topp, "--seed", "1") == greedy


def serial_argmax(logits) -> int:
    """The definition of greedy decoding: one pass from logits[0], moving on a strictly
    larger value (the first of ties; a NaN never compares larger)."""
    best = 0
    for i in range(1, len(logits)):
        if logits[i] > logits[best]:
            best = i
    return best


@settings(max_examples=600, deadline=None)
@given(st.integers(1, 80).flatmap(lambda n: st.lists(
    st.one_of(st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 7.0, -7.0]),
              st.floats(-50, 50, width=32)), min_size=n, max_size=n)))
def test_argmax_equals_the_serial_definition(lib, logits):
    x = np.array(logits, np.float32)
    got = lib.sample_argmax(x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), x.size)
    assert got == serial_argmax(x), x


def test_argmax_on_a_qwen_sized_vocabulary(lib):
    rng = np.random.default_rng(7)
    for top in (0, 15, 16, 151_935, 77_777):
        x = rng.standard_normal(151_936).astype(np.float32)
        x[top] = 40.0
        x[rng.integers(0, x.size, 50)] = np.nan
        if top != 0:
            x[top + 1 - 2 * (top == x.size - 1):][:1] = 40.0  # a tie after (or before) it
        want = serial_argmax(x.tolist())
        assert lib.sample_argmax(x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), x.size) == want
