"""The ditto-run command line under AddressSanitizer + UndefinedBehaviorSanitizer: a forward
pass that matches the NumPy reference, generation, and every kind of bad input (clear message,
documented exit code, no sanitizer report)."""

import json
import os
import re
import struct
import subprocess

import numpy as np
import pytest

from tests.fixtures_native import (EXIT_IO, EXIT_MODEL, EXIT_OK, EXIT_PROMPT, EXIT_USAGE,
                                   dump_logits, rel_error, rewrite_crc, run_native, token_file)
from tests.native_reference import reference_logits


def check(p, code: int, *messages: str) -> str:
    """Assert exit code, messages on stderr, and no sanitizer report; return stderr."""
    err = p.stderr.decode(errors="replace")
    assert "AddressSanitizer" not in err and "runtime error" not in err \
        and "LeakSanitizer" not in err, err
    assert p.returncode == code, (p.returncode, err)
    for m in messages:
        assert m in err, (m, err)
    return err


# ------------------------------------------------------------------ sanitized runs that work

def test_asan_forward_pass_equals_reference(native_build, native_synth, tmp_path):
    for m in (native_synth.quant, native_synth.quant_untied):
        ids = [1, 40, 41, 42, 100, 200, 250, 3, 4]
        got = dump_logits(native_build.asan, m.path, ids, tmp_path)
        assert rel_error(got, reference_logits(m.cfg, m.weights, ids)).max() <= 1e-4


def test_asan_generate_score_tokens_chat(native_build, native_synth, tmp_path):
    exe, model = native_build.asan, native_synth.quant.path
    p = run_native(exe, "-m", model, "-p", "héllo wörld", "-n", 20, "--temp", 0.9,
                   "--top-p", 0.8, "--seed", 3, "--threads", 2)
    err = check(p, EXIT_OK, "tok/s", "time to first token")
    stats = json.loads(err.split("stats ", 1)[1].splitlines()[0])
    assert stats["prompt_tokens"] == len("héllo wörld".encode())
    assert 1 <= stats["generated_tokens"] <= 20
    assert stats["ctx"] == stats["prompt_tokens"] + 20 - 1  # KV cache only for what is used
    p = run_native(exe, "-m", model, "-p", "hi", "--chat", "-n", 5, "--temp", 0, "--print-ids")
    check(p, EXIT_OK)
    assert 1 <= len(json.loads(p.stdout)) <= 5
    p = run_native(exe, "-m", model, "--score", token_file(tmp_path / "t", [1, 5, 6, 7]))
    err = check(p, EXIT_OK)
    assert json.loads(p.stdout)["n_scored"] == 3
    # --score / --dump-logits: a line that fits the mode (no TTFT, no tok/s), stats unchanged
    assert re.search(r"^ditto-run: scored 3 tokens in \d+\.\d ms$", err, re.M), err
    assert "time to first token" not in err and "tok/s" not in err
    assert json.loads(err.split("stats ", 1)[1].splitlines()[0])["prompt_tokens"] == 4
    p = run_native(exe, "-m", model, "--ids", tmp_path / "t", "--dump-logits", tmp_path / "l")
    err = check(p, EXIT_OK)
    assert re.search(r"^ditto-run: computed the logits of 4 tokens in \d+\.\d ms$", err,
                     re.M), err
    assert "time to first token" not in err and "tok/s" not in err
    assert json.loads(err.split("stats ", 1)[1].splitlines()[0])["generated_tokens"] == 0


def _huge_pages_on() -> bool:
    """Whether Linux backs memory marked MADV_HUGEPAGE with 2 MiB pages (model.c reads the
    model into such memory then)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def test_read_and_mmap_loads_give_the_same_logits(native_build, native_synth, tmp_path,
                                                  monkeypatch):
    # the default reads the file into 2 MiB pages where Linux gives them; --mmap (or
    # DITTO_MMAP=1) maps it, DITTO_MMAP=0 always reads it: the same bytes in memory, so the
    # same logits to the bit
    monkeypatch.delenv("DITTO_MMAP", raising=False)
    m = native_synth.quant_qwen2
    ids = [1, 40, 41, 42, 100, 200, 3]
    kinds, logits = [], []
    for extra, env in [((), None), (("--mmap",), None), ((), {"DITTO_MMAP": "1"}),
                       ((), {"DITTO_MMAP": "0"})]:
        out = tmp_path / f"l{len(kinds)}.f32"
        p = run_native(native_build.asan, "-m", m.path, "--ids", token_file(tmp_path / "t", ids),
                       "--dump-logits", out, *extra, env=env)
        err = check(p, EXIT_OK)
        kinds.append(json.loads(err.split("stats ", 1)[1].splitlines()[0])["load"])
        logits.append(out.read_bytes())
    assert kinds == ["read" if _huge_pages_on() else "mmap", "mmap", "mmap", "read"]
    assert logits[0] == logits[1] == logits[2] == logits[3]
    assert rel_error(np.frombuffer(logits[0], "<f4").reshape(len(ids), -1),
                     reference_logits(m.cfg, m.weights, ids)).max() <= 1e-4
    # a bad file is refused the same way on both paths
    (tmp_path / "short.ditto").write_bytes(m.path.read_bytes()[:-64])
    for env in ({"DITTO_MMAP": "0"}, {"DITTO_MMAP": "1"}):
        p = run_native(native_build.asan, "-m", tmp_path / "short.ditto", "-p", "hi", env=env)
        check(p, EXIT_MODEL, "short.ditto", "file is truncated")
    p = run_native(native_build.asan, "-m", m.path, "-p", "hi", env={"DITTO_MMAP": "yes"})
    check(p, EXIT_USAGE, "DITTO_MMAP must be 1 (map the model file) or 0 (read it into "
          "memory), got 'yes'")


# read() of the file named by READ_FAULT_FILE fails as READ_FAULT says: "eio" every call;
# "early" returns 1000 bytes, then end of file; "slow" alternates EINTR and reads of at most
# 1000 bytes (the loader must retry and continue until the file is read)
READ_FAULT_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int on_target(int fd) {
    const char *want = getenv("READ_FAULT_FILE");
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (!want || n < 0) return 0;
    path[n] = 0;
    return strcmp(path, want) == 0;
}

ssize_t read(int fd, void *buf, size_t count) {
    static ssize_t (*real)(int, void *, size_t);
    static int calls;
    const char *mode = getenv("READ_FAULT");
    if (!real) real = (ssize_t (*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
    if (mode && on_target(fd)) {
        calls++;
        if (!strcmp(mode, "eio")) {
            errno = EIO;
            return -1;
        }
        if (!strcmp(mode, "early") && calls > 1) return 0;
        if (!strcmp(mode, "slow") && calls % 2) {
            errno = EINTR;
            return -1;
        }
        if (count > 1000) count = 1000;
    }
    return real(fd, buf, count);
}
"""


def test_read_errors_while_loading_are_reported(native_build, native_synth, tmp_path):
    # the read-into-memory load: an I/O error or a file that ends early is a clear error
    # naming the file; interrupted and partial reads are retried, giving the mapped file's
    # logits to the bit (the uninstrumented build: ASan's own read() would shadow the shim)
    shim = tmp_path / "read_fault.so"
    (tmp_path / "read_fault.c").write_text(READ_FAULT_SHIM)
    subprocess.run(["clang-22", "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o",
                    str(shim), str(tmp_path / "read_fault.c"), "-ldl"], check=True)
    m = native_synth.quant_qwen2
    ids = token_file(tmp_path / "t", [1, 40, 41, 42])
    env = {"LD_PRELOAD": str(shim), "READ_FAULT_FILE": str(m.path.resolve()),
           "DITTO_MMAP": "0"}
    p = run_native(native_build.run, "-m", m.path, "-p", "hi", env={**env, "READ_FAULT": "eio"})
    check(p, EXIT_MODEL, m.path.name, "cannot read: Input/output error")
    p = run_native(native_build.run, "-m", m.path, "-p", "hi",
                   env={**env, "READ_FAULT": "early"})
    check(p, EXIT_MODEL, m.path.name,
          "cannot read: the file ended early (changed while being read?)")
    logits = []
    for mode, load in [("slow", "0"), ("", "1")]:
        out = tmp_path / f"{load}.f32"
        p = run_native(native_build.run, "-m", m.path, "--ids", ids, "--dump-logits", out,
                       env={**env, "READ_FAULT": mode, "DITTO_MMAP": load})
        err = check(p, EXIT_OK)
        assert json.loads(err.split("stats ", 1)[1].splitlines()[0])["load"] == \
            ("read" if load == "0" else "mmap")
        logits.append(out.read_bytes())
    assert logits[0] == logits[1] and len(logits[0]) > 0


def test_tokens_prompt_file_is_byte_exact(native_build, native_synth, tmp_path):
    exe, model = native_build.asan, native_synth.quant.path
    text = b"line one\r\nline\ttwo\x00end\n\n"
    (tmp_path / "prompt.txt").write_bytes(text)
    p = run_native(exe, "-m", model, "-f", tmp_path / "prompt.txt", "--tokens")
    check(p, EXIT_OK)
    # the synthetic vocabulary has no merges: byte v is token v + 3
    assert json.loads(p.stdout) == [b + 3 for b in text]
    p = run_native(exe, "-m", model, "-p", "<|im_start|>x", "--tokens", "--special", "--bos")
    check(p, EXIT_OK)
    assert json.loads(p.stdout) == [1, 1, ord("x") + 3]
    p = run_native(exe, "-m", model, "-p", "<|im_start|>x", "--tokens")
    assert json.loads(p.stdout) == [b + 3 for b in b"<|im_start|>x"]
    p = run_native(exe, "-m", model, "-p", "hi", "--chat", "--tokens")
    want = [1] + [b + 3 for b in b"user\nhi"] + [2, ord("\n") + 3, 1] + \
        [b + 3 for b in b"assistant\n"]
    assert json.loads(p.stdout) == want


# ------------------------------------------------------------------ bad model files

def patched(src, tmp_path, name, edit, fix_crc=True):
    data = bytearray(src.read_bytes())
    edit(data)
    if fix_crc:
        rewrite_crc(data)
    out = tmp_path / name
    out.write_bytes(bytes(data))
    return out


def put_u32(off, v):
    def edit(d):
        d[off:off + 4] = struct.pack("<I", v)
    return edit


def put_u64(off, v):
    def edit(d):
        d[off:off + 8] = struct.pack("<Q", v)
    return edit


ENTRY = 128  # tensor table start; entry i at ENTRY + 128 * i


def bad_model_cases(size):
    return [
        ("magic", lambda d: d.__setitem__(slice(0, 8), b"NOTDITTO"), False, "bad magic"),
        ("version", put_u32(8, 3), False, "unsupported format version 3"),
        ("checksum", lambda d: d.__setitem__(-5, d[-5] ^ 0x40), False, "checksum mismatch"),
        ("offset_past_end", put_u64(ENTRY + 128 * 3 + 96, (size + 4096) // 64 * 64), True,
         "extends past the end of the file"),
        ("misaligned", put_u64(ENTRY + 128 * 3 + 96, size - 4096 + 4), True,
         "is not a multiple of 64"),
        ("nbytes", put_u64(ENTRY + 128 * 0 + 104, 1000), True, "nbytes=1000"),
        ("more_layers", put_u32(64 + 12, 3), True, "blk.2.attn_norm.weight is missing"),
        ("fewer_layers", put_u32(64 + 12, 1), True, "does not belong to the model"),
        ("dim", put_u32(64 + 4, 64), True, "but the config needs"),
        ("untied_without_output", put_u32(64 + 44, 0), True, "output.weight is missing"),
        ("heads", put_u32(64 + 16, 5), True, "not a multiple of n_kv_heads"),
        ("theta", lambda d: d.__setitem__(slice(100, 104), struct.pack("<f", float("nan"))),
         True, "rope_theta"),
        ("encoding", put_u32(ENTRY + 128 * 0 + 64, 9), True, "invalid encoding parameters"),
        ("bits", put_u32(ENTRY + 128 * 0 + 72, 12), True, "invalid encoding parameters"),
        ("n_tensors", put_u32(64 + 48, 100000), True, "does not fit"),
        # FORMAT.md: header bytes 32..63 are reserved, zero (outside the CRC, so checked alone)
        ("reserved", lambda d: d.__setitem__(47, 0x5A), False,
         "header reserved bytes 32..63 must be zero, byte 47 is 0x5a"),
    ]


@pytest.mark.parametrize("case", range(16))
def test_bad_model_file(native_build, native_synth, tmp_path, case):
    src = native_synth.quant.path
    name, edit, fix_crc, message = bad_model_cases(src.stat().st_size)[case]
    bad = patched(src, tmp_path, f"{name}.ditto", edit, fix_crc)
    p = run_native(native_build.asan, "-m", bad, "-p", "hi", "-n", 2)
    check(p, EXIT_MODEL, str(bad), message)


def test_truncated_empty_missing_and_trailing_files(native_build, native_synth, tmp_path):
    data = native_synth.quant.path.read_bytes()
    cases = [("truncated.ditto", data[:-100], "file is truncated"),
             ("trailing.ditto", data + b"\0" * 64, "trailing data"),
             ("empty.ditto", b"", "too small to be a Ditto model file"),
             ("header_only.ditto", data[:64], "file is truncated")]
    for name, content, message in cases:
        (tmp_path / name).write_bytes(content)
        p = run_native(native_build.asan, "-m", tmp_path / name, "-p", "hi")
        check(p, EXIT_MODEL, name, message)
    p = run_native(native_build.asan, "-m", tmp_path / "nope.ditto", "-p", "hi")
    check(p, EXIT_MODEL, "nope.ditto", "cannot open")
    p = run_native(native_build.asan, "-m", tmp_path, "-p", "hi")
    check(p, EXIT_MODEL, "not a regular file")


# ------------------------------------------------------------------ bad prompts and flags

def test_prompt_longer_than_context(native_build, native_synth):
    exe, model = native_build.asan, native_synth.quant.path
    p = run_native(exe, "-m", model, "-p", "0123456789", "--ctx", 4, "-n", 3)
    check(p, EXIT_PROMPT, "the prompt has 10 tokens but the context holds 4")
    p = run_native(exe, "-m", model, "-p", "x" * 100, "-n", 3)  # max_seq_len is 64
    check(p, EXIT_PROMPT, "the prompt has 100 tokens but the context holds 64")
    p = run_native(exe, "-m", model, "-p", "x", "--ctx", 65)
    check(p, EXIT_USAGE, "--ctx 65 exceeds the model's max_seq_len 64")
    # generation that reaches the end of the context stops there
    p = run_native(exe, "-m", model, "-p", "x" * 60, "-n", 30, "--temp", 0, "--print-ids")
    check(p, EXIT_OK)
    assert len(json.loads(p.stdout)) <= 5


def test_invalid_utf8_prompt(native_build, native_synth, tmp_path):
    exe, model = native_build.asan, native_synth.quant.path
    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe bytes")
    p = run_native(exe, "-m", model, "-f", tmp_path / "bad.txt", "-n", 2)
    check(p, EXIT_PROMPT, "bad.txt", "UTF-8")
    p = run_native(exe, "-m", model, "-p", b"\xc3\x28", "-n", 2)
    check(p, EXIT_PROMPT, "UTF-8")


@pytest.mark.parametrize("args,message", [
    (["-n", "0"], "-n must be an integer in 1..1073741824"),
    (["-n", "-5"], "-n must be an integer in 1..1073741824"),
    (["-n", "abc"], "-n must be an integer in 1..1073741824"),
    (["--bogus"], "unknown flag '--bogus'"),
    (["-n"], "flag '-n' needs a value"),
    (["--temp", "-1"], "--temp must be a number >= 0"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--top-p", "1e-50"], "ditto-run: --top-p must be > 0 as a float; '1e-50' rounds to 0\n"),
    (["--threads", "0"], "--threads must be an integer"),
    (["--seed", "-3"], "--seed must be a non-negative integer"),
    (["--kernel", "sse9"], "ditto-run: error: --kernel: unknown kernel 'sse9' (this program "
                           "has: avx512vbmi, avx512vnni, avxvnni, avx2, generic)\n"),
])
def test_bad_flags(native_build, native_synth, args, message):
    p = run_native(native_build.asan, "-m", native_synth.quant.path, "-p", "hi", *args)
    check(p, EXIT_USAGE, message)


def test_missing_arguments(native_build, native_synth, tmp_path):
    exe, model = native_build.asan, native_synth.quant.path
    check(run_native(exe, "-p", "hi"), EXIT_USAGE, "missing -m MODEL")
    check(run_native(exe, "-m", model), EXIT_USAGE, "missing prompt")
    check(run_native(exe, "-m", model, "-p", "a", "-f", "b"), EXIT_USAGE, "only one of")
    p = run_native(exe, "--help")
    assert p.returncode == 0 and b"exit codes" in p.stdout
    # the --ctx default the help states is what the run uses (stats ctx = prompt + N - 1)
    assert b"(default: prompt + N - 1, at most max_seq_len)" in p.stdout


def test_bad_token_files(native_build, native_synth, tmp_path):
    exe, model = native_build.asan, native_synth.quant.path
    (tmp_path / "x.json").write_text("[1, 2, x]")
    check(run_native(exe, "-m", model, "--ids", tmp_path / "x.json"), EXIT_PROMPT,
          "x.json", "unexpected character 'x'")
    token_file(tmp_path / "big.json", [1, 259])
    check(run_native(exe, "-m", model, "--score", tmp_path / "big.json"), EXIT_PROMPT,
          "out of range (vocab_size=259)")
    token_file(tmp_path / "one.json", [5])
    check(run_native(exe, "-m", model, "--score", tmp_path / "one.json"), EXIT_PROMPT,
          "needs at least 2 tokens")
    check(run_native(exe, "-m", model, "-p", "", "--no-bos"), EXIT_PROMPT, "prompt is empty")
    check(run_native(exe, "-m", model, "-f", tmp_path / "missing.txt"), EXIT_IO,
          "missing.txt", "cannot read")


def test_directory_as_input_file(native_build, native_synth, tmp_path):
    exe, model = native_build.asan, native_synth.quant.path
    for flag in ("-f", "--ids", "--score"):
        err = check(run_native(exe, "-m", model, flag, tmp_path), EXIT_IO)
        assert f"ditto-run: error: {tmp_path}: is a directory, not a file\n" in err, err


def test_dump_logits_unwritable_leaves_nothing(native_build, native_synth, tmp_path):
    out = tmp_path / "no_such_dir" / "logits.f32"
    p = run_native(native_build.asan, "-m", native_synth.quant.path, "-p", "hi",
                   "--dump-logits", out)
    check(p, EXIT_IO, "cannot write")
    assert not out.parent.exists()
    # a read-only directory: the temporary file cannot be created, nothing is left
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        p = run_native(native_build.asan, "-m", native_synth.quant.path, "-p", "hi",
                       "--dump-logits", ro / "l.f32")
        if os.geteuid() != 0:  # root ignores directory permissions
            check(p, EXIT_IO, "cannot write")
            assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


def test_chat_without_chat_text(native_build, tmp_path):
    from tests.fixtures_native import byte_vocab
    from tests.fixtures_tokenizer import tiny_model_with_tokenizer

    model = tiny_model_with_tokenizer(tmp_path / "nochat.ditto", byte_vocab(chat=False))
    p = run_native(native_build.asan, "-m", model, "-p", "hi", "--chat")
    check(p, EXIT_USAGE, "--chat: the model file has no chat template text")
