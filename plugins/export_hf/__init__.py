"""Ditto default plugin ``export_hf``: the ``hf`` exporter (Hugging Face ``LlamaForCausalLM``
directories: config.json, safetensors, tokenizer.json), registered through the entry-point
group ``ditto`` like any third-party plugin."""

from ditto_core.kit.hookspecs import hookimpl

from .exporter import HFExporter


@hookimpl
def register_exporters(register):
    register(HFExporter())
