"""The tokenizer under AddressSanitizer + UndefinedBehaviorSanitizer (tests/tokenizer_driver.c):
the golden corpus, our edge cases and invalid UTF-8 through encode and the streaming decoder,
for both tokenizer kinds; the results must still equal the references. Also: warning-free under
gcc (the shared-library fixture already builds with clang-22 -Wall -Wextra -Werror)."""

from __future__ import annotations

import os
import struct
import subprocess

import pytest

from ditto_core.model.modelfile import serialize_tokenizer

from .fixtures_tokenizer import (EDGE_CORPUS, NATIVE, TOKENIZER_SOURCES, WARN, build_driver,
                                 golden_rows, spec_from_sentencepiece)

SAN = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
       "-fno-sanitize-recover=all"]
INVALID = [b"abc\xffdef", b"\xe2\x96", b"\xed\xa0\x80", b"tail \xf0\x9f\x99"]


@pytest.fixture(scope="module")
def asan_driver(tmp_path_factory):
    return build_driver(tmp_path_factory.mktemp("asan") / "tokenizer_driver", SAN)


def _run(driver, block: bytes, n_vocab: int, texts: list[bytes], tmp_path):
    block_file = tmp_path / "block.bin"
    block_file.write_bytes(block)
    records = b"".join(struct.pack("<I", len(t)) + t for t in texts)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=23",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    res = subprocess.run([str(driver), str(block_file), str(n_vocab)], input=records,
                         capture_output=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr.decode(errors="replace")[-3000:]
    assert b"runtime error" not in res.stderr, res.stderr.decode(errors="replace")[-3000:]
    lines = res.stdout.decode().splitlines()
    assert len(lines) == 3 * len(texts)
    return [lines[i:i + 3] for i in range(0, len(lines), 3)]


def _ids(line: str, tag: str) -> list[int]:
    assert line.split(" ")[0] == tag, line
    return [int(x) for x in line.split()[1:]]


def test_bpe_under_sanitizers(asan_driver, smollm2_block, smollm2_spec, tmp_path):
    rows = golden_rows()
    texts = [r["text"].encode() for r in rows] + [t.encode() for t in EDGE_CORPUS] + INVALID
    out = _run(asan_driver, smollm2_block, len(smollm2_spec.tokens), texts, tmp_path)
    for row, (p, s, d) in zip(rows, out):
        assert _ids(p, "P") == row["ids_plain"]
        assert _ids(s, "S") == row["ids_special"]
        assert bytes.fromhex(d[2:]) == row["text"].encode()
    for (p, s, _), bad in zip(out[-len(INVALID):], INVALID):
        with pytest.raises(UnicodeDecodeError) as ref:
            bad.decode("utf-8")
        assert p == s == f"E invalid UTF-8 in the text at byte offset {ref.value.start} " \
                         f"(byte 0x{bad[ref.value.start]:02X})"


def test_spm_under_sanitizers(asan_driver, spm_model, tmp_path):
    spec = spec_from_sentencepiece(spm_model)
    texts = [t for t in EDGE_CORPUS if "<" not in t] + ["Привет 你好 🙂 done"]
    out = _run(asan_driver, serialize_tokenizer(spec), len(spec.tokens),
               [t.encode() for t in texts], tmp_path)
    for text, (p, s, d) in zip(texts, out):
        assert _ids(p, "P") == _ids(s, "S") == spm_model.encode(text)
        assert bytes.fromhex(d[2:]).decode() == spm_model.decode(spm_model.encode(text))


def test_gcc_compiles_warning_free(tmp_path):
    for src in TOKENIZER_SOURCES:
        subprocess.run(["gcc", *WARN, "-O2", "-I", str(NATIVE), "-c", str(src), "-o",
                        str(tmp_path / (src.stem + ".o"))], check=True)
