"""``ditto serve BUILD``: the command that opens a build and serves it over HTTP
(ditto_core.serve.app, docs/SERVE.md). Registered by ditto_core.cli.main when the server's
packages (fastapi, uvicorn) are installed."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import click

from ditto_core.base.errors import DittoError, OptionValueError
from ditto_core.runtime.runtime_api import KV_CACHE_TYPES
from ditto_core.serve.app import create_app, load_server

from .common import reports_errors


@click.command("serve")
@click.argument("build", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to listen on (loopback by default)")
@click.option("--port", default=8012, show_default=True, type=click.IntRange(0, 65535))
@click.option("--ctx", type=click.IntRange(1), default=None,
              help="context positions per slot [default: min(4096, max_seq_len)]")
@click.option("--slots", default=1, show_default=True, type=click.IntRange(1, 64),
              help="sessions answering requests at once, each keeping its prompt cache")
@click.option("--threads", default=0, type=click.IntRange(0, 1024),
              help="OpenMP threads per evaluation [default: all cores]")
@click.option("--batch-size", "batch", default=256, show_default=True,
              type=click.IntRange(1, 512), help="prompt tokens evaluated together")
@click.option("--api-key", default=None, help="require this key (Authorization: Bearer KEY)")
@click.option("--api-key-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="read the API key from this file (first line)")
@click.option("--spec", type=click.Choice(["none", "ngram"]), default="none",
              show_default=True, help="speculative decoding: ngram = prompt lookup (greedy "
                                      "requests)")
@click.option("--spec-draft", "spec_k", default=7, show_default=True,
              type=click.IntRange(1, 64), help="most draft tokens per step")
@click.option("--spec-cost", "spec_cost", default=None, type=click.FloatRange(0.0),
              help="what one draft token adds to a verification, in one-token decode steps "
                   "[default: measured at start-up]")
@click.option("--max-queue", default=16, show_default=True, type=click.IntRange(0),
              help="requests that may wait for a slot; more are answered 503")
@click.option("--alias", default=None, help="model name in responses [default: the build "
                                            "directory's name]")
# given several times, the last value counts, and every one must be valid (as llama-server)
@click.option("--cache-type-k", "-ctk", "cache_type_k", type=click.Choice(KV_CACHE_TYPES),
              multiple=True, help="KV cache type for keys: f32 (default) or f16, half the "
                                  "bytes attention reads per token")
@click.option("--cache-type-v", "-ctv", "cache_type_v", type=click.Choice(KV_CACHE_TYPES),
              multiple=True, help="KV cache type for values: f32 (default) or f16")
def serve_command(build, host, port, ctx, slots, threads, batch, api_key, api_key_file, spec,
                  spec_k, spec_cost, max_queue, alias, cache_type_k, cache_type_v):
    """Serve BUILD over HTTP with llama-server's /infill, /completion, /tokenize ... and
    OpenAI's /v1/completions and /v1/chat/completions (docs/SERVE.md)."""
    reports_errors(_serve)(build, host, port, ctx, slots, threads, batch, api_key,
                           api_key_file, spec, spec_k, spec_cost, max_queue, alias,
                           (cache_type_k or ("f32",))[-1], (cache_type_v or ("f32",))[-1])


def _serve(build, host, port, ctx, slots, threads, batch, api_key, api_key_file, spec, spec_k,
           spec_cost, max_queue, alias, cache_type_k="f32", cache_type_v="f32"):
    import uvicorn

    if api_key is not None and api_key_file is not None:
        raise click.UsageError("give --api-key or --api-key-file, not both")
    if api_key is not None and not api_key.strip():
        raise click.UsageError("--api-key: empty key (every request would pass)")
    if api_key_file is not None:
        lines = api_key_file.read_text().splitlines()
        api_key = lines[0].strip() if lines else ""
        if not api_key:
            raise DittoError(f"{api_key_file}: empty API key file")
    sock = listen(host, port)
    try:
        server = load_server(build, ctx=ctx, slots=slots, threads=threads, batch=batch,
                             api_key=api_key, spec=spec, spec_k=spec_k, spec_cost=spec_cost,
                             max_queue=max_queue, alias=alias, cache_type_k=cache_type_k,
                             cache_type_v=cache_type_v)
    except OptionValueError as exc:  # a usage error (exit 2), as click's own range checks
        sock.close()
        raise click.BadParameter(exc.message, param_hint=f"'{exc.option}'") from None
    except BaseException:
        sock.close()
        raise
    if spec != "none" and not server.engine.batch_exact:
        click.echo("warning: --spec ngram: batched evaluation does not give the bits of "
                   "one-token decoding on this build; speculation is off so that greedy "
                   "output does not change", err=True)
    app = create_app(server)
    port = sock.getsockname()[1]  # the port the system chose for --port 0
    click.echo(f"ditto serve: {build} on http://{host}:{port} ({slots} slot(s) of "
               f"{server.engine.n_ctx} positions, KV cache {cache_type_k}/{cache_type_v}, "
               f"kernel {server.model.info['kernel']})", err=True)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=10, lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])
    server.model.close()


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` and listening, opened before the model loads so
    that an address in use or a host that does not resolve is a clear error (DittoError) and
    not uvicorn's log line and exit status 3."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise DittoError(f"--host {host}: {exc.strerror}") from None
    family, type_, proto, _, addr = infos[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        what = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be used: {exc.strerror}"
        raise DittoError(f"--host {host} --port {port}: the address {what}") from None
    sock.set_inheritable(True)
    return sock


def register(group: click.Group) -> None:
    """Add ``ditto serve`` to the click group ``group``."""
    group.add_command(serve_command)
