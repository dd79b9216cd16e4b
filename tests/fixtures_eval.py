"""Fixtures of the `ditto eval` / `bench` / `compare` tests: tinycoder builds."""

from pathlib import Path

import pytest

from tests.fixtures_compile import build_model


@pytest.fixture(scope="session")
def eval_builds(tmp_path_factory, build_cache_root) -> dict:
    """tinycoder built fp32 (``none``) and with ``kmeans`` b = 4, G = 32:
    {"none": dir, "kmeans": dir}."""
    from ditto_core.kit.components import QuantOptions

    d = tmp_path_factory.mktemp("eval_builds")
    build_model("tinycoder", d / "none", build_cache_root)
    build_model("tinycoder", d / "kmeans", build_cache_root, quantizer="kmeans",
                quant=QuantOptions(bits=4, group_size=32))
    return {"none": d / "none", "kmeans": d / "kmeans"}
