"""Calibration (ditto_core/eval/calibration.py): the importance statistic against the NumPy
reference forward pass, the importance file (ditto_core/kit/importance.py), and `ditto build
--calibration/--importance` on tinycoder (importance and calibration identity in build.json
and the cache key)."""

import hashlib
import json

import numpy as np
import pytest

from ditto_core.base.errors import DittoError
from ditto_core.eval import calibration as cal
from ditto_core.kit import importance as imp_mod
from ditto_core.model.modelfile import ModelFile
from ditto_core.stages import pipeline

from .native_reference import reference_logits


def test_shipped_text_identity():
    data, ident = cal.calibration_text("stdlib")
    assert ident == {"name": "stdlib:contextlib,string,copy,queue,json/decoder,json/encoder",
                     "bytes": 87935, "sha256": cal.CALIBRATION_SHA256}
    assert hashlib.sha256(data).hexdigest() == cal.CALIBRATION_SHA256
    # none of it is in the evaluation corpus
    from ditto_core.eval.corpus import CORPUS_MODULES
    assert not set(cal.CALIBRATION_MODULES) & set(CORPUS_MODULES)


def test_bad_calibration_text(tmp_path):
    with pytest.raises(DittoError, match=r"nope.txt: cannot read the calibration text"):
        cal.calibration_text(tmp_path / "nope.txt")
    (tmp_path / "e.txt").write_text("  \n")
    with pytest.raises(DittoError, match=r"e.txt: the calibration text is empty"):
        cal.calibration_text(tmp_path / "e.txt")
    (tmp_path / "b.bin").write_bytes(b"ok\n\xff\xfe")
    with pytest.raises(DittoError, match=r"b.bin: the calibration text is not UTF-8 \(invalid "
                                         r"byte at offset 3\)"):
        cal.calibration_text(tmp_path / "b.bin")
    (tmp_path / "short.txt").write_text("x = 1\n")
    with pytest.raises(DittoError, match=r"short.txt: .*at least"):
        cal.calibrate("tinycoder", tmp_path / "short.txt")


def test_importance_equals_the_reference_forward(tiny_gguf):
    """The hooks' mean x² per input channel equals the same statistic taken inside the NumPy
    float64 reference forward pass (tests/native_reference.py), for every matrix."""
    ck = pipeline.export(tiny_gguf)
    rng = np.random.default_rng(0)
    chunks = [list(rng.integers(0, ck.config.vocab_size, 40)) for _ in range(2)]
    got = cal.collect_importance(ck, chunks, threads=1)
    w = {n: np.asarray(ck.tensors[n](), np.float64) for n in ck.shapes}
    w.setdefault("output.weight", w["token_embd.weight"])
    sums, n_tok = {}, 0

    def linear(h, name):
        sums[name] = sums.get(name, 0.0) + (h * h).sum(axis=0)
        return h @ w[name].T

    for c in chunks:
        reference_logits(ck.config, w, c, linear)
        n_tok += len(c)
    out_name = "token_embd.weight" if ck.config.tied_embeddings else "output.weight"
    want = {(out_name if n == "output.weight" else n): s / n_tok for n, s in sums.items()}
    assert set(got) == set(want)
    for n in want:
        np.testing.assert_allclose(got[n], want[n], rtol=2e-4, err_msg=n)


def test_importance_file_round_trip_and_errors(tmp_path):
    imp = imp_mod.Importance({"blk.0.attn_q.weight": np.array([1.0, 2.0])},
                             {"format": imp_mod.FORMAT, "version": imp_mod.VERSION, "tokens": 512})
    p = tmp_path / "imp.npz"
    imp_mod.save_importance(imp, p)
    back = imp_mod.load_importance(p)
    np.testing.assert_array_equal(back.vectors["blk.0.attn_q.weight"], [1.0, 2.0])
    assert back.meta == imp.meta
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(DittoError, match=r"bad.npz: not an importance file \(.npz\): not a zip "
                                         r"archive \(`ditto calibrate` writes them\)$"):
        imp_mod.load_importance(bad)
    txt = tmp_path / "notes.txt"  # numpy alone would suggest allow_pickle for this one
    txt.write_text("hello\n")
    with pytest.raises(DittoError, match=r"notes.txt: not an importance file \(.npz\): not a "
                                         r"zip archive"):
        imp_mod.load_importance(txt)
    np.savez(tmp_path / "other.npz", x=np.ones(2))
    with pytest.raises(DittoError, match=r"other.npz: not a Ditto importance file"):
        imp_mod.load_importance(tmp_path / "other.npz")
    imp_mod.save_importance(imp_mod.Importance({"t": np.array([-1.0])}, imp.meta),
                            tmp_path / "neg.npz")
    with pytest.raises(DittoError, match=r"neg.npz: importance of 't' must be a finite, "
                                         r"non-negative 1-D float array"):
        imp_mod.load_importance(tmp_path / "neg.npz")
    with pytest.raises(DittoError, match=r"missing.npz: cannot read the importance file"):
        imp_mod.load_importance(tmp_path / "missing.npz")


def _build(tmp_path, name, **kw):
    from ditto_core import build
    return build("tinycoder", quantizer="kmeans", blas="openblas", out=tmp_path / name,
                 bits=2, group_size=8, **kw)


def test_build_with_calibration_and_importance_file(tmp_path):
    """`--calibration stdlib` records the text's identity and the importance file's hash in
    build.json; the same importance given as a file builds the same bytes; without it the
    unweighted file; the calibrated model file differs from the unweighted one."""
    plain = _build(tmp_path, "plain")
    calib = _build(tmp_path, "calib", calibration="stdlib")
    rec = calib.record
    assert rec["calibration"]["sha256"] == cal.CALIBRATION_SHA256
    assert rec["importance"]["chunks"] >= 2
    path = rec["importance"]["path"]
    assert rec["importance"]["sha256"] == hashlib.sha256(open(path, "rb").read()).hexdigest()
    assert "importance" not in plain.record
    again = _build(tmp_path, "again", importance=path)
    a, b = (tmp_path / "calib" / "model.ditto").read_bytes(), \
        (tmp_path / "again" / "model.ditto").read_bytes()
    assert a == b
    assert a != (tmp_path / "plain" / "model.ditto").read_bytes()
    meta = json.loads((tmp_path / "again" / "build.json").read_text())
    assert meta["importance"]["sha256"] == rec["importance"]["sha256"]
    with ModelFile.open(tmp_path / "calib" / "model.ditto") as mf:
        assert mf.tensors["blk.0.attn_q.weight"].encoding == "codebook"


def test_build_refuses_both(tmp_path):
    from ditto_core import build
    with pytest.raises(DittoError, match="either a calibration text or an importance file"):
        build("tinycoder", quantizer="kmeans", blas="openblas", out=tmp_path / "x",
              calibration="stdlib", importance=tmp_path / "i.npz")


def test_pipeline_build_takes_the_calibration_step_as_an_argument(tmp_path):
    """pipeline.build sits below calibration (docs/ARCHITECTURE.md "Layers"): a calibration
    text without its ``calibrate`` step is refused before any work; ditto_core.build passes
    calibration.cached_importance."""
    opts = pipeline.BuildOptions(quantizer="kmeans", blas="openblas", calibration="stdlib")
    with pytest.raises(DittoError, match=r"^a calibration text needs the calibration step: "
                                         r"pass calibrate=ditto_core.eval.calibration"):
        pipeline.build("tinycoder", tmp_path / "out", opts)
    assert not (tmp_path / "out").exists()


def test_calibrate_command(tmp_path):
    """`ditto calibrate tinycoder -o FILE` writes an importance file of every matrix the
    forward pass multiplies, with the shipped text's identity; `ditto build --importance` with
    it records the same hash."""
    from click.testing import CliRunner

    from ditto_core.cli.eval import register
    from ditto_core.cli.main import cli

    register(cli)
    out = tmp_path / "tc.npz"
    res = CliRunner().invoke(cli, ["calibrate", "tinycoder", "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    imp = cal.load_importance(out)
    assert imp.meta["calibration"]["sha256"] == cal.CALIBRATION_SHA256
    assert imp.meta["tokens"] == imp.meta["chunks"] * 512
    assert sorted(imp.vectors) == sorted(
        [f"blk.{i}.{t}.weight" for i in range(2) for t in
         ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")]
        + ["output.weight"])
    assert all(v.shape == (16,) or v.shape == (64,) for v in imp.vectors.values())


def test_calibrate_output_is_checked_before_the_run(tmp_path, tiny_gguf):
    """`ditto calibrate -o` follows the rule of every writing command (docs/RELIABILITY.md):
    an output that is one of its inputs (the model, the calibration text), a device node or a
    directory is refused before any work, and so is a missing directory; the inputs stay."""
    import shutil

    from click.testing import CliRunner

    from ditto_core.cli.eval import register
    from ditto_core.cli.main import cli

    register(cli)
    model = tmp_path / "t.gguf"
    shutil.copyfile(tiny_gguf, model)
    text = tmp_path / "cal.txt"
    text.write_text("x = 1\n" * 3000)
    before = model.read_bytes(), text.read_bytes()
    for out, message in [
            (model, f"{model}: the importance file would overwrite the input {model}"),
            (text, f"{text}: the importance file would overwrite the input {text}"),
            ("/dev/null", "/dev/null: is a character device; the importance file must be a "
                          "regular file, refusing to replace it"),
            (tmp_path / "no" / "x.npz", f"{tmp_path / 'no' / 'x.npz'}: the directory "
                                        f"{tmp_path / 'no'} does not exist")]:
        res = CliRunner().invoke(cli, ["calibrate", str(model), "-o", str(out), "--calibration",
                                       str(text), "-q"])
        assert res.exit_code == 1 and f"error: {message}" in res.output, res.output
    assert (model.read_bytes(), text.read_bytes()) == before
    assert not (tmp_path / "no").exists()
