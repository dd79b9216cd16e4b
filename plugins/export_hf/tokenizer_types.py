"""Type checks of an HF directory's tokenizer files before they are converted (docs/INPUTS.md).

``tokenizer.json`` and ``tokenizer_config.json`` are untrusted JSON: every field the converter
(``tokenizer.py``) reads is checked here for its JSON type and range with
``ditto_core.base.untrusted.Fields``, so a wrong-typed field is a DittoError naming the file and the
field, never a TypeError/KeyError in the converter.
"""

from __future__ import annotations

import json
from pathlib import Path

from ditto_core.base.errors import DittoError
from ditto_core.base.untrusted import U32_MAX, Fields

#: tokenizer_config.json keys holding a special token: a string, {"content": str}, or null
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DittoError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise DittoError(f"{path}: not valid JSON: {exc}") from None


def check_tokenizer_json(path: Path) -> None:
    """Raise DittoError ``<path>: <field> ...`` unless the fields of tokenizer.json that Ditto
    reads have their JSON types: ``model`` an object with ``vocab`` {str: id} and ``merges``
    (strings "a b" or [a, b] pairs), ``added_tokens`` objects with an integer ``id`` and a
    string ``content`` (flags true/false); ids in [0, 2^32 - 1]."""
    tj = Fields(_json(path), str(path), "field", "tokenizer")
    model = Fields(tj.mapping("model", {}), str(path), "field 'model' key")
    vocab = model.mapping("vocab", {})
    for text, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= U32_MAX:
            model.fail("vocab", f"must map tokens to ids in [0, {U32_MAX}]; token {text!r} "
                                f"has id {i!r}")
    merges = model.list("merges", (str, list), [])
    for rank, m in enumerate(merges):
        if isinstance(m, list) and (len(m) != 2 or not all(isinstance(x, str) for x in m)):
            model.fail("merges", f"item {rank} must be \"a b\" or a pair of strings", m)
    for k, a in enumerate(tj.list("added_tokens", dict, [])):
        t = Fields(a, str(path), f"field 'added_tokens[{k}]' key")
        t.int("id", lo=0)
        t.str("content")
        for flag in ("special", "single_word", "lstrip", "rstrip", "normalized"):
            t.bool(flag, None)


def check_tokenizer_config(path: Path) -> None:
    """Raise DittoError unless tokenizer_config.json's fields that Ditto reads have their
    types: special tokens (``SPECIAL_KEYS``) a string or {"content": string}; ``chat_template``
    a string or a list of {"name", "template"} strings; ``add_bos_token`` /
    ``add_eos_token`` true/false."""
    f = Fields(_json(path), str(path), "key", "tokenizer config")
    for key in SPECIAL_KEYS:
        v = f.get(key, None)
        if isinstance(v, dict):
            Fields(v, str(path), f"key {key!r} field").str("content")
        elif v is not None and not isinstance(v, str):
            f.fail(key, "must be a string or {\"content\": string}", v)
    tpl = f.get("chat_template", None)
    if isinstance(tpl, list):
        for k, item in enumerate(tpl):
            t = Fields(item, str(path), f"key 'chat_template[{k}]' field", "chat template entry")
            t.str("name")
            t.str("template")
    elif tpl is not None and not isinstance(tpl, str):
        f.fail("chat_template", "must be a string or a list of {name, template}", tpl)
    for key in ("add_bos_token", "add_eos_token"):
        f.bool(key, None)


def check_tokenizer_files(directory: Path) -> None:
    """Type-check the tokenizer files of an HF directory that exist (a missing tokenizer.json
    is reported by the converter)."""
    if (directory / "tokenizer.json").is_file():
        check_tokenizer_json(directory / "tokenizer.json")
    if (directory / "tokenizer_config.json").is_file():
        check_tokenizer_config(directory / "tokenizer_config.json")
