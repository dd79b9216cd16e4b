"""The generated Unicode class table (native/tokenizer/unicode/unicode_tables.c) is current and
right."""

from __future__ import annotations

from .fixtures_tokenizer import UNICODE
from .script_module import load_script


def _generator():
    return load_script(UNICODE / "gen_unicode_tables.py")


def test_committed_table_equals_generator_output():
    committed = (UNICODE / "unicode_tables.c").read_text(encoding="utf-8")
    assert committed == _generator().render(), (
        "native/tokenizer/unicode/unicode_tables.c is stale: run python "
        "native/tokenizer/unicode/gen_unicode_tables.py")


def test_table_follows_hf_tokenizers_unicode_version():
    """HF tokenizers' ByteLevel regex (Oniguruma) and Digits (Rust char::is_numeric) treat
    letters / digits of Unicode 15.0 and 16.0 as \\p{L} / \\p{N} and those of 17.0 not: the
    table is generated for 16.0 and agrees on these."""
    from tokenizers import pre_tokenizers

    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    cases = {0x11F04: 1, 0x1E4D0: 1, 0x10D50: 1, 0x105C0: 1,  # letters of 15.0 and 16.0
             0x11F50: 2, 0x10D40: 2,                            # digits of 15.0 and 16.0
             0x10940: 0}                                        # a letter of 17.0
    gen = _generator()
    assert gen.UNICODE_VERSION == "16.0.0"
    for cp, cls in cases.items():
        words = len(bl.pre_tokenize_str("a" + chr(cp) + "b"))
        assert words == (1 if cls == 1 else 3), hex(cp)
        assert gen.classify(cp) == cls, hex(cp)


def test_c_lookup_agrees_with_unicodedata_for_every_code_point(tokenizer_lib):
    # \p{L} = category L*, \p{N} = N*, \s = White_Space: str.isspace() without U+001C..U+001F
    # (those four are bidi B/S but not White_Space; HF's ByteLevel regex and Rust agree)
    import unicodedata2

    expected = {"L": 1, "N": 2}
    lookup = tokenizer_lib.unicode_class
    wrong = []
    for cp in range(0x110000):
        c = chr(cp)
        want = 3 if c.isspace() and not 0x1C <= cp <= 0x1F else \
            expected.get(unicodedata2.category(c)[0], 0)
        if lookup(cp) != want:
            wrong.append(hex(cp))
    assert not wrong, wrong[:20]


def test_committed_case_table_equals_generator_output():
    committed = (UNICODE / "unicode_case.c").read_text(encoding="utf-8")
    assert committed == _generator().render_case(), (
        "native/tokenizer/unicode/unicode_case.c is stale: run python "
        "native/tokenizer/unicode/gen_unicode_tables.py")


def test_c_lowercase_agrees_with_hf_for_every_code_point(tokenizer_lib):
    """The Lowercase normalizer's table equals HF's Lowercase on each character alone (Rust
    char::to_lowercase: İ -> i + U+0307, Σ -> σ without the final-sigma context, Garay)."""
    import ctypes

    from tokenizers import normalizers
    hf = normalizers.Lowercase()
    low = tokenizer_lib.unicode_lower
    low.restype = ctypes.c_int
    low.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)]
    out = (ctypes.c_uint32 * 3)()
    wrong = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        n = low(cp, out)
        if "".join(map(chr, out[:n])) != hf.normalize_str(chr(cp)):
            wrong.append(hex(cp))
    assert not wrong, wrong[:20]
    assert low(0x130, out) == 2 and out[:2] == [0x69, 0x307]


def test_committed_norm_table_equals_generator_output():
    mod = load_script(UNICODE / "gen_unicode_norm.py")
    committed = (UNICODE / "unicode_norm.c").read_text(encoding="utf-8")
    assert committed == mod.render(), (
        "native/tokenizer/unicode/unicode_norm.c is stale: run python "
        "native/tokenizer/unicode/gen_unicode_norm.py")


def test_c_normalization_forms_equal_hf_on_every_code_point(tokenizer_lib):
    """NFC / NFD / NFKC / NFKD in C (a byte vocabulary without merges shows the normalized
    bytes) equal HF tokenizers' normalizers on all code points, in runs of 1000 and each one
    after a letter and before a combining mark (so composition and reordering happen)."""
    import numpy as np
    from tokenizers import normalizers

    from ditto_core.base.types import TokenizerSpec
    from ditto_core.model.modelfile import serialize_tokenizer

    from .fixtures_tokenizer import CTokenizer

    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    chunks = ["".join(map(chr, cps[i:i + 1000])) for i in range(0, len(cps), 1000)]
    chunks += ["".join("a" + chr(c) + "\u0301\u0316" for c in cps[i:i + 500])
               for i in range(0, 0x30000, 500)]
    for form in ("NFC", "NFD", "NFKC", "NFKD"):
        spec = TokenizerSpec(kind="bpe_bytes", tokens=tuple(bytes([b]) for b in range(256)),
                             scores=np.zeros(256, np.float32),
                             token_types=np.ones(256, np.uint32), pre="none",
                             normalizer=((form.lower(),),))
        ctok = CTokenizer(tokenizer_lib, serialize_tokenizer(spec), 256)
        ref = getattr(normalizers, form)()
        for chunk in chunks:
            got = bytes(ctok.encode(chunk)).decode("utf-8")
            assert got == ref.normalize_str(chunk), (form, hex(ord(chunk[0])))


def test_committed_word_table_equals_generator_output():
    committed = (UNICODE / "unicode_word.c").read_text(encoding="utf-8")
    assert committed == _generator().render_word(), (
        "native/tokenizer/unicode/unicode_word.c is stale: run python "
        "native/tokenizer/unicode/gen_unicode_tables.py")
