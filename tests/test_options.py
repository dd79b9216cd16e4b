"""Component options: declared as attrs classes, set with -O COMPONENT.KEY=VALUE, checked before
any work with messages naming component and key, listed by `ditto plugins --options`, and part
of every stage's cache key and of build.json (the stale-executable regression)."""

import json
import os
import subprocess
from typing import Literal

import attrs
import pytest

from ditto_core.base import options as opt
from ditto_core.base.options import OptionError, option
from ditto_core.stages import pipeline
from ditto_core.stages.plugins import get_registry
from ditto_core.stages.selection import choose

from .fixtures_compile import build_model


class Thing:
    name = "thing"

    @attrs.frozen
    class Options:
        mode: Literal["a", "b"] = option("a", "the mode", env="DITTO_TEST_THING_MODE")
        count: int = option(2, "how many", validator=attrs.validators.ge(1))
        scale: float = option(1.0, "a scale")
        on: bool = option(False, "a switch")
        cpu: str | None = option(None, "a name or none")

    def __init__(self, options=None):
        self.options = options

    def with_options(self, options):
        return Thing(options)


def test_resolve_parses_command_line_text_by_type():
    o = opt.resolve(Thing(), {"mode": "b", "count": "0x10", "scale": "2.5", "on": "yes",
                              "cpu": "znver3"}, environ={})
    assert attrs.asdict(o) == {"mode": "b", "count": 16, "scale": 2.5, "on": True,
                               "cpu": "znver3"}
    assert attrs.asdict(opt.resolve(Thing(), {}, environ={})) == {
        "mode": "a", "count": 2, "scale": 1.0, "on": False, "cpu": None}
    # Python values pass through when they have the right type
    assert opt.resolve(Thing(), {"count": 3, "on": False}, environ={}).count == 3


@pytest.mark.parametrize("given,message", [
    ({"mdoe": "a"}, "thing.mdoe: unknown option of thing (its options: mode, count, scale, "
                    "on, cpu)"),
    ({"mode": "c"}, "thing.mode: 'c' is not one of a, b"),
    ({"count": "two"}, "thing.count: expected an integer, got 'two'"),
    ({"count": True}, "thing.count: expected an integer, got True"),
    ({"count": "0"}, "thing.count: 'count' must be >= 1: 0"),
    ({"scale": "fast"}, "thing.scale: expected a number, got 'fast'"),
    ({"on": "maybe"}, "thing.on: expected true or false, got 'maybe'"),
])
def test_bad_options_name_component_and_key(given, message):
    with pytest.raises(OptionError) as err:
        opt.resolve(Thing(), given, environ={})
    assert str(err.value) == message


def test_component_without_options_refuses_any():
    class Plain:
        name = "plain"

    assert opt.resolve(Plain(), {}) is None
    with pytest.raises(OptionError, match=r"^plain\.x: plain has no options$"):
        opt.resolve(Plain(), {"x": "1"})


def test_env_alias_is_deprecated_and_explicit_wins():
    with pytest.warns(FutureWarning, match=r"\$DITTO_TEST_THING_MODE is deprecated: use -O "
                                           r"thing\.mode=b"):
        assert opt.resolve(Thing(), {}, environ={"DITTO_TEST_THING_MODE": "b"}).mode == "b"
    assert opt.resolve(Thing(), {"mode": "a"}, environ={"DITTO_TEST_THING_MODE": "b"}).mode == "a"
    with pytest.raises(OptionError, match=r"thing\.mode \(from \$DITTO_TEST_THING_MODE\): "
                                          r"'z' is not one of a, b"):
        opt.resolve(Thing(), {}, environ={"DITTO_TEST_THING_MODE": "z"})


def test_parse_assignments_and_normalize():
    assert opt.parse_assignments(["gemv-blas.omp_threads=region", "llvm.opt-level=2",
                                  "a.b.c=x=y"]) == {
        "gemv-blas": {"omp_threads": "region"}, "llvm": {"opt_level": "2"},
        "a.b": {"c": "x=y"}}
    for bad in ("gemv-blas=region", "omp_threads=1", ".x=1", "x.=1"):
        with pytest.raises(OptionError, match="expected COMPONENT.KEY=VALUE"):
            opt.parse_assignments([bad])
    assert opt.normalize({"gemv-blas.strict": True, "llvm": {"opt-level": 1}}) == {
        "gemv-blas": {"strict": True}, "llvm": {"opt_level": 1}}


def test_defaults_declare_their_options():
    reg = get_registry()
    pass_ = choose(reg, "pass", "gemv-blas", {"gemv-blas": {"omp_threads": "region",
                                                               "strict": "true"}})
    assert (pass_.component.omp_threads, pass_.component.allow_strict) == ("region", True)
    blas = choose(reg, "blas", "openblas", {"openblas": {"system": "true"}})
    assert blas.component.system and blas.component.symbol("cblas_sgemv") == "cblas_sgemv"
    linker = choose(reg, "linker", "llvm", {"llvm": {"opt_level": "1", "cpu": "znver3"}})
    assert linker.component.opt_level == 1 and linker.component.host()[0] == "znver3"
    km = choose(reg, "quantizer", "kmeans", {"kmeans": {"lloyd_restarts": "2"}})
    assert km.component.options.lloyd_restarts == 2
    assert km.record() == {"name": "kmeans", "options": {
        "lloyd_restarts": 2, "lloyd_max_iter": 100, "lloyd_tol": 1e-6}}


def test_ditto_plugins_options_lists_every_option():
    out = subprocess.run(["ditto", "plugins", "--json", "--options"], check=True,
                         capture_output=True, text=True).stdout
    rows = {r["plugin"]: r for r in json.loads(out)["plugins"]}
    gemv = rows["pass_gemv_blas"]["components"]["pass"][0]
    assert gemv["options"] == [
        {"key": "omp_threads", "type": "single|region|blas", "default": "single",
         "doc": gemv["options"][0]["doc"], "env": "DITTO_GEMV_OMP"},
        {"key": "strict", "type": "bool", "default": False, "doc": gemv["options"][1]["doc"],
         "env": "DITTO_GEMV_STRICT"}]
    assert rows["export_hf"]["components"]["exporter"] == [{"name": "hf", "options": []}]
    table = subprocess.run(["ditto", "plugins", "--options"], check=True, capture_output=True,
                           text=True).stdout
    assert "gemv-blas.omp_threads" in table and "single|region|blas" in table
    assert "llvm.opt_level" in table and "kmeans.lloyd_restarts" in table


def test_model_key_holds_component_options(tiny_gguf):
    reg = get_registry()
    exp = choose(reg, "exporter", "gguf")
    packer = choose(reg, "packer", "bits")
    keys = {pipeline.model_key(tiny_gguf, exp, choose(reg, "quantizer", "kmeans", given),
                               packer, pipeline.QuantOptions())
            for given in ({}, {"kmeans": {"lloyd_restarts": 5}},
                          {"kmeans": {"lloyd_max_iter": 7}})}
    assert len(keys) == 3


@pytest.mark.parametrize("argv,message", [
    (["-O", "gemv-blas.omp_thread=region"],
     "error: gemv-blas.omp_thread: unknown option of gemv-blas (its options: omp_threads, "
     "strict)\n"),
    (["-O", "gemv-blas.omp_threads=two"],
     "error: gemv-blas.omp_threads: 'two' is not one of single, region, blas\n"),
    (["-O", "kmeans.lloyd_tol=1"],
     "error: kmeans.lloyd_tol: the quantizer 'kmeans' is not used by this build (its "
     "components: gguf, none, bits, clang, gemv-blas, llvm, openblas)\n"),
    (["-O", "nosuch.x=1"],
     "error: nosuch.x: no component is named 'nosuch' (this build's components: gguf, none, "
     "bits, clang, gemv-blas, llvm, openblas)\n"),
    (["-O", "llvm.cpu=nosuchcpu"],
     "error: llvm.cpu: 'nosuchcpu' is not a CPU that LLVM knows for this target (`clang-22 "
     "--print-supported-cpus` lists them)\n"),
    (["-O", "noequals"],
     "error: -O 'noequals': expected COMPONENT.KEY=VALUE (e.g. "
     "gemv-blas.omp_threads=region)\n"),
])
def test_cli_bad_option_fails_before_export(tmp_path, argv, message, monkeypatch):
    from click.testing import CliRunner

    from ditto_core.cli.main import cli

    def no_work(*a, **k):
        raise AssertionError("the build started")

    monkeypatch.setattr(pipeline, "_prepare_out_dir", no_work)  # runs just before export
    r = CliRunner().invoke(cli, ["build", "tinycoder", "--quantizer", "none", "--blas",
                                 "openblas", "-o", str(tmp_path / "b"), *argv])
    assert r.exit_code == 1 and r.stderr == message
    assert not (tmp_path / "b").exists()


def test_one_option_never_shares_a_cache_entry(tiny_builds, build_cache_root, tmp_path,
                                               monkeypatch):
    """The stale-executable bug: the GEMV pass's OpenMP mode changes the executable, so a
    build that differs only in it must not reuse the other's cached executable."""
    d, first = tiny_builds["rewrite"]
    assert first["components"]["passes"] == [
        {"name": "gemv-blas", "options": {"omp_threads": "single", "strict": False}}]
    rec = build_model("tinycoder", tmp_path / "region", build_cache_root,
                      options={"gemv-blas.omp_threads": "region"})
    assert rec["cached"] == {"model": True, "compile": False}
    assert rec["compile_key"] != first["compile_key"]
    assert rec["components"]["passes"][0]["options"]["omp_threads"] == "region"
    on_disk = json.loads((tmp_path / "region" / "build.json").read_text())
    assert on_disk["components"] == rec["components"]
    assert (tmp_path / "region" / "ditto-run").read_bytes() != (d / "ditto-run").read_bytes()
    # the deprecated environment variable is the same option: same key, a cache hit
    monkeypatch.setenv("DITTO_GEMV_OMP", "region")
    with pytest.warns(FutureWarning, match="DITTO_GEMV_OMP is deprecated"):
        again = build_model("tinycoder", tmp_path / "env", build_cache_root)
    assert again["cached"] == {"model": True, "compile": True}
    assert again["compile_key"] == rec["compile_key"]
    monkeypatch.delenv("DITTO_GEMV_OMP")
    back = build_model("tinycoder", tmp_path / "single", build_cache_root)
    assert back["compile_key"] == first["compile_key"] and back["cached"]["compile"]
    assert (tmp_path / "single" / "ditto-run").read_bytes() == (d / "ditto-run").read_bytes()


def test_cli_deprecated_env_warns_in_one_line(tmp_path):
    env = dict(os.environ, DITTO_GEMV_OMP="blas")
    p = subprocess.run(["ditto", "build", "tinycoder", "--quantizer", "none", "--blas",
                        "openblas", "-o", str(tmp_path / "b"), "-O", "nosuch.x=1"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 1
    assert p.stderr.splitlines() == [
        "warning: $DITTO_GEMV_OMP is deprecated: use -O gemv-blas.omp_threads=blas",
        "error: nosuch.x: no component is named 'nosuch' (this build's components: gguf, none, "
        "bits, clang, gemv-blas, llvm, openblas)"]
    env["DITTO_GEMV_OMP"] = "two"
    p = subprocess.run(["ditto", "build", "tinycoder", "--quantizer", "none", "--blas",
                        "openblas", "-o", str(tmp_path / "b")], capture_output=True, text=True,
                       env=env)
    assert (p.returncode, p.stderr) == (1, "error: gemv-blas.omp_threads (from $DITTO_GEMV_OMP):"
                                           " 'two' is not one of single, region, blas\n")
    assert not (tmp_path / "b").exists()


def test_budgeted_model_key_holds_the_allocation_code(tiny_gguf, tmp_path, monkeypatch):
    """A budgeted build's model cache key changes with the bit allocation's code (here the
    kernel cost model), so an edited allocator never reuses a cached plan; a build without a
    budget keeps its key."""
    from ditto_core.model import kernel_paths

    reg = get_registry()
    parts = (tiny_gguf, choose(reg, "exporter", "gguf"), choose(reg, "quantizer", "kmeans", {}),
             choose(reg, "packer", "bits"))
    plain, budgeted = pipeline.QuantOptions(), pipeline.QuantOptions(target_bpw=5.0)
    before = [pipeline.model_key(*parts, o) for o in (plain, budgeted)]
    edited = tmp_path / "kernel_paths.py"
    edited.write_text(open(kernel_paths.__file__).read() + "\n# another cost\n")
    monkeypatch.setattr(kernel_paths, "__file__", str(edited))
    after = [pipeline.model_key(*parts, o) for o in (plain, budgeted)]
    assert after[0] == before[0] and after[1] != before[1]
