"""The compatibility engine: which GPU, driver, CUDA and PyTorch builds work together, and why not.

Facts come from the knowledge base (``torchrig/data/*.toml``); the rules are pure functions
(``torchrig.compat.rules``); nothing here touches the host, so everything is testable without a GPU.

>>> from torchrig.compat import load_kb, check, resolve, Verdict
>>> kb = load_kb()
>>> r = check(kb, gpus=[kb.find_gpu("RTX 5090")], driver="570.86.10", build=kb.find_build("2.7.0+cu128"))
>>> r.verdict is Verdict.WORKS
True
"""

from __future__ import annotations

from torchrig.compat.check import CheckResult, check
from torchrig.compat.kb import Build, Gpu, KnowledgeBase, Release, Toolkit, Variant, build_kb, load_kb
from torchrig.compat.reasons import Fix, Reason, Severity, Verdict
from torchrig.compat.resolve import NoBuildFound, Resolution, resolve

__all__ = [
    "Build",
    "CheckResult",
    "Fix",
    "Gpu",
    "KnowledgeBase",
    "NoBuildFound",
    "Reason",
    "Release",
    "Resolution",
    "Severity",
    "Toolkit",
    "Variant",
    "Verdict",
    "build_kb",
    "check",
    "load_kb",
    "resolve",
]
