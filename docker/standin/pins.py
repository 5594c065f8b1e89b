"""Print ``name==version`` for every distribution the image needs, at the versions this interpreter has.

The stand-in base must hold the Ray and torch of the environment the tests ran with, or the image the
deploy test runs is not the one the suite checked. The set is mocolab's own requirements with the
``cluster`` extra, plus Ray's ``default``, ``train`` and ``tune`` extras (what docker/Dockerfile installs),
closed over their requirements as installed here.
"""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(roots: list[str]) -> dict[str, str]:
    env = default_environment()
    pins: dict[str, str] = {}
    todo = [(Requirement(r), "") for r in roots]
    seen: set[tuple[str, str]] = set()
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({**env, "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        dist = metadata.distribution(name)  # PackageNotFoundError: the environment lacks a requirement
        pins[name] = dist.version
        for ex in [""] + sorted(req.extras):
            if (name, ex) in seen:
                continue
            seen.add((name, ex))
            todo += [(Requirement(r), ex) for r in dist.requires or []]
    return pins


def main() -> None:
    project = tomllib.loads((Path(sys.argv[1]) / "pyproject.toml").read_text())["project"]
    roots = project["dependencies"] + project["optional-dependencies"]["cluster"]
    roots.append(f"ray[default,train,tune]=={metadata.version('ray')}")
    for name, version in sorted(closure(roots).items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
