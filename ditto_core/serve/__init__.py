"""``ditto serve``'s HTTP server: the engine (slots, prompt caches, batching; ``serve.engine``)
and the FastAPI app (``serve.app``). The command itself is ditto_core.cli.serve."""
