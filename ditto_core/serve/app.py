"""The server of ``ditto serve BUILD`` (the command: ditto_core.cli.serve): llama-server's
editor and OpenAI endpoints over a build's runtime library (docs/SERVE.md).

FastAPI + uvicorn serve HTTP; pydantic models validate the requests (unknown fields are
ignored, as llama-server does, so editor plugins that send extra options work unchanged);
sse-starlette frames the streams. The engine (``serve.engine``) holds the model, the slots and
their prompt caches.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from pathlib import Path
from typing import Any, Literal, Union

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from ditto_core.base.errors import DittoError, OptionValueError
from ditto_core.runtime.runtime_api import Model, RuntimeAPIError, open_build
from .engine import (SAMPLERS, BadRequest, Busy, Engine, GenParams, Result,
                     is_runtime_input_error)

#: llama-server's default logical batch (``-b 2048``), which sizes the parts of its FIM prompt
#: (Server.infill_prompt).
FIM_BATCH = 2048

#: FIM control tokens by their text (Qwen2.5-Coder's names), for model files without FIM records.
FIM_TEXTS = {"pre": "<|fim_prefix|>", "suf": "<|fim_suffix|>", "mid": "<|fim_middle|>",
             "rep": "<|repo_name|>", "sep": "<|file_sep|>"}

#: llama-server's fallback when a model has no chat template: ChatML.
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class ApiError(Exception):
    """An error answered as OpenAI's error object with this HTTP status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_


# ---------------------------------------------------------------------------- request models

#: the largest n_predict / max_tokens llama-server takes (its int32 field)
INT32_MAX = 2**31 - 1


class _Req(BaseModel):
    # JSON's Infinity and NaN (Python's json reads them) are refused as any other bad value
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


#: llama-server sampling options Ditto does not implement, with the value that turns each off:
#: a request may send them at that value (clients send defaults), any other value is refused.
UNSUPPORTED_NEUTRAL: dict[str, Any] = {
    "typical_p": 1.0, "mirostat": 0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
    "top_n_sigma": -1.0, "dynatemp_range": 0.0, "n_probs": 0, "grammar": "",
    "json_schema": None, "logit_bias": None, "n_discard": 0, "logprobs": None,
    "top_logprobs": None, "response_format": None, "tools": None, "functions": None,
    "best_of": 1}

#: The names (llama-server's aliases included) of the samplers Ditto runs, to their canonical
#: name (engine.SAMPLERS). llama-server's other samplers (dry, typ_p, top_n_sigma, xtc: no-ops
#: at the neutral values above; infill) are accepted in ``samplers`` and not run
#: (docs/SERVE.md "Sampling").
SAMPLER_NAMES = {"penalties": "penalties", "top_k": "top_k", "top-k": "top_k", "topk": "top_k",
                 "top_p": "top_p", "top-p": "top_p", "topp": "top_p", "nucleus": "top_p",
                 "min_p": "min_p", "min-p": "min_p", "minp": "min_p",
                 "temperature": "temperature", "temp": "temperature"}


def _neutral(name: str, value: Any, neutral: Any) -> bool:
    if value is None or value == neutral:
        return True
    if name in ("logit_bias", "json_schema", "response_format", "grammar", "tools",
                "functions"):
        if name == "response_format" and isinstance(value, dict):
            return value.get("type", "text") == "text"
        return not value  # empty list / object / string
    if name == "top_n_sigma":
        return isinstance(value, (int, float)) and value <= 0
    if name == "logprobs":
        return value is False or value == 0
    return False


def check_unsupported(body: BaseModel) -> None:
    """Refuse (400, naming the field) a llama-server / OpenAI sampling option that Ditto does
    not implement, sent with a value other than the one that turns it off."""
    extra = body.model_extra or {}
    for name, neutral in UNSUPPORTED_NEUTRAL.items():
        if name in extra and not _neutral(name, extra[name], neutral):
            raise ApiError(400, f"{name}: not supported by ditto serve (only {neutral!r}, "
                                f"which turns it off, is accepted; got {extra[name]!r})")


def sampler_names(samplers: Any) -> tuple[str, ...] | None:
    """llama-server's ``samplers`` (a list of names, or a string of its one-letter codes) as
    the canonical names Ditto runs (SAMPLER_NAMES); None when not given. Raises ApiError for
    a sampler Ditto cannot run that changes the result (adaptive_p)."""
    if samplers is None:
        return None
    chars = {"k": "top_k", "p": "top_p", "m": "min_p", "t": "temperature", "e": "penalties",
             "d": "dry", "y": "typ_p", "s": "top_n_sigma", "x": "xtc", "i": "infill",
             "a": "adaptive_p"}
    if isinstance(samplers, str):
        names = [chars.get(c, c) for c in samplers]
    elif isinstance(samplers, list) and all(isinstance(n, str) for n in samplers):
        names = [n.lower() for n in samplers]
    else:
        raise ApiError(400, "samplers: expected a list of sampler names or a string of "
                            f"sampler letters, got {samplers!r}")
    out = []
    for n in names:
        if n in SAMPLER_NAMES:
            out.append(SAMPLER_NAMES[n])
        elif n in ("adaptive_p", "adaptive-p", "adaptivep"):
            raise ApiError(400, "samplers: adaptive_p is not supported by ditto serve")
        # other names: samplers not run here, or unknown to llama-server too (it skips them)
    return tuple(out)


class CompletionParams(_Req):
    """Options of /completion and /infill (llama-server's names and defaults)."""

    model_config = ConfigDict(extra="allow")  # unknown fields ignored, as llama-server does

    n_predict: StrictInt = -1
    #: read when n_predict is not given (llama-server takes max_tokens as its fallback)
    max_tokens: Union[StrictInt, None] = None
    temperature: float = Field(0.8, ge=0)
    top_k: StrictInt = 40
    top_p: float = Field(0.95, gt=0, le=1)
    min_p: float = Field(0.05, ge=0, le=1)
    repeat_penalty: float = Field(1.0, gt=0)
    repeat_last_n: StrictInt = Field(64, ge=-1)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    samplers: Union[list[str], str, None] = None
    seed: StrictInt = -1
    stop: Union[list[str], str, None] = None
    n_indent: StrictInt = Field(0, ge=0)
    t_max_prompt_ms: float = Field(0, ge=0)
    t_max_predict_ms: float = Field(0, ge=0)
    cache_prompt: StrictBool = True
    stream: StrictBool = False
    response_fields: Union[list[str], None] = None
    id_slot: StrictInt = -1
    return_tokens: StrictBool = False
    ignore_eos: StrictBool = False


class CompletionRequest(CompletionParams):
    #: one prompt (text, token ids, or a mix) or, as llama-server reads it, several: a list
    #: without a token id at its top level, each element a text or a list of ids and texts
    prompt: Union[str, list[Union[StrictInt, str, list[Union[StrictInt, str]]]]]


class ExtraChunk(_Req):
    filename: str = "tmp"
    text: str  # required, as llama-server requires it


class InfillRequest(CompletionParams):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = []
    prompt: str = ""


class TokenizeRequest(_Req):
    content: str
    add_special: StrictBool = False
    parse_special: StrictBool = True
    with_pieces: StrictBool = False


class DetokenizeRequest(_Req):
    tokens: list[StrictInt] = []


class StreamOptions(_Req):
    include_usage: StrictBool = False


class OAIParams(_Req):
    """Options shared by the OpenAI endpoints."""

    model_config = ConfigDict(extra="allow")  # unknown fields ignored, as llama-server does

    model: Union[str, None] = None
    max_tokens: Union[StrictInt, None] = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: StrictInt = 0
    min_p: float = Field(0.0, ge=0, le=1)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repeat_penalty: float = Field(1.0, gt=0)
    repeat_last_n: StrictInt = Field(64, ge=-1)
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: Union[StreamOptions, None] = None
    stop: Union[list[str], str, None] = None
    seed: Union[StrictInt, None] = None
    cache_prompt: StrictBool = True


class OAICompletionRequest(OAIParams):
    #: one prompt (a text or token ids) or several (texts, or lists of token ids)
    prompt: Union[str, list[StrictInt], list[str], list[list[StrictInt]]]
    suffix: Union[str, None] = None
    echo: StrictBool = False


class ContentPart(_Req):
    type: str = "text"
    text: Union[str, None] = None  # required for a text part (checked in chat_prompt)


class ChatMessage(_Req):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[ContentPart], None] = None
    #: an assistant turn's tool calls (OpenAI's shape): read only to refuse them by name
    tool_calls: Union[list[Any], None] = None


class ChatRequest(OAIParams):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Union[StrictInt, None] = None


# -------------------------------------------------------------------------------- the server

class Server:
    """The model, its engine and the request → prompt logic of every endpoint."""

    def __init__(self, build: Path, model: Model, engine: Engine, alias: str,
                 api_key: str | None = None):
        self.build, self.model, self.engine = build, model, engine
        self.alias, self.api_key = alias, api_key
        # the FIM tokens recorded at export; by their text in a file without those records
        roles = {"pre": "prefix", "suf": "suffix", "mid": "middle", "rep": "repo", "sep": "sep"}
        self.fim = {k: model.fim_token(r) for k, r in roles.items()}
        if any(self.fim[k] < 0 for k in ("pre", "suf", "mid")):
            self.fim = {k: model.find_token(t) for k, t in FIM_TEXTS.items()}
        self.created = int(time.time())
        from ditto_core.model.modelfile import ModelFile

        with ModelFile(model.path, verify=False) as mf:
            spec = mf.tokenizer
        self.chat_template = spec.chat_template or ""
        self.special = {}
        for name in ("bos", "eos", "unk", "pad"):
            tid = getattr(spec, f"{name}_id")
            if tid >= 0:
                self.special[f"{name}_token"] = bytes(spec.tokens[tid]).decode("utf-8",
                                                                                "replace")

    # -- prompts -----------------------------------------------------------------------------
    def tokens_of(self, text: str, *, bos: bool = False, special: bool = False) -> list[int]:
        """User text → ids; control-token texts in it stay plain text unless ``special`` (a
        raw /completion prompt, which llama-server tokenizes with them parsed)."""
        return self.model.tokenize(text, add_bos=bos and self.model.info["add_bos"],
                                   parse_special=special)

    def completion_prompts(self, prompt) -> list[list[int]]:
        """/completion's prompts as llama-server splits them: a list holding no token id at
        its top level is several prompts (each a text, ids, or a mix), anything else one. Of
        several, every one is checked (``check_prompt``) before any runs, and an error names
        the one at fault, ``prompt.K``."""
        if isinstance(prompt, list) and prompt and not any(isinstance(p, int) for p in prompt):
            out = []
            for k, p in enumerate(prompt):
                try:
                    out.append(self.completion_prompt(p))
                    self.check_prompt(out[-1])
                except ApiError as exc:
                    msg = exc.message.removeprefix("prompt: ")
                    raise ApiError(exc.status, f"prompt.{k}: {msg}", exc.type) from None
            return out
        if isinstance(prompt, list) and any(isinstance(p, list) for p in prompt):
            raise ApiError(400, "prompt: a list of token ids cannot also hold lists")
        return [self.completion_prompt(prompt)]

    def completion_prompt(self, prompt) -> list[int]:
        """/completion's (and /v1/completions') prompt: text, ids, or a mix (BOS first when
        the model wants it and the prompt starts with text). Control-token texts in it are
        parsed, as llama-server's prompts are: the client wrote the whole prompt, template
        included."""
        if isinstance(prompt, str):
            parts = [prompt]
        else:
            parts = list(prompt)
        if not parts or parts == [""]:
            raise ApiError(400, "prompt is empty")
        ids: list[int] = []
        for k, p in enumerate(parts):
            if isinstance(p, str):
                ids += self.tokens_of(p, bos=(k == 0), special=True)
            else:
                if not 0 <= p < self.model.vocab_size:
                    raise ApiError(400, f"prompt: token id {p} is out of range "
                                        f"(vocab {self.model.vocab_size})")
                ids.append(p)
        if not ids:
            raise ApiError(400, "prompt is empty (0 tokens)")
        return ids

    def has_fim(self) -> bool:
        return all(self.fim[k] >= 0 for k in ("pre", "suf", "mid"))

    def infill_prompt(self, prefix: str, suffix: str, extra: list, prompt: str,
                      n_predict: int) -> list[int]:
        """The FIM prompt: [repo-level extra context] <FIM_PRE> prefix <FIM_SUF> suffix
        <FIM_MID> prompt. With <|repo_name|> and <|file_sep|> in the vocabulary the extra
        chunks are laid out as files of a repository (Qwen2.5-Coder's repo-level format), else
        their text goes first as is. The parts are cut as llama-server cuts them
        (format_prompt_infill, with its default batch of FIM_BATCH tokens): the prefix keeps
        its last 3/4 · FIM_BATCH tokens, the suffix its first FIM_BATCH/4 - 2 - len(prompt),
        the extra context its last n_ctx - FIM_BATCH + 2. When that is still more than the
        context holds (with room for min(n_predict, n_ctx/4) tokens to generate), the extra
        context goes first, then the prefix and the suffix share the room 3:1."""
        if not self.has_fim():
            raise ApiError(400, "this model has no FIM tokens (<|fim_prefix|>, <|fim_suffix|>, "
                                "<|fim_middle|>): /infill and suffix are not supported")
        f = self.fim
        extra_ids: list[int] = []
        repo = f["rep"] >= 0 and f["sep"] >= 0
        if repo:
            extra_ids += [f["rep"]] + self.tokens_of("myproject\n")
        for ch in extra:
            if repo:
                extra_ids += [f["sep"]] + self.tokens_of(ch.filename + "\n")
            extra_ids += self.tokens_of(ch.text)
        if repo:
            extra_ids += [f["sep"]] + self.tokens_of("filename\n")
        pre, suf, mid = self.tokens_of(prefix), self.tokens_of(suffix), self.tokens_of(prompt)
        n_ctx = self.engine.n_ctx
        reserve = min(n_predict if n_predict > 0 else 256, n_ctx // 4)
        bos = [self.model.info["bos_id"]] if (self.model.info["add_bos"]
                                              and self.model.info["bos_id"] >= 0) else []
        room = n_ctx - 1 - reserve - len(bos) - 3 - len(mid)
        if room < 0:
            raise ApiError(400, f"prompt: {len(mid)} tokens leave no room in the context of "
                                f"{n_ctx}")
        pre = pre[max(0, len(pre) - 3 * (FIM_BATCH // 4)):]
        suf = suf[:max(0, FIM_BATCH // 4 - (2 + len(mid)))]
        extra_ids = extra_ids[max(0, len(extra_ids) - max(0, n_ctx - FIM_BATCH + 2)):]
        n_suf = min(len(suf), room // 4)
        n_pre = min(len(pre), room - n_suf)
        n_suf = min(len(suf), room - n_pre)
        pre, suf = pre[len(pre) - n_pre:], suf[:n_suf]
        n_extra = min(len(extra_ids), room - n_pre - n_suf)
        extra_ids = extra_ids[len(extra_ids) - n_extra:] if n_extra > 0 else []
        return (bos + extra_ids + [f["pre"]] + pre + [f["suf"]] + suf + [f["mid"]] + mid)

    def chat_prompt(self, messages: list[ChatMessage]) -> list[int]:
        """The model's chat template (ChatML when it has none) rendered with jinja2 as
        transformers does, for ``messages`` and the generation prompt. The template's own text
        is tokenized with control tokens parsed, each message's content without."""
        from ditto_core.text.chat_template import _environment

        contents = []
        for k, msg in enumerate(messages):
            c = msg.content
            if msg.tool_calls:  # with or without content: the template would drop them
                raise ApiError(400, f"messages.{k}.tool_calls: tool calls are not supported by "
                                    "ditto serve")
            if c is None:  # as llama-server: only a message with tool calls may leave it out
                raise ApiError(400, f"messages.{k}: missing 'content'")
            if isinstance(c, list):
                for j, part in enumerate(c):
                    if part.type != "text":
                        raise ApiError(400, f"messages.{k}.content: a {part.type!r} part: only "
                                            "text parts are supported by ditto serve")
                    if part.text is None:
                        raise ApiError(400, f"messages.{k}.content.{j}.text: Field required")
                c = "".join(part.text for part in c)
            contents.append(c)
        marks = [f"\x00ditto-message-{k}-{uuid.uuid4().hex}\x00" for k in range(len(messages))]
        # llama-server renders OpenAI's 'developer' role as 'system' for every template but
        # GPT-OSS's (the one that knows it; its text has <|channel|>), as common/chat.cpp does
        developer = "developer" if "<|channel|>" in (self.chat_template or "") else "system"
        msgs = [{"role": developer if m.role == "developer" else m.role, "content": mk}
                for m, mk in zip(messages, marks)]
        try:
            text = _environment().from_string(self.chat_template or CHATML).render(
                messages=msgs, tools=None, documents=None, add_generation_prompt=True,
                **self.special)
        except Exception as exc:  # jinja2 errors, raise_exception() of the template
            raise ApiError(400, f"messages: the chat template cannot render them: {exc}")
        ids: list[int] = []
        pos = 0
        for k, (mk, content) in enumerate(zip(marks, contents)):
            i = text.find(mk, pos)
            if i < 0:
                raise ApiError(400, f"messages.{k}: this model's chat template does not "
                                    f"render the {messages[k].role!r} message in its place")
            ids += self.model.tokenize(text[pos:i], parse_special=True)
            ids += self.model.tokenize(content, parse_special=False)
            pos = i + len(mk)
        ids += self.model.tokenize(text[pos:], parse_special=True)
        return ids

    # -- generation ----------------------------------------------------------------------------
    def check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ApiError(400, "prompt is empty (0 tokens)")
        if len(ids) >= self.engine.n_ctx:
            raise ApiError(400, f"the prompt has {len(ids)} tokens but the context holds "
                                f"{self.engine.n_ctx} (--ctx); shorten it")

    async def run(self, request, ids: list[int], params: GenParams, on_chunk=None) -> Result | None:
        """Generate for ``ids``: wait for a slot, then collect the events (``on_chunk(text,
        ids, id_slot)`` awaited for each piece when streaming). Returns the Result, or None when the
        client went away (generation cancelled)."""
        self.check_prompt(ids)
        try:
            slot = await self.engine.acquire(ids, params.id_slot)
        except Busy as exc:
            raise ApiError(503, str(exc), "unavailable_error") from None
        except BadRequest as exc:
            raise ApiError(400, str(exc)) from None
        q: asyncio.Queue = asyncio.Queue()
        cancel = self.engine.start(slot, ids, params, q.put_nowait)
        checked = time.monotonic()
        try:
            while True:
                try:
                    ev = await asyncio.wait_for(q.get(), 0.1)
                except asyncio.TimeoutError:
                    ev = None
                # a non-streamed request learns of a closed connection only by asking; a
                # stream's task is cancelled by sse-starlette instead
                if on_chunk is None and time.monotonic() - checked >= 0.1:
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        cancel.set()
                        return None
                if ev is None:
                    continue
                if ev[0] == "chunk":
                    if on_chunk is not None:
                        await on_chunk(ev[1], ev[2], slot.id)
                elif ev[0] == "done":
                    return ev[1]
                else:
                    exc = ev[1]
                    if is_runtime_input_error(exc):
                        raise ApiError(400, str(exc))
                    raise ApiError(500, f"generation failed: {exc}", "server_error")
        finally:
            cancel.set()  # a client that went away (or an error) stops the generation

    def gen_params(self, p: CompletionParams) -> GenParams:
        name, n_predict = "n_predict", p.n_predict
        if "n_predict" not in p.model_fields_set and p.max_tokens is not None:
            name, n_predict = "max_tokens", p.max_tokens
        if n_predict < -1:
            raise ApiError(400, f"{name} must be -1 (no limit), 0 (evaluate the prompt "
                                f"only) or positive, got {n_predict}")
        if n_predict > INT32_MAX:
            raise ApiError(400, f"{name} must be at most {INT32_MAX}, got {n_predict}")
        check_unsupported(p)
        stop = [p.stop] if isinstance(p.stop, str) else list(p.stop or [])
        return GenParams(n_predict=n_predict, temperature=p.temperature, top_k=p.top_k,
                         top_p=p.top_p, min_p=p.min_p, repeat_penalty=p.repeat_penalty,
                         repeat_last_n=p.repeat_last_n, presence_penalty=p.presence_penalty,
                         frequency_penalty=p.frequency_penalty,
                         samplers=sampler_names(p.samplers),
                         seed=p.seed, stop=tuple(stop), n_indent=p.n_indent,
                         t_max_prompt_ms=p.t_max_prompt_ms, t_max_predict_ms=p.t_max_predict_ms,
                         cache_prompt=p.cache_prompt, ignore_eos=p.ignore_eos,
                         id_slot=p.id_slot)

    def oai_params(self, p: OAIParams, max_tokens: int | None,
                   name: str = "max_tokens") -> GenParams:
        if p.n != 1:
            raise ApiError(400, f"n: only 1 choice is supported, got {p.n}")
        if max_tokens is not None and max_tokens < 1:
            raise ApiError(400, f"{name} must be at least 1, got {max_tokens}")
        if max_tokens is not None and max_tokens > INT32_MAX:
            raise ApiError(400, f"{name} must be at most {INT32_MAX}, got {max_tokens}")
        check_unsupported(p)
        stop = [p.stop] if isinstance(p.stop, str) else list(p.stop or [])
        return GenParams(n_predict=max_tokens if max_tokens is not None else -1,
                         temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                         min_p=p.min_p, repeat_penalty=p.repeat_penalty,
                         repeat_last_n=p.repeat_last_n, presence_penalty=p.presence_penalty,
                         frequency_penalty=p.frequency_penalty,
                         seed=p.seed if p.seed is not None and p.seed >= 0 else -1,
                         stop=tuple(stop), cache_prompt=p.cache_prompt)

    def settings(self, params: GenParams | None) -> dict:
        p = params or GenParams()
        return {"n_ctx": self.engine.n_ctx, "model": self.alias,
                "params": {"n_predict": p.n_predict, "seed": p.seed,
                           "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p,
                           "min_p": p.min_p, "repeat_penalty": p.repeat_penalty,
                           "repeat_last_n": p.repeat_last_n,
                           "presence_penalty": p.presence_penalty,
                           "frequency_penalty": p.frequency_penalty,
                           "samplers": list(p.samplers) if p.samplers is not None
                           else list(SAMPLERS),
                           "stop": list(p.stop), "n_indent": p.n_indent,
                           "ignore_eos": p.ignore_eos, "t_max_prompt_ms": p.t_max_prompt_ms,
                           "t_max_predict_ms": p.t_max_predict_ms,
                           "cache_prompt": p.cache_prompt},
                "speculative": self.engine.spec != "none"}

    def completion_body(self, res: Result, params: GenParams, ids: list[int],
                        return_tokens: bool) -> dict:
        return {"index": 0, "content": res.content,
                "tokens": list(res.tokens) if return_tokens else [],
                "id_slot": res.id_slot, "stop": True, "model": self.alias,
                "tokens_predicted": len(res.tokens), "tokens_evaluated": len(ids),
                "generation_settings": self.settings(params),
                "prompt": self.model.detokenize(ids, show_special=True),
                "has_new_line": "\n" in res.content, "truncated": res.truncated,
                "stop_type": "limit" if res.stop_type == "cancelled" else res.stop_type,
                "stopping_word": res.stopping_word, "tokens_cached": res.tokens_cached,
                "timings": res.timings}


def select_fields(body: dict, fields: list[str] | None) -> dict:
    """llama-server's ``response_fields``: only the named fields; "a/b" takes body["a"]["b"]
    and names it "a/b". Missing fields are left out."""
    if not fields:
        return body
    out = {}
    for f in fields:
        cur: Any = body
        for part in f.split("/"):
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            else:
                break
        else:
            out[f] = cur
    return out


#: next_piece's answer once the run has finished and everything it put out was taken
RUN_DONE = object()


async def next_piece(out: asyncio.Queue, task: asyncio.Future) -> Any:
    """The next piece a streamed run put on ``out`` (its ``on_chunk`` callback), waiting for
    one while ``task`` (the run) goes on; ``RUN_DONE`` once the task has finished and ``out``
    is empty (the task's result or error is then ``task.result()``). The waiting getter never
    outlives the call, also when the caller is cancelled (a client gone)."""
    if not out.empty():
        return out.get_nowait()
    if task.done():
        return RUN_DONE
    getter = asyncio.ensure_future(out.get())
    try:
        await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not getter.done():
            getter.cancel()
    if getter.done() and not getter.cancelled():
        return getter.result()
    return out.get_nowait() if not out.empty() else RUN_DONE


def finish_reason(res: Result) -> str:
    return "length" if res.stop_type == "limit" else "stop"


def error_body(status: int, message: str, type_: str) -> dict:
    return {"error": {"code": status, "message": message, "type": type_}}


def create_app(server: Server):
    """The ASGI application of ``server`` (every endpoint of docs/SERVE.md): the FastAPI app
    (its ``fastapi`` attribute) under the middleware (CORS, the API key, JSON bodies)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse
    from sse_starlette.sse import EventSourceResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        server.engine.close()  # cancels what still runs, stops the slot workers

    app = FastAPI(title="ditto serve", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return JSONResponse(error_body(exc.status, exc.message, exc.type),
                            status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request, exc: RequestValidationError):
        msgs = []
        for e in exc.errors():
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
            if e.get("type") == "json_invalid":
                msgs.append(f"the body is not valid JSON: {e.get('ctx', {}).get('error', '')}")
            else:
                msgs.append(f"{loc or 'body'}: {e.get('msg')}")
        return JSONResponse(error_body(400, "; ".join(msgs), "invalid_request_error"),
                            status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):
        cause = exc.__cause__
        if isinstance(cause, UnicodeDecodeError):  # FastAPI's body reading: name the bytes
            return JSONResponse(error_body(
                400, f"the body is not valid UTF-8: {cause.reason} (byte "
                     f"0x{cause.object[cause.start]:02x} at offset {cause.start})",
                "invalid_request_error"), status_code=400)
        return JSONResponse(error_body(exc.status_code, str(exc.detail),
                                       "not_found_error" if exc.status_code == 404
                                       else "invalid_request_error"),
                            status_code=exc.status_code)

    @app.exception_handler(RuntimeAPIError)
    async def _runtime_error(request, exc: RuntimeAPIError):
        # user input the runtime refuses (text that is not valid Unicode ...) is the client's
        if is_runtime_input_error(exc):
            return JSONResponse(error_body(400, str(exc), "invalid_request_error"),
                                status_code=400)
        return JSONResponse(error_body(500, f"runtime error: {exc}", "server_error"),
                            status_code=500)

    @app.exception_handler(Exception)
    async def _internal_error(request, exc: Exception):
        # a bug: still OpenAI's error object, so that clients can show the message
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}: {exc}",
                                       "server_error"), status_code=500)

    # -- plain endpoints -------------------------------------------------------------------
    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        return {"status": "ok"}

    @app.get("/props")
    async def props():
        return {"default_generation_settings": server.settings(None),
                "total_slots": len(server.engine.slots),
                "model_path": str(server.model.path), "model_alias": server.alias,
                "chat_template": server.chat_template,
                # the BOS and EOS texts, as llama-server's /props gives them
                **{k: server.special[k] for k in ("bos_token", "eos_token")
                   if k in server.special},
                "modalities": {"vision": False, "audio": False},
                "build_info": f"ditto serve; kernel {server.model.info['kernel']}",
                "infill": server.has_fim(),
                "speculative": {"type": server.engine.spec, "n_max": server.engine.spec_k,
                                "batch_exact": server.engine.batch_exact,
                                "verify_cost_per_draft": server.engine.verify_cost}}

    @app.get("/slots")
    async def slots():
        return [{"id": s.id, "n_ctx": s.n_ctx, "is_processing": s.busy,
                 "speculative": server.engine.spec != "none", "n_cached": len(s.tokens),
                 "n_requests": s.n_requests,
                 "params": server.settings(s.params)["params"]} for s in server.engine.slots]

    @app.get("/metrics")
    async def metrics():
        e = server.engine
        m = dict(e.metrics)
        busy = sum(s.busy for s in e.slots)
        rows = [
            ("prompt_tokens_total", "counter", "Number of prompt tokens processed.",
             m["prompt_tokens_total"]),
            ("prompt_seconds_total", "counter", "Prompt process time in seconds.",
             m["prompt_seconds_total"]),
            ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
             m["prompt_tokens_total"] / m["prompt_seconds_total"]
             if m["prompt_seconds_total"] else 0.0),
            ("tokens_predicted_total", "counter", "Number of generation tokens processed.",
             m["tokens_predicted_total"]),
            ("tokens_predicted_seconds_total", "counter", "Predict process time in seconds.",
             m["tokens_predicted_seconds_total"]),
            ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
             m["tokens_predicted_total"] / m["tokens_predicted_seconds_total"]
             if m["tokens_predicted_seconds_total"] else 0.0),
            ("requests_processing", "gauge", "Number of requests processing.", busy),
            ("requests_deferred", "gauge", "Number of requests waiting for a slot.", e.waiting),
            ("requests_total", "counter", "Number of generation requests started.",
             m["requests_total"]),
            ("n_tokens_max", "counter", "Largest prompt seen, in tokens.", m["n_tokens_max"]),
            ("n_decode_total", "counter", "Number of evaluation calls.", m["n_decode_total"]),
            ("spec_decode_num_drafts_total", "counter", "Speculative verification steps.",
             m["spec_drafts_total"]),
            ("spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.",
             m["spec_draft_tokens_total"]),
            ("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
             m["spec_accepted_tokens_total"]),
        ]
        lines = []
        for name, kind, help_, value in rows:
            lines += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {kind}",
                      f"llamacpp:{name} {value}"]
        return PlainTextResponse("\n".join(lines) + "\n",
                                 media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        try:
            # add_special adds what the vocabulary adds (llama_tokenize): BOS only where the
            # model's add_bos is set (not Qwen2.5's)
            ids = server.model.tokenize(req.content,
                                        add_bos=req.add_special and server.model.info["add_bos"],
                                        parse_special=req.parse_special)
        except RuntimeAPIError as exc:
            raise ApiError(400, f"content: {exc}") from None
        if not req.with_pieces:
            return {"tokens": ids}
        out = []
        for t in ids:
            b = server.model.piece(t)
            try:
                piece: Any = b.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(b)
            out.append({"id": t, "piece": piece})
        return {"tokens": out}

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        try:
            # control tokens as their text, as llama-server's /detokenize (and transformers'
            # decode) give them
            return {"content": server.model.detokenize(req.tokens, show_special=True)}
        except RuntimeAPIError as exc:
            raise ApiError(400, f"tokens: {exc}") from None

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        info = server.model.info
        return {"object": "list", "data": [{
            "id": server.alias, "object": "model", "created": server.created,
            "owned_by": "ditto",
            "meta": {"n_vocab": info["vocab_size"], "n_ctx_train": info["max_seq_len"],
                     "n_embd": info["dim"], "size": server.model.path.stat().st_size}}]}

    # -- llama-server completion endpoints --------------------------------------------------
    async def llama_completion(request, prompts: list[list[int]], req: CompletionParams,
                               params: GenParams):
        """One result per prompt, run one after the other (``index``: the prompt's place); a
        single prompt answers an object, several a list, as llama-server does."""
        if not req.stream:
            bodies = []
            for k, ids in enumerate(prompts):
                res = await server.run(request, ids, params)
                if res is None:
                    return JSONResponse({}, status_code=499)
                body = server.completion_body(res, params, ids, req.return_tokens)
                body["index"] = k
                bodies.append(select_fields(body, req.response_fields))
            return bodies[0] if len(prompts) == 1 else bodies
        for ids in prompts:  # a bad prompt is a 400, not an error event of the stream
            server.check_prompt(ids)

        async def events():
            for k, ids in enumerate(prompts):
                failed: list = []
                async for ev in prompt_events(k, ids, failed):
                    yield ev
                if failed:  # an error event ends the stream
                    return

        async def prompt_events(index, ids, failed):
            out: asyncio.Queue = asyncio.Queue()

            async def on_chunk(text, tok_ids, id_slot):
                await out.put({"index": index, "content": text, "tokens": list(tok_ids),
                               "stop": False, "id_slot": id_slot})

            task = asyncio.ensure_future(server.run(request, ids, params, on_chunk))
            try:
                while (piece := await next_piece(out, task)) is not RUN_DONE:
                    yield {"data": json.dumps(piece)}
                try:
                    res = task.result()
                except ApiError as exc:
                    failed.append(exc)
                    yield {"data": json.dumps(error_body(exc.status, exc.message, exc.type))}
                    return
                body = server.completion_body(res, params, ids, req.return_tokens)
                body["content"], body["index"] = "", index
                yield {"data": json.dumps(select_fields(body, req.response_fields))}
            finally:  # a stream closed early (client gone) leaves no task pending
                task.cancel()

        return EventSourceResponse(events(), sep="\n")

    @app.post("/completion")
    @app.post("/completions")
    async def completion(req: CompletionRequest, request: Request):
        params = server.gen_params(req)
        prompts = server.completion_prompts(req.prompt)
        return await llama_completion(request, prompts, req, params)

    @app.post("/infill")
    async def infill(req: InfillRequest, request: Request):
        params = server.gen_params(req)
        ids = server.infill_prompt(req.input_prefix, req.input_suffix, req.input_extra,
                                   req.prompt, req.n_predict)
        return await llama_completion(request, [ids], req, params)

    # -- OpenAI endpoints ------------------------------------------------------------------
    async def oai(request, prompts: list[list[int]], params: GenParams, stream: bool,
                  include_usage: bool, chat: bool):
        """OpenAI's response to ``prompts`` (one for chat; for /v1/completions one or more,
        each its own choice, ``index`` K, run one after the other, as llama-server answers a
        list of prompts)."""
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion" if chat else "text_completion"

        def usage(results):
            n_prompt = sum(len(ids) for ids in prompts[:len(results)])
            n_gen = sum(len(res.tokens) for res in results)
            return {"prompt_tokens": n_prompt, "completion_tokens": n_gen,
                    "total_tokens": n_prompt + n_gen}

        def choice(text, fr, index=0, delta=False):
            if chat:
                key = "delta" if delta else "message"
                msg = {"content": text} if delta else {"role": "assistant", "content": text}
                return {"index": index, key: msg, "logprobs": None, "finish_reason": fr}
            return {"index": index, "text": text, "logprobs": None, "finish_reason": fr}

        if not stream:
            results = []
            for ids in prompts:
                res = await server.run(request, ids, params)
                if res is None:
                    return JSONResponse({}, status_code=499)
                results.append(res)
            body = {"id": cid, "object": obj, "created": int(time.time()),
                    "model": server.alias, "system_fingerprint": "ditto",
                    "choices": [choice(res.content, finish_reason(res), k)
                                for k, res in enumerate(results)],
                    "usage": usage(results)}
            if len(results) == 1:
                body["timings"] = results[0].timings
            return body
        for ids in prompts:
            server.check_prompt(ids)
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices, **kw):
            return {"data": json.dumps({"id": cid, "object": chunk_obj,
                                        "created": int(time.time()), "model": server.alias,
                                        "system_fingerprint": "ditto", "choices": choices,
                                        **kw})}

        async def events():
            out: asyncio.Queue = asyncio.Queue()

            async def on_chunk(text, _ids, _slot):
                await out.put(text)

            if chat:
                yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}])
            results = []
            for k, ids in enumerate(prompts):
                task = asyncio.ensure_future(server.run(request, ids, params, on_chunk))
                try:
                    while (piece := await next_piece(out, task)) is not RUN_DONE:
                        yield chunk([choice(piece, None, k, delta=True)])
                    try:
                        res = task.result()
                    except ApiError as exc:
                        yield {"data": json.dumps(error_body(exc.status, exc.message,
                                                             exc.type))}
                        return
                finally:  # a stream closed early (client gone) leaves no task pending
                    task.cancel()
                results.append(res)
                if chat:
                    yield chunk([{"index": 0, "delta": {}, "logprobs": None,
                                  "finish_reason": finish_reason(res)}])
                else:
                    yield chunk([choice("", finish_reason(res), k)])
            if include_usage:
                yield chunk([], usage=usage(results))
            yield {"data": "[DONE]"}

        return EventSourceResponse(events(), sep="\n")

    @app.post("/v1/completions")
    async def v1_completions(req: OAICompletionRequest, request: Request):
        params = server.oai_params(req, req.max_tokens if req.max_tokens is not None else 16)
        if req.echo:
            raise ApiError(400, "echo: not supported")
        prompt = req.prompt
        # several prompts (texts, or lists of token ids) are several choices, as llama-server
        several = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)
        prompts = list(prompt) if several else [prompt]
        prompts_ids = []
        for k, p in enumerate(prompts):
            try:
                if req.suffix is not None:
                    if not isinstance(p, str):
                        raise ApiError(400, "suffix needs a text prompt")
                    ids = server.infill_prompt(p, req.suffix, [], "", params.n_predict)
                else:
                    ids = server.completion_prompt(p)
                    if several:
                        server.check_prompt(ids)
            except ApiError as exc:
                if not several:
                    raise
                msg = exc.message.removeprefix("prompt: ")
                raise ApiError(exc.status, f"prompt.{k}: {msg}", exc.type) from None
            prompts_ids.append(ids)
        inc = bool(req.stream_options and req.stream_options.include_usage)
        return await oai(request, prompts_ids, params, req.stream, inc, chat=False)

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def v1_chat(req: ChatRequest, request: Request):
        named = "max_completion_tokens" if req.max_completion_tokens is not None \
            else "max_tokens"
        params = server.oai_params(req, getattr(req, named), named)
        ids = server.chat_prompt(req.messages)
        inc = bool(req.stream_options and req.stream_options.include_usage)
        return await oai(request, [ids], params, req.stream, inc, chat=True)

    from starlette.middleware.cors import CORSMiddleware

    outer = JsonBody(app)
    if server.api_key is not None:
        outer = ApiKeyAuth(outer, server.api_key)
    # outermost, as llama-server: a browser's preflight is answered before the key is asked
    # for, and every response (a 401 too) carries Access-Control-Allow-Origin
    asgi = CORSMiddleware(outer, allow_origins=["*"], allow_methods=["GET", "POST"],
                          allow_headers=["*"])
    asgi.fastapi = app  # the routes and their OpenAPI description, under the middleware
    return asgi


class ApiKeyAuth:
    """ASGI middleware: every request but OPTIONS and /health carries ``key`` as ``Authorization:
    Bearer KEY`` or ``X-Api-Key: KEY``, else 401 (as llama-server's --api-key). Plain ASGI, not
    Starlette's BaseHTTPMiddleware: that one hides a client's disconnect from the endpoint, so
    a non-streamed generation would run to its end for nobody."""

    def __init__(self, app, key: str):
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send):
        if (scope["type"] == "http" and scope.get("method") != "OPTIONS"
                and scope.get("path") not in ("/health", "/v1/health")):
            headers = {k.lower(): v for k, v in scope.get("headers", [])}
            auth = headers.get(b"authorization", b"")
            given = auth[7:] if auth.lower().startswith(b"bearer ") else headers.get(
                b"x-api-key", b"")
            if not secrets.compare_digest(given, self.key):
                from fastapi.responses import JSONResponse

                await JSONResponse(error_body(401, "Invalid API Key", "authentication_error"),
                                   status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class JsonBody:
    """ASGI middleware: a POST body is read as JSON whatever its Content-Type says (curl -d
    sends form encoding; llama-server reads JSON either way)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") == "POST":
            headers = [(k, v) for k, v in scope.get("headers", []) if k != b"content-type"]
            scope = dict(scope, headers=headers + [(b"content-type", b"application/json")])
        await self.app(scope, receive, send)


# ---------------------------------------------------------------------------- opening a build

def load_server(build: Path, *, ctx: int | None = None, slots: int = 1, threads: int = 0,
                batch: int = 256, api_key: str | None = None, spec: str = "none",
                spec_k: int = 7, spec_cost: float | None = None, max_queue: int = 16,
                alias: str | None = None, cache_type_k: str = "f32",
                cache_type_v: str = "f32") -> Server:
    """Open a build's model through its ``libditto.so`` and make the engine. ``ctx``: positions
    per slot (default: min(4096, max_seq_len)). ``spec_cost``: what a draft token adds to a
    verification, in one-token steps (None: measured at start-up). ``cache_type_k``,
    ``cache_type_v``: the slots' KV cache element types ("f32", "f16"). Raises DittoError for a
    directory that is no build, a build without the library (rebuild), a bad value."""
    model = open_build(build, threads=threads)
    try:
        n_ctx = ctx if ctx else min(4096, model.max_seq_len)
        if not 1 <= n_ctx <= model.max_seq_len:
            raise OptionValueError("--ctx", f"{n_ctx} is not in 1..{model.max_seq_len} (the "
                                            "model's max_seq_len)")
        engine = Engine(model, n_slots=slots, n_ctx=n_ctx, n_batch=batch, max_queue=max_queue,
                        spec=spec, spec_k=spec_k, spec_cost=spec_cost,
                        cache_type_k=cache_type_k, cache_type_v=cache_type_v)
    except BaseException:
        model.close()
        raise
    return Server(Path(build), model, engine, alias or Path(build).resolve().name, api_key)
