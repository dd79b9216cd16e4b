"""Ditto: compile a Llama-family LLM checkpoint into a standalone CPU executable.

The Python API (docs/PYTHON.md): ``ditto_core.build(model, quantizer=..., blas=..., out=...)``
returns a ``Build`` with ``.run(prompt)``, ``.logits(token_ids)`` and ``.inspect()``;
``Build.open(dir)`` opens an existing build directory.
"""

__version__ = "0.1.0"

from .api import Build, build  # noqa: E402

__all__ = ["Build", "build", "__version__"]
