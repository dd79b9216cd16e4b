"""The example third-party plugin examples/ditto-quant-rtn, installed with pip and used through
the plugin registry; its RTN agrees with GGUF's own Q4_1 at G = 32."""

import gguf
import numpy as np
import pytest
from gguf import quants

from ditto_core.base.errors import DittoError
from ditto_core.kit.components import QuantOptions


def test_registered_from_its_own_distribution(rtn_registry):
    reg = rtn_registry
    found = reg.components["quantizer"]["rtn"]
    assert found.dist == "ditto-quant-rtn" and found.plugin == "quant_rtn"
    assert ("quant_rtn", "ditto-quant-rtn", "0.1.0") in reg.plugins
    assert reg.components["quantizer"]["kmeans"].dist == "ditto-llm"


def _rtn(reg):
    import ditto_quant_rtn  # importable only after the fixture installed it
    return ditto_quant_rtn.rtn_matrix


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_gguf_q4_1(rtn_registry, seed):
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal((64, 256)) * rng.uniform(0.01, 1, (64, 1))).astype(np.float32)
    q = _rtn(rtn_registry)(W, 4, 32, "f32")
    rec = q.codebooks[np.arange(64)[:, None], np.arange(256)[None, :] // 32, q.indices]
    qt = gguf.GGMLQuantizationType.Q4_1
    ref = quants.dequantize(quants.quantize(W, qt), qt)
    # Q4_1 stores its scale and minimum in f16: values differ by at most ~2^-11 of the range
    g = W.reshape(64, 8, 32)
    bound = np.repeat((np.abs(g).max(-1) * 3) * 2.0 ** -11, 32, axis=1).reshape(64, 256)
    step = np.repeat((g.max(-1) - g.min(-1)) / 15, 32, axis=1).reshape(64, 256)
    diff = np.abs(rec - ref)
    assert np.mean(diff <= bound) > 0.999
    assert np.all(diff <= step + bound)  # a near-tie may round to the neighbouring level
    err_ref = ((W - ref) ** 2).sum() / (W ** 2).sum()
    assert q.rel_error == pytest.approx(err_ref, rel=0.02)


def test_options_checked(rtn_registry):
    rtn = rtn_registry.get("quantizer", "rtn")
    with pytest.raises(DittoError, match="1..8"):
        rtn.quantize(None, QuantOptions(bits=0))
    with pytest.raises(DittoError, match=r"rtn: group size G must be an integer in 2\.\."):
        rtn.quantize(None, QuantOptions(group_size=1))
    with pytest.raises(DittoError, match="rtn: unknown method 'lloyd'; choose one of rtn"):
        rtn.check_options(QuantOptions(method="lloyd"))
    W = np.ones((3, 9), np.float32)
    W[2, 4] = np.nan
    with pytest.raises(DittoError, match=r"'w'.*\(2, 4\)"):
        _rtn(rtn_registry)(W, 4, 8, "f16", "w")
