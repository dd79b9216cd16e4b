"""Shared pytest fixtures. Each area keeps its fixtures in its own module, listed here."""

pytest_plugins = [
    "tests.fixtures_models",
    "tests.fixtures_hf",
    "tests.fixtures_qwen2",
    "tests.fixtures_compile",
    "tests.fixtures_native",
    "tests.fixtures_pass",
    "tests.fixtures_tokenizer",
    "tests.fixtures_quant",
    "tests.fixtures_eval",
    "tests.fixtures_plugins",
    "tests.fixtures_serve",
    "tests.fixtures_signals",
]
