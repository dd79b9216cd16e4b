"""A model's Jinja chat template reduced, at export, to the fixed text around one user message.

transformers' ``apply_chat_template(messages, add_generation_prompt=True)`` renders the template
with jinja2 in an ``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with the
``loopcontrols`` extension, a ``tojson`` filter (no HTML escaping), the globals
``raise_exception`` and ``strftime_now``, and the tokenizer's special-token strings
(``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``) as variables
(transformers ``utils/chat_template_utils.py``). ``reduce_chat_template`` does the same with a
single user message twice, once per sentinel text, and keeps the text before and after the
message when both renders agree on it: then ``prefix + message + suffix`` is exactly what the
template gives for any message the template does not inspect (e.g. a default system prompt
inserted when none is given comes out as in transformers). The runtime's ``--chat`` tokenizes
that whole string at once, with special tokens parsed in the template's text only.
"""

from __future__ import annotations

import json
from datetime import datetime

from ditto_core.base.errors import DittoError

#: two user messages that no template rewrites (no surrounding whitespace, no markup)
SENTINELS = ("DittoUserMessageSentinelA7Q", "Second sentinel: 42 + x?")


class ChatTemplateError(DittoError):
    """The chat template cannot be reduced to text around the user message."""


def _environment():
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(template: str, content: str, special_tokens: dict[str, str]) -> str:
    """The template rendered for one user message ``content`` with the generation prompt, as
    transformers' ``apply_chat_template(..., add_generation_prompt=True, tokenize=False)``."""
    env = _environment()
    return env.from_string(template).render(
        messages=[{"role": "user", "content": content}], tools=None, documents=None,
        add_generation_prompt=True, **special_tokens)


def reduce_chat_template(template: str, special_tokens: dict[str, str],
                         where: str) -> tuple[str, str]:
    """``(prefix, suffix)``: the template's text before and after the user message.

    ``special_tokens``: ``bos_token`` etc. as strings (absent ones left out). Raises
    ChatTemplateError naming ``where`` when jinja2 fails on the template, or the message does
    not appear exactly once, or the text around it depends on the message."""
    import jinja2

    parts = []
    for s in SENTINELS:
        try:
            text = render(template, s, special_tokens)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"{where}: chat template: jinja2 cannot render it for one "
                                    f"user message: {exc}") from None
        if text.count(s) != 1:
            raise ChatTemplateError(f"{where}: chat template: the user message appears "
                                    f"{text.count(s)} times in the rendered prompt (Ditto "
                                    f"needs it exactly once, unchanged)")
        parts.append(tuple(text.split(s)))
    if parts[0] != parts[1]:
        raise ChatTemplateError(f"{where}: chat template: the text around the user message "
                                f"depends on the message; Ditto cannot reduce it to a fixed "
                                f"prefix and suffix")
    return parts[0]


def with_chat_text(spec, where: str):
    """``spec`` (TokenizerSpec) with ``chat_prefix`` / ``chat_suffix`` from its
    ``chat_template``; unchanged when there is no template. A template that cannot be reduced
    leaves them None (``ditto-run --chat`` then refuses) and prints a ``warning:`` line on
    stderr with the reason."""
    import sys

    import attrs

    if not spec.chat_template:
        return spec
    special = {}
    for name in ("bos", "eos", "unk", "pad"):
        tid = getattr(spec, f"{name}_id")
        if tid >= 0:
            special[f"{name}_token"] = bytes(spec.tokens[tid]).decode("utf-8", "replace")
    try:
        prefix, suffix = reduce_chat_template(spec.chat_template, special, where)
    except ChatTemplateError as exc:
        print(f"warning: {exc}; --chat will not be available for this model", file=sys.stderr,
              flush=True)
        return spec
    return attrs.evolve(spec, chat_prefix=prefix, chat_suffix=suffix)
