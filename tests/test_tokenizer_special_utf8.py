"""reliability/tokenizer-special-partial-utf8-heap-overflow: a control token whose text ended
in a lone lead byte made --special encoding loop in place and write past its heap buffers.
Control and user-defined token texts must be valid UTF-8 (FORMAT.md "Validity rules", as in HF
tokenizers, whose texts are strings): both readers refuse such a file with a clear error. The
encoder also matches control tokens only on UTF-8 character boundaries, so the plain text
around a match stays valid UTF-8 and every buffer write stays in bounds."""

import json

import pytest

from ditto_core.base.errors import DittoError
from ditto_core.model.modelfile import ModelFile
from tests.fixtures_native import EXIT_MODEL, EXIT_OK, run_native
from tests.modelfile_edit import ModelImage


def _set_token_text(img: ModelImage, token_id: int, text: bytes) -> None:
    sec = img.token_sections()
    offs = [int.from_bytes(img.b[sec["offsets"] + 4 * i:sec["offsets"] + 4 * i + 4], "little")
            for i in (token_id, token_id + 1)]
    assert offs[1] - offs[0] == len(text), "same length keeps the blob layout"
    img.b[sec["blob"] + offs[0]:sec["blob"] + offs[1]] = text


@pytest.fixture(scope="module")
def partial_utf8_model(native_synth, tmp_path_factory):
    """native_synth.quant (byte-level BPE over bytes, no merges: id = 3 + byte) with control
    token 0 ending in a lone lead byte and control token 1 starting with a continuation byte."""
    img = ModelImage(native_synth.quant.path)
    _set_token_text(img, 0, b"x" * 10 + "é".encode() + b"\xc3")  # 13 bytes, was <|endoftext|>
    _set_token_text(img, 1, b"\xa9" + "é".encode() + b"y" * 9)  # 12 bytes, was <|im_start|>
    return img.save(tmp_path_factory.mktemp("tok_utf8") / "partial.ditto")


@pytest.mark.parametrize("prompt", ["x" * 10 + "éé", "ééyyyyyyyyy"])
@pytest.mark.parametrize("special", [True, False])
def test_partial_utf8_control_tokens_are_refused(native_build, partial_utf8_model, prompt,
                                                 special):
    args = ["-m", partial_utf8_model, "-p", prompt, "--tokens"] + (["--special"] if special
                                                                   else [])
    p = run_native(native_build.asan, *args)
    err = p.stderr.decode()
    assert p.returncode == EXIT_MODEL, err
    assert "Sanitizer" not in err and "runtime error" not in err, err
    assert (f"{partial_utf8_model}: tokenizer: tokenizer block: control/user-defined token 0 "
            "is not valid UTF-8 text") in err
    with pytest.raises(DittoError, match="control/user-defined token 0 is not valid UTF-8"):
        ModelFile(partial_utf8_model)


def test_whole_character_control_token_still_matches(native_build, native_synth, tmp_path):
    img = ModelImage(native_synth.quant.path)
    _set_token_text(img, 0, b"x" * 11 + "é".encode())  # 13 bytes of whole characters
    model = img.save(tmp_path / "whole.ditto")
    prompt = "a" + "x" * 11 + "éb"
    p = run_native(native_build.asan, "-m", model, "-p", prompt, "--tokens", "--special")
    assert p.returncode == EXIT_OK, p.stderr.decode()
    assert json.loads(p.stdout) == [3 + ord("a"), 0, 3 + ord("b")]
