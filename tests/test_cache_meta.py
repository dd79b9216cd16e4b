"""A cache entry whose meta.json is wrong-typed, not an object, or missing is a corrupt entry:
removed with one warning, rebuilt and stored again (issue: reliability, cache-meta-json-poisoning),
never a crash of every later build nor a permanent silent miss."""

import json
from pathlib import Path

import pytest

from ditto_core.base.cache import Cache
from ditto_core.stages.compile import pass_reports_problem
from ditto_core.stages.pipeline import pack_summary_problem

GOOD = {"pack": {"bpw": 4.5, "file_bytes": 123, "tensors": {}}}


@pytest.fixture
def cache(tmp_path):
    c = Cache(root=tmp_path / "c")
    src = tmp_path / "model.ditto"
    src.write_bytes(b"payload")
    c.put("model", "k" * 64, {"model.ditto": src}, GOOD)
    return c


def _meta(cache):
    return cache.entry("model", "k" * 64) / "meta.json"


def _fetch(cache, tmp_path):
    return cache.fetch("model", "k" * 64, {"model.ditto": tmp_path / "got"},
                       validate=pack_summary_problem)


def test_good_entry_is_a_hit(cache, tmp_path):
    assert _fetch(cache, tmp_path)["pack"] == GOOD["pack"]
    assert (tmp_path / "got").read_bytes() == b"payload"


@pytest.mark.parametrize("edit,why", [
    (lambda d: d["pack"].update(bpw="zzz"), "meta.json 'pack.bpw' is not a number ('zzz')"),
    (lambda d: d["pack"].update(file_bytes=None), "'pack.file_bytes' is not a byte count"),
    (lambda d: d.update(pack=[1]), "meta.json has no 'pack' summary object"),
    (lambda d: d["pack"].update(tensors="x"), "'pack.tensors' is not an object"),
])
def test_wrong_typed_meta_is_discarded_and_rebuilt(cache, tmp_path, capsys, edit, why):
    d = json.loads(_meta(cache).read_text())
    edit(d)
    _meta(cache).write_text(json.dumps(d))
    assert _fetch(cache, tmp_path) is None
    err = capsys.readouterr().err
    assert err.startswith(f"warning: cache entry {cache.entry('model', 'k' * 64)}: "), err
    assert why in err and err.endswith("; rebuilding it\n") and err.count("\n") == 1
    assert not cache.entry("model", "k" * 64).exists() and not (tmp_path / "got").exists()
    cache.put("model", "k" * 64, {"model.ditto": tmp_path / "model.ditto"}, GOOD)
    assert _fetch(cache, tmp_path) is not None


@pytest.mark.parametrize("content", [None, "[1, 2]", "{not json"])
def test_missing_or_unreadable_meta_is_discarded_and_replaced(cache, tmp_path, capsys, content):
    if content is None:
        _meta(cache).unlink()
    else:
        _meta(cache).write_text(content)
    assert _fetch(cache, tmp_path) is None
    assert "meta.json missing or unreadable; rebuilding it" in capsys.readouterr().err
    assert cache.put("model", "k" * 64, {"model.ditto": tmp_path / "model.ditto"}, GOOD)
    assert _fetch(cache, tmp_path)["pack"] == GOOD["pack"]  # stored again: a hit from now on


def test_put_replaces_an_entry_without_meta(cache, tmp_path):
    _meta(cache).unlink()
    assert cache.put("model", "k" * 64, {"model.ditto": tmp_path / "model.ditto"}, GOOD)
    assert _meta(cache).is_file()


@pytest.mark.parametrize("passes,ok", [
    ([], True), ([{"name": "gemv-blas", "candidates": []}], True), ("x", False),
    ([1], False), ([{"candidates": "x"}], False), ([{"candidates": [3]}], False),
])
def test_compile_entry_pass_reports_are_checked(passes, ok):
    assert (pass_reports_problem({"passes": passes}, True) is None) is ok


def test_plugin_fingerprint_covers_every_module_of_the_plugin_and_its_bases(tmp_path,
                                                                          monkeypatch):
    """Editing a helper module in a subfolder, or a C source, of a plugin package changes its
    fingerprint (so the stage cache misses); the key does not depend on where it is installed."""
    import importlib
    import sys

    from ditto_core.stages.compile import plugin_fingerprint

    def make(root):
        pkg = root / "fp_plugin"
        (pkg / "algo").mkdir(parents=True)
        (pkg / "__init__.py").write_text("from .algo.grid import SCALE\n"
                                         "class Q:\n    name = 'q'\n")
        (pkg / "algo" / "__init__.py").write_text("")
        (pkg / "algo" / "grid.py").write_text("SCALE = 1.0\n")
        (pkg / "kernel.c").write_text("int f(void) { return 1; }\n")
        return pkg

    def fingerprint(root):
        monkeypatch.syspath_prepend(str(root))
        for m in [m for m in sys.modules if m.split(".")[0] == "fp_plugin"]:
            del sys.modules[m]
        mod = importlib.import_module("fp_plugin")
        fp = plugin_fingerprint(mod.Q())
        monkeypatch.undo()
        return fp

    pkg = make(tmp_path / "a")
    base = fingerprint(tmp_path / "a")
    assert base not in ("?", "") and fingerprint(tmp_path / "a") == base
    make(tmp_path / "b")
    assert fingerprint(tmp_path / "b") == base  # same code elsewhere: same key
    (pkg / "algo" / "grid.py").write_text("SCALE = 0.25\n")
    edited = fingerprint(tmp_path / "a")
    assert edited != base
    (pkg / "kernel.c").write_text("int f(void) { return 2; }\n")
    assert fingerprint(tmp_path / "a") not in (base, edited)

    from ditto_core.kit.quantkit import CodebookQuantizer

    class Sub(CodebookQuantizer):  # defined here: its work comes from the kit
        name = "sub"

    fp_sub = plugin_fingerprint(Sub())
    kit = tmp_path / "kit"
    import ditto_core.kit as kit_pkg
    import shutil
    shutil.copytree(Path(kit_pkg.__file__).parent, kit, ignore=shutil.ignore_patterns("__pycache__"))
    (kit / "quantkit.py").write_text((kit / "quantkit.py").read_text() + "\n# edited\n")
    monkeypatch.setattr(kit_pkg, "__file__", str(kit / "__init__.py"))
    assert plugin_fingerprint(Sub()) != fp_sub
