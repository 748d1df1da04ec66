"""``torchrig install``: the right PyTorch build for this machine, installed, verified, and doctor's verdict.

request (``InstallRequest``) → plan (``make_plan``: the interpreter, the machine's GPUs and driver or the ones
given, ``resolve``'s build walked down to the newest one the index really serves, the installer's argv) → run
(``run_install``: pip or uv, the constraints file, a real kernel, doctor's checks) → ``InstallResult``.

>>> from torchrig.install import InstallRequest, run_install
>>> run_install(InstallRequest(dry_run=True)).plan.command     # doctest: +SKIP
'/usr/bin/python3 -m pip install torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu'
"""

from __future__ import annotations

from torchrig.install.plan import InstallPlan, InstallRequest
from torchrig.install.run import InstallResult, make_plan, run_install

__all__ = ["InstallPlan", "InstallRequest", "InstallResult", "make_plan", "run_install"]
