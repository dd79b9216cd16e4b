"""Qwen2's tokenizer (pre-tokenizer ``qwen2``), the end-of-generation set, fill in the middle and
Qwen's chat template, against transformers / HF ``tokenizers``.

- The real Qwen2.5-Coder-0.5B-Instruct GGUF through Ditto's GGUF exporter and C tokenizer: ids
  equal to transformers' tokenizer read from the same GGUF on the eval corpus (whole and line by
  line) and on code with CRLF, tabs, whitespace runs, CJK, emoji, digit runs, contractions in
  capitals and control-token texts, with control tokens parsed and not parsed (HF
  ``encode_special_tokens``).
- A tokenizer.json with Qwen2.5's pre-tokenizer (NFC, Split(regex, isolated) + ByteLevel(use_regex
  false)) trained here by ``tokenizers``, through the HF exporter: ids equal to HF's.
- ``ditto-run --suffix`` builds ``[fim_prefix] + tok(prefix) + [fim_suffix] + tok(suffix) +
  [fim_middle]`` from the model's FIM ids; a model without them is refused.
- Generation stops at any end-of-generation token; a file without EOG records at EOS only.
- ``--chat`` on Qwen's template equals transformers' ``apply_chat_template`` (default system
  message included).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import attrs
import numpy as np
import pytest

from ditto_core.model.modelfile import ModelFile, serialize_tokenizer
from tests.fixtures_native import EXIT_USAGE, byte_vocab, run_native
from tests.fixtures_tokenizer import EDGE_CORPUS, CTokenizer, _gguf_spec, tiny_model_with_tokenizer

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

#: what the Qwen2 pattern splits differently from GPT-2's
QWEN2_CASES = [
    "def f(x):\r\n\treturn x  \r\n\r\n\r\n",
    "\t\tif x:\n\t\t\ty = 1\n" + " " * 40 + "z\n\n   \n",
    "a\n \n\n  b  \n\t c \r\r\n .foo (bar) [baz] -1 --x",
    "x = 1234567890 + 3.14159e-10 + 0x1F",
    "I'M YOU'RE HE'S THEY'VE WE'LL SHE'D IT'S DON'T 'S 'LL 'Re 'vE 'ſ 'ſx",
    "中文字符测试，标点符号！ 日本語のひらがな 한국어 문장",
    "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🙂🙂🙂 x²+y³ ٣٤٥ ½ Ⅻ 𝟘𝟙",
    "e\u0301 a\u0308 \u00a0nbsp \u3000ideo \u2028line\u0085nel",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|endoftext|>",
    "<|fim_prefix|>def f(<|fim_suffix|>)\n<|fim_middle|><tool_call>{}</tool_call><|file_sep|>",
]


def _corpus_texts() -> list[str]:
    from ditto_core.eval.corpus import corpus_bytes
    corpus = corpus_bytes().decode("utf-8")
    return [corpus, *corpus.splitlines(keepends=True), *EDGE_CORPUS, *QWEN2_CASES]


def _hf_ids(backend, text: str, special: bool) -> list[int]:
    """HF ``tokenizers`` ids; ``special``: control-token texts become their tokens."""
    backend.encode_special_tokens = not special
    try:
        return backend.encode(text, add_special_tokens=False).ids
    finally:
        backend.encode_special_tokens = False


# ---------------------------------------------------------------- the real Qwen2.5-Coder-0.5B

@pytest.fixture(scope="module")
def qwen_spec(qwen05_gguf):
    return _gguf_spec(str(qwen05_gguf))


@pytest.fixture(scope="module")
def qwen_transformers(qwen05_hf_tokenizer):
    return qwen05_hf_tokenizer


@pytest.fixture(scope="module")
def qwen_tok_model(qwen_spec, tmp_path_factory):
    """A .ditto file with Qwen's tokenizer and a 1-layer zero model of width 8 (5 MB)."""
    return tiny_model_with_tokenizer(tmp_path_factory.mktemp("qwen_tok") / "qwen_tok.ditto",
                                     qwen_spec)


def test_gguf_export_reads_qwen2_as_transformers_does(qwen_spec, qwen_transformers):
    backend = json.loads(qwen_transformers.backend_tokenizer.to_str())
    # transformers' GGUF reader builds Qwen2.5's pre-tokenizer without a normalizer (no NFC,
    # as llama.cpp): Ditto's export of the GGUF has none either
    assert backend["normalizer"] is None and qwen_spec.normalizer == ()
    split, byte_level = backend["pre_tokenizer"]["pretokenizers"]
    assert split["pattern"]["Regex"] == QWEN2_REGEX and split["behavior"] == "Isolated"
    assert byte_level["type"] == "ByteLevel" and byte_level["use_regex"] is False
    assert qwen_spec.pre == "qwen2" and not qwen_spec.add_bos
    assert (qwen_spec.bos_id, qwen_spec.eos_id) == (151643, 151645)
    texts = [qwen_spec.tokens[i] for i in qwen_spec.fim_ids]
    assert texts == [b"<|fim_prefix|>", b"<|fim_suffix|>", b"<|fim_middle|>", b"<|fim_pad|>",
                     b"<|repo_name|>", b"<|file_sep|>"]
    # llama.cpp's end-of-generation set, without the normal token 128247 "</s>"
    assert qwen_spec.tokens[128247] == b"</s>"
    assert [qwen_spec.tokens[i] for i in qwen_spec.eog_ids] == [
        b"<|endoftext|>", b"<|im_end|>", b"<|fim_pad|>", b"<|repo_name|>", b"<|file_sep|>"]


def test_ids_equal_transformers(tokenizer_lib, qwen_spec, qwen_transformers):
    ctok = CTokenizer(tokenizer_lib, serialize_tokenizer(qwen_spec), len(qwen_spec.tokens))
    backend = qwen_transformers.backend_tokenizer
    texts = _corpus_texts()
    assert len(texts) > 10000
    for special in (True, False):
        bad = [t for t in texts
               if ctok.encode(t, parse_special=special) != _hf_ids(backend, t, special)]
        assert not bad, (special, len(bad), bad[:3])
    # the typed control text is plain text without parsing, one token with it
    t = "<|im_end|>"
    assert ctok.encode(t, parse_special=True) == [151645]
    assert len(ctok.encode(t, parse_special=False)) > 1
    # decoding gives the text back
    ids = ctok.encode(QWEN2_CASES[0] + QWEN2_CASES[5], parse_special=True)
    assert ctok.decode(ids).decode("utf-8") == qwen_transformers.decode(ids)


def _run_tokens(exe, model, *args) -> list[int]:
    r = run_native(exe, "-m", model, "--tokens", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_fim_prompt_ids(native_build, qwen_tok_model, qwen_transformers, tmp_path):
    backend = qwen_transformers.backend_tokenizer
    pre_id, suf_id, mid_id = (qwen_transformers.convert_tokens_to_ids(t) for t in
                              ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    prefix = "def fib(n):\r\n\t'''<|im_end|> 12345'''\n    if n < 2:\n"
    suffix = "\n    return fib(n - 1) + fib(n - 2)  # 中文 <|fim_middle|>\n"
    want = ([pre_id] + _hf_ids(backend, prefix, False) + [suf_id] + _hf_ids(backend, suffix, False)
            + [mid_id])
    assert _run_tokens(native_build.asan, qwen_tok_model, "-p", prefix, "--suffix", suffix) == want
    # from files, and with --special: the user's texts never make control tokens
    (tmp_path / "pre.txt").write_text(prefix)
    (tmp_path / "suf.txt").write_text(suffix)
    assert _run_tokens(native_build.asan, qwen_tok_model, "-f", tmp_path / "pre.txt",
                       "--suffix-file", tmp_path / "suf.txt", "--special") == want
    assert _run_tokens(native_build.asan, qwen_tok_model, "-p", "", "--suffix", "") == \
        [pre_id, suf_id, mid_id]


def test_chat_equals_transformers(native_build, qwen_spec, qwen_tok_model, qwen_transformers):
    msgs = ["Write a quicksort in Python.", "  two\nlines  ", "café 🙂 <|im_end|>"]
    assert qwen_spec.chat_prefix == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\n")
    assert qwen_spec.chat_suffix == "<|im_end|>\n<|im_start|>assistant\n"
    for m in msgs:
        conv = [{"role": "user", "content": m}]
        text = qwen_transformers.apply_chat_template(conv, add_generation_prompt=True,
                                                     tokenize=False)
        assert qwen_spec.chat_prefix + m + qwen_spec.chat_suffix == text
        ids = qwen_transformers.apply_chat_template(conv, add_generation_prompt=True,
                                                    tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        got = _run_tokens(native_build.asan, qwen_tok_model, "-p", m, "--chat", "--special")
        assert got == ids, m


def test_chat_template_rendered_from_the_gguf_string(qwen05_gguf, qwen_spec, qwen_transformers):
    """ditto_core.text.chat_template on the template string of the GGUF's metadata (as the exporter
    read it), as transformers renders it (its own default system message)."""
    from ditto_core.text.chat_template import reduce_chat_template

    template = qwen_spec.chat_template
    assert template == qwen_transformers.chat_template and "Alibaba Cloud" in template
    prefix, suffix = reduce_chat_template(
        template, {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}, str(qwen05_gguf))
    assert prefix.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You "
                             "are a helpful assistant.<|im_end|>\n")
    for m in ("hello", "", "{{ x }} {% raw %}"):
        assert prefix + m + suffix == qwen_transformers.apply_chat_template(
            [{"role": "user", "content": m}], add_generation_prompt=True, tokenize=False)


# ---------------------------------------------------------------- FIM refusals, EOG stop

def test_fim_needs_the_model_s_fim_tokens(native_build, smollm2_tok_model):
    # SmolLM2 has <reponame> (FIM repo) but no prefix / suffix / middle tokens
    r = run_native(native_build.asan, "-m", smollm2_tok_model, "-p", "a", "--suffix", "b",
                   "--tokens")
    assert r.returncode == EXIT_USAGE
    assert r.stderr.decode() == (
        f"ditto-run: error: {smollm2_tok_model}: --suffix: the model file has no "
        f"fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|> or the "
        f"like)\n")


@pytest.mark.parametrize("args, message", [
    (["--suffix", "b", "--chat"], "--suffix (fill in the middle) and --chat exclude each other"),
    (["--suffix", "b", "--suffix-file", "f"], "give only one of --suffix and --suffix-file"),
])
def test_fim_usage_errors(native_build, smollm2_tok_model, args, message):
    r = run_native(native_build.asan, "-m", smollm2_tok_model, "-p", "a", *args)
    assert r.returncode == EXIT_USAGE
    assert r.stderr.decode().startswith(f"ditto-run: {message}\n")


def test_invalid_utf8_suffix_is_named(native_build, qwen_tok_model):
    r = run_native(native_build.asan, "-m", qwen_tok_model, "-p", "ok", "--suffix",
                   b"ab\xffc", "--tokens")
    assert r.returncode == 3
    assert r.stderr.decode() == ("ditto-run: error: --suffix: invalid UTF-8 in the text at byte "
                                 "offset 2 (byte 0xFF)\n")


def test_generation_stops_at_any_end_of_generation_token(native_build, tmp_path):
    """A zero model gives equal logits, so greedy decoding picks token 0, <|endoftext|>: not EOS
    (2, <|im_end|>) but in the EOG set {0, 2}. A file without EOG records (older exports) stops
    at EOS alone and keeps generating token 0."""
    spec = byte_vocab(chat=False)
    assert spec.tokens[0] == b"<|endoftext|>" and spec.eos_id == 2
    with_eog = tiny_model_with_tokenizer(tmp_path / "eog.ditto",
                                         attrs.evolve(spec, eog_ids=(0, 2)))
    old = tiny_model_with_tokenizer(tmp_path / "old.ditto", spec)
    for model, want in ((with_eog, [0]), (old, [0, 0, 0, 0, 0])):
        r = run_native(native_build.asan, "-m", model, "-p", "a", "-n", "5", "--temp", "0",
                       "--print-ids")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == want
    r = run_native(native_build.asan, "-m", with_eog, "-p", "a", "-n", "3", "--temp", "0",
                   "--print-ids", "--ignore-eos")
    assert json.loads(r.stdout) == [0, 0, 0]
    mf = ModelFile(with_eog)
    assert (mf.tokenizer.eog_ids, mf.tokenizer.fim_ids) == ((0, 2), ())
    # ditto inspect shows the set (a file without EOG records: its EOS)
    from click.testing import CliRunner

    from ditto_core.cli.main import cli
    for model, eog in ((with_eog, [0, 2]), (old, [2])):
        r = CliRunner().invoke(cli, ["inspect", "--json", str(model)])
        assert r.exit_code == 0, r.output
        tok = json.loads(r.stdout)["tokenizer"]
        assert (tok["eog_ids"], tok["fim_ids"]) == (eog, {})
        r = CliRunner().invoke(cli, ["inspect", str(model)])
        assert f"end of generation: {eog}; fill in the middle: none" in r.stdout


def test_eog_and_fim_records_are_checked(qwen_spec, tmp_path, native_build):
    """Both readers refuse an EOG / FIM record naming a token outside the vocabulary or a FIM
    role twice (FORMAT.md rule 24)."""
    from ditto_core.base.errors import DittoError
    from ditto_core.model.modelfile import parse_tokenizer

    spec = attrs.evolve(byte_vocab(chat=False), eog_ids=(0, 2), fim_ids=(0, 1, 2, -1, -1, -1))
    block = serialize_tokenizer(spec)
    assert parse_tokenizer(block).fim_ids == (0, 1, 2, -1, -1, -1)
    ext_at = len(block) - 5 * 16  # two EOG records, three FIM records, 16 bytes each
    for name, at, value, msg in [("EOG id 259", ext_at + 4, 259, "end-of-generation token 259"),
                                 ("FIM role twice", ext_at + 4 * 16 + 8, 1, "FIM record"),
                                 ("FIM role 6", ext_at + 2 * 16 + 8, 6, "FIM record")]:
        bad = bytearray(block)
        bad[at:at + 4] = np.uint32(value).tobytes()
        with pytest.raises(DittoError, match=msg):
            parse_tokenizer(bytes(bad))
    with pytest.raises(DittoError, match="FIM token 300"):
        serialize_tokenizer(attrs.evolve(spec, fim_ids=(300, 1, 2, -1, -1, -1)))


# ---------------------------------------------------------------- an HF tokenizer.json

@pytest.fixture(scope="module")
def qwen2_style_dir(tmp_path_factory):
    """A byte-level BPE trained by ``tokenizers`` with Qwen2.5's tokenizer.json layout: NFC,
    Split(QWEN2_REGEX, isolated) + ByteLevel(use_regex=false), ByteLevel decoder, Qwen's
    control tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>",
                "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>"]
    texts = [*EDGE_CORPUS, *QWEN2_CASES, *(open(m.__file__).read()
                                          for m in (json, random, subprocess))]
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=800, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=specials, show_progress=False))
    d = tmp_path_factory.mktemp("qwen2_style")
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>",
                                                         "add_bos_token": False}))
    return d, tok


def test_hf_split_tokenizer_equals_hf(tokenizer_lib, qwen2_style_dir):
    from ditto_export_hf.tokenizer import tokenizer_from_hf

    d, hf = qwen2_style_dir
    spec = tokenizer_from_hf(d, hf.get_vocab_size(), {})
    assert spec.pre == "qwen2" and spec.normalizer == (("nfc",),)
    assert [spec.tokens[i] for i in spec.eog_ids] == [b"<|endoftext|>", b"<|im_end|>",
                                                      b"<|fim_pad|>"]
    assert [spec.tokens[i] for i in spec.fim_ids[:4]] == [
        b"<|fim_prefix|>", b"<|fim_suffix|>", b"<|fim_middle|>", b"<|fim_pad|>"]
    ctok = CTokenizer(tokenizer_lib, serialize_tokenizer(spec), len(spec.tokens))
    rng = random.Random(7)
    alphabet = (list("ab zZ09'sdtlmrevSDTLMREV\t\n\r  .,;:!?-_()[]{}<>|/\\\"#")
                + ["é", "e\u0301", "ß", "中", "🙂", "👍🏽", "²", "٣", "\u00a0", "\u3000", "ſ",
                   "\u2028", "\x85", "Å", "\u212b", "<|im_end|>", "'s", "'LL", "\r\n", "    "])
    texts = [*EDGE_CORPUS, *QWEN2_CASES,
             *("".join(rng.choice(alphabet) for _ in range(rng.randrange(30)))
               for _ in range(400))]
    for special in (True, False):
        for t in texts:
            assert ctok.encode(t, parse_special=special) == _hf_ids(hf, t, special), (special, t)


def test_hf_split_with_another_regex_is_refused(qwen2_style_dir, tmp_path):
    from ditto_core.base.errors import DittoError
    from ditto_export_hf.tokenizer import tokenizer_from_hf

    d, hf = qwen2_style_dir
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{N}{1,3}| ?\p{L}+"
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(DittoError, match=r"tokenizer.json: pre_tokenizer Split: pattern .* is not "
                                         r"reproduced by Ditto's tokenizer"):
        tokenizer_from_hf(tmp_path, hf.get_vocab_size(), {})


def test_ditto_run_passes_suffix_through(tmp_path):
    """`ditto run DIR ... --suffix TEXT` gives the flags to the build's executable unchanged."""
    (tmp_path / "build.json").write_text("{}")
    (tmp_path / "model.ditto").write_bytes(b"")
    exe = tmp_path / "ditto-run"
    exe.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    exe.chmod(0o755)
    r = subprocess.run([sys.executable, "-c", "from ditto_core.cli.main import main; main()", "run",
                        str(tmp_path), "-p", "def f(", "--suffix", "):\n", "--suffix-file", "x"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"-m\n{tmp_path / 'model.ditto'}\n-p\ndef f(\n--suffix\n):\n\n"
                        f"--suffix-file\nx\n")
