"""native/ compiles warning-free (-Wall -Wextra -Werror) with gcc and clang-22, and the gcc
build (libgomp) computes the same logits as the clang-22 build (libomp)."""

import subprocess

import numpy as np

from tests.fixtures_native import MAKE, NATIVE, dump_logits, rel_error


def test_warning_free_under_gcc_and_clang(native_build, native_synth, tmp_path):
    p = subprocess.run([*MAKE, "-C", str(NATIVE), f"BUILD={tmp_path}", "warnings"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "warning" not in (p.stdout + p.stderr).lower()
    ids = [1, 40, 41, 42, 100, 200]
    m = native_synth.quant
    gcc = dump_logits(tmp_path / "ditto-run-gcc", m.path, ids, tmp_path)
    clang = dump_logits(native_build.run, m.path, ids, tmp_path)
    assert rel_error(gcc, clang).max() <= 1e-5
    assert np.array_equal(gcc.argmax(-1), clang.argmax(-1))
