"""Write a commented torchrig.toml image spec (refuses to overwrite one without --force).

The spec says what the image holds: the PyTorch build (a version and variant, or 'auto': resolved for the
GPUs and the oldest driver it must run on), Python, extra pip and apt packages, the services (JupyterLab,
SSH), the non-root user, the working directory and the variant (runtime, or devel with nvcc and headers).
Then `torchrig image render` prints its Dockerfile and `torchrig image build` builds it.

Without --gpu, init looks for this machine's GPUs and driver (NVML) and targets them; with none found it
writes the CPU build. It says what it chose and why (also as a comment in the file).

examples:
  torchrig init                                         # this machine's GPUs and driver, else the CPU build
  torchrig init --gpu "RTX 4090" --gpu A100 --driver 550.54.15
  torchrig init --torch 2.8.0 --variant cu128 --devel
  torchrig init --variant cpu --python 3.11 ci/torchrig.toml
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import unicodedata
from pathlib import Path
from typing import Any

from torchrig.errors import UsageError
from torchrig.report import SimpleReport

TEMPLATE = """\
# torchrig image spec. `torchrig image render` prints the Dockerfile, `torchrig image build` builds it.
# Chosen by torchrig init: {why}
schema_version = 1

[torch]
# A release ("2.8.0") or "auto": the newest release that runs on every GPU below with the driver below.
version = {version}
# "cpu", a CUDA variant ("cu126", "cu128", ...) or "auto" (the best for the GPUs and driver).
variant = {variant}
# For "auto": the GPUs the image must run on (any spelling nvidia-smi or a datasheet uses)...
gpus = {gpus}
# ...and the oldest NVIDIA driver it must run on (nvidia-smi shows it).
{driver_line}

[python]
version = {python}        # the runtime bases ship 3.11, 3.12 and 3.13; the devel bases the OS's Python

[packages]
pip = []                  # extra pip requirements, e.g. ["transformers==4.46.0"]; torch stays pinned
apt = []                  # extra Debian/Ubuntu packages, e.g. ["git", "htop"]

[services]                # started by `torchrig serve`, the image's entrypoint, as the user below
jupyter = true            # JupyterLab on :8888, token from /run/secrets/jupyter_token or generated (printed in the logs)
ssh = true                # OpenSSH on :22, public keys only (/run/secrets/authorized_keys or $SSH_AUTHORIZED_KEYS)

[user]                    # the container runs as this non-root user (match your host uid for bind mounts)
name = "torch"
uid = 1000
gid = 1000

[image]
variant = {image_variant}      # "runtime", or "devel": nvcc and headers for torch.compile, Triton, C++/CUDA extensions
workdir = "/workspace"
name = "torchrig/pytorch"  # the repository the image is tagged in (the tag names the resolved stack)
# base = "debian:bookworm-slim"              # another base: a pinned tag or digest, never :latest
# pip_index_url = "https://pypi.example/simple"  # a PyPI mirror
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", nargs="?", default="torchrig.toml", help="where to write (default: ./torchrig.toml)"
    )
    parser.add_argument(
        "--torch", default="auto", metavar="VERSION", help="torch release, e.g. 2.8.0 (default: auto)"
    )
    parser.add_argument("--variant", default="auto", help="cpu, cuXYZ or auto (default: auto)")
    parser.add_argument(
        "--gpu", action="append", default=[], metavar="NAME", help="a target GPU (repeatable)"
    )
    parser.add_argument("--driver", metavar="VERSION", help="the oldest driver the image must run on")
    parser.add_argument("--python", default="3.11", help="Python version (default: 3.11)")
    parser.add_argument("--devel", action="store_true", help="the devel variant (nvcc and headers)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")
    from torchrig.cli.cmd_check import add_platform_argument

    add_platform_argument(parser)


def choose(args: argparse.Namespace) -> Any:
    """The target (GPUs, driver, variant) and why: as given, else detected here (NVML), else the CPU build."""
    from torchrig.compat.host import detect_local_gpus
    from torchrig.compat.target import choose_target

    looked = args.variant != "cpu" and not args.gpu
    return choose_target(args.gpu, args.driver, args.variant, detect_local_gpus() if looked else None)


def _q(value: object) -> str:
    """A TOML basic string (or a list of them): JSON's escapes, but raw non-ASCII (JSON would escape U+10000
    as a surrogate pair, which TOML does not read)."""
    return json.dumps(value, ensure_ascii=False)


def render_spec(args: argparse.Namespace, target: Any) -> str:
    driver = target.driver
    return TEMPLATE.format(
        why=target.why,
        version=_q(args.torch),
        variant=_q(target.variant),
        gpus=_q(list(target.gpus)),
        driver_line=f"min_driver = {_q(driver)}" if driver else '# min_driver = "535.104.05"',
        python=_q(args.python),
        image_variant=_q("devel" if args.devel else "runtime"),
    )


def run(args: argparse.Namespace) -> SimpleReport:
    from torchrig.image.spec import parse_spec
    from torchrig.inputfiles import loads_toml

    for option, values in (
        ("--torch", [args.torch]),
        ("--variant", [args.variant]),
        ("--python", [args.python]),
        ("--driver", [args.driver or ""]),
        ("--gpu", args.gpu),
    ):
        for value in values:  # a control character or an undecodable byte cannot go into a TOML string
            if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in value):
                raise UsageError(f"{option} {value!r} holds control or undecodable characters")
    path = Path(args.path)
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists", hint="pass --force to overwrite it, or give another path")
    if args.driver is not None:
        from torchrig.compat import versions as V

        V.parse_driver(args.driver)
    from torchrig.cli.cmd_check import platform_from

    plat = platform_from(args)
    target = choose(args)
    if plat.id != "linux-x86_64":
        # The image is a Linux container: x86_64 wheels under WSL 2 or Docker Desktop on Windows.
        target = dataclasses.replace(target, why=f"{target.why}; host platform {plat.label}")
    text = render_spec(args, target)
    # what we write must be valid (bad --torch etc. fail here)
    parse_spec(loads_toml(text, "the spec", str(path)), str(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise UsageError(
            f"cannot write {path}: {err.strerror}", hint="give a path in a writable folder"
        ) from None
    chosen = {
        "gpus": list(target.gpus),
        "driver": target.driver,
        "variant": target.variant,
        "why": target.why,
    }
    gpus = ", ".join(target.gpus) or "no GPU"
    nxt = f"torchrig image render {path if str(path) != 'torchrig.toml' else ''}".rstrip()
    return SimpleReport(
        data={"path": str(path), "spec": text, "chosen": chosen},
        text=f"wrote {path}: torch {args.torch}, variant {target.variant}, for {gpus}"
        + (f", driver {target.driver}" if target.driver else "")
        + f"\nwhy: {target.why}\nnext: {nxt}",
    )
