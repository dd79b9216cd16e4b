"""``ditto serve`` (docs/SERVE.md): the C API through ctypes, then the HTTP server as a
subprocess on a free loopback port, driven by plain HTTP (httpx, requests shaped as llama.vim
sends them) and by the ``openai`` client. The model is tinycoder built with ``kmeans``
and int8 codebooks (``serve_build``), whose build directory holds ``libditto.so``."""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from ditto_core.runtime.run import run_build
from ditto_core.runtime.runtime_api import RuntimeAPIError, open_build
from ditto_core.serve.engine import common_prefix, find_stop, ngram_draft, partial_stop

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(build: Path, *args: str) -> SimpleNamespace:
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="2")
    proc = subprocess.Popen([sys.executable, "-c", "from ditto_core.cli.main import main; main()",
                             "serve", str(build), "--port", str(port), "--threads", "2", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"ditto serve exited {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return SimpleNamespace(proc=proc, url=url, port=port)
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise AssertionError("ditto serve did not answer /health within 120 s")


def stop_server(srv) -> int:
    if srv.proc.poll() is None:
        srv.proc.send_signal(signal.SIGTERM)
        try:
            srv.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait()
    return srv.proc.returncode


@pytest.fixture(scope="module")
def tiny_build(serve_build) -> Path:
    d = serve_build
    assert (d / "libditto.so").is_file()
    return d


@pytest.fixture(scope="module")
def server(tiny_build):
    srv = start_server(tiny_build, "--slots", "2", "--ctx", "256", "--api-key", KEY)
    yield srv
    stop_server(srv)


def post(srv, path, body, **kw):
    return httpx.post(srv.url + path, json=body, headers=AUTH, timeout=120, **kw)


def slots_when_idle(srv, seconds: float) -> list:
    """/slots once no slot is processing, or as it stands after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        slots = httpx.get(srv.url + "/slots", headers=AUTH).json()
        if not any(s["is_processing"] for s in slots) or time.monotonic() > deadline:
            return slots
        time.sleep(0.1)


def sse_events(srv, path, body) -> list:
    """The JSON payloads of a streamed response, in order ("[DONE]" kept as a string)."""
    out = []
    with httpx.stream("POST", srv.url + path, json=body, headers=AUTH, timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def greedy_run(build, prompt, n):
    proc = run_build(build, ["-p", prompt, "-n", str(n), "--temp", "0", "--threads", "2",
                             "--print-ids"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- C API / ctypes

def test_session_eval_truncate_and_batch_bits(tiny_build):
    """Prefill tiles, one-token decode and a truncated-then-continued session give the same
    logits bit for bit (the prompt cache and the speculation rely on it); tokenize/detokenize
    round-trip; bad input is an error, not a crash."""
    m = open_build(tiny_build, threads=2)
    ids = m.tokenize(PROMPT, add_bos=True)
    assert ids[0] == m.info["bos_id"] == 1 and len(ids) > 10
    assert m.detokenize(ids) == PROMPT
    a, b = m.session(64, 256), m.session(64, 1)
    la = a.eval(ids, "all")
    lb = np.stack([b.eval([t]) for t in ids])
    assert la.shape == (len(ids), m.vocab_size) and la.dtype == np.float32
    assert np.array_equal(la.view(np.uint32), lb.view(np.uint32))
    a.truncate(5)
    assert a.pos == 5
    lc = a.eval(ids[5:], "all")
    assert np.array_equal(lc.view(np.uint32), la[5:].view(np.uint32))
    with pytest.raises(Exception, match="out of range"):
        a.eval([m.vocab_size])
    with pytest.raises(Exception, match="context full"):
        a.eval([5] * 64)
    assert a.pos == len(ids)  # a failed eval changes nothing
    with pytest.raises(Exception, match="n_ctx"):
        m.session(m.max_seq_len + 1)
    s0, s1 = m.sampler(0.0), m.sampler(0.8, top_k=1, seed=3)
    assert s0.sample(la[-1]) == int(np.argmax(la[-1])) == s1.sample(la[-1])
    a.close(), b.close()
    m.close()


def test_ditto_mmap_chooses_how_the_library_loads(tiny_build, monkeypatch):
    """DITTO_MMAP=1 maps the model file, 0 reads it into memory: the same logits to the bit;
    any other value is refused by ditto_model_open with its message."""
    logits = []
    for value in ("1", "0"):
        monkeypatch.setenv("DITTO_MMAP", value)
        m = open_build(tiny_build, threads=1)
        s = m.session(32, 32)
        logits.append(s.eval(m.tokenize(PROMPT, add_bos=True), "all"))
        s.close(), m.close()
    assert np.array_equal(logits[0].view(np.uint32), logits[1].view(np.uint32))
    monkeypatch.setenv("DITTO_MMAP", "yes")
    with pytest.raises(RuntimeAPIError, match="DITTO_MMAP must be 1 .* got 'yes'"):
        open_build(tiny_build)


def test_bad_ditto_tiles_is_refused_by_the_library(tiny_build, monkeypatch):
    """DITTO_TILES takes 0 or 1 (row tiles on or off): ditto_model_open refuses any other
    value with its message, as ditto-run does."""
    monkeypatch.setenv("DITTO_TILES", "2")
    with pytest.raises(RuntimeAPIError, match=r"DITTO_TILES must be 1 \(b = 4 weight matrices "
                                              r"in row tiles where the kernel table reads them\) "
                                              r"or 0 \(file order\), got '2'"):
        open_build(tiny_build)


def test_bad_ditto_kernel_is_refused_by_the_library(tiny_build, monkeypatch):
    """An unknown DITTO_KERNEL is refused by ditto_model_open with ditto-run's message, named
    by the environment variable (the `kernel` argument is named as such)."""
    monkeypatch.setenv("DITTO_KERNEL", "sse9")
    with pytest.raises(RuntimeAPIError, match=r"DITTO_KERNEL: unknown kernel 'sse9' \(this "
                                              r"program has: "):
        open_build(tiny_build)


def test_too_many_threads_are_refused(tiny_build):
    """More OpenMP threads than DITTO_MAX_THREADS (1024) is an error of ditto_model_open, and
    a usage error of ditto serve (exit 2), not an OpenMP abort when the threads cannot start;
    so is a --ctx the model cannot hold."""
    with pytest.raises(RuntimeAPIError, match="threads: 100000 is more than 1024"):
        open_build(tiny_build, threads=100000)
    proc = subprocess.run([sys.executable, "-m", "ditto_core", "serve", str(tiny_build),
                           "--threads", "100000"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--threads" in proc.stderr and \
        "100000 is not in the range 0<=x<=1024" in proc.stderr, proc.stderr
    # --ctx past the model's max_seq_len, known once the model is open: a usage error too
    proc = subprocess.run([sys.executable, "-m", "ditto_core", "serve", str(tiny_build),
                           "--ctx", "100000000", "--port", "0"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and ("Invalid value for '--ctx': 100000000 is not in 1..2048 "
                                     "(the model's max_seq_len)") in proc.stderr, proc.stderr


def test_long_context_prefill_bits(tiny_build):
    """Past one block of keys (512) and across token blocks, a prefill tile's logits are those
    of decoding one token at a time, bit for bit (the blocked attention of prefill.c)."""
    m = open_build(tiny_build, threads=2)
    ids = np.random.default_rng(5).integers(3, m.vocab_size, size=1200).tolist()
    a, b = m.session(1300, 256), m.session(1300, 1)
    la = a.eval(ids, "all")
    lb = np.stack([b.eval([t]) for t in ids])
    assert np.array_equal(la.view(np.uint32), lb.view(np.uint32))
    a.truncate(700)  # a tile starting past the first key block
    lc = a.eval(ids[700:], "all")
    assert np.array_equal(lc.view(np.uint32), la[700:].view(np.uint32))
    a.close(), b.close()
    m.close()


def test_f16_kv_cache_sessions(tiny_build):
    """A session with f16 keys and values (llama.cpp's --cache-type-k/-v f16): a prefill
    tile's logits are those of one token at a time, bit for bit (so the prompt cache and the
    ngram speculation stay exact), and not the float32 cache's; the engine takes the types
    and refuses another by its flag."""
    from ditto_core.base.errors import DittoError
    from ditto_core.serve.engine import Engine

    m = open_build(tiny_build, threads=2)
    ids = np.random.default_rng(6).integers(3, m.vocab_size, size=600).tolist()
    a, b = m.session(700, 256, "f16", "f16"), m.session(700, 1, "f16", "f16")
    c = m.session(700, 256)
    la = a.eval(ids, "all")
    lb = np.stack([b.eval([t]) for t in ids])
    assert np.array_equal(la.view(np.uint32), lb.view(np.uint32))
    assert np.abs(c.eval(ids, "all") - la).max() > 0
    a.close(), b.close(), c.close()
    with pytest.raises(RuntimeAPIError, match="cache_type_v 'q8_0' is not a KV cache type "
                                              r"\(f32, f16\)"):
        m.session(16, 1, "f16", "q8_0")
    for bad in (None, b"f16", 16, "f16\x00x"):  # not a name, or one that C would cut short
        with pytest.raises(RuntimeAPIError,
                           match=re.escape(f"cache_type_k {bad!r} is not a KV cache")):
            m.session(16, 1, bad)
    err = ctypes.create_string_buffer(256)
    assert m.lib.ditto_session_new_kv(None, 16, 1, b"f16", b"f16", ctypes.byref(ctypes.c_void_p()),
                                      err, 256) == 1
    assert err.value == b"ditto_session_new_kv: model and out must not be NULL"
    e = Engine(m, n_ctx=32, cache_type_k="f16", cache_type_v="f32")
    assert e.slots[0].session.eval([5, 6, 7]).shape == (m.vocab_size,)
    e.close()
    with pytest.raises(DittoError, match="--cache-type-k: unknown KV cache type 'bf16'"):
        Engine(m, n_ctx=32, cache_type_k="bf16")
    m.close()


def test_serve_with_an_f16_kv_cache(tiny_build):
    """ditto serve -ctk f16 (llama-server's flag): the start-up line names the cache types and
    a greedy /completion gives ditto-run's text with the same flags; a bad value is refused
    even when a good one follows it, as llama-server refuses it."""
    srv = start_server(tiny_build, "-ctk", "f16", "--cache-type-v", "f16")
    try:
        r = httpx.post(srv.url + "/completion", json={"prompt": "def add(a, b):",
                                                       "n_predict": 12, "temperature": 0},
                       timeout=60).json()
    finally:
        rc = stop_server(srv)
    assert rc in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
    assert "KV cache f16/f16, kernel " in srv.proc.stderr.read()
    want = run_build(tiny_build, ["-p", "def add(a, b):", "-n", "12", "--temp", "0", "-ctk",
                                  "f16", "-ctv", "f16"], capture_output=True, text=True)
    assert r["content"] == want.stdout.removesuffix("\n")  # ditto-run ends its text with one
    proc = subprocess.run([sys.executable, "-m", "ditto_core", "serve", str(tiny_build),
                           "-ctk", "q8_0", "-ctk", "f16", "--port", "0"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and ("Invalid value for '--cache-type-k' / '-ctk': 'q8_0' is "
                                     "not one of 'f32', 'f16'.") in proc.stderr


def test_session_on_a_library_of_api_version_2(tiny_build):
    """A build linked before ditto_session_new_kv (API version 3) still opens and makes float32
    sessions; an f16 cache on it is refused with the advice to rebuild."""
    from ditto_core.base.errors import DittoError

    class Version2:
        def __init__(self, lib):
            self._lib, self._name = lib, "old-build/libditto.so"

        def __getattr__(self, name):
            if name == "ditto_session_new_kv":
                raise AttributeError(name)
            return getattr(self._lib, name)

    m = open_build(tiny_build, threads=1)
    real, m.lib = m.lib, Version2(m.lib)
    try:
        s = m.session(8, 1)
        assert s.eval([3, 4]).shape == (m.vocab_size,)
        s.close()
        with pytest.raises(DittoError, match="old-build/libditto.so: this build's runtime "
                                             "library predates f16 KV caches"):
            m.session(8, 1, "f16", "f16")
        # a name that is no cache type is refused as such, not as a reason to rebuild
        with pytest.raises(RuntimeAPIError, match="cache_type_k 'q8_0' is not a KV cache type"):
            m.session(8, 1, "q8_0")
    finally:
        m.lib = real
        m.close()


def test_sampler_min_p(tiny_build):
    """min_p keeps the tokens whose probability at temperature 1 is at least min_p times the
    most likely one's (llama.cpp's min_p on the logits): with probabilities 1 : 0.04 : 0.06
    of three tokens, min_p 0.05 never draws the 0.04 one, min_p 0 does."""
    m = open_build(tiny_build, threads=1)
    logits = np.full(m.vocab_size, -1e30, np.float32)
    logits[[7, 8, 9]] = [0.0, np.log(0.04), np.log(0.06)]
    drawn = {t: set() for t in (0.0, 0.05)}
    for min_p in drawn:
        for seed in range(400):
            drawn[min_p].add(m.sampler(1.0, seed=seed, min_p=min_p).sample(logits))
    assert drawn[0.0] == {7, 8, 9} and drawn[0.05] == {7, 9}
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(Exception, match="min_p must be in"):
            m.sampler(1.0, min_p=bad)
    m.close()


def test_penalties_and_samplers_as_llama_cpp():
    """apply_penalties is llama.cpp's penalties sampler: a repeated token's logit divided by
    repeat_penalty when positive, multiplied when not, then lowered by count * frequency +
    presence; ``samplers`` turns samplers off, a left-out temperature being 1."""
    from ditto_core.serve.engine import GenParams, apply_penalties, sampling
    lg = np.array([2.0, -1.0, 0.5, 3.0], np.float32)
    out = apply_penalties(lg, [0, 1, 1, 3, 0, 0], repeat=2.0, frequency=0.25, presence=0.5)
    want = np.array([2.0 / 2 - (3 * 0.25 + 0.5), -1.0 * 2 - (2 * 0.25 + 0.5), 0.5,
                     3.0 / 2 - (0.25 + 0.5)], np.float32)
    assert np.array_equal(out, want) and lg[0] == 2.0  # a copy
    assert sampling(GenParams()) == (0.8, 40, 0.95, 0.05, False)
    assert sampling(GenParams(samplers=("top_k", "top_p"), temperature=0.0)) == (
        1.0, 40, 0.95, 0.0, False)
    assert sampling(GenParams(top_k=1, temperature=0.7))[0] == 0.0
    assert sampling(GenParams(repeat_penalty=1.1))[4] is True
    assert sampling(GenParams(repeat_penalty=1.1, repeat_last_n=0))[4] is False


def test_draft_policy_weighs_cost_and_acceptance():
    """DraftPolicy drafts as many tokens as pay for their verification: none when drafts cost
    much and rarely come true, all k_max when they are cheap and always right; acceptance it
    has seen moves it (the first rejected token counts as a failure, later ones not at all)."""
    from ditto_core.serve.engine import DraftPolicy, ngram_match
    cheap, dear = DraftPolicy(0.1, 7), DraftPolicy(2.0, 7)
    assert dear.length(1, 7) == 0 and dear.length(3, 7) == 0
    assert cheap.length(3, 7) > cheap.length(1, 7) >= 1 and cheap.length(3, 2) <= 2
    # p = 0.5 at r = 0.4: one draft token (1.5 / 1.4) beats two (1.75 / 1.8) and none (1.0)
    half = DraftPolicy(0.4, 7)
    half.succ[2], half.trials[2] = 1.0, 2.0
    assert half.length(2, 7) == 1
    for _ in range(20):
        cheap.update(1, 7, 7)
    assert cheap.p(1) > 0.95 and cheap.length(1, 7) == 7
    cheap.update(1, 7, 2)  # two right, the third wrong: 3 trials, 2 successes
    assert cheap.trials[1] == 2 + 20 * 7 + 3 and cheap.succ[1] == 2 * 0.4 + 20 * 7 + 2
    assert ngram_match([1, 2, 3, 7, 1, 2, 3], 2) == (3, [7, 1])
    assert ngram_match([5, 6], 4) == (0, [])


def test_engine_text_helpers():
    assert common_prefix([1, 2, 3, 4], [1, 2, 5]) == 2 and common_prefix([], [1]) == 0
    assert find_stop("abc</s>de", ["</s>", "de"], 0) == (3, "</s>")
    assert partial_stop("hello </", ["</s>"]) == 2 and partial_stop("hello", ["</s>"]) == 0
    # the latest earlier occurrence of the last 3-gram (1 2 3) is followed by 9 9
    assert ngram_draft([1, 2, 3, 7, 1, 2, 3, 9, 9, 1, 2, 3], 4) == [9, 9, 1, 2]
    assert ngram_draft([5, 6], 4) == []


def test_infill_layout(tiny_build):
    """The repo-level FIM layout of /infill, on a stand-in model whose vocabulary has the FIM
    tokens (token ids of text: one per character)."""
    from ditto_core.serve.app import Server

    fim = {"<|fim_prefix|>": 1001, "<|fim_suffix|>": 1002, "<|fim_middle|>": 1003,
           "<|repo_name|>": 1004, "<|file_sep|>": 1005}

    class Stub:
        vocab_size, max_seq_len = 2000, 4096
        info = {"add_bos": 0, "bos_id": -1}

        def find_token(self, t):
            return fim.get(t, -1)

        def tokenize(self, text, add_bos=False, parse_special=False):
            return [ord(c) for c in text]

    srv = Server.__new__(Server)
    srv.model, srv.engine = Stub(), SimpleNamespace(n_ctx=4096)
    srv.fim = {k: srv.model.find_token(t) for k, t in
               zip(("pre", "suf", "mid", "rep", "sep"), fim)}
    extra = [SimpleNamespace(filename="a.py", text="x=1\n")]
    ids = srv.infill_prompt("def f(", "):\n", extra, "ab", 16)
    t = lambda s: [ord(c) for c in s]  # noqa: E731
    assert ids == ([1004] + t("myproject\n") + [1005] + t("a.py\n") + t("x=1\n") + [1005]
                   + t("filename\n") + [1001] + t("def f(") + [1002] + t("):\n") + [1003]
                   + t("ab"))
    srv.engine = SimpleNamespace(n_ctx=64)  # the prefix keeps its end, the suffix its start
    ids = srv.infill_prompt("p" * 100, "s" * 100, [], "", 8)
    assert len(ids) == 55 and ids[ids.index(1001) + 1:ids.index(1002)] == t("p" * 39)
    assert ids[-1] == 1003 and ids[ids.index(1002) + 1:-1] == t("s" * 13)
    # llama-server's cut (format_prompt_infill, n_batch 2048): prefix 1536, suffix 512 - 2 -
    # len(prompt), extra n_ctx - 2048 + 2, the extra then cut to leave 16 positions to generate
    srv.engine = SimpleNamespace(n_ctx=4096)
    big = [SimpleNamespace(filename="b.py", text="e" * 3000)]
    ids = srv.infill_prompt("p" * 3000, "s" * 1000, big, "ab", 16)
    pre, suf = ids[ids.index(1001) + 1:ids.index(1002)], ids[ids.index(1002) + 1:ids.index(1003)]
    assert pre == t("p" * 1536) and suf == t("s" * 508) and ids[-3:] == [1003] + t("ab")
    extra = ([1004] + t("myproject\n") + [1005] + t("b.py\n") + t("e" * 3000) + [1005]
             + t("filename\n"))
    assert len(ids) == 4096 - 1 - 16 and ids[:ids.index(1001)] == extra[-2030:]


def test_chat_message_the_template_leaves_out_is_refused():
    """A message the chat template does not render (this one skips 'tool' messages) is a 400
    naming it, not a prompt silently without it. OpenAI's 'developer' role renders as
    'system', as llama-server does for every template but GPT-OSS's (llama.cpp
    common/chat.cpp), which keeps it."""
    from ditto_core.serve.app import ApiError, ChatMessage, Server

    srv = Server.__new__(Server)
    srv.model = SimpleNamespace(tokenize=lambda text, parse_special=False: [ord(c) for c in text])
    srv.special = {}
    srv.chat_template = ("{% for m in messages %}{% if m.role in ('system', 'user') %}"
                         "<{{ m.role }}>{{ m.content }}{% endif %}{% endfor %}<assistant>")
    msgs = [ChatMessage(role="user", content="hi")]
    assert srv.chat_prompt(msgs) == [ord(c) for c in "<user>hi<assistant>"]
    dev = ChatMessage(role="developer", content="be brief")
    assert srv.chat_prompt([dev, *msgs]) == [ord(c) for c in "<system>be brief<user>hi<assistant>"]
    with pytest.raises(ApiError) as e:
        srv.chat_prompt([*msgs, ChatMessage(role="tool", content="42")])
    assert e.value.status == 400 and e.value.message == (
        "messages.1: this model's chat template does not render the 'tool' message in its place")
    srv.chat_template = ("{% for m in messages %}<|start|>{{ m.role }}<|channel|>{{ m.content }}"
                         "{% endfor %}<|start|>assistant")
    assert srv.chat_prompt([dev]) == [ord(c) for c in
                                      "<|start|>developer<|channel|>be brief<|start|>assistant"]
    # an assistant turn of tool calls (content null): named as what it is
    call = ChatMessage(role="assistant", content=None,
                       tool_calls=[{"id": "c1", "type": "function",
                                    "function": {"name": "f", "arguments": "{}"}}])
    with pytest.raises(ApiError) as e:
        srv.chat_prompt([*msgs, call])
    assert e.value.status == 400 and e.value.message == (
        "messages.1.tool_calls: tool calls are not supported by ditto serve")
    with pytest.raises(ApiError) as e:  # with content too: the template would drop the calls
        srv.chat_prompt([*msgs, ChatMessage(role="assistant", content="let me check",
                                            tool_calls=call.tool_calls)])
    assert e.value.message == "messages.1.tool_calls: tool calls are not supported by ditto serve"
    with pytest.raises(ApiError) as e:
        srv.chat_prompt([*msgs, ChatMessage(role="assistant")])
    assert e.value.message == "messages.1: missing 'content'"


# ------------------------------------------------------------------------------ HTTP server

def test_health_auth_props(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    r = httpx.get(server.url + "/props")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.post(server.url + "/completion", json={"prompt": "a"},
                      headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.options(server.url + "/completion").status_code != 401
    # CORS as llama-server: a browser's preflight passes without the key, and every answer
    # (a 401 too) lets any origin read it
    origin = {"Origin": "http://example.com"}
    pre = httpx.options(server.url + "/completion", headers={
        **origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "*"
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert "authorization" in pre.headers["access-control-allow-headers"].lower()
    for r in (httpx.get(server.url + "/health", headers=origin),
              httpx.get(server.url + "/props", headers=origin)):
        assert r.headers["access-control-allow-origin"] == "*"
    props = httpx.get(server.url + "/props", headers=AUTH).json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 256
    assert props["infill"] is False
    models = httpx.get(server.url + "/v1/models", headers=AUTH).json()
    assert models["object"] == "list" and models["data"][0]["meta"]["n_vocab"] == 32000


def test_completion_equals_ditto_run(server, tiny_build):
    ids = greedy_run(tiny_build, PROMPT, 12)
    r = post(server, "/completion", {"prompt": PROMPT, "n_predict": 12, "temperature": 0,
                                     "return_tokens": True, "cache_prompt": False})
    body = r.json()
    assert r.status_code == 200, body
    assert body["tokens"] == ids[:len(body["tokens"])]
    assert body["stop_type"] in ("limit", "eos") and body["tokens_predicted"] == len(ids)
    # max_tokens stands for n_predict when that is not given (llama-server's fallback)
    short = post(server, "/completion", {"prompt": PROMPT, "max_tokens": 3, "temperature": 0,
                                         "return_tokens": True}).json()
    assert short["tokens"] == ids[:3] and short["tokens_predicted"] == min(3, len(ids))
    both = post(server, "/completion", {"prompt": PROMPT, "max_tokens": 3, "n_predict": 5,
                                        "temperature": 0, "return_tokens": True}).json()
    assert both["tokens"] == ids[:5]
    m = open_build(tiny_build)
    want = m.tokenize(PROMPT, add_bos=True)
    assert body["tokens_evaluated"] == len(want)
    full = m.detokenize(want + ids)
    assert PROMPT + body["content"] == full
    m.close()


def test_tokenize_detokenize(server, tiny_build):
    text = "héllo <s> wörld\n\tx = 1"
    m = open_build(tiny_build)
    r = post(server, "/tokenize", {"content": text, "parse_special": False}).json()
    assert r["tokens"] == m.tokenize(text)
    proc = run_build(tiny_build, ["-p", text, "--tokens"], capture_output=True, text=True)
    assert r["tokens"] == json.loads(proc.stdout)
    assert post(server, "/tokenize", {"content": text, "add_special": True,
                                      "parse_special": False}).json()["tokens"][0] == 1
    pieces = post(server, "/tokenize", {"content": "ab é", "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == m.tokenize("ab é")
    assert all(isinstance(p["piece"], (str, list)) for p in pieces)
    assert post(server, "/detokenize", {"tokens": r["tokens"]}).json()["content"] == text
    bad = post(server, "/detokenize", {"tokens": [10**6]})
    assert bad.status_code == 400 and "out of range" in bad.json()["error"]["message"]
    m.close()


def test_stream_equals_nonstream_and_stop_strings(server):
    base = {"prompt": PROMPT, "n_predict": 24, "temperature": 0.9, "seed": 7, "top_k": 40}
    plain = post(server, "/completion", base).json()
    events = sse_events(server, "/completion", {**base, "stream": True})
    assert events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1])
    assert "".join(e["content"] for e in events) == plain["content"]
    # every piece names the slot that made it, as the final result does
    assert {e["id_slot"] for e in events} == {events[-1]["id_slot"]} and \
        events[-1]["id_slot"] in (0, 1)
    text = plain["content"]
    assert len(text) > 8
    # a stop string spanning tokens: the text before it, never a byte of it
    stop = text[len(text) // 2:len(text) // 2 + 4]
    cut = text[:text.find(stop)]
    for stream in (False, True):
        req = {**base, "stop": [stop, "\x00never"], "stream": stream}
        if stream:
            ev = sse_events(server, "/completion", req)
            got, final = "".join(e["content"] for e in ev), ev[-1]
        else:
            final = post(server, "/completion", req).json()
            got = final["content"]
        assert got == cut and final["stop_type"] == "word" and final["stopping_word"] == stop


def test_prompt_cache(server, tiny_build):
    m = open_build(tiny_build)
    p = m.tokenize(PROMPT * 2, add_bos=True)
    m.close()
    req = {"prompt": p, "n_predict": 8, "temperature": 0, "id_slot": 1, "return_tokens": True}
    first = post(server, "/completion", {**req, "cache_prompt": False}).json()
    assert first["timings"]["cache_n"] == 0
    again = post(server, "/completion", req).json()
    assert again["timings"]["cache_n"] == len(p) - 1 and again["tokens"] == first["tokens"]
    longer = p + [13, 1678]
    a = post(server, "/completion", {**req, "prompt": longer}).json()
    assert a["timings"]["cache_n"] == len(p)
    b = post(server, "/completion", {**req, "prompt": longer, "cache_prompt": False}).json()
    assert b["timings"]["cache_n"] == 0 and a["tokens"] == b["tokens"]
    assert a["content"] == b["content"]
    # tokens_cached, as llama-server's: what the slot's cache holds at the end, the prompt and
    # the generated tokens but the last (sampled, never evaluated: the limit stopped it)
    for r, prompt in ((first, p), (again, p), (a, longer), (b, longer)):
        assert r["stop_type"] == "limit" and len(r["tokens"]) == 8
        assert r["tokens_cached"] == len(prompt) + 8 - 1
    slots = httpx.get(server.url + "/slots", headers=AUTH).json()
    assert slots[1]["n_cached"] >= len(longer) and not any(s["is_processing"] for s in slots)


def test_greedy_with_penalties_equals_reference_loop(server, tiny_build):
    """A greedy /completion with repeat, frequency and presence penalties gives the tokens of a
    reference loop: each step's logits (the C API) penalised over the last repeat_last_n
    tokens of prompt + output (-1: all; llama-server feeds the prompt to its sampler too),
    argmax. A presence penalty of -40 makes every token already in the context win, so the
    output differs from the plain greedy one, which repeats none of them."""
    from ditto_core.serve.engine import apply_penalties
    m = open_build(tiny_build, threads=2)
    p = m.tokenize(PROMPT, add_bos=True)
    sess = m.session(128, 256)
    hist, lg, want = list(p), sess.eval(p), []
    for _ in range(12):
        t = int(np.argmax(apply_penalties(lg, hist, 1.3, 0.2, -40.0)))
        want.append(t)
        hist.append(t)
        lg = sess.eval([t])
    plain = post(server, "/completion", {"prompt": p, "n_predict": 12, "temperature": 0,
                                         "ignore_eos": True, "return_tokens": True}).json()
    got = post(server, "/completion", {
        "prompt": p, "n_predict": 12, "temperature": 0, "repeat_penalty": 1.3,
        "repeat_last_n": -1, "frequency_penalty": 0.2, "presence_penalty": -40.0,
        "ignore_eos": True, "return_tokens": True}).json()
    assert got["tokens"] == want, (got["tokens"], want)
    assert plain["tokens"] != want, plain["tokens"]
    assert got["generation_settings"]["params"]["repeat_penalty"] == 1.3
    sess.close()
    m.close()


def test_completion_several_prompts(server, tiny_build):
    """A prompt list without a token id at its top level is several prompts (llama-server's
    rule): one result each, in order, with its index, equal to asking for each alone; a list
    with ids stays one mixed prompt."""
    m = open_build(tiny_build)
    ids = m.tokenize("def add(a, b):", add_bos=True)
    m.close()
    base = {"n_predict": 6, "temperature": 0, "return_tokens": True, "cache_prompt": False}
    prompts = [PROMPT, ids, ["class A:", 13]]
    alone = [post(server, "/completion", {**base, "prompt": p}).json() for p in prompts]
    both = post(server, "/completion", {**base, "prompt": prompts}).json()
    assert isinstance(both, list) and [b["index"] for b in both] == [0, 1, 2]
    assert [b["tokens"] for b in both] == [a["tokens"] for a in alone]
    assert [b["content"] for b in both] == [a["content"] for a in alone]
    ev = sse_events(server, "/completion", {**base, "prompt": prompts[:2], "stream": True})
    for k in (0, 1):
        mine = [e for e in ev if e != "[DONE]" and e["index"] == k]
        assert mine[-1]["stop"] is True
        assert "".join(e["content"] for e in mine) == alone[k]["content"]
    r = post(server, "/completion", {**base, "prompt": [PROMPT, ""]})
    assert r.status_code == 400 and "empty" in r.json()["error"]["message"]


def test_llama_vim_shapes_on_a_model_without_fim(server):
    """llama.vim's /infill request (and its cache-warming one with n_predict 0) on a model
    without FIM tokens: a clear 400; the server keeps serving."""
    req = {"id_slot": 0, "input_prefix": "def f(x):\n", "input_suffix": "\n", "prompt": "    ",
           "input_extra": [{"text": "import os\n", "time": 1.0, "filename": "a.py"}],
           "n_predict": 0, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.9,
           "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
           "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
           "response_fields": ["content", "timings/prompt_n", "truncated", "tokens_cached"]}
    r = post(server, "/infill", req)
    assert r.status_code == 400 and "FIM" in r.json()["error"]["message"]
    r = post(server, "/v1/completions", {"prompt": "a", "suffix": "b", "max_tokens": 4})
    assert r.status_code == 400 and "FIM" in r.json()["error"]["message"]


def test_completion_n_predict_0_and_response_fields(server):
    r = post(server, "/completion", {"prompt": PROMPT, "n_predict": 0,
                                     "response_fields": ["content", "timings/prompt_n",
                                                         "tokens_cached", "truncated"]}).json()
    assert r["content"] == "" and set(r) == {"content", "timings/prompt_n", "tokens_cached",
                                             "truncated"}
    assert r["timings/prompt_n"] >= 1


@pytest.mark.parametrize("path,body,needle", [
    ("/completion", "{not json", "not valid JSON"),
    ("/completion", {"prompt": PROMPT, "n_predict": "many"}, "n_predict"),
    ("/completion", {"prompt": PROMPT, "n_predict": -2}, "n_predict"),
    ("/completion", {"prompt": ""}, "empty"),
    ("/completion", {"prompt": "x " * 400}, "context holds 256"),
    ("/completion", {"prompt": [1, 99999999]}, "out of range"),
    ("/completion", {"n_predict": 3}, "prompt"),
    ("/completion", {"prompt": "a", "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "a", "max_tokens": -1}, "max_tokens"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ("/completion", {"prompt": "a", "id_slot": 7}, "id_slot"),
    ("/completion", {"prompt": "a", "mirostat": 2}, "mirostat: not supported"),
    ("/completion", {"prompt": "a", "grammar": "root ::= \"x\""}, "grammar: not supported"),
    ("/completion", {"prompt": "a", "samplers": ["top_k", "adaptive_p"]}, "adaptive_p"),
    ("/completion", {"prompt": "a", "samplers": 3}, "samplers"),
    ("/completion", {"prompt": [5, [6, 7]]}, "a list of token ids cannot also hold lists"),
    ("/completion", {"prompt": "a", "min_p": 1.5}, "min_p"),
    ("/completion", {"prompt": "a", "repeat_penalty": 0}, "repeat_penalty"),
    ("/v1/completions", {"prompt": "a", "logit_bias": {"5": 100}}, "logit_bias: not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "presence_penalty": 3}, "presence_penalty"),
    ("/completion", '{"prompt": "a", "temperature": Infinity}',
     "temperature: Input should be a finite number"),
    ("/completion", '{"prompt": "a", "repeat_penalty": NaN}',
     "repeat_penalty: Input should be a finite number"),
    ("/v1/completions", '{"prompt": "a", "frequency_penalty": -Infinity}',
     "frequency_penalty: Input should be a finite number"),
    ("/infill", {"input_prefix": "a", "input_extra": [{"filename": "f.py"}]},
     "input_extra.0.text: Field required"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages.0: missing 'content'"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages.0.content.0.text: Field required"),
    ("/completion", {"prompt": ["a", ""]}, "prompt.1: prompt is empty"),
    ("/completion", {"prompt": ["a", [1, 99999999]]}, "prompt.1: token id 99999999 is out"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "max_completion_tokens": 0},
     "max_completion_tokens must be at least 1, got 0"),
    ("/completion", {"prompt": ["a", "x " * 400]}, "prompt.1: the prompt has"),
    ("/completion", {"prompt": "a", "max_tokens": -2}, "max_tokens must be -1"),
    # llama-server's int32 bound, not a wrap-around to "no limit"
    ("/completion", {"prompt": "a", "n_predict": 99999999999999999999},
     "n_predict must be at most 2147483647, got 99999999999999999999"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 2**31},
     "max_tokens must be at most 2147483647, got 2147483648"),
    ("/completion", b'{"prompt": "abc\xff"}',
     "the body is not valid UTF-8: invalid start byte (byte 0xff at offset 15)"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]},
     "messages.0.content: a 'image_url' part: only text parts"),
    ("/v1/completions", {"prompt": "a", "best_of": 3}, "best_of: not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools: not supported"),
])
def test_bad_requests(server, path, body, needle):
    if isinstance(body, (str, bytes)):
        r = httpx.post(server.url + path, content=body, headers=AUTH, timeout=60)
    else:
        r = post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "invalid_request_error"
    assert needle in err["message"]
    assert httpx.get(server.url + "/health").status_code == 200


def test_openai_client(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
    c = client.completions.create(model="x", prompt=PROMPT, max_tokens=10, temperature=0)
    assert c.choices[0].finish_reason in ("length", "stop") and c.usage.completion_tokens >= 1
    streamed = client.completions.create(model="x", prompt=PROMPT, max_tokens=10,
                                         temperature=0, stream=True,
                                         stream_options={"include_usage": True})
    chunks = list(streamed)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.choices[0].text
    assert chunks[-1].usage.total_tokens == c.usage.total_tokens
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi <s>"}]
    chat = client.chat.completions.create(model="x", messages=msgs, max_tokens=8,
                                          temperature=0)
    text = chat.choices[0].message.content
    assert chat.choices[0].message.role == "assistant" and isinstance(text, str)
    parts = list(client.chat.completions.create(model="x", messages=msgs, max_tokens=8,
                                                temperature=0, stream=True))
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == text
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="bad").completions.create(
            model="x", prompt="a", max_tokens=2)


def test_completion_prompt_parses_control_tokens(server):
    """A raw /completion or /v1/completions prompt is tokenized with control-token texts
    parsed, as llama-server tokenizes its prompts (the client wrote the template too): the same
    ids as /tokenize with parse_special and BOS."""
    eos = httpx.get(server.url + "/props", headers=AUTH).json()["eos_token"]
    text = PROMPT + eos + "def"
    want = post(server, "/tokenize", {"content": text, "add_special": True,
                                      "parse_special": True}).json()["tokens"]
    plain = post(server, "/tokenize", {"content": text, "add_special": True,
                                       "parse_special": False}).json()["tokens"]
    assert len(want) < len(plain)  # the EOS text is one control token
    r = post(server, "/completion", {"prompt": text, "n_predict": 1, "temperature": 0}).json()
    assert r["tokens_evaluated"] == len(want)
    u = post(server, "/v1/completions", {"prompt": text, "max_tokens": 1}).json()["usage"]
    assert u["prompt_tokens"] == len(want)


def test_openai_completions_with_several_prompts(server):
    """/v1/completions with a list of prompts (texts, or lists of token ids): one choice per
    prompt, index K, each the text that prompt alone gets (greedy); usage summed; streamed,
    each prompt's chunks carry its index; a bad prompt is named prompt.K, as llama-server
    answers a list of prompts."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
    texts = [PROMPT, "def add(a, b):"]
    alone = [client.completions.create(model="x", prompt=t, max_tokens=6, temperature=0)
             for t in texts]
    both = client.completions.create(model="x", prompt=texts, max_tokens=6, temperature=0)
    assert [c.index for c in both.choices] == [0, 1]
    assert [c.text for c in both.choices] == [a.choices[0].text for a in alone]
    assert both.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert both.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    ids = [post(server, "/tokenize", {"content": t}).json()["tokens"] for t in texts]
    by_ids = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 6,
                                              "temperature": 0}).json()
    assert [c["index"] for c in by_ids["choices"]] == [0, 1]
    streamed = list(client.completions.create(model="x", prompt=texts, max_tokens=6,
                                              temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    for k in (0, 1):
        got = "".join(ch.choices[0].text for ch in streamed
                      if ch.choices and ch.choices[0].index == k)
        assert got == alone[k].choices[0].text
    assert streamed[-1].usage.total_tokens == both.usage.total_tokens
    r = post(server, "/v1/completions", {"prompt": ["a", ""], "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["message"] == "prompt.1: prompt is empty"


def test_concurrent_load_with_disconnects(server):
    """12 clients at once on 2 slots: completions, streams dropped after the first event,
    malformed bodies. Every completion is answered, no slot stays busy."""
    results, errors = [], []

    def complete(i):
        r = post(server, "/completion", {"prompt": PROMPT + str(i), "n_predict": 6,
                                         "temperature": 0})
        results.append(r.status_code)

    def drop(i):
        with httpx.stream("POST", server.url + "/completion", headers=AUTH, timeout=60,
                          json={"prompt": PROMPT, "n_predict": 200, "stream": True,
                                "ignore_eos": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break  # the client goes away mid-generation

    def malformed(i):
        r = httpx.post(server.url + "/completion", content=b'{"prompt": [1, "x"', headers=AUTH,
                       timeout=60)
        if r.status_code != 400:
            errors.append(r.status_code)

    jobs = [complete, drop, malformed, complete] * 3
    threads = [threading.Thread(target=f, args=(i,)) for i, f in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(results) == [200] * 6 and not errors
    slots = slots_when_idle(server, 30)
    assert not any(s["is_processing"] for s in slots)
    metrics = httpx.get(server.url + "/metrics", headers=AUTH).text
    assert "llamacpp:requests_processing 0" in metrics
    assert "# TYPE llamacpp:prompt_tokens_total counter" in metrics


def test_stream_dropped_while_queued_leaves_no_task(tiny_build):
    """A stream whose client goes away while it waits for the busy slot ends cleanly: no
    pending task is left for asyncio to report ("Task was destroyed but it is pending!")."""
    srv = start_server(tiny_build, "--slots", "1", "--ctx", "2048")
    done = threading.Event()

    def busy_slot():
        return any(s["is_processing"] for s in httpx.get(srv.url + "/slots").json())

    try:
        def long_stream():  # holds the only slot until the probes are done, then leaves
            with httpx.stream("POST", srv.url + "/completion", timeout=120, json={
                    "prompt": PROMPT, "n_predict": 2000, "stream": True,
                    "ignore_eos": True}) as r:
                for _ in r.iter_lines():
                    if done.is_set():
                        break

        busy = threading.Thread(target=long_stream)
        busy.start()
        deadline = time.monotonic() + 60
        while not busy_slot():
            assert time.monotonic() < deadline, "the long stream never took the slot"
            time.sleep(0.02)
        for path, body in (("/completion", {"prompt": "a", "n_predict": 4}),
                           ("/v1/completions", {"prompt": "a", "max_tokens": 4})):
            with pytest.raises(httpx.ReadTimeout):  # queued behind the long stream
                with httpx.stream("POST", srv.url + path, json={**body, "stream": True},
                                  timeout=0.5) as r:
                    for _ in r.iter_lines():
                        pass
        assert busy_slot(), "the long stream ended before the probes did"
        done.set()
        busy.join(timeout=120)
        # more requests, so that the server allocates and its garbage collector runs: that
        # is when asyncio reports a task destroyed while pending
        for _ in range(3):
            assert httpx.post(srv.url + "/completion", timeout=120, json={
                "prompt": PROMPT, "n_predict": 200, "ignore_eos": True}).status_code == 200
    finally:
        done.set()
        stop_server(srv)
    err = srv.proc.stderr.read()
    assert "Task was destroyed" not in err and "Traceback" not in err, err


def test_spec_ngram_identical_greedy_and_sigterm(tiny_build, server):
    """--spec ngram gives the greedy tokens of --spec none, with drafts accepted; SIGTERM
    stops the server."""
    spec = start_server(tiny_build, "--ctx", "256", "--spec", "ngram", "--spec-cost", "0.1")
    try:
        props = httpx.get(spec.url + "/props").json()
        assert props["speculative"]["batch_exact"] is True
        assert props["speculative"]["verify_cost_per_draft"] == 0.1
        prompts = [PROMPT * 3, "a b c a b c a b c a b", [1, 5, 6, 7, 5, 6, 7, 5, 6]]
        for p in prompts:
            req = {"prompt": p, "n_predict": 40, "temperature": 0, "return_tokens": True,
                   "cache_prompt": False}
            want = post(server, "/completion", req).json()
            got = httpx.post(spec.url + "/completion", json=req, timeout=120).json()
            assert got["tokens"] == want["tokens"] and got["content"] == want["content"]
        metrics = httpx.get(spec.url + "/metrics").text
        drafts = [ln for ln in metrics.splitlines()
                  if ln.startswith("llamacpp:spec_decode_num_draft_tokens_total")]
        assert float(drafts[0].split()[1]) > 0
    finally:
        rc = stop_server(spec)
    assert rc in (0, -signal.SIGTERM, 128 + signal.SIGTERM)


def test_build_without_library_says_rebuild(tiny_build, tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    for name in ("ditto-run", "model.ditto", "build.json"):
        (d / name).symlink_to(tiny_build / name)
    proc = subprocess.run([sys.executable, "-c", "from ditto_core.cli.main import main; main()",
                           "serve", str(d)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "libditto.so" in proc.stderr and "rebuild" in proc.stderr


def test_address_in_use_and_empty_key_are_refused_before_serving(tiny_build):
    cli = [sys.executable, "-c", "from ditto_core.cli.main import main; main()", "serve",
           str(tiny_build)]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run(cli + ["--port", str(port)], capture_output=True, text=True,
                              timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == f"error: --host 127.0.0.1 --port {port}: the address is in use\n"
    proc = subprocess.run(cli + ["--host", "no-such-host.invalid"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.startswith(
        "error: --host no-such-host.invalid: "), proc.stderr
    proc = subprocess.run(cli + ["--api-key", " "], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--api-key: empty key" in proc.stderr


def test_run_names_a_model_file_that_is_not_a_regular_file(tiny_build, tmp_path):
    d = tmp_path / "b"
    d.mkdir()
    for name in ("ditto-run", "build.json"):
        (d / name).symlink_to(tiny_build / name)
    (d / "model.ditto").mkdir()
    proc = subprocess.run([sys.executable, "-c", "from ditto_core.cli.main import main; main()",
                           "run", str(d), "-p", "x"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert proc.stderr == f"error: {d / 'model.ditto'}: the build's model file is not a " \
                          "regular file\n"


def test_negative_spec_cost_is_a_usage_error(tiny_build):
    proc = subprocess.run([sys.executable, "-c", "from ditto_core.cli.main import main; main()",
                           "serve", str(tiny_build), "--spec", "ngram", "--spec-cost", "-1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--spec-cost" in proc.stderr
    assert "-1.0 is not in the range x>=0" in proc.stderr


# ----------------------------------------------------------------- real FIM: Qwen2.5-Coder

@pytest.fixture(scope="module")
def qwen_server(serve_build, qwen05_f32_ditto, tmp_path_factory):
    """Qwen2.5-Coder-0.5B (fp32 model file) served by the runtime of ``serve_build``."""
    d = tmp_path_factory.mktemp("qwen_build")
    for name in ("ditto-run", "libditto.so", "build.json"):
        (d / name).symlink_to(serve_build / name)
    (d / "model.ditto").symlink_to(qwen05_f32_ditto)
    srv = start_server(d, "--ctx", "1024", "--api-key", KEY)
    yield srv
    stop_server(srv)


def test_qwen_tokenize_special_as_llama_server(qwen_server):
    """/tokenize add_special adds what the vocabulary adds (Qwen2.5: no BOS), /detokenize
    writes control tokens as their text, as llama-server and transformers do."""
    plain = post(qwen_server, "/tokenize", {"content": "hi"}).json()["tokens"]
    assert post(qwen_server, "/tokenize", {"content": "hi", "add_special": True}).json() == \
        {"tokens": plain}
    text = "<|im_start|>user\nhi<|im_end|>"
    ids = post(qwen_server, "/tokenize", {"content": text}).json()["tokens"]
    assert len(ids) == 5
    assert post(qwen_server, "/detokenize", {"tokens": ids}).json() == {"content": text}


def test_qwen_non_streamed_request_cancelled_when_the_client_goes(qwen_server):
    """A non-streamed request whose client goes away (here: a 2 s timeout, behind the API key
    check) stops generating and frees its slot, instead of running its 800 tokens."""
    with pytest.raises(httpx.TimeoutException):
        httpx.post(qwen_server.url + "/completion", headers=AUTH, timeout=2,
                   json={"prompt": "def f():", "n_predict": 800, "ignore_eos": True})
    slots = slots_when_idle(qwen_server, 5)
    assert not any(s["is_processing"] for s in slots), slots
    assert slots[0]["n_cached"] < 300  # stopped early: prompt + far fewer than 800 tokens


def test_qwen_cache_warming_ignores_t_max_prompt_ms(qwen_server):
    """llama.vim's cache-warming request (n_predict 0, t_max_prompt_ms 1) evaluates its whole
    prompt, as llama-server does (it does not implement t_max_prompt_ms): the next request finds
    all of it cached, not only the first 256-token chunk."""
    text = "".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n\n" for i in range(40))
    ids = post(qwen_server, "/tokenize", {"content": text}).json()["tokens"]
    assert 2 * 256 < len(ids) < 900, len(ids)
    warm = post(qwen_server, "/completion", {
        "prompt": ids, "id_slot": 0, "n_predict": 0, "samplers": [], "cache_prompt": True,
        "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
        "response_fields": ["content", "timings/prompt_n", "timings/cache_n",
                            "tokens_cached"]}).json()
    assert warm["content"] == "" and warm["timings/prompt_n"] + warm["timings/cache_n"] == len(ids)
    assert warm["tokens_cached"] == len(ids)
    more = post(qwen_server, "/tokenize", {"content": "def g(x):\n"}).json()["tokens"]
    got = post(qwen_server, "/completion", {
        "prompt": ids + more, "id_slot": 0, "n_predict": 4, "top_k": 1, "t_max_prompt_ms": 1,
        "response_fields": ["timings/prompt_n", "timings/cache_n"]}).json()
    assert got == {"timings/prompt_n": len(more), "timings/cache_n": len(ids)}


def test_qwen_infill_llama_vim_and_openai_suffix(qwen_server):
    import openai

    assert httpx.get(qwen_server.url + "/props", headers=AUTH).json()["infill"] is True
    prefix = "def add(a, b):\n    return "
    suffix = "\n\n\nprint(add(2, 3))\n"
    req = {"id_slot": 0, "input_prefix": prefix, "input_suffix": suffix, "prompt": "",
           "input_extra": [{"text": "import math\n", "time": 1.0, "filename": "util.py"}],
           "n_predict": 0, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.9,
           "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
           "t_max_prompt_ms": 5000, "t_max_predict_ms": 20000,
           "response_fields": ["content", "timings/prompt_n", "timings/predicted_n",
                               "truncated", "timings/cache_n"]}
    warm = post(qwen_server, "/infill", req).json()
    assert warm["content"] == "" and warm["timings/prompt_n"] > 10 and warm["truncated"] is False
    got = post(qwen_server, "/infill", {**req, "n_predict": 12, "top_k": 1}).json()  # greedy
    assert got["timings/cache_n"] == warm["timings/prompt_n"] - 1  # the warm-up is reused
    assert got["content"].startswith("a + b"), got
    client = openai.OpenAI(base_url=qwen_server.url + "/v1", api_key=KEY)
    c = client.completions.create(model="qwen", prompt=prefix, suffix=suffix, max_tokens=8,
                                  temperature=0)
    assert c.choices[0].text.startswith("a + b")
