"""The C kernels (native/kernels/matmul.c, codebook_ref.c, native/model/model.c) called through
ctypes against direct NumPy computations: codebook GEMV and row decode for every bit width b = 1..8 and group sizes
with tail sub-blocks, the fp32 GEMV, half -> float conversion and CRC-32."""

import ctypes
import zlib

import numpy as np
import pytest

from tests.fixtures_native import CB_F16, CB_F32, dequantize_codebook, random_codebook_tensor
from ditto_core.base.types import CodebookTensor
from ditto_core.model.modelfile import TensorInfo
from ditto_pack_bits import codebook_payload, dequantize

F32P = ctypes.POINTER(ctypes.c_float)


@pytest.fixture(scope="module")
def lib(native_build):
    lib = ctypes.CDLL(str(native_build.kernels))
    lib.codebook_gemv_ref.argtypes = [F32P, F32P, ctypes.c_char_p, ctypes.c_uint32,
                                      ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.codebook_row_ref.argtypes = [F32P, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int,
                                     ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.matmul.argtypes = [F32P, F32P, F32P, ctypes.c_int, ctypes.c_int]
    lib.f16_to_f32.argtypes = [ctypes.c_uint16]
    lib.f16_to_f32.restype = ctypes.c_float
    lib.crc32_update.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]
    lib.crc32_update.restype = ctypes.c_uint32
    lib.tensor_expected_nbytes.argtypes = [ctypes.c_uint32] * 4 + [ctypes.c_uint64] * 2
    lib.tensor_expected_nbytes.restype = ctypes.c_uint64
    return lib


def fptr(a: np.ndarray):
    assert a.dtype == np.float32 and a.flags.c_contiguous
    return a.ctypes.data_as(F32P)


def c_gemv(lib, ct: CodebookTensor, x: np.ndarray) -> np.ndarray:
    rows, cols = ct.indices.shape
    y = np.zeros(rows, dtype=np.float32)
    payload = codebook_payload(ct)
    lib.codebook_gemv_ref(fptr(y), fptr(x), payload,
                          CB_F16 if ct.codebook_type == "f16" else CB_F32, ct.bits,
                          ct.group_size, rows, cols)
    return y


# (cols, G): tails of every length, G larger than a row, G not a multiple of 8
SHAPES = [(64, 16), (70, 16), (33, 2), (35, 3), (100, 37), (50, 256), (257, 64), (19, 5),
          (576, 32), (1, 2)]


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("cb_type", ["f16", "f32"])
def test_codebook_gemv_equals_dequantize_then_dot(lib, bits, cb_type):
    rng = np.random.default_rng(bits * 10 + (cb_type == "f16"))
    for cols, G in SHAPES:
        rows = int(rng.integers(1, 12))
        ct = random_codebook_tensor(rng, rows, cols, bits, G, cb_type, scale=1.0)
        x = rng.normal(size=cols).astype(np.float32)
        W = dequantize_codebook(ct)
        # the packer's own decoder reads the same payload back to the same weights
        info = TensorInfo("w", "codebook", (rows, cols), bits, G, cb_type)
        np.testing.assert_array_equal(dequantize(info, np.frombuffer(codebook_payload(ct),
                                                                     np.uint8)), W)
        want = W @ x.astype(np.float64)
        got = c_gemv(lib, ct, x)
        tol = 1e-5 * np.sqrt(cols) * (np.abs(x).max() + 1)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=tol, err_msg=f"cols={cols} G={G}")


@pytest.mark.parametrize("bits", [1, 3, 4, 7, 8])
def test_codebook_row_decode_equals_dequantize(lib, bits):
    rng = np.random.default_rng(bits)
    for cols, G in SHAPES:
        rows = 5
        ct = random_codebook_tensor(rng, rows, cols, bits, G, "f32" if bits % 2 else "f16")
        payload = codebook_payload(ct)
        W = dequantize_codebook(ct)
        for r in range(rows):
            out = np.zeros(cols, dtype=np.float32)
            lib.codebook_row_ref(fptr(out), payload, CB_F32 if bits % 2 else CB_F16, bits, G,
                                 rows, cols, r)
            np.testing.assert_array_equal(out, W[r].astype(np.float32))


def test_index_packing_follows_format_md():
    """FORMAT.md: b = 8 one byte per index, b = 4 low nibble first, b = 2 four per byte,
    b = 1 eight per byte (LSB first), b = 3 eight indices in 3 bytes."""
    def packed_indices(bits, idx):
        ct = CodebookTensor(bits=bits, group_size=8,
                            codebooks=np.zeros((1, 1, 1 << bits), np.float32),
                            indices=np.array([idx], dtype=np.uint8), codebook_type="f32")
        cb_bytes = -(-(4 << bits) // 64) * 64  # K f32 centroids, padded to 64 bytes
        return codebook_payload(ct)[cb_bytes:]

    assert packed_indices(8, [1, 2, 3, 4, 5, 6, 7, 255]) == bytes([1, 2, 3, 4, 5, 6, 7, 255])
    assert packed_indices(4, [1, 2, 3, 4, 5, 6, 7, 15]) == bytes([0x21, 0x43, 0x65, 0xF7])
    assert packed_indices(2, [1, 2, 3, 0, 0, 1, 2, 3]) == bytes([0b00111001, 0b11100100])
    assert packed_indices(1, [1, 0, 0, 0, 0, 0, 0, 1]) == bytes([0b10000001])
    v = sum(i << (3 * j) for j, i in enumerate([7, 1, 2, 3, 4, 5, 6, 0]))
    assert packed_indices(3, [7, 1, 2, 3, 4, 5, 6, 0]) == v.to_bytes(3, "little")


def test_matmul_fp32_equals_numpy(lib):
    rng = np.random.default_rng(0)
    for d, n in [(1, 1), (7, 13), (96, 576), (300, 65)]:
        W = rng.normal(size=(d, n)).astype(np.float32)
        x = rng.normal(size=n).astype(np.float32)
        y = np.zeros(d, dtype=np.float32)
        lib.matmul(fptr(y), fptr(x), fptr(W), n, d)
        np.testing.assert_allclose(y, W.astype(np.float64) @ x, rtol=1e-5, atol=1e-5 * np.sqrt(n))


def test_f16_to_f32_all_halves(lib):
    h = np.arange(65536, dtype=np.uint16)
    want = h.view(np.float16).astype(np.float32)
    got = np.array([lib.f16_to_f32(int(v)) for v in h], dtype=np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_crc32_equals_zlib(lib):
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, size=100_003, dtype=np.uint8).tobytes()
    for start, end in [(0, 0), (0, 1), (3, 17), (5, 100_003), (0, 64), (1, 99_999)]:
        assert lib.crc32_update(0, data[start:end], end - start) == zlib.crc32(data[start:end])
    # continuing a running CRC
    part = lib.crc32_update(0, data[:1000], 1000)
    assert lib.crc32_update(part, data[1000:5000], 4000) == zlib.crc32(data[:5000])


def test_crc32_every_short_length_and_alignment(lib):
    """Lengths 0..300 from 17 start addresses: the byte-table path (< 64 bytes), the
    carry-less-multiplication folds where the CPU has them (64-byte steps, then 16-byte ones)
    and the byte tails after them, each against zlib."""
    data = np.random.default_rng(2).integers(0, 256, size=400, dtype=np.uint8).tobytes()
    buf = ctypes.create_string_buffer(data, len(data))
    base = ctypes.addressof(buf)
    for off in range(17):
        for n in range(301):
            got = lib.crc32_update(0, ctypes.cast(base + off, ctypes.c_char_p), n)
            assert got == zlib.crc32(data[off:off + n]), (off, n)


def test_expected_nbytes_formula(lib):
    # FORMAT.md: codebook_bytes = roundup(rows*S*K*elem, 64), nbytes = that + rows*ceil(cols/8)*b
    assert lib.tensor_expected_nbytes(0, 0, 0, 0, 3, 5) == 60
    rows, cols, b, G = 10, 100, 3, 37
    S, K = 3, 8
    cb = -(-rows * S * K * 2 // 64) * 64
    assert lib.tensor_expected_nbytes(1, CB_F16, b, G, rows, cols) == cb + rows * 13 * b
    assert lib.tensor_expected_nbytes(1, CB_F32, 9, G, rows, cols) == 0  # b > 8
    assert lib.tensor_expected_nbytes(1, CB_F32, 4, 1, rows, cols) == 0  # G < 2
    assert lib.tensor_expected_nbytes(1, 7, 4, 8, rows, cols) == 0  # unknown codebook type
    assert lib.tensor_expected_nbytes(5, 0, 0, 0, rows, cols) == 0  # unknown encoding
    # dimensions the int-indexed kernels cannot address, or sizes that would overflow
    assert lib.tensor_expected_nbytes(0, 0, 0, 0, 1, 2**31) == 0
    assert lib.tensor_expected_nbytes(1, CB_F32, 8, 2, 2**31 - 1, 2**31 - 1) == 0
