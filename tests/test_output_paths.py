"""Outputs never replace inputs, special files or symlinks (issue: reliability, data loss).

`ditto export X -o X` (and every spelling of it: a symlink or hard link to X, a file inside an
HF input directory) is refused with the source intact; a FIFO, device node or directory as the
output is refused; a symlink output is written through (the link stays, its target gets the
file). The same rule holds for `ditto cc` outputs and for the model-file writer itself."""

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ditto_core.base.errors import DittoError
from ditto_core.base.outputs import output_target
from ditto_core.cli.cc import cc_command
from ditto_core.cli.main import cli
from ditto_core.model.modelfile import ModelFile


@pytest.fixture
def gguf_copy(tiny_gguf, tmp_path) -> Path:
    p = tmp_path / "model.gguf"
    shutil.copyfile(tiny_gguf, p)
    return p


def _export(model, out):
    return CliRunner().invoke(cli, ["export", str(model), "-o", str(out), "-q"])


def _same_bytes(a: Path, b: Path) -> bool:
    return a.read_bytes() == b.read_bytes()


def test_export_onto_its_own_input_is_refused(gguf_copy, tiny_gguf):
    r = _export(gguf_copy, gguf_copy)
    assert r.exit_code == 1
    assert r.stderr == (f"error: {gguf_copy}: the model file would overwrite the input "
                        f"{gguf_copy}; choose another output path\n")
    assert _same_bytes(gguf_copy, tiny_gguf)
    assert sorted(os.listdir(gguf_copy.parent)) == ["model.gguf"]


@pytest.mark.parametrize("how", ["symlink", "hardlink", "dotdot"])
def test_export_onto_an_alias_of_its_input_is_refused(gguf_copy, tiny_gguf, how):
    d = gguf_copy.parent
    if how == "symlink":
        out = d / "out.ditto"
        out.symlink_to("model.gguf")
    elif how == "hardlink":
        out = d / "out.ditto"
        os.link(gguf_copy, out)
    else:
        (d / "sub").mkdir()
        out = d / "sub" / ".." / "model.gguf"
    r = _export(gguf_copy, out)
    assert r.exit_code == 1, r.output
    assert f"the model file would overwrite the input {gguf_copy}" in r.stderr
    assert _same_bytes(gguf_copy, tiny_gguf)
    if how == "symlink":
        assert out.is_symlink() and os.readlink(out) == "model.gguf"


def test_export_into_a_file_of_the_input_hf_directory_is_refused(tmp_path):
    from tests.fixtures_hf import write_tiny_hf_dir

    d = write_tiny_hf_dir(tmp_path / "hf")[0]
    before = (d / "model.safetensors").read_bytes()
    r = _export(d, d / "model.safetensors")
    assert r.exit_code == 1
    assert "would overwrite the input" in r.stderr
    assert (d / "model.safetensors").read_bytes() == before


@pytest.mark.parametrize("kind,word", [("fifo", "a FIFO"), ("dir", "a directory"),
                                       ("dev", "a character device")])
def test_export_onto_a_special_file_is_refused(gguf_copy, tmp_path, kind, word):
    if kind == "fifo":
        out = tmp_path / "fifo"
        os.mkfifo(out)
    elif kind == "dir":
        out = tmp_path / "adir"
        out.mkdir()
    else:
        out = Path("/dev/null")
    r = _export(gguf_copy, out)
    assert r.exit_code == 1
    assert r.stderr.startswith(f"error: {out}: is {word}; the model file must be a regular file")
    if kind == "fifo":
        assert Path(out).exists() and not Path(out).is_file()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_export_through_a_symlink_writes_its_target(gguf_copy, tmp_path):
    real = tmp_path / "real.ditto"
    real.write_bytes(b"old")
    link = tmp_path / "link.ditto"
    link.symlink_to("real.ditto")
    r = _export(gguf_copy, link)
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and os.readlink(link) == "real.ditto"
    with ModelFile.open(real) as mf:
        assert mf.config.n_layers == 2


def test_dangling_symlink_into_a_missing_directory_is_refused(gguf_copy, tmp_path):
    link = tmp_path / "dang.ditto"
    link.symlink_to(tmp_path / "nowhere" / "x.ditto")
    r = _export(gguf_copy, link)
    assert r.exit_code == 1
    assert "whose directory does not exist" in r.stderr
    assert link.is_symlink()


def test_output_target_api(tmp_path):
    f = tmp_path / "a"
    f.write_text("x")
    assert output_target(tmp_path / "new") == tmp_path / "new"
    (tmp_path / "l").symlink_to("a")
    assert output_target(tmp_path / "l") == f
    with pytest.raises(DittoError, match="would overwrite the input"):
        output_target(tmp_path / "l", "report", inputs=[f])


@pytest.fixture
def csrc(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.c").write_text("int main(void) { return 0; }\n")
    return tmp_path


@pytest.mark.parametrize("opt", ["-o", "--report", "--emit-ir"])
def test_cc_refuses_special_and_input_outputs(csrc, opt):
    os.mkfifo(csrc / "fifo")
    (csrc / "src.c").symlink_to("p.c")
    args = ["p.c", "--blas", "openblas"] + (["-o", "exe"] if opt != "-o" else [])
    r = CliRunner().invoke(cc_command, args + [opt, "fifo"])
    assert r.exit_code == 1
    assert r.stderr.startswith("error: fifo: is a FIFO;"), r.stderr
    r = CliRunner().invoke(cc_command, args + [opt, "src.c"])
    assert r.exit_code == 1
    assert "would overwrite" in r.stderr and "p.c" in r.stderr
    assert (csrc / "p.c").read_text() == "int main(void) { return 0; }\n"
    assert sorted(os.listdir(csrc)) == ["fifo", "p.c", "src.c"]


def test_compare_refuses_special_result_files_before_any_work(tmp_path):
    from ditto_core.eval import compare

    out = tmp_path / "cmp"
    out.mkdir()
    os.mkfifo(out / "results.csv")
    with pytest.raises(DittoError, match=r"results.csv: is a FIFO; the result file must be"):
        compare.compare("tinycoder", ["none"], out, {"eval": False, "bench": False})
    assert sorted(os.listdir(out)) == ["results.csv"]  # no builds started
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DittoError, match="exists and is not a directory"):
        compare.compare("tinycoder", ["none"], tmp_path / "afile", {})


def test_compare_tables_write_through_symlinks(tmp_path):
    from ditto_core.eval import compare

    out = tmp_path / "cmp"
    out.mkdir()
    (tmp_path / "kept.csv").write_text("old")
    (out / "results.csv").symlink_to(tmp_path / "kept.csv")
    compare.write_tables(out, [{"config": "none", "bpw": 32.0}])
    assert (out / "results.csv").is_symlink()
    assert (tmp_path / "kept.csv").read_text().startswith("config,")


def test_special_files_as_model_inputs_are_named(tmp_path):
    """A FIFO or device node given where a model is read (`ditto inspect`, `ditto export`) is
    refused as not a regular file, without blocking on it (docs/INPUTS.md)."""
    fifo = tmp_path / "m.ditto"
    os.mkfifo(fifo)
    for args, path, kind in [(["inspect", str(fifo)], fifo, "a FIFO"),
                             (["inspect", "/dev/null"], "/dev/null", "a character device"),
                             (["export", str(fifo), "-o", str(tmp_path / "o.ditto")], fifo,
                              "a FIFO")]:
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 1, r.output
        assert f"error: {path}: not a regular file ({kind})" in r.output
    assert not (tmp_path / "o.ditto").exists()
