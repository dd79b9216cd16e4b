"""Property-based fuzz of ``ditto serve``'s request bodies (docs/SERVE.md "Fuzz test").

The server runs as a subprocess on tinycoder (``serve_build``, as tests/test_serve.py) with a
small context. Two kinds of requests, both bounded so that the module takes well under a
minute:

- schemathesis generates requests from the app's own OpenAPI description (FastAPI's, built
  from the pydantic request models), bodies that conform to it and bodies that violate it
  (wrong types, missing fields, values out of range), for every endpoint;
- hypothesis sends bodies that are not what any schema describes: bytes that are not JSON,
  JSON of the wrong shape, deep nesting, NaN and infinities, lone surrogates, huge integers.

Every answer must be a 2xx, or a 4xx JSON error ``{"error": {"message": ...}}`` — never a 5xx,
never a dropped connection — and ``/health`` answers after each test. The last tests pin
what the fuzz found (ids beyond int32, lone surrogates: both were 500s).
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_serve import start_server, stop_server

#: examples per endpoint (schemathesis) and per malformed-body test (hypothesis)
SCHEMA_EXAMPLES = 30
MALFORMED_EXAMPLES = 60
#: most tokens a fuzzed request generates
MAX_TOKENS = 4
POST_PATHS = ["/completion", "/infill", "/tokenize", "/detokenize", "/v1/completions",
              "/v1/chat/completions"]


@pytest.fixture(scope="module")
def fuzz_server(serve_build):
    """``ditto serve`` on tinycoder: a small context, so that any generation is short."""
    srv = start_server(serve_build, "--ctx", "128", "--max-queue", "4")
    srv.client = httpx.Client(base_url=srv.url, timeout=60)
    yield srv
    srv.client.close()
    assert stop_server(srv) is not None


def check_answer(status: int, body: bytes, what: str) -> None:
    """2xx, or a 4xx whose body is OpenAI's error object with a message."""
    assert status < 500, f"{what}: HTTP {status}: {body[:500]!r}"
    if status >= 400:
        err = json.loads(body)["error"]
        assert isinstance(err["message"], str) and err["message"], f"{what}: {body[:500]!r}"


def assert_healthy(srv) -> None:
    r = srv.client.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def bound_generation(body: dict, path: str) -> None:
    """Keep a generated body's generation short (a few tokens, time limits of at most 1 s):
    the fuzz is about the request's shape, and every token costs time on a shared machine.
    Values of the wrong type or below range are left for validation to refuse."""
    key = "n_predict" if path in ("/completion", "/completions", "/infill") else "max_tokens"
    for k in (key, "max_completion_tokens"):
        v = body.get(k, -1 if k == key else None)
        if type(v) is int and (v == -1 or v > MAX_TOKENS):
            body[k] = MAX_TOKENS
    for k in ("t_max_predict_ms", "t_max_prompt_ms"):
        v = body.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
            body[k] = min(v, 1000)


# ------------------------------------------------------------------- schema-driven (OpenAPI)

@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    """The OpenAPI description of the app (built without a model) pointed at the server."""
    from ditto_core.serve.app import create_app

    raw = create_app(SimpleNamespace(api_key=None)).fastapi.openapi()
    schema = schemathesis.openapi.from_dict(raw)
    schema.config.update(base_url=fuzz_server.url)
    schema.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE,
                                           schemathesis.GenerationMode.NEGATIVE])
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=SCHEMA_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_schema_fuzz(case, fuzz_server):
    """Bodies generated from the OpenAPI schema, conforming and not: never a 5xx."""
    if isinstance(case.body, dict):
        bound_generation(case.body, case.path)
    try:
        response = case.call(timeout=60)
    except Exception as exc:  # a dropped connection or a timeout (requests' errors)
        pytest.fail(f"{case.method} {case.path} {case.body!r:.300}: {exc!r}")
    check_answer(response.status_code, response.content, f"{case.method} {case.path} "
                 f"{case.body!r:.300}")


# ------------------------------------------------------------------------ malformed bodies

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                         st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=12)
FIELDS = ["prompt", "n_predict", "temperature", "top_k", "top_p", "seed", "stop", "n_indent",
          "t_max_prompt_ms", "t_max_predict_ms", "cache_prompt", "stream", "response_fields",
          "id_slot", "return_tokens", "ignore_eos", "input_prefix", "input_suffix",
          "input_extra", "content", "tokens", "add_special", "parse_special", "with_pieces",
          "messages", "max_tokens", "max_completion_tokens", "n", "suffix", "echo",
          "stream_options", "model"]
#: values JSON parsers accept that a schema never describes
ODD_VALUES = [math.nan, math.inf, -math.inf, 2 ** 64, -(2 ** 63) - 1, 10 ** 30, "\ud800",
              "a\x00b", "<|im_end|>", "\U0010ffff" * 3, [], {}, [[]], [None], [2 ** 40]]


@st.composite
def odd_bodies(draw) -> bytes:
    """Request bodies that no schema describes, as raw bytes."""
    kind = draw(st.sampled_from(["bytes", "truncated", "shape", "fields", "deep"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "truncated":
        text = json.dumps(draw(st.dictionaries(st.sampled_from(FIELDS), json_values,
                                               min_size=1, max_size=4)))
        return text[:draw(st.integers(0, max(0, len(text) - 1)))].encode()
    if kind == "shape":
        return json.dumps(draw(json_values)).encode()
    if kind == "deep":
        n = draw(st.sampled_from([64, 1000, 100_000]))
        opener = draw(st.sampled_from(['[', '{"prompt": ']))
        return (opener * n).encode() + b"1" + (b"]" if opener == "[" else b"}") * n
    body = {f: draw(st.one_of(json_values, st.sampled_from(ODD_VALUES)))
            for f in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=5,
                                   unique=True))}
    bound_generation(body, "/completion")
    bound_generation(body, "/v1/completions")
    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("path", POST_PATHS)
def test_malformed_bodies(fuzz_server, path):
    """Bytes that are not JSON, JSON of the wrong shape, deep nesting, NaN, lone surrogates,
    integers wider than 64 bits: a 4xx JSON error (or a 2xx), and the server keeps serving."""

    @settings(max_examples=MALFORMED_EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(body=odd_bodies(), ctype=st.sampled_from(["application/json", "text/plain",
                                                      "application/x-www-form-urlencoded"]))
    def run(body, ctype):
        try:
            r = fuzz_server.client.post(path, content=body, headers={"Content-Type": ctype})
        except httpx.HTTPError as exc:
            pytest.fail(f"POST {path} {body[:200]!r}: {exc!r}")
        check_answer(r.status_code, r.content, f"POST {path} {body[:300]!r}")

    run()
    assert_healthy(fuzz_server)


def test_health_after_fuzz(fuzz_server):
    """The server still answers, with its slots idle."""
    import time

    assert_healthy(fuzz_server)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        slots = fuzz_server.client.get("/slots").json()
        if not any(s["is_processing"] for s in slots):
            break
        time.sleep(0.2)
    assert not any(s["is_processing"] for s in slots)


# ------------------------------------------------------- what the fuzz found (regressions)

@pytest.mark.parametrize("tokens", [[2 ** 64], [1, 2 ** 70], [2 ** 32 + 5], [2 ** 31],
                                    [-(2 ** 31) - 1], [-(2 ** 63) - 1]])
def test_detokenize_ids_beyond_int32(fuzz_server, tokens):
    """Ids wider than 64 bits were a 500 (OverflowError), ids beyond int32 wrapped into other
    ids (2**32 + 5 detokenized as token 5): now a 400 naming the id."""
    r = fuzz_server.client.post("/detokenize", json={"tokens": tokens})
    assert r.status_code == 400, r.text
    bad = next(t for t in tokens if not -2 ** 31 <= t < 2 ** 31)
    assert f"token id {bad} " in r.json()["error"]["message"]


@pytest.mark.parametrize("path,body", [
    ("/tokenize", {"content": "a\ud800b"}),
    ("/completion", {"prompt": "def f():\udfff", "n_predict": 2}),
    ("/completion", {"prompt": [1, "x\ud83d"], "n_predict": 2}),
    ("/v1/completions", {"prompt": "\ud800", "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi \udc00"}],
                              "max_tokens": 2}),
])
def test_lone_surrogates_are_a_400(fuzz_server, path, body):
    """A JSON string with a lone surrogate escape (no UTF-8 form) was a 500 from the encoder:
    now a 400 that says so."""
    r = fuzz_server.client.post(path, content=json.dumps(body).encode())
    assert r.status_code == 400, r.text
    assert "lone surrogate" in r.json()["error"]["message"]
    assert_healthy(fuzz_server)
