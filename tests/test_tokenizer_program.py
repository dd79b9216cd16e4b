"""The tokenizer inside the inference program: ``ditto-run --tokens`` (native/app/main.c) on a model
file carrying SmolLM2's tokenizer prints llama.cpp's token ids for the golden corpus."""

from __future__ import annotations

import json

import pytest

from .fixtures_native import run_native
from .fixtures_tokenizer import golden_rows

ROWS = golden_rows()


@pytest.mark.parametrize("exe", ["run", "asan"])
def test_tokens_flag_prints_golden_ids(native_build, smollm2_tok_model, tmp_path, exe):
    program = getattr(native_build, exe)
    rows = ROWS if exe == "run" else ROWS[::6]  # the sanitizer build is slower: a sample
    for i, row in enumerate(rows):
        prompt = tmp_path / f"prompt{i}.txt"
        prompt.write_bytes(row["text"].encode("utf-8"))  # -f reads the prompt byte-exact
        for flags, key in ((["--tokens"], "ids_plain"), (["--tokens", "--special"],
                                                         "ids_special")):
            res = run_native(program, "-m", smollm2_tok_model, "-f", prompt, *flags)
            assert res.returncode == 0, res.stderr.decode(errors="replace")
            assert json.loads(res.stdout) == row[key], row["text"]


def test_invalid_utf8_prompt_is_refused(native_build, smollm2_tok_model, tmp_path):
    prompt = tmp_path / "bad.txt"
    prompt.write_bytes(b"valid then \xc3\x28 invalid")
    res = run_native(native_build.asan, "-m", smollm2_tok_model, "-f", prompt, "--tokens")
    assert res.returncode != 0
    assert b"invalid UTF-8" in res.stderr and b"byte offset 11" in res.stderr
    assert b"ERROR: AddressSanitizer" not in res.stderr and b"runtime error" not in res.stderr
