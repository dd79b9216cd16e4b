"""The codebook group size G is range-checked everywhere it enters: the model file readers (C
loader and ModelFile refuse G outside 2..2^24 before any arithmetic), the kernels (a G longer
than the row is the whole row, so their int column arithmetic stays in range) and `ditto build`
(--group-size outside the range is refused before export). Reproduces
reliability/codebook-group-size-overflow: G = 2^31-1 gave all-zero logits, 2^32-1 SIGSEGV."""

import subprocess
import sys

import numpy as np
import pytest

from ditto_core.base.errors import DittoError
from ditto_core.kit.components import QuantOptions
from ditto_core.model import format as F
from ditto_core.model.codebook import check_params as check_codebook_params
from ditto_core.model.modelfile import ModelFile
from tests.fixtures_native import EXIT_MODEL, dump_logits, run_native
from tests.modelfile_edit import ModelImage

IDS = [1, 40, 41, 42, 100, 200]


def _with_group_size(src, dst, G):
    """Copy ``src`` with every codebook tensor whose rows fit in one sub-block (G >= cols)
    given group size ``G``: the same layout and the same weights when G is valid."""
    img = ModelImage(src)
    changed = 0
    for i, e in enumerate(img.entries()):
        if e["encoding"] == F.ENC_CODEBOOK and e["group_size"] >= e["cols"]:
            img.set_entry(i, group_size=G)
            changed += 1
    assert changed >= 1
    return img.save(dst)


def test_largest_group_size_runs_like_one_sub_block_per_row(native_build, native_synth,
                                                           tmp_path):
    src = native_synth.quant.path
    want = dump_logits(native_build.asan, src, IDS, tmp_path)
    big = _with_group_size(src, tmp_path / "gmax.ditto", F.MAX_GROUP_SIZE)
    assert ModelFile(big).tensors  # the Python reader accepts it too
    got = dump_logits(native_build.asan, big, IDS, tmp_path)
    np.testing.assert_array_equal(got, want)
    assert np.abs(got).max() > 0.1


@pytest.mark.parametrize("G", [F.MAX_GROUP_SIZE + 1, 2**31 - 1, 2**31, 2**32 - 1])
def test_group_size_beyond_the_limit_is_refused_by_both_readers(native_build, native_synth,
                                                                tmp_path, G):
    bad = _with_group_size(native_synth.quant.path, tmp_path / "bad.ditto", G)
    p = run_native(native_build.asan, "-m", bad, "-p", "hi", "-n", 2, "--temp", 0)
    err = p.stderr.decode()
    assert p.returncode == EXIT_MODEL, err
    assert f"group_size={G}" in err and "invalid encoding parameters" in err, err
    assert "Sanitizer" not in err and "runtime error" not in err
    with pytest.raises(DittoError, match=f"group size G must be an integer in 2..16777216, got {G}"):
        ModelFile(bad)


def test_check_codebook_params_names_the_limit():
    check_codebook_params(4, F.MAX_GROUP_SIZE, "f16")
    for bits, G, ct, msg in [(4, 1, "f16", "group size G must be an integer in 2..16777216, got 1"),
                             (4, 2**32 - 1, "f16", "got 4294967295"),
                             (4, 2.5, "f16", "group size G must be an integer in 2..16777216, got 2.5"),
                             (9, 256, "f16", "bit width b must be an integer in 1..8, got 9"),
                             (4, 256, "bf16", "codebook type must be 'f16', 'f32' or 'int8'")]:
        with pytest.raises(DittoError, match=msg):
            check_codebook_params(bits, G, ct)


def test_build_refuses_huge_group_size_before_export(tmp_path):
    from ditto_core.stages import pipeline

    opts = pipeline.BuildOptions(quantizer="kmeans", blas="openblas",
                                 quant=QuantOptions(bits=1, group_size=2**32 - 1))
    # a model path that does not exist: the option error must come first
    with pytest.raises(DittoError, match="group size G must be an integer in 2..16777216, got 4294967295"):
        pipeline.build(tmp_path / "no-such-model.gguf", tmp_path / "out", opts,
                       show_progress=False)
    assert not (tmp_path / "out").exists()


def test_cli_refuses_huge_group_size(tmp_path):
    p = subprocess.run([sys.executable, "-m", "ditto_core.cli.main", "build", "tinycoder",
                        "--quantizer", "kmeans", "--blas", "openblas", "--bits", "1",
                        "--group-size", "4294967295", "-o", str(tmp_path / "g")],
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert "'--group-size': 4294967295 is not in the range 2<=x<=16777216" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "g").exists()
