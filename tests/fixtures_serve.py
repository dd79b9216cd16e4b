"""Session fixture of the ``ditto serve`` tests: tinycoder built as ``ditto build tinycoder
--quantizer kmeans`` does by default (b = 4, G = 256, int8 codebooks), with ``libditto.so``."""

from pathlib import Path

import pytest

from tests.fixtures_compile import build_model


@pytest.fixture(scope="session")
def serve_build(tmp_path_factory, build_cache_root) -> Path:
    """Build directory of tinycoder with the default int8 codebooks (its compile stages shared
    with the other builds through ``build_cache_root``)."""
    from ditto_core.kit.components import QuantOptions

    d = tmp_path_factory.mktemp("serve_build") / "tiny_int8"
    build_model("tinycoder", d, build_cache_root, quantizer="kmeans",
                quant=QuantOptions(codebook_type="int8"))
    return d
