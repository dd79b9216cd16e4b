"""Component options: what a component declares, how users set them, how they are checked.

A component declares its options as a nested attrs class named ``Options`` (one field per
option: name, type, default, doc, validator), as simonw/llm's models declare ``Options``, and a
method ``with_options(options) -> component`` returning a copy configured with them::

    class GemvBlasPass:
        name = "gemv-blas"

        @attrs.frozen
        class Options:
            omp_threads: Literal["single", "region", "blas"] = option(
                "single", "How BLAS runs inside OpenMP regions.", env="DITTO_GEMV_OMP")

        def with_options(self, options): ...

Users set them as ``-O COMPONENT.KEY=VALUE`` (``ditto build``/``ditto cc``) or
``options={"COMPONENT": {"KEY": value}}`` (``ditto_core.build``). ``resolve`` turns the given
values (strings from the command line are parsed by the field's type) into an ``Options``
instance and raises ``OptionError`` naming the component and the key for an unknown key, a
value of the wrong type, a value outside the field's choices or one its validator refuses.
The resolved options are part of the stage's cache key and of build.json.

An option may name an environment variable (``env=``) as a deprecated alias: when the option is
not given explicitly and the variable is set, its value is used (and a FutureWarning says
which ``-O`` replaces it), so the value still reaches the cache key.
"""

from __future__ import annotations

import os
import typing
from types import UnionType
import warnings
from typing import Any, Callable, Literal, Mapping, Sequence, get_args, get_origin

import attrs

from .errors import DittoError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class OptionError(DittoError):
    """A component option is unknown, malformed or out of range (the message names
    ``COMPONENT.KEY``)."""


def option(default: Any, doc: str, *, validator: Callable | None = None,
           env: str | None = None, env_value: Callable[[str], Any] | None = None) -> Any:
    """An attrs field for a component's ``Options`` class.

    ``doc``: one line shown by ``ditto plugins --options``; ``validator``: an attrs validator
    (``attrs.validators.ge(1)``...) raising ValueError/TypeError for a bad value; ``env``: a
    deprecated environment variable that sets this option when it is not given explicitly;
    ``env_value``: maps the variable's text to the option's value (default: parsed by the
    field's type)."""
    meta = {"doc": doc, "env": env, "env_value": env_value}
    return attrs.field(default=default, validator=validator, metadata=meta)


def options_class(component) -> type | None:
    """The component's ``Options`` attrs class, or None when it declares no options."""
    cls = getattr(component, "Options", None)
    if cls is None:
        return None
    if not attrs.has(cls):
        raise DittoError(f"component {getattr(component, 'name', component)!r}: Options must be "
                         "an attrs class")
    return cls


def _fields(cls) -> dict[str, attrs.Attribute]:
    attrs.resolve_types(cls, include_extras=False)
    return {f.name: f for f in attrs.fields(cls)}


def type_name(tp) -> str:
    """How a field type is shown to users: ``int``, ``bool``, ``single|region|blas``..."""
    if get_origin(tp) is Literal:
        return "|".join(str(a) for a in get_args(tp))
    if get_origin(tp) is tuple:
        return f"list of {type_name(get_args(tp)[0])}"
    if get_origin(tp) in (typing.Union, UnionType):
        return " or ".join(type_name(a) for a in get_args(tp) if a is not type(None))
    return getattr(tp, "__name__", str(tp))


def _convert(tp, value, where: str):
    """``value`` (a string from the command line, or a Python value) as type ``tp``."""
    origin = get_origin(tp)
    if origin in (typing.Union, UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        for a in args:
            try:
                return _convert(a, value, where)
            except OptionError:
                continue
        raise OptionError(f"{where}: expected {type_name(tp)}, got {value!r}")
    if origin is Literal:
        choices = get_args(tp)
        for c in choices:
            if value == c or (isinstance(value, str) and str(c) == value):
                return c
        raise OptionError(f"{where}: {value!r} is not one of "
                          f"{', '.join(map(str, choices))}")
    if origin is tuple:
        item = get_args(tp)[0]
        parts = [p for p in value.split(",") if p] if isinstance(value, str) else list(value)
        return tuple(_convert(item, p, where) for p in parts)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise OptionError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            if isinstance(value, str):
                return int(value.strip(), 0)
        except ValueError:
            pass
        raise OptionError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        try:
            if isinstance(value, str):
                return float(value)
        except ValueError:
            pass
        raise OptionError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise OptionError(f"{where}: expected a string, got {value!r}")
    return value


def resolve(component, given: Mapping[str, Any] | None = None, *,
            environ: Mapping[str, str] | None = None):
    """The component's ``Options`` instance from ``given`` (key → value; ``-`` in keys is read
    as ``_``) over the defaults and the deprecated environment aliases. Returns None when the
    component declares no options (then ``given`` must be empty).

    Raises OptionError naming ``COMPONENT.KEY`` for an unknown key, a wrong type, a value
    outside the choices or one the field's validator refuses."""
    name = getattr(component, "name", "?")
    given = {k.replace("-", "_"): v for k, v in (given or {}).items()}
    cls = options_class(component)
    if cls is None:
        if given:
            raise OptionError(f"{name}.{next(iter(given))}: {name} has no options")
        return None
    fields = _fields(cls)
    environ = os.environ if environ is None else environ
    values = {}
    for key, value in given.items():
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise OptionError(f"{name}.{key}: unknown option of {name} (its options: {known})")
        values[key] = _convert(fields[key].type, value, f"{name}.{key}")
    for key, f in fields.items():
        env = f.metadata.get("env")
        if key in values or not env or environ.get(env) is None:
            continue
        text = environ[env]
        conv = f.metadata.get("env_value")
        where = f"{name}.{key} (from ${env})"
        values[key] = conv(text) if conv else _convert(f.type, text, where)
        warnings.warn(f"${env} is deprecated: use -O {name}.{key}={values[key]}",
                      FutureWarning, stacklevel=2)
    try:
        return cls(**values)
    except (ValueError, TypeError) as exc:
        bad = next((k for k in values if k in str(exc)), next(iter(values), "?"))
        raise OptionError(f"{name}.{bad}: {exc}") from None


def configure(component, options):
    """The component configured with its resolved ``options`` (``with_options``); the
    component itself when it has no options."""
    if options is None:
        return component
    with_options = getattr(component, "with_options", None)
    if with_options is None:
        raise DittoError(f"component {component.name!r} declares Options but no with_options()")
    return with_options(options)


def as_dict(options) -> dict:
    """Resolved options as plain data (for cache keys and build.json); {} for None."""
    return {} if options is None else attrs.asdict(options, recurse=True)


def describe(component) -> list[dict]:
    """One dict per option of ``component``: key, type, default, doc, env (deprecated alias)."""
    cls = options_class(component)
    if cls is None:
        return []
    out = []
    for key, f in _fields(cls).items():
        default = f.default.factory() if isinstance(f.default, attrs.Factory) else f.default
        out.append({"key": key, "type": type_name(f.type), "default": default,
                    "doc": f.metadata.get("doc", ""), "env": f.metadata.get("env")})
    return out


def parse_assignments(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """``["gemv-blas.omp_threads=region", ...]`` → ``{"gemv-blas": {"omp_threads":
    "region"}}``. Raises OptionError for an item that is not ``COMPONENT.KEY=VALUE``."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        lhs, eq, value = item.partition("=")
        comp, dot, key = lhs.strip().rpartition(".")
        if not eq or not dot or not comp or not key:
            raise OptionError(f"-O {item!r}: expected COMPONENT.KEY=VALUE "
                              "(e.g. gemv-blas.omp_threads=region)")
        out.setdefault(comp, {})[key.replace("-", "_")] = value
    return out


def normalize(options: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Options given as ``{"comp": {"key": v}}``, ``{"comp.key": v}`` or a mix, as
    ``{"comp": {"key": v}}``. Raises OptionError for a key with no component part."""
    out: dict[str, dict[str, Any]] = {}
    for k, v in (options or {}).items():
        if isinstance(v, Mapping):
            out.setdefault(k, {}).update({kk.replace("-", "_"): vv for kk, vv in v.items()})
            continue
        comp, dot, key = k.rpartition(".")
        if not dot or not comp:
            raise OptionError(f"option {k!r}: expected COMPONENT.KEY")
        out.setdefault(comp, {})[key.replace("-", "_")] = v
    return out
