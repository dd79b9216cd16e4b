"""Ditto: compile a Llama-family LLM checkpoint into a standalone CPU executable.

The Python API (docs/PYTHON.md): ``ditto_core.build(model, quantizer=..., blas=..., out=...)``
returns a ``Build`` with ``.run(prompt)``, ``.logits(token_ids)`` and ``.inspect()``;
``Build.open(dir)`` opens an existing build directory; errors are ``ditto_core.DittoError``.
"""

__version__ = "0.1.0"

__all__ = ["Build", "DittoError", "build", "__version__"]


def __getattr__(name: str):
    """``Build`` and ``build`` from ``ditto_core.api``, imported on first use, so importing a
    lower module (``ditto_core.kit.quantkit`` in a quantizer plugin, ``ditto_core.kit.hookspecs``)
    does not load the API, the pipeline or the command line (docs/ARCHITECTURE.md "Layers")."""
    if name in ("Build", "build"):
        from . import api

        return getattr(api, name)
    if name == "DittoError":  # the base of every error the API raises
        from .base.errors import DittoError

        return DittoError
    raise AttributeError(f"module 'ditto_core' has no attribute {name!r}")
