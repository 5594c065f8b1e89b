"""Methods from outside the package: found by name or by path, checked against the ``Method`` protocol.

A plugin is a class (or a builder function) that makes a ``Method`` (method/protocol.py) from a config.
``method.name`` names it one of two ways:

- ``byol``: an entry point of the group ``mocolab.methods`` that an installed distribution declares
  (``[project.entry-points."mocolab.methods"] byol = "mocolab_byol:BYOL"``). Every process of the environment
  sees it, Ray's workers and trials included: the way to share a method.
- ``my_methods:BYOL``: a module on Python's path, else in the current folder, and a name in it: nothing to
  install. A run's Ray Train workers get the module's folder on their path (training/shipping.py,
  ``method_runtime_env``): this machine's workers, or a cluster's where the folder is on shared storage.

mocolab's own methods beyond the MoCo family (``OWN``: ``supervised``, the bound a reproduction reads its claims
against) are named and loaded the same way, from the package itself: no install, and their module joins the
code fingerprint of the runs they train only.

What a plugin provides (docs/methods.md, "Your own method"; examples/plugins/mocolab-byol is one):

- ``from_config(cfg, parts, options)`` (a class) or the builder itself: the ``Method`` for a config, where
  ``options`` is its own fields (``Options``) as the config sets them, or None where it declares none;
- every member of the ``Method`` protocol (an ``nn.Module``): the class's methods are checked when it is
  loaded, the instance's attributes when it is built;
- ``Options`` (optional): a dataclass of its own fields, each with a default and of type bool, int, float or
  str (or one of them or None). The config sets them as ``method.<plugin>.<field>``, where ``<plugin>`` is the
  entry point's name or the name after a path's colon; an unknown field is refused like any other. A
  ``ValueError`` from its ``__post_init__`` that starts with the field's name (``"hidden: 0 is out of
  range ..."``) reaches the user as ``method.<plugin>.hidden: ...``;
- ``check_config(cfg, options)`` (optional): its own checks of the rest of the config, raising ``ValueError``
  naming the field.

All of it runs at the door, in ``config.validate`` (before any run, folder or process exists), and again
wherever the method is built. A plugin's module joins the run's code fingerprint (``Plugin.modules``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import importlib.metadata
import os
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from torch import nn

from mocolab.config.choices import NEGATIVE_SOURCES, VERSIONS
from mocolab.config.schema import _coerce
from mocolab.method.protocol import Method, MethodParts

if TYPE_CHECKING:
    from mocolab.config.schema import Config

GROUP = "mocolab.methods"  # the entry point group plugins declare
# mocolab's own methods that a config names by method.name, as it names an installed plugin: name -> module:Class
OWN = {"supervised": "mocolab.method.supervised:Supervised"}
# what the class must define (the rest of the protocol is read on the instance, where __init__ may set it)
CLASS_MEMBERS = ("from_config", "forward", "checkpoint_parts", "describe", "uniform_loss")
_SCALARS = {bool: "bool", int: "int", float: "float", str: "str"}  # field types a config value is coerced to


class PluginError(ValueError):
    """A plugin that cannot be used: not found, not importable, or not a ``Method``. A ValueError, so a
    command refuses it in one line (exit 2) as it refuses any other bad config."""


@dataclass(frozen=True)
class Plugin:
    """A loaded plugin: what ``method.name`` names (``name``), where it came from (``origin``: the entry point
    or the path), what builds the method and the fields it declares."""

    name: str
    origin: str  # "entry point byol = mocolab_byol:BYOL (mocolab-byol 0.1.0)", or "my:BYOL, from /x/my.py"
    target: Any  # the class or the builder
    build_fn: Callable[..., Method]  # (cfg, parts, options) -> Method
    options_type: type | None  # its Options dataclass
    field_types: Mapping[str, str]  # Options field -> the type as config/schema.py's _coerce reads it
    modules: tuple[str, ...]  # the modules of its code: they join the run's code fingerprint
    ship: tuple[str, ...] = ()  # a path plugin's folder (where its top-level module is): Ray Train's workers

    @property
    def namespace(self) -> str:
        return self.name.rpartition(":")[2]

    def options(self, given: Mapping[str, Any]) -> Any:
        """The plugin's ``Options`` from the config's ``method.<plugin>.*`` (keys ``<plugin>.<field>``), each
        value coerced to its field's type; None where it declares no fields."""
        ns = self.namespace
        fields = dict(self.field_types)
        values = {}
        for key, value in given.items():
            name = key.partition(".")[2]
            if name not in fields:
                known = [f"method.{ns}.{f}" for f in fields]
                if not known:
                    raise ValueError(f"unknown config key 'method.{key}': the plugin {self.name!r} declares no "
                                     f"fields of its own")
                close = difflib.get_close_matches(f"method.{key}", known, n=1)
                raise ValueError(f"unknown config key 'method.{key}'; the plugin {self.name!r} has {known}"
                                 + (f" (did you mean {close[0]}?)" if close else ""))
            values[name] = _coerce(f"method.{key}", value, fields[name])
        if self.options_type is None:
            return None
        try:
            return self.options_type(**values)
        except ValueError as err:  # the plugin's own checks: the field they name gets its namespace in front
            named = str(err).partition(":")[0] in fields
            raise ValueError(f"method.{ns}.{err}" if named else f"method.{ns}: {err}") from None

    def check(self, cfg: Config) -> Any:
        """Its fields and its own checks of ``cfg``, as the door runs them; returns its options."""
        options = self.options(cfg.method.options)
        check_config = getattr(self.target, "check_config", None)
        if check_config is not None:
            check_config(cfg, options)
        return options

    def build(self, cfg: Config, parts: MethodParts) -> Method:
        """The method for ``cfg``, checked for every member of the ``Method`` protocol."""
        method = self.build_fn(cfg, parts, self.options(cfg.method.options))
        missing = [m for m in protocol_members() if not hasattr(method, m)]
        if not isinstance(method, nn.Module):
            missing.insert(0, "nn.Module (the trainer moves, trains and saves it as one)")
        if missing:
            raise PluginError(f"method.name: {self.name!r} ({self.origin}) built an object of type "
                              f"{type(method).__name__} that lacks {', '.join(missing)} of the Method protocol "
                              f"(method/protocol.py)")
        return method


def protocol_members() -> tuple[str, ...]:
    """Every member of ``method.protocol.Method``: its attributes, properties and methods."""
    members = {*Method.__annotations__, *(n for n in vars(Method) if not n.startswith("_"))}
    return tuple(sorted(members))


def installed() -> dict[str, list[importlib.metadata.EntryPoint]]:
    """The plugins the environment's distributions declare (group ``mocolab.methods``), by name."""
    found: dict[str, list[importlib.metadata.EntryPoint]] = {}
    for ep in importlib.metadata.entry_points(group=GROUP):
        found.setdefault(ep.name, []).append(ep)
    return dict(sorted(found.items()))


def check_method(cfg: Config) -> Plugin:
    """What the door checks of a config naming a plugin (config.validate): it is found and loaded, it is a
    ``Method``, its fields are its own and in range, and its own checks of the config pass.

    ``cfg.method.options`` then holds every field the plugin declares, each of its type, the unset ones at
    their defaults: the config says all it means, as the built-ins' fields do (``--print-config`` lists them,
    MLflow records them), and ``false`` and ``"false"`` name one run."""
    plugin = load(cfg.method.name)
    options = plugin.check(cfg)
    if options is not None:
        cfg.method.options = {f"{plugin.namespace}.{k}": v for k, v in dataclasses.asdict(options).items()}
    return plugin


def method_modules(cfg: Config) -> tuple[str, ...]:
    """The modules of the config's plugin (or mocolab's own method it names), for the run's code fingerprint
    (``code_fingerprint(extra=...)``); none for the built-in methods, which are on the training path already."""
    return load(cfg.method.name).modules if cfg.method.name else ()


def shipped_paths(cfg: Config) -> tuple[str, ...]:
    """The folders a run's Ray Train workers need on their path to import its plugin: a ``module:Class``
    path's (none for an installed plugin: the workers have it too)."""
    return load(cfg.method.name).ship if cfg.method.name else ()


@functools.lru_cache(maxsize=None)
def load(name: str) -> Plugin:
    """The plugin ``name`` (mocolab's own, an entry point's name or a ``module:Class`` path), loaded and
    checked once per process. Raises ``PluginError`` naming what is wrong and what is there instead."""
    if name in OWN:
        target, origin, module_name = _own(name)
        ship = ()
    elif ":" in name:
        module_name, _, attr = name.partition(":")
        module = _import(module_name, name)
        if not hasattr(module, attr):
            public = sorted(n for n, v in vars(module).items() if isinstance(v, type) and not n.startswith("_")
                            and getattr(v, "__module__", None) == module.__name__)
            raise PluginError(f"method.name: module {module_name!r} ({module.__file__}) has no {attr!r}; its "
                              f"classes: {public}")
        target, origin = getattr(module, attr), f"{name}, from {module.__file__}"
        ship = _ship(module_name)
    else:
        target, origin, module_name = _entry_point(name)
        ship = ()
    modules = tuple(dict.fromkeys(m for m in (module_name, getattr(target, "__module__", None)) if m))
    build_fn, options_type, field_types = _check_target(name, origin, target)
    return Plugin(name, origin, target, build_fn, options_type, field_types, modules, ship)


def _own(name: str) -> tuple[Any, str, str]:
    """(target, origin, module) of mocolab's own method ``name``; refused where an installed plugin takes the
    name too (a config naming it would otherwise mean one thing or the other by the order of a lookup)."""
    clash = installed().get(name, [])
    if clash:
        raise PluginError(f"method.name: {name!r} is mocolab's own method ({OWN[name]}), and "
                          f"{', '.join(_describe(ep) for ep in clash)} declares a plugin of that name too; "
                          f"rename the plugin's entry point")
    module_name, _, attr = OWN[name].partition(":")
    return getattr(importlib.import_module(module_name), attr), f"mocolab's own method {name} = {OWN[name]}", \
        module_name


def _entry_point(name: str) -> tuple[Any, str, str]:
    """(target, origin, module) of the installed plugin ``name``."""
    found = installed()
    eps = found.get(name, [])
    if not eps:
        if name in NEGATIVE_SOURCES or name in VERSIONS:
            field = "moco.version" if name in VERSIONS else "moco.negatives"
            raise PluginError(f"method.name: {name!r} is a built-in method: choose it with {field}={name} and "
                              f"leave method.name empty (it names a plugin)")
        close = difflib.get_close_matches(name, [*found, *OWN], n=3, cutoff=0.5)
        raise PluginError(f"method.name: {name!r} is no installed plugin (entry point group {GROUP}); installed: "
                          f"{list(found) or 'none'}" + (f"; closest: {close}" if close else "")
                          + f"; mocolab's own: {list(OWN)}"
                          + "; or name a module of your own as module:Class (docs/methods.md, 'Your own method')")
    if len(eps) > 1:
        raise PluginError(f"method.name: {name!r} is declared by {len(eps)} installed distributions "
                          f"({', '.join(_describe(ep) for ep in eps)}); uninstall all but one")
    ep = eps[0]
    origin = f"entry point {_describe(ep)}"
    try:
        target = ep.load()
    except Exception as err:  # noqa: BLE001 - whatever the plugin's import raises, named with the plugin
        raise PluginError(f"method.name: the plugin {name!r} ({origin}) failed to load: "
                          f"{type(err).__name__}: {err}") from err
    return target, origin, ep.module


def _describe(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{ep.name} = {ep.value}" + (f" ({dist.name} {dist.version})" if dist is not None else "")


def _import(module_name: str, name: str):
    """``module_name`` from Python's path, else from the current folder (as ``python -m`` would find it; the
    ``mocolab`` command's own path holds no current folder)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        here = os.getcwd()
        missing_itself = err.name is not None and module_name.split(".")[0] == err.name.split(".")[0]
        if not missing_itself or here in sys.path:
            raise PluginError(f"method.name: cannot import {module_name!r} (of {name!r}): {err}") from err
        sys.path.append(here)
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as again:
            sys.path.remove(here)
            raise PluginError(f"method.name: cannot import {module_name!r} (of {name!r}): {again}; a "
                              f"module:Class path names a module on Python's path or in the current folder "
                              f"({here})") from again
        except Exception as again:  # noqa: BLE001
            raise PluginError(f"method.name: importing {module_name!r} (of {name!r}) failed: "
                              f"{type(again).__name__}: {again}") from again
    except Exception as err:  # noqa: BLE001 - a syntax error or a missing dependency of the plugin's own
        raise PluginError(f"method.name: importing {module_name!r} (of {name!r}) failed: "
                          f"{type(err).__name__}: {err}") from err


def _ship(module_name: str) -> tuple[str, ...]:
    """The folder a path plugin's top-level module or package was imported from, for the workers' path;
    nothing for a module installed in this environment (every worker has it)."""
    top = sys.modules[module_name.split(".")[0]]
    paths = list(getattr(top, "__path__", None) or [])
    path = paths[0] if len(paths) == 1 else getattr(top, "__file__", None)
    if path is None or Path(path).resolve().is_relative_to(Path(sys.prefix).resolve()):
        return ()
    return (str(Path(path).resolve().parent),)


def _check_target(name: str, origin: str, target: Any) -> tuple[Callable[..., Method], type | None,
                                                                dict[str, str]]:
    """(builder, Options, field types) of a plugin's class or builder, or a ``PluginError`` naming every
    member the class lacks and every field the config could not set."""
    if isinstance(target, type):
        missing = [m for m in CLASS_MEMBERS if not callable(getattr(target, m, None))]
        if "forward" not in missing and target.forward is nn.Module.forward:
            missing.append("forward")
        if not issubclass(target, nn.Module):
            missing.insert(0, "nn.Module as a base class")
        if missing:
            raise PluginError(f"method.name: {name!r} ({origin}) is not a method: {target.__name__} lacks "
                              f"{', '.join(missing)} of the Method protocol (method/protocol.py; "
                              f"docs/methods.md, 'Your own method')")
        build_fn = target.from_config
    elif callable(target):
        build_fn = target  # a builder: the method it builds is checked when it is built
    else:
        raise PluginError(f"method.name: {name!r} ({origin}) is a {type(target).__name__}, neither a class nor "
                          f"a builder function")
    options_type = getattr(target, "Options", None)
    if options_type is None:
        return build_fn, None, {}
    where = f"{name!r} ({origin}): {getattr(target, '__name__', name)}.Options"
    if not (isinstance(options_type, type) and dataclasses.is_dataclass(options_type)):
        raise PluginError(f"method.name: {where} must be a dataclass of the plugin's own fields")
    hints = typing.get_type_hints(options_type)
    types = {}
    for f in dataclasses.fields(options_type):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise PluginError(f"method.name: {where}.{f.name} has no default; every field needs one (a config "
                              f"that does not set it must still mean something)")
        text = _field_type(hints.get(f.name))
        if text is None:
            raise PluginError(f"method.name: {where}.{f.name} is of type {hints.get(f.name)!r}; a config field is "
                              f"bool, int, float or str (or one of them | None)")
        types[f.name] = text
    try:
        options_type()
    except Exception as err:  # noqa: BLE001 - its own defaults must pass its own checks
        raise PluginError(f"method.name: {where}() refuses its own defaults: {type(err).__name__}: {err}") from err
    return build_fn, options_type, types


def _field_type(tp: Any) -> str | None:
    """``int`` -> "int", ``float | None`` -> "float | None" (what ``_coerce`` reads); None for any other type."""
    if tp in _SCALARS:
        return _SCALARS[tp]
    args = typing.get_args(tp)
    if len(args) == 2 and type(None) in args:
        other = next(a for a in args if a is not type(None))
        return f"{_SCALARS[other]} | None" if other in _SCALARS else None
    return None


__all__ = ["CLASS_MEMBERS", "GROUP", "OWN", "Plugin", "PluginError", "check_method", "installed", "load",
           "method_modules", "protocol_members", "shipped_paths"]
