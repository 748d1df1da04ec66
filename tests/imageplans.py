"""The image test cases: a spec fixture and a recorded stack each, resolved into an :class:`ImagePlan` (no
network, no engine). Shared by the render goldens and the image-contract tests."""

from __future__ import annotations

import json
from pathlib import Path

from torchrig.image.spec import load_spec
from torchrig.image.stack import ImagePlan, ResolvedStack, choose_base, load_bases

FIX = Path(__file__).resolve().parent / "fixtures" / "image"
STACKS = json.loads((FIX / "stacks.json").read_text())

CASES = {
    # name: (spec file, stack, options)
    "runtime-jupyter-ssh-cu128": ("runtime-jupyter-ssh-cu128.toml", "2.8.0+cu128", {}),
    "devel-cu128": ("devel-cu128.toml", "2.8.0+cu128", {}),
    "cpu-only": ("cpu-only.toml", "2.8.0+cpu", {}),
    "wheelhouse-ca": (
        "wheelhouse-ca.toml",
        "2.8.0+cu128",
        {
            "wheelhouse": True,
            "ca_cert": True,
            "base": "torchrig-test/debian:bookworm",
            "pip_index_url": "https://pypi.org/simple",
        },
    ),
}


def stack(key: str, python: str) -> ResolvedStack:
    row = {k: v for k, v in STACKS[key].items() if k != "source"}
    row["arch_list"], row["ptx"] = tuple(row["arch_list"]), tuple(row["ptx"])
    return ResolvedStack(python=python, **row)


def plan_for(case: str) -> ImagePlan:
    spec_file, key, opts = CASES[case]
    spec = load_spec(FIX / spec_file)
    spec = type(spec)(
        **{**spec.__dict__, "path": spec_file}
    )  # goldens name the file, not this checkout's path
    st = stack(key, spec.python)
    rows, components = load_bases()
    return ImagePlan(
        spec=spec,
        stack=st,
        base=choose_base(spec, st, rows, opts.get("base")),
        jupyterlab=components["jupyterlab"],
        wheelhouse=opts.get("wheelhouse", False),
        ca_cert=opts.get("ca_cert", False),
        pip_index_url=opts.get("pip_index_url"),
        torchrig_requires=('tomli>=2.0; python_version < "3.11"',),
    )
