"""Plugin mechanism: a third-party distribution installed with pip shows up in `ditto plugins`
and can be used; duplicate component names and broken plugins are reported clearly."""

import json
import subprocess
import re
import types
from importlib import metadata

import numpy as np
import pytest

from ditto_core.base.errors import PluginError
from ditto_core.kit.components import QuantOptions
from ditto_core.kit.hookspecs import hookimpl
from ditto_core.stages import pipeline
from ditto_core.stages.plugins import build_registry

def test_ditto_plugins_lists_defaults_and_installed_plugin(test_plugin_installed):
    out = subprocess.run(["ditto", "plugins", "--json"], check=True, capture_output=True,
                         text=True).stdout
    rows = {r["plugin"]: r for r in json.loads(out)["plugins"]}
    mine = rows["test_plugin"]
    assert (mine["distribution"], mine["version"]) == ("ditto-test-plugin", "0.0.1")
    assert mine["components"] == {
        "exporter": [{"name": "test-ditto"}], "quantizer": [{"name": "test-identity"}],
        "packer": [{"name": "test-f32"}], "emitter": [{"name": "test-clang"}],
        "pass": [{"name": "count-loops"}],
        "blas": [{"name": "test-openblas", "available": True, "reason": ""}],
        "linker": [{"name": "test-clang"}]}
    assert rows["export_gguf"]["components"] == {"exporter": [{"name": "gguf"}]}
    assert rows["export_hf"]["components"] == {"exporter": [{"name": "hf"}]}
    assert rows["pass_gemv_blas"]["components"] == {  # the default pass says so
        "pass": [{"name": "gemv-blas", "default_order": 0}]}
    assert rows["quant_none"]["distribution"] == "ditto-llm"
    table = subprocess.run(["ditto", "plugins"], check=True, capture_output=True,
                           text=True).stdout
    assert "ditto-test-plugin" in table and "test-identity" in table


def test_installed_plugin_quantizes(test_plugin_installed, tiny_gguf):
    reg = build_registry()
    ck = pipeline.export(tiny_gguf, registry=reg)
    q = pipeline.quantize(ck, "test-identity", QuantOptions(), registry=reg)
    assert set(q.plan.values()) == {("f32", None)}
    for name, value in q.tensors():
        np.testing.assert_array_equal(value, ck.tensors[name]())


class FakeDist:
    def __init__(self, name, version="1.0"):
        self.metadata = {"Name": name}
        self.version = version


class FakeEP:
    """Stands in for importlib.metadata.EntryPoint: name, dist, load()."""

    def __init__(self, name, module, dist):
        self.name, self._module, self.dist = name, module, FakeDist(dist)

    def load(self):
        if isinstance(self._module, Exception):
            raise self._module
        return self._module


def quantizer_plugin(modname, qname):
    mod = types.ModuleType(modname)

    class Q:
        name = qname

        def quantize(self, checkpoint, options):
            raise NotImplementedError

    @hookimpl
    def register_quantizers(register):
        register(Q())

    mod.register_quantizers = register_quantizers
    return mod


def test_duplicate_component_names_both_distributions():
    eps = [FakeEP("alpha", quantizer_plugin("alpha_mod", "same"), "dist-alpha"),
           FakeEP("beta", quantizer_plugin("beta_mod", "same"), "dist-beta"),
           FakeEP("gamma", quantizer_plugin("gamma_mod", "other"), "dist-gamma")]
    msg = ("two quantizers are named 'same': one from plugin 'alpha' (distribution "
           "dist-alpha), one from plugin 'beta' (distribution dist-beta)")
    with pytest.warns(UserWarning, match=re.escape(msg)):
        reg = build_registry(eps)
    with pytest.raises(PluginError, match=re.escape(msg) + "; uninstall one of them to use "
                       "'same'$"):
        reg.get("quantizer", "same")
    assert reg.get("quantizer", "other").name == "other"  # the rest stays usable
    assert reg.conflicts == {"quantizer": {"same": msg}}


def test_a_plugin_whose_hook_raises_or_registers_a_bad_component_is_skipped():
    raising = types.ModuleType("raising_mod")

    class HalfDone:
        name = "half-done"

        def quantize(self, checkpoint, options):
            raise NotImplementedError

    @hookimpl
    def register_quantizers(register):
        register(HalfDone())  # registered before the hook fails: dropped with the rest
        raise RuntimeError("boom")

    raising.register_quantizers = register_quantizers
    bad = types.ModuleType("bad_mod")

    class NoMethod:
        name = "nomethod"

    class Nameless:
        def quantize(self, checkpoint, options):
            raise NotImplementedError

    @hookimpl
    def register_bad(register):
        register(NoMethod())
        register(Nameless())

    bad.register_quantizers = register_bad
    eps = [FakeEP("raising", raising, "dist-raising"), FakeEP("bad", bad, "dist-bad"),
           FakeEP("good", quantizer_plugin("good_mod", "fine"), "dist-good")]
    with pytest.warns(UserWarning) as caught:
        reg = build_registry(eps)
    failed = dict(reg.failed)
    assert failed["raising"] == ("register_quantizers raised RuntimeError: boom; none of its "
                                 "quantizers are registered")
    assert [e for e, _ in reg.failed].count("bad") == 2
    assert ("quantizer 'nomethod' has no quantize method (see docs/PLUGINS.md); not "
            "registered") in [w for e, w in reg.failed if e == "bad"]
    assert any(w.startswith("registered a quantizer without a name: ") for e, w in reg.failed
               if e == "bad")
    assert len(caught) == 3
    assert sorted(reg.components["quantizer"]) == ["fine"]


def test_broken_plugin_warns_and_others_work():
    eps = [FakeEP("broken", ImportError("No module named 'nonexistent_dep'"), "dist-broken"),
           FakeEP("good", quantizer_plugin("good_mod", "fine"), "dist-good")]
    with pytest.warns(UserWarning, match="broken.*dist-broken.*nonexistent_dep"):
        reg = build_registry(eps)
    assert reg.get("quantizer", "fine").name == "fine"
    assert [f[0] for f in reg.failed] == ["broken"]
    assert [p[0] for p in reg.plugins] == ["good"]
    with pytest.raises(PluginError, match="unknown quantizer 'nope'; available: fine"):
        reg.get("quantizer", "nope")


def pass_plugin(modname, passes):
    """A plugin module registering one IR pass per (name, default_order or None)."""
    mod = types.ModuleType(modname)

    def make(pname, order):
        class P:
            name = pname

            def run(self, module, blas):
                return module, None
        if order is not None:
            P.default_order = order
        return P()

    @hookimpl
    def register_passes(register):
        for pname, order in passes:
            register(make(pname, order))

    mod.register_passes = register_passes
    return mod


def test_default_passes_are_what_the_registry_declares():
    from ditto_core.stages.selection import choose_compile, default_passes

    default = build_registry()
    assert default_passes(default) == ("gemv-blas",)
    eps = [FakeEP(ep.name, ep.load(), "ditto-llm") for ep in metadata.entry_points(group="ditto")
           if ep.name in ("pass_gemv_blas", "emit_clang", "link_llvm")]
    eps.append(FakeEP("third", pass_plugin("third_mod", [("before", -1), ("after", 1),
                                                         ("named-only", None)]), "dist-third"))
    reg = build_registry(eps)
    assert default_passes(reg) == ("before", "gemv-blas", "after")
    stages = choose_compile(reg, blas=None)
    assert [p.name for p in stages.passes] == ["before", "gemv-blas", "after"]
    # naming passes replaces the default list; --no-rewrite runs none
    assert [p.name for p in choose_compile(reg, blas=None, passes=["named-only"]).passes] == \
        ["named-only"]
    assert choose_compile(reg, blas=None, rewrite=False).passes == ()
