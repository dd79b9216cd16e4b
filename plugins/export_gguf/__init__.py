"""Ditto default plugin ``export_gguf``: the ``gguf`` exporter (llama.cpp GGUF files, ``llama``
architecture), registered through the entry-point group ``ditto`` like any third-party plugin."""

from ditto_core.kit.hookspecs import hookimpl

from .exporter import GGUFExporter


@hookimpl
def register_exporters(register):
    register(GGUFExporter())
