"""The int8 codebook type (docs/FORMAT.md): the quantizer's rounding onto the int8 grid, the
packer's exact payload bytes and refusals, the Python reader, ditto inspect, and the C loader's
checks of centroids and scales."""

import numpy as np
import pytest

from ditto_core.base.errors import DittoError
from ditto_core.base.types import CodebookTensor
from ditto_core.model.codebook import payload_bytes as codebook_nbytes
from ditto_core.model.modelfile import ModelFile, TensorInfo
from ditto_pack_bits import codebook_payload, dequantize
from ditto_quant_kmeans.quantizer import int8_codebooks, quantize_matrix
from tests.fixtures_native import (EXIT_MODEL, rewrite_crc, run_native, synthetic_model)


def test_int8_codebooks_round_onto_the_grid():
    cent = np.array([[[-1.0, 0.0, 0.5, 2.54]], [[0.0, 0.0, 0.0, 0.0]]])
    stored, scales = int8_codebooks(cent)
    s = np.float32(np.float16(2.54 / 127))  # 0.02 in f16 = 0.0200042724609375
    assert scales.tolist() == [[float(s)], [0.0]]
    q = np.rint(cent[0, 0] / float(s))
    assert q.tolist() == [-50.0, 0.0, 25.0, 127.0]
    assert stored[0, 0].tolist() == (q * s).astype(np.float32).tolist()
    assert stored[1].tolist() == [[0.0, 0.0, 0.0, 0.0]]


def test_int8_scale_is_raised_when_f16_rounding_would_clip():
    # 127 * f16(c / 127) < c: the scale goes one f16 step up, so q stays within 127
    c = 1.0 + 2.0 ** -9
    s16 = np.float16(c / 127)
    assert float(s16) * 127 < c
    stored, scales = int8_codebooks(np.array([[c, -c / 3]]))
    assert scales[0] == np.float32(np.nextafter(s16, np.float16(np.inf)))
    assert abs(stored[0, 0] / scales[0]) <= 127


def test_int8_scale_overflow_is_refused():
    with pytest.raises(DittoError, match="overflows the f16 scale of an int8 codebook"):
        int8_codebooks(np.array([[1e8, 0.0]]))


def test_quantizer_assigns_nearest_stored_int8_centroid():
    rng = np.random.default_rng(0)
    W = rng.normal(size=(8, 300)).astype(np.float32)
    q = quantize_matrix(W, 4, 128, codebook_type="int8")
    assert q.codebook_type == "int8" and q.scales.shape == (8, 3)
    ints = q.codebooks / np.where(q.scales > 0, q.scales, 1)[..., None]
    assert np.array_equal(ints, np.rint(ints)) and np.abs(ints).max() == 127
    sub = np.arange(300) // 128
    What = q.codebooks[np.arange(8)[:, None], sub[None, :], q.indices]
    # nearest stored centroid: no other centroid of the sub-block is closer
    d_all = np.abs(W[:, :, None] - q.codebooks[np.arange(8)[:, None], sub[None, :], :])
    assert np.all(np.abs(W - What) <= d_all.min(axis=-1) + 0.0)
    f16 = quantize_matrix(W, 4, 128, codebook_type="f16")
    assert q.rel_error < 1.05 * f16.rel_error  # the int8 grid costs little at b = 4


def test_payload_bytes_exact():
    cb = np.array([[[-0.5, 1.0], [0.25, 0.0]]], np.float32)  # 1 row, S = 2, K = 2
    sc = np.array([[1.0 / 127, 0.25 / 127]], np.float32).astype(np.float16).astype(np.float32)
    cb = (np.rint(cb / sc[..., None]) * sc[..., None]).astype(np.float32)
    t = CodebookTensor(bits=1, group_size=2, codebooks=cb,
                       indices=np.array([[1, 0, 1]], np.uint8), codebook_type="int8", scales=sc)
    raw = codebook_payload(t)
    q = np.rint(cb / sc[..., None]).astype(np.int8).ravel()
    assert q.tolist() == [-64, 127, 127, 0]
    want = q.tobytes() + sc.astype("<f2").tobytes()
    want += b"\0" * (64 - len(want)) + bytes([0b101])
    assert raw == want
    assert len(raw) == codebook_nbytes(1, 3, 1, 2, "int8") == 65
    info = TensorInfo("w", "codebook", (1, 3), 1, 2, "int8", 0, len(raw))
    assert dequantize(info, np.frombuffer(raw, np.uint8)).tolist() == \
        [[float(cb[0, 0, 1]), float(cb[0, 0, 0]), float(cb[0, 1, 1])]]


@pytest.mark.parametrize("bad,message", [
    ("offgrid", "scale times an integer in -127..127"),
    ("noscales", "int8 codebooks need scales of shape (1, 1)"),
    ("negscale", "finite, non-negative f16"),
])
def test_packer_refuses_bad_int8_codebooks(bad, message):
    sc = np.array([[0.5]], np.float32)
    cb = np.array([[[-1.0, 0.5]]], np.float32)
    if bad == "offgrid":
        cb[0, 0, 0] = -0.75
    if bad == "negscale":
        sc = -sc
    t = CodebookTensor(bits=1, group_size=2, codebooks=cb, indices=np.zeros((1, 2), np.uint8),
                       codebook_type="int8", scales=None if bad == "noscales" else sc)
    with pytest.raises(DittoError, match=message.replace("(", r"\(").replace(")", r"\)")):
        codebook_payload(t)


@pytest.fixture(scope="module")
def int8_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("int8") / "m.ditto"
    synthetic_model(path, seed=11, tied=True, quantized=True, cb_types=("int8",))
    return path


def test_reader_and_inspect_show_int8(int8_model):
    from ditto_core.model.summary import inspect_summary

    with ModelFile.open(int8_model) as mf:
        s = inspect_summary(mf)
    quant = [t for t in s["tensors"] if t["encoding"] == "codebook"]
    assert quant and {t["codebook_type"] for t in quant} == {"int8"}
    for t in quant:  # theoretical = indices + int8 centroids + f16 scales, no padding
        rows, cols = t["shape"]
        S = -(-cols // t["group_size"])
        assert t["theoretical_bytes"] == -(-rows * cols * t["bits"] // 8) + \
            rows * S * ((1 << t["bits"]) + 2)


def _patched(int8_model, tmp_path, what):
    mf = ModelFile(int8_model)
    info = next(t for t in mf.tensors.values() if t.encoding == "codebook")
    data = bytearray(int8_model.read_bytes())
    rows, S, K = info.rows, info.n_sub_blocks, 1 << info.bits
    if what == "centroid":
        data[info.offset + K + 1] = 0x80  # row 0, sub-block 1 (or row 1), centroid 1: -128
    else:
        at = info.offset + rows * S * K + 2 * 3  # the 4th scale
        data[at:at + 2] = np.array([np.float16(np.inf)]).view(np.uint8).tobytes()
    out = tmp_path / f"{what}.ditto"
    out.write_bytes(rewrite_crc(data))
    return out, info, S


def test_loader_refuses_int8_centroid_minus_128(native_build, int8_model, tmp_path):
    path, info, S = _patched(int8_model, tmp_path, "centroid")
    p = run_native(native_build.asan, "-m", path, "-p", "hi", "-n", 1)
    assert p.returncode == EXIT_MODEL
    row, sub = (0, 1) if S > 1 else (1, 0)
    msg = (f"tensor {info.name}: int8 centroid -128 at row {row} sub-block {sub} (int8 "
           f"codebooks use -127..127)")
    assert msg in p.stderr.decode()
    with pytest.raises(DittoError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        ModelFile(path)  # the Python reader applies the same rule


def test_loader_refuses_infinite_int8_scale(native_build, int8_model, tmp_path):
    path, info, S = _patched(int8_model, tmp_path, "scale")
    p = run_native(native_build.asan, "-m", path, "-p", "hi", "-n", 1)
    assert p.returncode == EXIT_MODEL
    msg = (f"tensor {info.name}: int8 codebook scale 0x7c00 at row {3 // S} sub-block "
           f"{3 % S} is negative, infinite or NaN")
    assert msg in p.stderr.decode()
    with pytest.raises(DittoError, match=msg):
        ModelFile(path)


def test_default_codebook_type_is_int8_for_kmeans(monkeypatch, tmp_path):
    """ditto build / ditto_core.build without a codebook type: int8 with kmeans (docs/QUANT.md
    "int8 vs f16 codebooks"), f16 with any other quantizer; an explicit type is kept. The CLI
    passes None through."""
    from click.testing import CliRunner

    import ditto_core.stages.pipeline as pipeline
    from ditto_core.api import build
    from ditto_core.cli.main import cli

    seen = []
    monkeypatch.setattr(pipeline, "build",
                        lambda model, out, opts, *a, **k: seen.append(opts.quant) or {})
    build("tinycoder", quantizer="kmeans", out=tmp_path)
    build("tinycoder", quantizer="rtn", out=tmp_path)
    build("tinycoder", quantizer="kmeans", codebook_type="f16", out=tmp_path)
    assert [q.codebook_type for q in seen] == ["int8", "f16", "f16"]
    CliRunner().invoke(cli, ["build", "tinycoder", "--quantizer", "kmeans", "--blas", "openblas",
                             "-o", str(tmp_path / "x"), "-q"])
    assert seen[-1].codebook_type == "int8"
