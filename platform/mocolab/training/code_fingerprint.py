"""The code a run's result depends on, as a digest the driver knows before it names or resumes a run.

A run's name is a digest of its config and seed; what trains it is the code on the training path: every
mocolab module the Ray Train worker's entry point imports, followed import by import (the loop, the method,
the data path, the models, evaluation, the tracking the worker logs through), plus the versions of Python
and of the packages on the step's path.  Each module counts by its code alone: docstrings, comments and
layout are left out (``ast.unparse`` of the tree without its docstrings), so a reworded comment or a
reflowed line keeps the fingerprint and a changed loss, augmentation or trainer changes it.  A module the
worker does not import (the report, the CLI, a study's plot) never counts.  Extra modules (a method or
backbone from outside the package: a plugin's, method/plugins.py ``method_modules``) join by name, with the
modules of their own top-level package that they import.  No torch here: the driver computes it before any
work.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import platform
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Iterable, Mapping

PACKAGE = Path(__file__).resolve().parents[1]  # the mocolab folder this process runs
ENTRY = "mocolab.training.worker"  # what every rank runs (train_loop_per_worker); in process too
STEP_PACKAGES = ("torch", "torchvision", "kornia", "numpy")  # what a training step computes with
UNKNOWN = ""  # the fingerprint of a run that records none: code unknown


@dataclass(frozen=True)
class CodeFingerprint:
    """``digest``: 16 hex digits over ``modules`` (module -> digest of its code) and ``versions``."""

    digest: str
    modules: Mapping[str, str] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)

    @property
    def short(self) -> str:
        return self.digest[:8]

    def differences(self, other: CodeFingerprint) -> list[str]:
        """What ``other`` (an earlier run's) has that this code has not: modules changed, added or gone, and
        package versions, as lines a person reads (``mocolab.method.losses: changed``)."""
        def change(m: str) -> str:
            return "changed" if m in self.modules and m in other.modules else "added" if m in self.modules else "gone"

        out = [f"{m}: {change(m)}" for m in sorted(set(self.modules) | set(other.modules))
               if self.modules.get(m) != other.modules.get(m)]
        out += [f"{p} {other.versions.get(p, '?')} -> {self.versions.get(p, '?')}"
                for p in sorted(set(self.versions) | set(other.versions))
                if self.versions.get(p) != other.versions.get(p)]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "modules": dict(self.modules), "versions": dict(self.versions)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> CodeFingerprint:
        if not raw:
            return cls(UNKNOWN)
        return cls(str(raw.get("digest", UNKNOWN)), dict(raw.get("modules", {})), dict(raw.get("versions", {})))


def code_fingerprint(extra: Iterable[str] = ()) -> CodeFingerprint:
    """The fingerprint of the code that trains a run here: ``ENTRY``'s import closure and ``extra`` modules
    (importable names, inside mocolab or not), with the step's package versions."""
    return _fingerprint(tuple(sorted(set(extra))))


@functools.lru_cache(maxsize=8)
def _fingerprint(extra: tuple[str, ...]) -> CodeFingerprint:
    modules = {name: _code_digest(path) for name, path in sorted(_closure([ENTRY, *extra]).items())}
    versions = {"python": platform.python_version(), **{p: _version(p) for p in STEP_PACKAGES}}
    blob = json.dumps({"modules": modules, "versions": versions}, sort_keys=True).encode()
    return CodeFingerprint(hashlib.sha256(blob).hexdigest()[:16], modules, versions)


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"


def _source(name: str) -> Path | None:
    """The file of module ``name``: inside mocolab from this folder (what the workers run), else where the
    import system finds it; None for a name that is no module of a file (a class, a builtin)."""
    parts = name.split(".")
    if parts[0] == "mocolab":
        base = PACKAGE.joinpath(*parts[1:])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def _closure(entries: Iterable[str]) -> dict[str, Path]:
    """Every mocolab module ``entries`` import at module level, transitively (a function's own imports wait
    for a use the training path may never make: a plot, a CLI answer), with the parent packages' __init__;
    an entry from outside mocolab (a plugin's module) is followed the same way within its own top-level
    package."""
    entries = list(entries)
    roots = {"mocolab", *(e.split(".")[0] for e in entries)}
    found: dict[str, Path] = {}
    todo = list(entries)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        path = _source(name)
        if path is None:
            continue
        found[name] = path
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts)) if parts[0] in roots]
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            todo += [m for m in _imported(node, package) if m.split(".")[0] in roots]
    return found


def _imported(node: ast.stmt, package: str = "") -> list[str]:
    """The modules a top-level statement imports (``from a.b import c`` names a.b, and a.b.c where c is a
    module), looking inside if/try blocks at module level; a relative import resolves against ``package``
    (the importing module's package: a plugin's own may import its siblings so)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level and package:
        parts = package.split(".")
        base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
        return [base, *(f"{base}.{a.name}" for a in node.names)] if node.level <= len(parts) else []
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    if isinstance(node, (ast.If, ast.Try)):
        inner = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                 *(s for h in getattr(node, "handlers", []) for s in h.body)]
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return []
        return [m for s in inner for m in _imported(s, package)]
    return []


def _code_digest(path: Path) -> str:
    """A digest of a module's code: its syntax tree without docstrings, unparsed (comments and layout gone)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.unparse(tree).encode()).hexdigest()[:16]


def neutral_changes(path: str | Path) -> frozenset[tuple[str, str]]:
    """The code changes declared neutral in a committed list (``[{"from": digest, "to": digest, "reason":
    "..."}]``; "" for code unknown): an interrupted run may continue across exactly these, its segments
    recorded, because a person stated why the change leaves every number as it was."""
    raw = json.loads(Path(path).read_text())
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a list of {{from, to, reason}}")
    pairs = set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not str(item.get("reason", "")).strip() \
                or not all(isinstance(item.get(k), str) for k in ("from", "to")):
            raise ValueError(f"{path}: entry {i} needs 'from' and 'to' (code fingerprints) and a 'reason'")
        pairs.add((item["from"], item["to"]))
    return frozenset(pairs)


__all__ = ["ENTRY", "STEP_PACKAGES", "UNKNOWN", "CodeFingerprint", "code_fingerprint", "neutral_changes"]
