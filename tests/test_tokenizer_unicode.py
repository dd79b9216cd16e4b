"""The generated Unicode class table (native/unicode_tables.c) is current and right."""

from __future__ import annotations

import importlib.util
import unicodedata

from .fixtures_tokenizer import NATIVE


def _generator():
    spec = importlib.util.spec_from_file_location("gen_unicode_tables",
                                                  NATIVE / "gen_unicode_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_table_equals_generator_output():
    committed = (NATIVE / "unicode_tables.c").read_text(encoding="utf-8")
    assert committed == _generator().render(), \
        "native/unicode_tables.c is stale: run python native/gen_unicode_tables.py"


def test_c_lookup_agrees_with_unicodedata_for_every_code_point(tokenizer_lib):
    # \p{L} = category L*, \p{N} = N*, \s = White_Space: str.isspace() without U+001C..U+001F
    # (those four are bidi B/S but not White_Space; HF's ByteLevel regex and Rust agree)
    expected = {"L": 1, "N": 2}
    lookup = tokenizer_lib.unicode_class
    wrong = []
    for cp in range(0x110000):
        c = chr(cp)
        want = 3 if c.isspace() and not 0x1C <= cp <= 0x1F else \
            expected.get(unicodedata.category(c)[0], 0)
        if lookup(cp) != want:
            wrong.append(hex(cp))
    assert not wrong, wrong[:20]
