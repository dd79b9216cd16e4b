"""The generation engine of ``ditto serve`` (docs/SERVE.md), without HTTP.

One model (``runtime_api.Model``) and ``n_slots`` slots, each a session whose KV cache is kept
between requests with the tokens it holds. A request takes the idle slot sharing the longest
token prefix with its prompt, truncates the slot's cache to that prefix and evaluates only the
rest (``cache_prompt``), then generates in the slot's own worker thread: sampling, end-of-
generation tokens, stop strings held back until they cannot match any more, ``n_indent``, time
limits, and optional prompt-lookup speculation (``spec="ngram"``, greedy requests only).

Threads: the slot assignment runs on the asyncio event loop; each slot's generation runs in
that slot's worker thread and reports events back to the loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Callable, Sequence

import attrs
import numpy as np

from ditto_core.base.errors import DittoError
from ditto_core.runtime.runtime_api import KV_CACHE_TYPES, Model, RuntimeAPIError

#: tokens of the prompt evaluated per call (cancellation is checked between calls)
PROMPT_CHUNK = 256


class Busy(DittoError):
    """Every slot is busy and the queue of waiting requests is full (HTTP 503)."""


class BadRequest(DittoError):
    """A request the engine refuses (HTTP 400): prompt too long for the context, bad slot id."""


@attrs.frozen
class GenParams:
    """Generation parameters of one request (llama-server's names; docs/SERVE.md).

    ``n_predict``: tokens to generate at most, -1 until EOS or the context is full, 0 only
    evaluates the prompt into the cache. ``temperature`` 0 is greedy. ``top_k`` <= 0 and
    ``top_p`` >= 1 disable those filters. ``seed`` -1 draws one. ``stop``: strings that end the
    text (left out of it). ``n_indent``: a generated line (after the first) indented by fewer
    columns ends the text before that line. ``t_max_predict_ms``: a time limit of generation,
    only once a newline was generated, 0 = none. ``t_max_prompt_ms`` is accepted and, as
    llama-server does (its server-task.h: "TODO: implement"), not acted on: the whole prompt
    is evaluated, so llama.vim's cache-warming request (``n_predict`` 0, ``t_max_prompt_ms``
    1) fills the cache with all of its extra context. ``id_slot`` -1: any slot. ``min_p``
    (0: off), ``repeat_penalty`` (1: off), ``presence_penalty`` and ``frequency_penalty``
    (0: off) over the last ``repeat_last_n`` tokens of the context (0: none, -1: all):
    llama.cpp's samplers (``apply_penalties``). ``samplers``: the names of the samplers that
    run (llama-server's ``samplers``); None runs them all. A temperature left out of
    ``samplers`` is 1."""

    n_predict: int = -1
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    samplers: tuple[str, ...] | None = None
    seed: int = -1
    stop: tuple[str, ...] = ()
    n_indent: int = 0
    t_max_prompt_ms: float = 0.0
    t_max_predict_ms: float = 0.0
    cache_prompt: bool = True
    ignore_eos: bool = False
    id_slot: int = -1


@attrs.define
class Result:
    """What a generation produced. ``stop_type``: "eos", "limit", "word" or "cancelled";
    ``timings``: llama-server's timing fields (milliseconds, tokens per second)."""

    content: str = ""
    tokens: list = attrs.Factory(list)
    stop_type: str = "limit"
    stopping_word: str = ""
    truncated: bool = False
    #: tokens the slot's KV cache holds when the request ends, prompt and generated (as
    #: llama-server's tokens_cached: its slot's prompt length)
    tokens_cached: int = 0
    #: prompt tokens taken from the cache instead of evaluated (timings.cache_n)
    prompt_cached: int = 0
    tokens_evaluated: int = 0
    id_slot: int = 0
    timings: dict = attrs.Factory(dict)
    n_draft: int = 0
    n_accept: int = 0


#: The sampler names of llama-server's ``samplers`` that Ditto runs, in the order it runs
#: them (penalties, top_k, min_p, then softmax at the temperature and top_p).
SAMPLERS = ("penalties", "top_k", "top_p", "min_p", "temperature")


def sampling(params: GenParams) -> tuple[float, int, float, float, bool]:
    """(temperature, top_k, top_p, min_p, penalties on) that ``params`` asks for once its
    ``samplers`` list is applied: a sampler left out of it is off (a temperature left out is
    1, as llama.cpp then draws from the unscaled distribution; top_k 1 is greedy)."""
    on = set(SAMPLERS if params.samplers is None else params.samplers)
    penalties = "penalties" in on and (
        params.repeat_last_n != 0 and (params.repeat_penalty != 1.0
                                       or params.presence_penalty != 0.0
                                       or params.frequency_penalty != 0.0))
    top_k = params.top_k if "top_k" in on else 0
    # a single candidate is the largest logit whatever the temperature: greedy (argmax)
    temperature = 0.0 if top_k == 1 else params.temperature if "temperature" in on else 1.0
    return (temperature, top_k,
            params.top_p if "top_p" in on else 1.0,
            params.min_p if "min_p" in on else 0.0,
            penalties)


def apply_penalties(logits: np.ndarray, window: Sequence[int], repeat: float, frequency: float,
                    presence: float) -> np.ndarray:
    """llama.cpp's penalties sampler (src/llama-sampling.cpp, ``llama_sampler_penalties``) on
    a copy of ``logits`` float32 [vocab]: each token id occurring c > 0 times in ``window``
    has its logit divided by ``repeat`` when positive (multiplied when not), then lowered by
    c * frequency + presence, in float32."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if not len(window):
        return out
    ids, counts = np.unique(np.asarray(window, np.int64), return_counts=True)
    v = out[ids]
    v = np.where(v <= 0, v * np.float32(repeat), v / np.float32(repeat)).astype(np.float32)
    v = v - (counts.astype(np.float32) * np.float32(frequency) + np.float32(presence))
    out[ids] = v
    return out


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = np.asarray(a[:n], np.int64), np.asarray(b[:n], np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def find_stop(text: str, stops: Sequence[str], start: int) -> tuple[int, str]:
    """(index, string) of the stop string that occurs first in ``text`` at or after ``start``
    (the longest one on a tie), or (-1, "")."""
    best, word = -1, ""
    for s in stops:
        if not s:
            continue
        i = text.find(s, max(0, start))
        if i >= 0 and (best < 0 or i < best or (i == best and len(s) > len(word))):
            best, word = i, s
    return best, word


def partial_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string (text
    that must be held back: the next token may complete the stop string)."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def ngram_draft(hist: Sequence[int], k: int, n_max: int = 3, n_min: int = 1) -> list[int]:
    """Prompt-lookup draft (no draft model): for n = n_max down to n_min, find the latest
    earlier occurrence of the last n tokens of ``hist`` and propose the (up to) ``k`` tokens
    that followed it; [] when nothing matches."""
    return ngram_match(hist, k, n_max, n_min)[1]


def ngram_match(hist: Sequence[int], k: int, n_max: int = 3,
                n_min: int = 1) -> tuple[int, list[int]]:
    """(n, draft) of ngram_draft: the length n of the matched suffix (0 when nothing
    matches) with the tokens that followed its latest earlier occurrence."""
    L = len(hist)
    if k <= 0 or L < 2:
        return 0, []
    arr = np.asarray(hist, np.int64)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        tail = arr[L - n:]
        # candidate starts j (j + n < L): windows arr[j:j+n] equal to tail, latest first
        cand = np.flatnonzero(arr[:L - n] == tail[0])
        for j in cand[::-1]:
            j = int(j)
            if j + n >= L:
                continue
            if np.array_equal(arr[j:j + n], tail):
                follow = arr[j + n:j + n + k]
                if follow.size:
                    return n, [int(t) for t in follow]
    return 0, []


class DraftPolicy:
    """How many draft tokens to verify, from what a verification costs and how often drafts of
    each match length n (1..3) came true in this request.

    A verification of 1 + k tokens costs (1 + r k) one-token steps (``r``, measured by
    Engine.probe_verify_cost); if each draft token from an n-token match is right with
    probability p_n (independently, given the ones before it were), it yields
    1 + p + ... + p^k tokens on average. The policy takes the k in 0..k_max with the most
    expected tokens per unit of cost, k = 0 (no draft) when no draft pays. p_n starts from a
    prior (0.8, 0.6, 0.4 for n = 3, 2, 1, worth two trials) and counts every draft token
    checked: accepted ones as successes, the first rejected one as a failure."""

    PRIOR = {3: 0.8, 2: 0.6, 1: 0.4}

    def __init__(self, r: float, k_max: int):
        self.r, self.k_max = r, k_max
        self.succ = {n: 2 * p for n, p in self.PRIOR.items()}
        self.trials = {n: 2.0 for n in self.PRIOR}

    def p(self, n: int) -> float:
        return self.succ[n] / self.trials[n]

    def length(self, n: int, room: int) -> int:
        """Draft tokens to verify after an n-token match, at most ``room``."""
        if n not in self.succ:
            return 0
        p, best, best_k, gain = self.p(n), 1.0, 0, 1.0
        for k in range(1, min(self.k_max, room) + 1):
            gain += p ** k
            rate = gain / (1.0 + self.r * k)
            if rate > best:
                best, best_k = rate, k
        return best_k

    def update(self, n: int, proposed: int, accepted: int) -> None:
        self.succ[n] += accepted
        self.trials[n] += accepted + (1 if accepted < proposed else 0)


class Slot:
    """One session with the tokens its KV cache holds (``tokens``), a worker thread and the
    request it serves (``busy``; changed on the event loop only)."""

    def __init__(self, engine: "Engine", idx: int, n_ctx: int, n_batch: int):
        self.engine, self.id, self.n_ctx = engine, idx, n_ctx
        self.session = engine.model.session(n_ctx, n_batch, *engine.cache_types)
        self.tokens: list[int] = []
        self.busy = False
        self.last_used = 0.0
        self.n_requests = 0
        self.params: GenParams | None = None
        self.cancel: threading.Event | None = None
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._work, name=f"ditto-slot-{idx}", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            job()


class Engine:
    """Slots over one model (see the module docstring).

    ``spec``: "none" or "ngram" (prompt-lookup speculation with drafts of up to ``spec_k``
    tokens, used by greedy requests when the batched evaluation gives the same bits as one-token
    decoding, ``batch_exact``; ``spec_cost``: what each draft token adds to a verification, in
    one-token steps, for DraftPolicy, None to measure it, ``probe_verify_cost``). ``max_queue``: requests that may wait for a slot; one more is
    refused with ``Busy``. ``cache_type_k``, ``cache_type_v``: the slots' KV cache element
    types, "f32" or "f16" (``Model.session``)."""

    def __init__(self, model: Model, *, n_slots: int = 1, n_ctx: int = 4096, n_batch: int = 256,
                 max_queue: int = 16, spec: str = "none", spec_k: int = 7,
                 spec_cost: float | None = None, cache_type_k: str = "f32",
                 cache_type_v: str = "f32"):
        if spec not in ("none", "ngram"):
            raise DittoError(f"--spec: unknown speculation {spec!r} (none, ngram)")
        for flag, t in (("--cache-type-k", cache_type_k), ("--cache-type-v", cache_type_v)):
            if t not in KV_CACHE_TYPES:
                raise DittoError(f"{flag}: unknown KV cache type {t!r} (f32, f16)")
        self.model = model
        self.cache_types = (cache_type_k, cache_type_v)
        self.n_ctx, self.n_batch, self.max_queue = n_ctx, n_batch, max_queue
        self.spec, self.spec_k = spec, spec_k
        self.batch_exact = self.probe_batch_exact() if spec != "none" else None
        self.verify_cost = (None if not self.batch_exact else spec_cost
                            if spec_cost is not None else self.probe_verify_cost())
        self.slots = [Slot(self, i, n_ctx, n_batch) for i in range(n_slots)]
        self.waiting = 0
        self._cond: asyncio.Condition | None = None
        self.metrics = {"prompt_tokens_total": 0, "prompt_seconds_total": 0.0,
                        "tokens_predicted_total": 0, "tokens_predicted_seconds_total": 0.0,
                        "n_decode_total": 0, "n_tokens_max": 0, "requests_total": 0,
                        "spec_drafts_total": 0, "spec_draft_tokens_total": 0,
                        "spec_accepted_tokens_total": 0}
        self._mlock = threading.Lock()
        self.closed = False

    # -- exactness probe --------------------------------------------------------------------
    def probe_batch_exact(self, n: int = 12) -> bool:
        """Whether evaluating several tokens at once (logits of every position) gives the bits
        of evaluating them one at a time, on a fixed token sequence of this model; speculation
        is used only when it does, so that it never changes greedy output."""
        m = self.model
        ids = [(i * 7919 + 13) % m.vocab_size for i in range(n)]
        ctx = min(n + 1, m.max_seq_len)
        a = m.session(ctx, max(2, min(n, 512)), *self.cache_types)
        b = m.session(ctx, 1, *self.cache_types)
        try:
            a.eval(ids[:3], "none")
            b.eval(ids[:3], "none")
            la = a.eval(ids[3:], "all")
            lb = np.stack([b.eval([t]) for t in ids[3:]])
            return bool(np.array_equal(la.view(np.uint32), lb.view(np.uint32)))
        finally:
            a.close()
            b.close()

    def probe_verify_cost(self, k: int = 7, reps: int = 3) -> float:
        """r: what each draft token adds to a verification, in one-token decode steps: the
        best of ``reps`` timings of evaluating 1 + k tokens (logits of every position) against
        one token, at a 256-token context. The draft policy (DraftPolicy) weighs drafts with
        it, so a CPU whose batched evaluation costs more drafts less."""
        m = self.model
        ids = [(i * 7919 + 13) % m.vocab_size for i in range(256 + k + 1)]
        sess = m.session(min(len(ids) + 1, m.max_seq_len), 256, *self.cache_types)
        try:
            sess.eval(ids[:256], "none")
            one, many = float("inf"), float("inf")
            for _ in range(reps):
                t = time.perf_counter()
                sess.eval(ids[256:257])
                one = min(one, time.perf_counter() - t)
                sess.truncate(256)
                t = time.perf_counter()
                sess.eval(ids[256:257 + k], "all")
                many = min(many, time.perf_counter() - t)
                sess.truncate(256)
            return max(0.05, (many / one - 1.0) / k)
        finally:
            sess.close()

    # -- slots (event loop) -----------------------------------------------------------------
    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    def _pick(self, prompt: Sequence[int], id_slot: int) -> Slot | None:
        if id_slot >= 0:
            s = self.slots[id_slot]
            return None if s.busy else s
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        return max(idle, key=lambda s: (common_prefix(s.tokens, prompt), -s.last_used))

    async def acquire(self, prompt: Sequence[int], id_slot: int = -1) -> Slot:
        """The idle slot with the longest shared prefix (or slot ``id_slot``), waiting for one
        when all are busy. Raises Busy when ``max_queue`` requests already wait, BadRequest for
        a slot id out of range."""
        if id_slot >= len(self.slots):
            raise BadRequest(f"id_slot {id_slot} does not exist (slots 0..{len(self.slots) - 1})")
        cond = self._condition()
        async with cond:
            slot = self._pick(prompt, id_slot)
            if slot is None:
                if self.waiting >= self.max_queue:
                    raise Busy(f"all {len(self.slots)} slots are busy and {self.waiting} "
                               "requests are waiting")
                self.waiting += 1
                try:
                    while (slot := self._pick(prompt, id_slot)) is None:
                        await cond.wait()
                finally:
                    self.waiting -= 1
            slot.busy = True
            return slot

    def release(self, slot: Slot) -> None:
        """Mark ``slot`` idle and wake the waiting requests (event loop thread)."""
        slot.busy = False
        slot.cancel = None
        slot.last_used = time.monotonic()
        cond = self._condition()

        async def notify():
            async with cond:
                cond.notify_all()

        asyncio.ensure_future(notify())

    def start(self, slot: Slot, prompt: list[int], params: GenParams,
              on_event: Callable[[tuple], None]) -> threading.Event:
        """Run the generation in ``slot``'s worker thread. ``on_event`` gets, on the event loop,
        ("chunk", text, token_ids) as text becomes final, then ("done", Result) or ("error",
        exception); the slot is released after the last event. Returns the cancel flag."""
        loop = asyncio.get_running_loop()
        cancel = threading.Event()
        slot.cancel, slot.params = cancel, params
        slot.n_requests += 1
        with self._mlock:
            self.metrics["requests_total"] += 1

        def send(ev):
            try:
                loop.call_soon_threadsafe(on_event, ev)
            except RuntimeError:  # the loop has closed (shutdown)
                pass

        def job():
            try:
                res = self.generate(slot, prompt, params,
                                    lambda text, ids: send(("chunk", text, ids)), cancel)
                send(("done", res))
            except Exception as exc:  # reported to the client; the server keeps serving
                send(("error", exc))
            finally:
                try:
                    loop.call_soon_threadsafe(self.release, slot)
                except RuntimeError:
                    slot.busy = False

        slot.jobs.put(job)
        return cancel

    def close(self) -> None:
        """Cancel running generations, stop the workers and free the sessions."""
        self.closed = True
        for s in self.slots:
            if s.cancel is not None:
                s.cancel.set()
            s.jobs.put(None)
        for s in self.slots:
            s.thread.join(timeout=30)
            s.session.close()

    # -- generation (worker thread) --------------------------------------------------------
    def _count(self, **kw) -> None:
        with self._mlock:
            for k, v in kw.items():
                self.metrics[k] += v

    def generate(self, slot: Slot, prompt: list[int], params: GenParams,
                 emit: Callable[[str, list], None], cancel: threading.Event) -> Result:
        """Evaluate ``prompt`` in ``slot`` (reusing its cached prefix) and generate; ``emit``
        gets each piece of final text (never part of a stop string, never a split character)
        with the ids of the tokens it came from. Runs in the slot's worker thread."""
        m, sess = self.model, slot.session
        res = Result(id_slot=slot.id, tokens_evaluated=len(prompt))
        if len(prompt) >= slot.n_ctx:
            raise BadRequest(f"the prompt has {len(prompt)} tokens but the context holds "
                             f"{slot.n_ctx} (--ctx)")
        t0 = time.perf_counter()
        n_keep = common_prefix(slot.tokens, prompt) if params.cache_prompt else 0
        n_keep = min(n_keep, len(prompt) - 1, sess.pos)  # the last token runs for its logits
        sess.truncate(n_keep)
        del slot.tokens[n_keep:]
        res.prompt_cached = n_keep
        logits = None
        rest = prompt[n_keep:]
        for i in range(0, len(rest), PROMPT_CHUNK):
            if cancel.is_set():
                res.stop_type = "cancelled"
                return self._finish(res, slot, t0, t0, 0)
            chunk = rest[i:i + PROMPT_CHUNK]
            last = i + PROMPT_CHUNK >= len(rest)
            logits = sess.eval(chunk, "last" if last else "none")
            slot.tokens.extend(chunk)
            self._count(n_decode_total=1)
        t_prompt = time.perf_counter()
        self._count(prompt_tokens_total=len(rest), prompt_seconds_total=t_prompt - t0)
        with self._mlock:
            self.metrics["n_tokens_max"] = max(self.metrics["n_tokens_max"], len(prompt))
        if params.n_predict == 0:
            res.stop_type = "limit"
            return self._finish(res, slot, t0, t_prompt, len(rest))

        seed = params.seed if params.seed >= 0 else int.from_bytes(
            np.random.default_rng().bytes(8), "little")
        temperature, top_k, top_p, min_p, penalize = sampling(params)
        sampler = m.sampler(temperature, top_k, top_p, seed, min_p)
        greedy = temperature == 0
        last_n = slot.n_ctx if params.repeat_last_n < 0 else params.repeat_last_n
        use_spec = (self.spec == "ngram" and greedy and not penalize
                    and bool(self.batch_exact))
        policy = DraftPolicy(self.verify_cost, self.spec_k) if use_spec else None
        dec = m.decoder()
        for t in prompt:  # the text continues the prompt's (SentencePiece's leading space)
            dec.feed(t)
        stops = tuple(s for s in params.stop if s)
        max_stop = max((len(s) for s in stops), default=0)
        limit = params.n_predict if params.n_predict > 0 else slot.n_ctx
        text, sent, ids_unsent = "", 0, []
        queued: list[tuple[int, np.ndarray]] = []  # accepted draft tokens with their logits
        t_first = None
        n_gen = 0
        while True:
            if cancel.is_set():
                res.stop_type = "cancelled"
                break
            if queued:
                tok, next_logits = queued.pop(0)
            elif penalize:
                window = slot.tokens[len(slot.tokens) - min(last_n, len(slot.tokens)):]
                tok, next_logits = sampler.sample(apply_penalties(
                    logits, window, params.repeat_penalty, params.frequency_penalty,
                    params.presence_penalty)), None
            else:
                tok, next_logits = sampler.sample(logits), None
            n_gen += 1
            if t_first is None:
                t_first = time.perf_counter()
            if m.is_eog(tok) and not params.ignore_eos:
                res.stop_type = "eos"
                break
            res.tokens.append(tok)
            ids_unsent.append(tok)
            before = len(text)
            text += dec.feed(tok).decode("utf-8", "replace")
            i, word = find_stop(text, stops, before - max_stop + 1)
            if i >= 0:
                text = text[:i]
                res.stop_type, res.stopping_word = "word", word
                break
            if params.n_indent > 0 and self._under_indented(text, params.n_indent):
                text = text[:text.rfind("\n") + 1]
                res.stop_type = "limit"
                break
            safe = len(text) - partial_stop(text, stops)
            if params.n_indent > 0:
                safe = min(safe, self._indent_hold(text))
            if safe > sent:
                emit(text[sent:safe], ids_unsent)
                sent, ids_unsent = safe, []
            if n_gen >= limit:
                res.stop_type = "limit"
                break
            if (params.t_max_predict_ms > 0 and "\n" in text
                    and (time.perf_counter() - t_first) * 1e3 > params.t_max_predict_ms):
                res.stop_type = "limit"
                break
            if next_logits is not None:  # a draft token already in the cache
                logits = next_logits
                continue
            if sess.pos >= slot.n_ctx:
                res.truncated = True
                res.stop_type = "limit"
                break
            drafts, n_match = [], 0
            if use_spec:
                room = min(slot.n_ctx - sess.pos - 1, limit - n_gen - 1)
                n_match, drafts = ngram_match(slot.tokens + [tok], min(self.spec_k, room))
                drafts = drafts[:policy.length(n_match, room)] if n_match else []
            if drafts:
                out = sess.eval([tok] + drafts, "all")
                slot.tokens.extend([tok] + drafts)
                n_acc = 0
                while n_acc < len(drafts) and m.argmax(out[n_acc]) == drafts[n_acc]:
                    n_acc += 1
                drop = len(drafts) - n_acc
                if drop:
                    sess.truncate(sess.pos - drop)
                    del slot.tokens[len(slot.tokens) - drop:]
                queued = [(drafts[j], out[j + 1]) for j in range(n_acc)]
                logits = out[0]
                policy.update(n_match, len(drafts), n_acc)
                res.n_draft += len(drafts)
                res.n_accept += n_acc
                self._count(spec_drafts_total=1, spec_draft_tokens_total=len(drafts),
                            spec_accepted_tokens_total=n_acc)
            else:
                logits = sess.eval([tok])
                slot.tokens.append(tok)
            self._count(n_decode_total=1)
        if queued:  # accepted drafts past the stop: out of the cache again
            sess.truncate(sess.pos - len(queued))
            del slot.tokens[len(slot.tokens) - len(queued):]
        if res.stop_type in ("eos", "limit") and not res.stopping_word:
            text += dec.flush().decode("utf-8", "replace")
            i, word = find_stop(text, stops, sent - max_stop + 1)
            if i >= 0:
                text, res.stop_type, res.stopping_word = text[:i], "word", word
        if len(text) > sent:
            emit(text[sent:], ids_unsent)
        res.content = text
        t_end = time.perf_counter()
        self._count(tokens_predicted_total=len(res.tokens),
                    tokens_predicted_seconds_total=t_end - t_prompt)
        return self._finish(res, slot, t0, t_prompt, len(rest), t_end)

    @staticmethod
    def _under_indented(text: str, n_indent: int) -> bool:
        """The last line (not the first) has text and starts with fewer than n_indent
        whitespace columns."""
        nl = text.rfind("\n")
        if nl < 0:
            return False
        line = text[nl + 1:]
        stripped = line.lstrip(" \t")
        return bool(stripped) and len(line) - len(stripped) < n_indent

    @staticmethod
    def _indent_hold(text: str) -> int:
        """With n_indent: hold back a last line that is only whitespace so far (its indentation
        is not known yet)."""
        nl = text.rfind("\n")
        if nl >= 0 and not text[nl + 1:].strip(" \t"):
            return nl + 1
        return len(text)

    @staticmethod
    def _finish(res: Result, slot: Slot, t0: float, t_prompt: float, n_prompt: int,
                t_end: float | None = None) -> Result:
        res.tokens_cached = len(slot.tokens)
        t_end = t_prompt if t_end is None else t_end
        p_ms, g_ms = (t_prompt - t0) * 1e3, (t_end - t_prompt) * 1e3
        n_gen = len(res.tokens)
        res.timings = {
            "cache_n": res.prompt_cached, "prompt_n": n_prompt, "prompt_ms": p_ms,
            "prompt_per_token_ms": p_ms / n_prompt if n_prompt else 0.0,
            "prompt_per_second": n_prompt / p_ms * 1e3 if p_ms > 0 else 0.0,
            "predicted_n": n_gen, "predicted_ms": g_ms,
            "predicted_per_token_ms": g_ms / n_gen if n_gen else 0.0,
            "predicted_per_second": n_gen / g_ms * 1e3 if g_ms > 0 else 0.0,
        }
        if res.n_draft:
            res.timings["draft_n"] = res.n_draft
            res.timings["draft_n_accepted"] = res.n_accept
        return res


def is_runtime_input_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the runtime refusing the request's input (a 400, not a 500)."""
    return isinstance(exc, BadRequest) or (isinstance(exc, RuntimeAPIError) and exc.status in (1, 3))
