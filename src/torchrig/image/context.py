"""The build context: the rendered files plus torchrig's own wheel, the wheelhouse and the build CA.

The plan (:class:`ContextPlan`, names -> sources) is made first; :func:`write_context_tar` streams it to a
tar file with fixed timestamps and owners, so the same inputs give the same bytes and the same digest.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from torchrig.errors import EngineUnavailable, UsageError
from torchrig.image import render
from torchrig.image.stack import ImagePlan

# Reproducible wheels: setuptools/wheel stamp zip entries with SOURCE_DATE_EPOCH (1980-01-01, zip's floor).
_EPOCH = "315532800"


@dataclass(frozen=True)
class ContextPlan:
    """In-context name -> text (rendered) or a host file to copy."""

    texts: dict[str, str]
    files: dict[str, Path] = field(default_factory=dict)

    def digest(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self.texts):
            h.update(f"{name}\0{self.texts[name]}\0".encode())
        for name in sorted(self.files):
            h.update(f"{name}\0".encode())
            with open(self.files[name], "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        return h.hexdigest()


def source_checkout() -> Path | None:
    """The source tree torchrig runs from (an editable or in-place install), else None."""
    import torchrig

    root = Path(torchrig.__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "torchrig"' in pyproject.read_text(encoding="utf-8"):
        return root
    return None


def build_torchrig_wheel(out_dir: Path) -> Path:
    """``pip wheel`` of the running torchrig's checkout (serve is torchrig code, so the image needs it)."""
    root = source_checkout()
    if root is None:
        raise UsageError(
            "torchrig is not running from a source checkout, so its wheel cannot be built",
            hint="pass --torchrig-dist DIR with a torchrig wheel",
        )
    env = dict(os.environ, SOURCE_DATE_EPOCH=_EPOCH)
    with tempfile.TemporaryDirectory(prefix="torchrig-wheel-") as tmp:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "-w",
                str(out_dir),
                str(root),
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp,
            timeout=300,
        )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EngineUnavailable(
            f"building torchrig's wheel failed: {tail[0]}",
            hint="pip install setuptools wheel, or pass --torchrig-dist DIR",
        )
    wheels = sorted(out_dir.glob("torchrig-*.whl"))
    if not wheels:
        raise EngineUnavailable("pip wheel produced no torchrig wheel", hint="pass --torchrig-dist DIR")
    return wheels[-1]


def find_wheel(dist_dir: Path) -> Path:
    wheels = sorted(dist_dir.glob("torchrig-*.whl"))
    if not wheels:
        raise UsageError(
            f"{dist_dir}: no torchrig-*.whl in it", hint="build one with 'pip wheel --no-deps .'"
        )
    return wheels[-1]


def plan_context(
    plan: ImagePlan, torchrig_wheel: Path, wheelhouse: Path | None, ca_cert: Path | None
) -> ContextPlan:
    texts = {
        "Dockerfile": render.render_dockerfile(plan),
        f"{render.CONTEXT_FILES}/image.json": render.image_config(plan),
        f"{render.CONTEXT_FILES}/profile.sh": render.PROFILE_SH,
    }
    if plan.locked:
        texts[f"{render.CONTEXT_FILES}/locked.txt"] = "".join(f"{line}\n" for line in plan.locked.pip)
    files = {f"{render.CONTEXT_TORCHRIG}/{torchrig_wheel.name}": torchrig_wheel}
    if wheelhouse is not None:
        for wheel in sorted(wheelhouse.iterdir()):
            if (
                wheel.is_file()
                and wheel.suffix in (".whl", ".gz", ".zip")
                and not wheel.name.startswith("torchrig-")
            ):
                files[f"{render.CONTEXT_WHEELHOUSE}/{wheel.name}"] = wheel
    if ca_cert is not None:
        files[render.CONTEXT_CA] = ca_cert
    return ContextPlan(texts=texts, files=files)


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid = size, 0, 0o644, 0, 0
    return info


def write_context_tar(ctx: ContextPlan, out: IO[bytes]) -> None:
    """Write the context as an uncompressed tar (what the Engine API's /build takes)."""
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name in sorted(ctx.texts):
            data = ctx.texts[name].encode()
            tar.addfile(_info(name, len(data)), io.BytesIO(data))
        for name in sorted(ctx.files):
            path = ctx.files[name]
            with open(path, "rb") as f:
                tar.addfile(_info(name, path.stat().st_size), f)


def check_inputs(wheelhouse: Path | None, ca_cert: Path | None) -> None:
    """One-line errors for options that name nothing usable."""
    if wheelhouse is not None:
        if not wheelhouse.is_dir():
            raise UsageError(
                f"--wheelhouse {wheelhouse}: not a directory", hint="pip download the wheels into it first"
            )
        if not any(wheelhouse.glob("torch-*.whl")):
            raise UsageError(
                f"--wheelhouse {wheelhouse}: holds no torch wheel",
                hint="pip download torch==VERSION -d DIR (with --python-version/--platform for the image)",
            )
    if ca_cert is not None:
        if not ca_cert.is_file():
            raise UsageError(f"--ca-cert {ca_cert}: no such file")
        if b"-----BEGIN CERTIFICATE-----" not in ca_cert.read_bytes():
            raise UsageError(
                f"--ca-cert {ca_cert}: not a PEM certificate", hint="export the proxy's CA as PEM"
            )
