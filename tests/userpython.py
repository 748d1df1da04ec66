"""A Python that another Unix user can run torchrig with, for the tests that act as two or three people.

The interpreter that runs the tests may live where other users cannot go (a pyenv under /root); then they get
the system's python3 with copies of the packages they need: torchrig's own runtime dependencies (read from its
installed metadata, with theirs, so a new dependency cannot be forgotten here) and whatever the test adds
(the Docker SDK and its requests stack, pynvml)."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

DOCKER_SDK = ("docker", "requests", "urllib3", "idna", "charset_normalizer", "certifi")


def _requirement_names(dist: str) -> list[str]:
    """The distributions ``dist`` needs on this interpreter (extras left out, markers evaluated)."""
    from packaging.requirements import Requirement

    names = []
    for text in md.requires(dist) or ():
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            names.append(req.name)
    return names


def runtime_modules(dist: str = "torchrig") -> list[str]:
    """The top-level modules of ``dist``'s runtime dependencies and theirs, as installed here."""
    by_dist: dict[str, list[str]] = {}
    for module, dists in md.packages_distributions().items():
        for d in dists:
            by_dist.setdefault(re.sub(r"[-_.]+", "-", d).lower(), []).append(module)
    seen: set[str] = set()
    todo = _requirement_names(dist)
    modules: list[str] = []
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        modules += [m for m in by_dist.get(name, []) if not m.startswith("_") and m not in modules]
        todo += _requirement_names(name)
    return sorted(modules)


def copy_packages(names: list[str] | tuple[str, ...], dest: Path) -> None:
    """Copy each importable top-level module or package (a folder, or one file) into ``dest``, readable by all."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin, name
        if spec.submodule_search_locations:
            shutil.copytree(next(iter(spec.submodule_search_locations)), dest / name, dirs_exist_ok=True)
        else:
            shutil.copy(spec.origin, dest / Path(spec.origin).name)
    subprocess.run(["chmod", "-R", "a+rX", str(dest)], check=True)


def probe_code(extra: tuple[str, ...] = DOCKER_SDK[:1]) -> str:
    """The import line that proves a user's Python has what torchrig and the test need."""
    return "import " + ", ".join(("torchrig", *runtime_modules(), *extra))
