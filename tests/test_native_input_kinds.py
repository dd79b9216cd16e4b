"""Two kinds of input ditto-run refuses up front (native/io/input.h, native/app/main.c): an input
path that is not a regular file (a FIFO must not block the open, a device must not be read), and a
numeric flag that is not exactly a number in range (blanks, signs on unsigned values, trailing
text, empty values, overflow). Run under ASan + UBSan, like tests/test_native_cli.py."""

import os
import time

import pytest

from tests.fixtures_native import EXIT_IO, EXIT_MODEL, EXIT_OK, EXIT_USAGE, run_native
from tests.test_native_cli import check


@pytest.mark.parametrize("flag", ["-m", "-f", "--ids", "--score"])
def test_fifo_input_is_refused_without_blocking(native_build, native_synth, tmp_path, flag):
    """A FIFO with no writer: open() would wait forever; ditto-run names it and exits at once."""
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    if flag == "-m":
        args, code = ["-m", fifo, "-p", "hi"], EXIT_MODEL
        expected = f"ditto-run: error: {fifo}: not a regular file\n"
    else:
        args, code = ["-m", native_synth.quant.path, flag, fifo], EXIT_IO
        expected = f"ditto-run: error: {fifo}: not a regular file (a FIFO, socket or device)\n"
    t0 = time.monotonic()
    p = run_native(native_build.asan, *args, timeout=60)
    assert time.monotonic() - t0 < 30
    err = check(p, code)
    assert expected in err, err


def test_device_input_is_refused(native_build, native_synth):
    """/dev/null reads as an empty file; as a prompt file or model it is refused by type."""
    p = run_native(native_build.asan, "-m", native_synth.quant.path, "-f", "/dev/null")
    assert "ditto-run: error: /dev/null: not a regular file (a FIFO, socket or device)\n" in \
        check(p, EXIT_IO)
    p = run_native(native_build.asan, "-m", "/dev/null", "-p", "hi")
    assert "ditto-run: error: /dev/null: not a regular file\n" in check(p, EXIT_MODEL)


@pytest.mark.parametrize("flag,value,message", [
    ("--seed", " -1", "--seed must be a non-negative integer"),
    ("--seed", "-1", "--seed must be a non-negative integer"),
    ("--seed", "\t-1", "--seed must be a non-negative integer"),
    ("--seed", "", "--seed must be a non-negative integer"),
    ("--seed", " 7", "--seed must be a non-negative integer"),
    ("--seed", "7 ", "--seed must be a non-negative integer"),
    ("--seed", "+7", "--seed must be a non-negative integer"),
    ("--seed", "18446744073709551616", "--seed must be a non-negative integer"),
    ("-n", " 5", "-n must be an integer in 1..1073741824"),
    ("-n", "5 ", "-n must be an integer in 1..1073741824"),
    ("-n", "5x", "-n must be an integer in 1..1073741824"),
    ("-n", "", "-n must be an integer in 1..1073741824"),
    ("-n", "99999999999999999999", "-n must be an integer in 1..1073741824"),
    ("--threads", " 1", "--threads must be an integer in 1..1024"),
    ("--ctx", "1e3", "--ctx must be an integer in 1..16777216"),
    ("--ctx", "2147483648", "--ctx must be an integer in 1..16777216"),
    ("-b", "0x10", "--batch-size must be an integer in 1..512"),
    ("--temp", " 0.5", "--temp must be a number >= 0"),
    ("--temp", "0.5 ", "--temp must be a number >= 0"),
    ("--temp", "", "--temp must be a number >= 0"),
    ("--temp", "nan", "--temp must be a number >= 0"),
    ("--temp", "1e39", "--temp must be a number >= 0"),
    ("--top-p", " 0.5", "--top-p must be in (0, 1]"),
    ("--top-p", "0.5x", "--top-p must be in (0, 1]"),
])
def test_numeric_flag_must_be_exactly_a_number(native_build, native_synth, flag, value, message):
    p = run_native(native_build.asan, "-m", native_synth.quant.path, "-p", "hi", flag, value)
    err = check(p, EXIT_USAGE)
    assert f"ditto-run: {message}, got '{value}'\n" in err, err


def test_numeric_flag_limits_accepted(native_build, native_synth):
    """The largest seed (2^64 - 1), a float without a leading digit and the smallest -n run."""
    p = run_native(native_build.asan, "-m", native_synth.quant.path, "-p", "hi", "-n", "1",
                   "--seed", "18446744073709551615", "--temp", ".5", "--top-p", "1")
    check(p, EXIT_OK)
