"""The libFuzzer targets of native/fuzz (clang-22, ASan + UBSan): the model loader + forward
pass, the tokenizer (block, encode with and without --special, decode) and the token file
parser. Each runs for a bounded time from seeds made of the real bundled models (CI:
$DITTO_FUZZ_TEST_SECONDS, default 10 s per target; `make -C native fuzz` runs longer), after
replaying every known crash input (tests/data/fuzz_regressions, plus model files generated here
from the seeds). Any crash, sanitizer report or leak fails the test. docs/RELIABILITY.md has
the longer runs and their results."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ditto_core.model import format as F
from tests.fixtures_native import MAKE
from tests.modelfile_edit import ModelImage
from tests.script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native"
REGRESSIONS = ROOT / "tests" / "data" / "fuzz_regressions"
SECONDS = int(os.environ.get("DITTO_FUZZ_TEST_SECONDS", "10"))
TARGETS = ("model", "tokenizer", "tokenfile")


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    """Built fuzz targets, seed corpora (native/fuzz/make_seeds.py) and the env they run in."""
    build = tmp_path_factory.mktemp("fuzz_build")
    p = subprocess.run([*MAKE, "-C", str(NATIVE), f"BUILD={build}", "fuzz-build"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    make_seeds = load_script(NATIVE / "fuzz" / "make_seeds.py")
    seeds = build / "seeds"
    make_seeds.main(seeds)
    models = sorted((seeds / "models").glob("*.ditto"))
    assert len(models) == 4
    env = dict(os.environ, DITTO_FUZZ_MODELS=":".join(map(str, models)),
               ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1")
    return build, seeds, env


def _regression_models(seeds: Path, out: Path) -> list[Path]:
    """Model files of the crash kinds found so far: codebook G overflowing int arithmetic
    (G = 2^31-1, 2^31, 2^32-1), overlapping payloads, a control token of incomplete UTF-8."""
    out.mkdir()
    src = seeds / "model" / "bytes_tied.ditto"
    files = []
    for G in (2**31 - 1, 2**31, 2**32 - 1, F.MAX_GROUP_SIZE):
        img = ModelImage(src)
        for i, e in enumerate(img.entries()):
            if e["encoding"] == F.ENC_CODEBOOK:
                img.set_entry(i, group_size=G)
        files.append(img.save(out / f"group_size_{G}.ditto"))
    img = ModelImage(src)
    e = img.entries()
    img.set_entry(2, offset=e[1]["offset"])
    files.append(img.save(out / "overlap.ditto"))
    img = ModelImage(src)
    sec = img.token_sections()
    img.b[sec["blob"] + 1] = 0xC3  # "<|endoftext|>" -> "<\xc3..."
    files.append(img.save(out / "control_token_partial_utf8.ditto"))
    return files


def _run(exe: Path, args: list, env: dict, cwd: Path) -> str:
    p = subprocess.run(["nice", "-n", "5", str(exe)] + [str(a) for a in args], capture_output=True,
                       text=True, env=env, cwd=cwd, errors="replace")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    for bad in ("ERROR: AddressSanitizer", "runtime error", "ERROR: LeakSanitizer",
                "ERROR: libFuzzer", "deadly signal"):
        assert bad not in out, out[-4000:]
    return out


def test_known_crash_inputs_stay_fixed(fuzz, tmp_path):
    build, seeds, env = fuzz
    for target in TARGETS:
        inputs = sorted((REGRESSIONS / target).glob("*"))
        if target == "model":
            inputs += _regression_models(seeds, tmp_path / "models")
        inputs = [p for p in inputs if p.name != "README.md"]
        if target != "tokenfile":
            assert inputs, target
        if inputs:
            out = _run(build / "fuzz" / f"fuzz_{target}", inputs, env, tmp_path)
            assert f"Executed {inputs[-1]}" in out


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_finds_nothing(fuzz, tmp_path, target):
    build, seeds, env = fuzz
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    out = _run(build / "fuzz" / f"fuzz_{target}",
               [f"-max_total_time={SECONDS}", "-max_len=2000000", "-rss_limit_mb=4096",
                "-print_final_stats=1", f"-artifact_prefix={tmp_path}/", corpus,
                seeds / target], env, tmp_path)
    runs = int(out.split("stat::number_of_executed_units:", 1)[1].split()[0])
    assert runs > 100, out[-2000:]  # it really ran
    assert not list(tmp_path.glob("crash-*")) and not list(tmp_path.glob("leak-*"))
