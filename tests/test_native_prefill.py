"""Batched prefill (native/runtime/prefill.c, native/kernels/gemm.c): the prompt, --score and
--dump-logits input evaluated in tiles of tokens equal the token-by-token forward pass (--batch-size 1) and
the NumPy reference, for f32 and codebook models, tied and untied, with and without GQA,
prompt lengths that are not a multiple of the tile; the GEMM kernels against NumPy."""

import ctypes
import json

import numpy as np
import pytest

from tests.fixtures_native import (CB_F16, CB_F32, dequantize_codebook, dump_logits,
                                   random_codebook_tensor, rel_error, run_native, token_file)
from tests.native_reference import reference_logits
from ditto_pack_bits import codebook_payload

F32P = ctypes.POINTER(ctypes.c_float)
# f32 tied GQA; codebook tied GQA; codebook untied MHA; codebook untied GQA Qwen2 (q/k/v biases)
MODELS = ["f32", "quant", "quant_untied", "quant_qwen2"]


@pytest.fixture(scope="module")
def lib(native_build):
    lib = ctypes.CDLL(str(native_build.kernels))
    for fn in (lib.codebook_gemm_ref, lib.codebook_gemm_avx2):
        fn.argtypes = [F32P, F32P, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.gemm_avx2_supported.restype = ctypes.c_int
    lib.matmul_f32_batch.argtypes = [F32P, F32P, F32P] + [ctypes.c_int] * 3
    lib.codebook_gemv_ref.argtypes = [F32P, F32P, ctypes.c_char_p, ctypes.c_uint32,
                                      ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return lib


def fptr(a: np.ndarray):
    assert a.dtype == np.float32 and a.flags.c_contiguous
    return a.ctypes.data_as(F32P)


# ------------------------------------------------------------------------- GEMM kernels

# (rows, cols, G, T): rows not a multiple of the 16-row tile, cols across the 256-column
# chunk and not a multiple of 8, G not dividing cols, T not a multiple of the 4- and 6-token
# blocks; G multiples of 8 (the AVX2 path for b = 4) and not
GEMM_SHAPES = [(1, 1, 2, 1), (16, 64, 16, 4), (17, 70, 16, 5), (5, 257, 64, 3),
               (40, 300, 37, 9), (33, 576, 256, 7), (3, 19, 5, 64), (20, 513, 100, 2),
               (9, 600, 8, 13), (31, 1000, 256, 6), (16, 256, 32, 512)]


def test_avx2_gemm_support_matches_cpuinfo(lib):
    flags = next(ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")).split()
    want = all(f in flags for f in ("avx2", "fma", "f16c"))
    assert lib.gemm_avx2_supported() == int(want)


@pytest.mark.parametrize("kernel", ["codebook_gemm_ref", "codebook_gemm_avx2"])
@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("cb_type", ["f16", "f32"])
def test_codebook_gemm_equals_dequantize_then_matmul_and_gemv(lib, kernel, bits, cb_type):
    """codebook_gemm_avx2 takes b = 4 with G % 8 == 0 (on AVX2 CPUs) and falls back to the
    reference for the rest; both are checked on every shape."""
    rng = np.random.default_rng(100 + bits)
    for rows, cols, G, T in GEMM_SHAPES:
        ct = random_codebook_tensor(rng, rows, cols, bits, G, cb_type, scale=1.0)
        payload = codebook_payload(ct)
        X = rng.normal(size=(T, cols)).astype(np.float32)
        Y = np.full((T, rows), np.nan, dtype=np.float32)
        cbt = CB_F16 if cb_type == "f16" else CB_F32
        getattr(lib, kernel)(fptr(Y), fptr(X), T, payload, cbt, bits, G, rows, cols)
        W = dequantize_codebook(ct)
        want = X.astype(np.float64) @ W.T
        tol = 1e-5 * np.sqrt(cols) * (np.abs(X).max() + 1) * (np.abs(W).max() + 1)
        np.testing.assert_allclose(Y, want, rtol=1e-5, atol=tol,
                                   err_msg=f"rows={rows} cols={cols} G={G} T={T}")
        for t in range(T):  # each row of the GEMM is the GEMV of that activation row
            y = np.zeros(rows, dtype=np.float32)
            lib.codebook_gemv_ref(fptr(y), fptr(X[t].copy()), payload, cbt, bits, G, rows, cols)
            np.testing.assert_allclose(Y[t], y, rtol=1e-5, atol=tol)


def test_f32_gemm_equals_numpy(lib):
    rng = np.random.default_rng(5)
    for d, n, T in [(1, 1, 1), (7, 13, 3), (64, 576, 33), (100, 37, 64)]:
        W = rng.normal(size=(d, n)).astype(np.float32)
        X = rng.normal(size=(T, n)).astype(np.float32)
        Y = np.full((T, d), np.nan, dtype=np.float32)
        lib.matmul_f32_batch(fptr(Y), fptr(X), fptr(W), T, n, d)
        np.testing.assert_allclose(Y, X.astype(np.float64) @ W.T.astype(np.float64),
                                   rtol=1e-5, atol=1e-5 * np.sqrt(n) * 4)


# ------------------------------------------------------------------------- the program

@pytest.mark.parametrize("name", MODELS)
def test_batched_logits_equal_token_by_token_and_reference(native_build, native_synth,
                                                           tmp_path, name):
    m = getattr(native_synth, name)
    ids = np.random.default_rng(11).integers(0, m.cfg.vocab_size, size=45).tolist()
    one = dump_logits(native_build.run, m.path, ids, tmp_path, "--batch-size", 1)
    ref = reference_logits(m.cfg, m.weights, ids)
    assert rel_error(one, ref).max() <= 1e-4
    for tile in (2, 7, 16, 45, 64):  # 45 = 6*7 + 3 = 2*16 + 13: partial last tiles
        got = dump_logits(native_build.run, m.path, ids, tmp_path, "--batch-size", tile)
        assert got.shape == (45, 259)
        assert rel_error(got, one).max() <= 2e-6, tile
        assert rel_error(got, ref).max() <= 1e-4, tile


def test_batched_logits_do_not_depend_on_threads(native_build, native_synth, tmp_path):
    m = native_synth.quant
    ids = list(range(3, 40))
    a = dump_logits(native_build.run, m.path, ids, tmp_path, "--threads", 1, "-b", 16)
    b = dump_logits(native_build.run, m.path, ids, tmp_path, "--threads", 2, "-b", 16)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["f32", "quant_untied"])
def test_batched_score_equals_token_by_token(native_build, native_synth, tmp_path, name):
    m = getattr(native_synth, name)
    ids = np.random.default_rng(4).integers(0, 259, size=30).tolist()
    f = token_file(tmp_path / "t.json", ids)
    out = {}
    for tile in (1, 8, 64):
        p = run_native(native_build.run, "-m", m.path, "--score", f, "--batch-size", tile)
        assert p.returncode == 0, p.stderr.decode()
        out[tile] = json.loads(p.stdout)
        assert "scored 29 tokens in" in p.stderr.decode()
    for tile in (8, 64):
        assert out[tile]["n_scored"] == 29
        np.testing.assert_allclose(out[tile]["logprobs"], out[1]["logprobs"], rtol=0, atol=2e-5)
        np.testing.assert_allclose(out[tile]["sum_logprob"], out[1]["sum_logprob"], rtol=1e-6)


def test_batched_prompt_then_decode_equals_token_by_token(native_build, native_synth, tmp_path):
    """Generation after a batched prompt continues from the KV cache prefill() filled."""
    m = native_synth.quant_untied
    ids = np.random.default_rng(9).integers(3, 259, size=21).tolist()
    f = token_file(tmp_path / "p.json", ids)
    runs = []
    for tile in (1, 4, 64):
        p = run_native(native_build.run, "-m", m.path, "--ids", f, "-n", 20, "--temp", 0,
                       "--ignore-eos", "--print-ids", "--batch-size", tile)
        assert p.returncode == 0, p.stderr.decode()
        runs.append(json.loads(p.stdout))
    assert len(runs[0]) == 20 and runs[1] == runs[0] and runs[2] == runs[0]
    # the first generated token is the argmax of the reference logits at the prompt's end
    assert runs[0][0] == int(reference_logits(m.cfg, m.weights, ids)[-1].argmax())


@pytest.mark.parametrize("name", ["f32", "quant_qwen2"])
def test_f16_kv_cache_equals_reference_on_f16_keys_and_values(native_build, native_synth,
                                                              tmp_path, name):
    """--cache-type-k/-v f16 (llama.cpp's flags) store each key and value rounded to f16:
    token by token and batched, the logits are the reference's with the keys (after RoPE) and
    values so rounded, and measurably not the float32 cache's."""
    m = getattr(native_synth, name)
    ids = np.random.default_rng(12).integers(0, m.cfg.vocab_size, size=45).tolist()
    ref32 = reference_logits(m.cfg, m.weights, ids)
    ref_k = reference_logits(m.cfg, m.weights, ids, k_dtype=np.float16)
    ref_kv = reference_logits(m.cfg, m.weights, ids, k_dtype=np.float16, v_dtype=np.float16)
    for tile in (1, 16):
        kv = dump_logits(native_build.run, m.path, ids, tmp_path, "-b", tile, "-ctk", "f16",
                         "-ctv", "f16")
        assert rel_error(kv, ref_kv).max() <= 2e-5, tile
        assert rel_error(kv, ref32).max() >= 5e-5, tile
        k = dump_logits(native_build.run, m.path, ids, tmp_path, "-b", tile,
                        "--cache-type-k", "f16", "--cache-type-v", "f32")
        assert rel_error(k, ref_k).max() <= 2e-5, tile
        assert rel_error(k, ref_kv).max() >= 5e-5, tile


@pytest.mark.parametrize("flag", ["-ctk", "--cache-type-k", "-ctv", "--cache-type-v"])
def test_bad_kv_cache_type_is_a_usage_error(native_build, native_synth, flag):
    p = run_native(native_build.run, "-m", native_synth.f32.path, "-p", "hi", flag, "q8_0")
    assert p.returncode == 1
    long = "--cache-type-k" if flag in ("-ctk", "--cache-type-k") else "--cache-type-v"
    assert f"ditto-run: {long} must be f32 or f16, got 'q8_0'" in p.stderr.decode()


def test_batched_prefill_under_asan(native_build, native_synth, tmp_path):
    for name in MODELS:
        m = getattr(native_synth, name)
        ids = list(range(5, 28))  # 23 tokens: tiles 5 + 5 + 5 + 5 + 3
        got = dump_logits(native_build.asan, m.path, ids, tmp_path, "--batch-size", 5)
        assert rel_error(got, reference_logits(m.cfg, m.weights, ids)).max() <= 1e-4
        p = run_native(native_build.asan, "-m", m.path, "--score",
                       token_file(tmp_path / "s.json", ids), "-b", 6)
        assert p.returncode == 0, p.stderr.decode()
        p = run_native(native_build.asan, "-m", m.path, "--ids", tmp_path / "s.json", "-n", 5,
                       "--temp", 0, "-b", 512)
        assert p.returncode == 0, p.stderr.decode()
        p = run_native(native_build.asan, "-m", m.path, "--ids", tmp_path / "s.json", "-n", 5,
                       "--temp", 0, "-b", 6, "-ctk", "f16", "-ctv", "f16")
        assert p.returncode == 0, p.stderr.decode()


@pytest.mark.parametrize("value", ["0", "513", "abc", "-3"])
def test_bad_batch_size_is_a_usage_error(native_build, native_synth, value):
    p = run_native(native_build.run, "-m", native_synth.f32.path, "-p", "hi", "--batch-size",
                   value)
    assert p.returncode == 1
    assert (f"ditto-run: --batch-size must be an integer in 1..512, got '{value}'"
            in p.stderr.decode())
