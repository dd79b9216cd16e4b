"""Choosing the component of every stage by name, with its options, from one registry.

``ditto build``, ``ditto cc`` and ``ditto_core.build`` resolve every name and every
``-O COMPONENT.KEY=VALUE`` here, before any work starts, so an unknown component, an unknown
option or a bad value fails first; the chosen components (configured with their options) are
then handed to the stage functions, which use nothing else.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import attrs

from ditto_core.base import options as opt
from ditto_core.base.errors import DittoError
from .plugins import STAGES, Registry

#: Components used when a stage is not named (the exporter is detected from the model; the
#: passes are those that declare themselves default-on: ``default_passes``).
DEFAULT_PACKER = "bits"
DEFAULT_EMITTER = "clang"
DEFAULT_LINKER = "llvm"


def default_passes(registry: Registry) -> tuple[str, ...]:
    """The passes run when no ``--pass`` is given: every registered pass whose component has
    an integer ``default_order`` attribute, in increasing ``default_order``, ties by name
    (Ditto's ``gemv-blas``, which rewrites GEMV and GEMM nests, has 0). A third-party pass
    joins the default list by declaring one; any pass runs when named with ``--pass``."""
    found = []
    for comp in registry.all("pass"):
        order = getattr(comp, "default_order", None)
        if isinstance(order, int) and not isinstance(order, bool):
            found.append((order, comp.name))
    return tuple(name for _, name in sorted(found))


@attrs.frozen
class Chosen:
    """One stage's component, configured with its resolved options (None: it has none)."""

    stage: str
    component: Any
    options: Any = None

    @property
    def name(self) -> str:
        return self.component.name

    def record(self) -> dict:
        """``{"name", "options"}``: what build.json and the cache keys hold for this stage."""
        return {"name": self.name, "options": opt.as_dict(self.options)}


def choose(registry: Registry, stage: str, name: str,
           given: Mapping[str, Mapping[str, Any]] | None = None) -> Chosen:
    """The component ``name`` of ``stage`` configured with ``given[name]`` (key → value).
    Raises PluginError for an unknown name (listing the choices), OptionError for a bad
    option."""
    comp = registry.get(stage, name)
    options = opt.resolve(comp, (given or {}).get(comp.name))
    return Chosen(stage, opt.configure(comp, options), options)


def check_all_used(registry: Registry, given: Mapping[str, Mapping[str, Any]],
                   chosen: Sequence[Chosen]) -> None:
    """Raise OptionError when ``given`` sets options of a component this build does not use
    (naming it, its stage if it is registered, and the components the build uses)."""
    used = {c.name for c in chosen}
    for comp, keys in given.items():
        if comp in used:
            continue
        key = next(iter(keys), "?")
        names = ", ".join(c.name for c in chosen)
        stages = [STAGES[s][1] for s in STAGES if comp in registry.components[s]]
        if stages:
            raise opt.OptionError(f"{comp}.{key}: the {stages[0]} {comp!r} is not used by this "
                                  f"build (its components: {names})")
        raise opt.OptionError(f"{comp}.{key}: no component is named {comp!r} (this build's "
                              f"components: {names})")


def check_blas(chosen: Chosen | None) -> None:
    """Raise DittoError with the target's own "how to get it" message when the chosen BLAS
    target is not usable here (the one availability check of a build or compile)."""
    if chosen is None:
        return
    ok, why = chosen.component.available()
    if not ok:
        raise DittoError(f"BLAS target {chosen.name!r} is not available: {why}")


@attrs.frozen
class CompileStages:
    """The compile half's components: IR emitter, IR passes in run order (empty: no
    rewrite), linker, and the BLAS target (None: no BLAS linked)."""

    emitter: Chosen
    passes: tuple[Chosen, ...]
    linker: Chosen
    blas: Chosen | None

    def all(self) -> list[Chosen]:
        return [self.emitter, *self.passes, self.linker] + ([self.blas] if self.blas else [])

    def record(self) -> dict:
        """Names and resolved options of every compile stage (build.json, cache key)."""
        return {"emitter": self.emitter.record(), "passes": [p.record() for p in self.passes],
                "linker": self.linker.record(),
                "blas": self.blas.record() if self.blas else None}


def choose_compile(registry: Registry, *, blas: str | None, emitter: str | None = None,
                   passes: Sequence[str] | None = None, linker: str | None = None,
                   rewrite: bool = True,
                   options: Mapping[str, Mapping[str, Any]] | None = None) -> CompileStages:
    """Resolve the compile half: ``passes`` None → ``default_passes(registry)``; ``rewrite``
    False → no pass at all. The BLAS target's availability is checked here, once. Raises PluginError,
    OptionError, DittoError (BLAS target not usable)."""
    given = options or {}
    names = list(default_passes(registry) if passes is None else passes) if rewrite else []
    stages = CompileStages(
        emitter=choose(registry, "emitter", emitter or DEFAULT_EMITTER, given),
        passes=tuple(choose(registry, "pass", n, given) for n in names),
        linker=choose(registry, "linker", linker or DEFAULT_LINKER, given),
        blas=None if blas is None else choose(registry, "blas", blas, given))
    check_blas(stages.blas)
    return stages
