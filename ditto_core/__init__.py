"""Ditto: compile a Llama-family LLM checkpoint into a standalone CPU executable."""

__version__ = "0.1.0"
