"""The `ditto` command line: --help everywhere, export → inspect on the bundled tiny model,
inspect's size/bpw arithmetic on a codebook file, error reporting."""

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from ditto_core.base.types import ModelConfig
from ditto_core.cli.main import cli
from ditto_core.model.modelfile import TensorInfo, expected_shapes, write_model
from tests.test_modelfile import tiny_tokenizer


def test_help_on_every_command():
    out = subprocess.run(["ditto", "--help"], check=True, capture_output=True, text=True).stdout
    listed = [line.split()[0] for line in out.split("Commands:")[1].splitlines() if line.strip()]
    assert {"export", "inspect", "plugins", "build"} <= set(listed)
    for cmd in listed:
        r = subprocess.run(["ditto", cmd, "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and "Usage: ditto " + cmd in r.stdout, (cmd, r.stderr)

def test_python_dash_m_ditto_core_is_the_ditto_command():
    proc = subprocess.run([sys.executable, "-m", "ditto_core", "--version"],
                          capture_output=True, text=True, timeout=120)
    from importlib.metadata import version

    assert (proc.returncode, proc.stdout) == (0, f"ditto, version {version('ditto-llm')}\n")
    proc = subprocess.run([sys.executable, "-m", "ditto_core", "nonsense"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Usage: ditto [OPTIONS] COMMAND" in proc.stderr


def test_export_then_inspect_tiny(tiny_gguf, tmp_path):
    import gguf

    out = tmp_path / "tiny.ditto"
    r = CliRunner().invoke(cli, ["export", "tinycoder", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["inspect", "--json", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    meta = gguf.GGUFReader(tiny_gguf)
    f = meta.fields
    assert s["config"]["n_layers"] == f["llama.block_count"].contents() == 2
    assert s["config"]["dim"] == f["llama.embedding_length"].contents()
    assert s["n_tensors"] == len(meta.tensors) == 21
    assert s["n_weights"] == sum(int(t.n_elements) for t in meta.tensors)
    assert s["bpw_payload"] == 32.0 and s["overhead_percent"] == 0.0
    assert s["bpw_file"] == pytest.approx(8 * out.stat().st_size / s["n_weights"])
    assert s["tokenizer"]["kind"] == "spm_bpe" and s["tokenizer"]["n_tokens"] == 32000
    r = CliRunner().invoke(cli, ["inspect", str(out)])
    assert r.exit_code == 0 and "blk.1.ffn_down.weight" in r.output and "bpw" in r.output

def test_inspect_codebook_sizes(tmp_path):
    cfg = ModelConfig(dim=20, hidden_dim=36, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=10,
                      vocab_size=8, max_seq_len=16, rope_theta=10000.0, norm_eps=1e-5,
                      tied_embeddings=True)
    infos = [TensorInfo(n, "codebook", s, 2, 8, "f16") if n == "blk.0.ffn_down.weight"
             else TensorInfo(n, "f32", s) for n, s in expected_shapes(cfg).items()]
    rng = np.random.default_rng(0)

    def payloads():
        for t in infos:
            if t.encoding == "f32":
                yield t.name, rng.standard_normal(t.shape).astype(np.float32)
            else:
                yield t.name, bytes(t.expected_nbytes())

    path = tmp_path / "cb.ditto"
    write_model(path, cfg, tiny_tokenizer(), infos, payloads())
    s = json.loads(CliRunner().invoke(cli, ["inspect", "--json", str(path)]).output)
    row = next(r for r in s["tensors"] if r["name"] == "blk.0.ffn_down.weight")
    # ffn_down is [20, 36], b=2, G=8, f16 codebooks: S=5, K=4.
    # FORMAT.md: codebooks 20·5·4·2 = 800 -> padded to 832; indices 20 rows · ceil(36/8)·2 = 200
    assert row["bytes"] == 832 + 200
    # theoretical: 720 weights at 2 bits = 180 bytes + 800 bytes of codebooks
    assert row["theoretical_bytes"] == 980
    assert row["bpw"] == pytest.approx(8 * 1032 / 720)
    f32_bytes = sum(4 * int(np.prod(t.shape)) for t in infos if t.encoding == "f32")
    assert s["payload_bytes"] == f32_bytes + 1032
    assert s["theoretical_bytes"] == f32_bytes + 980
    assert s["overhead_percent"] == pytest.approx(100 * 52 / (f32_bytes + 980))

def test_inspect_refuses_damaged_file(tiny_f32_ditto, tmp_path):
    bad = tmp_path / "bad.ditto"
    data = bytearray(tiny_f32_ditto.read_bytes())
    data[-5] ^= 1
    bad.write_bytes(bytes(data))
    r = CliRunner().invoke(cli, ["inspect", str(bad)])
    assert r.exit_code == 1 and str(bad) in r.stderr and "checksum" in r.stderr
    r = CliRunner().invoke(cli, ["inspect", str(tmp_path / "none.ditto")])
    assert r.exit_code == 1 and "none.ditto" in r.stderr

def test_build_unknown_components_fail_before_work(tmp_path):
    out = tmp_path / "b"
    r = CliRunner().invoke(cli, ["build", "tinycoder", "--quantizer", "nope", "--blas",
                                 "openblas", "-o", str(out)])
    assert r.exit_code == 1 and "unknown quantizer 'nope'" in r.stderr and "none" in r.stderr
    r = CliRunner().invoke(cli, ["build", "tinycoder", "--quantizer", "none", "--blas", "nope",
                                 "-o", str(out)])
    assert r.exit_code == 1 and "unknown BLAS target 'nope'" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_build_quantizer_none_warns_about_ignored_quantize_options(tmp_path):
    out = tmp_path / "b"
    # --blas nope fails fast, after the warning; exit code is the failure's, not the warning's
    r = CliRunner().invoke(cli, ["build", "tinycoder", "--quantizer", "none", "--blas", "nope",
                                 "--bits", "3", "--group-size", "64", "-o", str(out)])
    assert r.exit_code == 1 and "unknown BLAS target 'nope'" in r.stderr
    assert r.stderr.splitlines()[0] == \
        "warning: --bits, --group-size ignored with --quantizer none (every tensor stays fp32)"
    # no quantize option given, or a quantizer that uses them: no warning
    for q, extra in (("none", []), ("kmeans", ["--bits", "3"])):
        r = CliRunner().invoke(cli, ["build", "tinycoder", "--quantizer", q, "--blas", "nope",
                                     *extra, "-o", str(out)])
        assert r.exit_code == 1 and "warning" not in r.stderr, r.stderr


def test_build_output_under_a_regular_file(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("user data")
    for out in (afile / "sub", afile / "sub" / "deeper"):
        r = CliRunner().invoke(cli, ["build", "tinycoder", "--quantizer", "none", "--blas",
                                     "openblas", "-o", str(out), "-q"])
        assert r.exit_code == 1, r.output
        assert r.stderr == f"error: {afile}: is not a directory, so -o {out} cannot be created\n"
        assert afile.read_text() == "user data" and sorted(tmp_path.iterdir()) == [afile]


@pytest.mark.parametrize("command", [["build", "tinycoder", "--quantizer", "none", "--blas",
                                      "openblas", "-o", "x"],
                                     ["cc", "prog.c", "-o", "x"]])
def test_pass_with_no_rewrite_is_a_usage_error(command, tmp_path):
    """--pass NAME with --no-rewrite would silently run no pass: refused (exit 2) before any
    work, for `ditto build` and `ditto cc` alike."""
    (tmp_path / "prog.c").write_text("int main(void) { return 0; }\n")
    r = subprocess.run([sys.executable, "-c", "from ditto_core.cli.main import main; main()",
                        *command, "--no-rewrite", "--pass", "gemv-blas"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "give --pass or --no-rewrite, not both (--no-rewrite runs no pass)" in r.stderr
    assert not (tmp_path / "x").exists()
