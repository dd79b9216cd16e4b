"""Plugin manager: loads every plugin of the entry-point group ``ditto`` and collects the
components each registers, per stage.

Loading follows simonw/llm's ``llm/plugins.py``: the default plugins are ordinary entry points
of this distribution. A plugin that fails to import, whose hook raises, or that registers a
component without a name or without the methods of its kind is skipped (that hook's components)
with a warning naming it; two components of one stage with one name make that name an error
naming both distributions, while every other component stays usable.
"""

from __future__ import annotations

import importlib.metadata as md
import warnings
from functools import lru_cache

import attrs
import pluggy

from ditto_core.base.errors import PluginError
from ditto_core.kit import hookspecs

GROUP = "ditto"

#: component kind -> (hook name, human name), in pipeline order; the kind is also the CLI flag
#: (``--exporter``, ..., ``--pass``, ``--linker``, ``--blas``)
STAGES = {
    "exporter": ("register_exporters", "exporter"),
    "quantizer": ("register_quantizers", "quantizer"),
    "packer": ("register_packers", "packer"),
    "emitter": ("register_emitters", "emitter"),
    "pass": ("register_passes", "pass"),
    "linker": ("register_linkers", "linker"),
    "blas": ("register_blas", "BLAS target"),
}

#: the methods every component of a kind must have (ditto_core/kit/components.py)
REQUIRED_METHODS = {
    "exporter": ("can_load", "load"),
    "quantizer": ("quantize",),
    "packer": ("pack",),
    "emitter": ("emit",),
    "pass": ("run",),
    "linker": ("link",),
    "blas": ("available", "symbol", "compile_flags", "link_flags", "thread_control"),
}

#: earlier hook names, still called: kind -> hook name
LEGACY_HOOKS = {"emitter": "register_ir_emitters", "pass": "register_ir_passes",
                "blas": "register_blas_targets"}

#: earlier kind names accepted by ``Registry.get``/``all``
_KIND_ALIASES = {"ir_emitter": "emitter", "ir_pass": "pass"}


@attrs.frozen
class Registered:
    """A component and where it came from."""

    component: object
    stage: str
    plugin: str  # entry-point name
    dist: str  # distribution name
    version: str


@attrs.define
class Registry:
    """All loaded plugins and their components."""

    pm: pluggy.PluginManager
    components: dict[str, dict[str, Registered]]
    plugins: list[tuple[str, str, str]]  # (entry point, distribution, version)
    failed: list[tuple[str, str]]  # (entry point, error)
    #: stage -> component name registered more than once -> the error naming the distributions
    conflicts: dict[str, dict[str, str]] = attrs.field(factory=dict)

    def get(self, stage: str, name: str):
        """The component of ``stage`` called ``name``; PluginError listing the choices if none,
        or naming both distributions if two plugins registered that name."""
        stage = _KIND_ALIASES.get(stage, stage)
        clash = self.conflicts.get(stage, {}).get(name)
        if clash is not None:
            raise PluginError(f"{clash}; uninstall one of them to use {name!r}")
        found = self.components[stage].get(name)
        if found is None:
            choices = ", ".join(sorted(self.components[stage])) or "none"
            raise PluginError(f"unknown {STAGES[stage][1]} {name!r}; available: {choices}")
        return found.component

    def all(self, stage: str) -> list:
        """Every component of ``stage``, in registration order."""
        stage = _KIND_ALIASES.get(stage, stage)
        return [r.component for r in self.components[stage].values()]


def _dist_of(ep: md.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ("?", "?")
    return (dist.metadata["Name"], dist.version)


def build_registry(entry_points=None) -> Registry:
    """Load plugins from ``entry_points`` (default: the installed group ``ditto``) and collect
    their components. Nothing a plugin does makes this fail: a plugin that fails to load,
    a hook that raises, or a component without a name or its kind's methods
    (``REQUIRED_METHODS``) is skipped with a warning and listed in ``failed``; a name two
    plugins register for one stage goes to ``conflicts`` (``get`` then raises PluginError
    naming both distributions)."""
    pm = pluggy.PluginManager("ditto")
    pm.add_hookspecs(hookspecs)
    eps = list(md.entry_points(group=GROUP)) if entry_points is None else list(entry_points)
    plugins, failed, origin = [], [], {}
    for ep in sorted(eps, key=lambda e: e.name):
        dist, version = _dist_of(ep)
        try:
            module = ep.load()
            pm.register(module, name=ep.name)
        except Exception as exc:  # a broken third-party plugin must not break the others
            warnings.warn(f"ditto: plugin {ep.name!r} from {dist} failed to load: {exc}",
                          stacklevel=2)
            failed.append((ep.name, f"{type(exc).__name__}: {exc}"))
            continue
        plugins.append((ep.name, dist, version))
        origin[id(module)] = (ep.name, dist, version)

    components: dict[str, dict[str, Registered]] = {s: {} for s in STAGES}
    conflicts: dict[str, dict[str, str]] = {s: {} for s in STAGES}
    claimed: dict[str, dict[str, Registered]] = {s: {} for s in STAGES}  # every name's first

    def skip(ep_name, dist, why):
        warnings.warn(f"ditto: plugin {ep_name!r} from {dist}: {why}", stacklevel=3)
        failed.append((ep_name, why))

    for stage, (hook_name, human) in STAGES.items():
        impls = list(getattr(pm.hook, hook_name).get_hookimpls())
        if stage in LEGACY_HOOKS:
            impls += getattr(pm.hook, LEGACY_HOOKS[stage]).get_hookimpls()
        for impl in impls:
            ep_name, dist, version = origin.get(id(impl.plugin), (impl.plugin_name, "?", "?"))
            mine: list[Registered] = []

            def register(component, _stage=stage, _ep=ep_name, _dist=dist, _ver=version,
                         _human=human, _mine=mine):
                name = getattr(component, "name", None)
                if not isinstance(name, str) or not name:
                    skip(_ep, _dist, f"registered a {_human} without a name: {component!r}")
                    return
                missing = [m for m in REQUIRED_METHODS[_stage]
                           if not callable(getattr(component, m, None))]
                if missing:
                    skip(_ep, _dist, f"{_human} {name!r} has no {', '.join(missing)} method "
                                     f"(see docs/PLUGINS.md); not registered")
                    return
                _mine.append(Registered(component, _stage, _ep, _dist, _ver))

            try:
                impl.function(register=register)
            except Exception as exc:  # a broken third-party hook must not break the others
                skip(ep_name, dist, f"{hook_name} raised {type(exc).__name__}: {exc}; none of "
                                    f"its {human}s are registered")
                continue
            for r in mine:
                name = r.component.name
                prev = claimed[stage].get(name)
                if prev is None:
                    claimed[stage][name] = components[stage][name] = r
                    continue
                components[stage].pop(name, None)
                msg = (f"two {human}s are named {name!r}: one from plugin {prev.plugin!r} "
                       f"(distribution {prev.dist}), one from plugin {r.plugin!r} "
                       f"(distribution {r.dist})")
                conflicts[stage][name] = msg
                warnings.warn(f"ditto: {msg}", stacklevel=2)
    return Registry(pm, components, plugins, failed, {s: c for s, c in conflicts.items() if c})


@lru_cache(maxsize=1)
def get_registry() -> Registry:
    """The process-wide registry of installed plugins (loaded once)."""
    return build_registry()
