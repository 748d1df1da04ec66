"""The build context: the rendered files plus torchrig's own wheel, the wheelhouse and the build CA.

The plan (:class:`ContextPlan`, names -> sources) is made first; :func:`write_context_tar` streams it to a
tar file with fixed timestamps and owners, so the same inputs give the same bytes and the same digest.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
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
from torchrig.inputfiles import open_regular, read_bytes

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
            with open_regular(self.files[name], "build context file") as f:  # streamed: a wheel is GBs
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        return h.hexdigest()


def source_checkout() -> Path | None:
    """The source tree torchrig runs from (an editable or in-place install), else None."""
    import torchrig

    root = Path(torchrig.__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""  # raw-read: own source
    if 'name = "torchrig"' in text:
        return root
    return None


def _backend_installed(root: Path) -> bool:
    """Whether this Python already has every ``[build-system] requires`` of the checkout (then the wheel is
    built offline with it); a fresh ``python3 -m venv`` has an old setuptools and no ``wheel``."""
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement

    from torchrig.inputfiles import InputError, read_toml

    try:
        doc = read_toml(root / "pyproject.toml", "the checkout's pyproject.toml")
        requires = [Requirement(r) for r in doc["build-system"]["requires"]]
    except (InputError, KeyError, TypeError, InvalidRequirement):
        return False
    for req in requires:
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            return False
        if not req.specifier.contains(have, prereleases=True):
            return False
    return True


def wheel_command(root: Path, out_dir: Path, *, isolated: bool) -> list[str]:
    """``pip wheel`` of the checkout: isolated (pip fetches the build backend into a throw-away environment)
    unless this Python has the backend already."""
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check"]
    if not isolated:
        cmd.append("--no-build-isolation")
    return [*cmd, "-w", str(out_dir), str(root)]


_SOURCE_FILES = ("pyproject.toml", "README.md", "setup.cfg", "setup.py", "MANIFEST.in", "LICENSE")


def _copy_source(root: Path, dest: Path) -> Path:
    """What the wheel is built from (the project files and ``src/``), copied into ``dest``."""
    dest.mkdir()
    for name in _SOURCE_FILES:
        if (root / name).is_file():
            shutil.copy2(root / name, dest / name)
    shutil.copytree(
        root / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    )
    return dest


def build_torchrig_wheel(out_dir: Path) -> Path:
    """``pip wheel`` of the running torchrig's checkout (serve is torchrig code, so the image needs it).

    It does not depend on this Python's setuptools or wheel: where they do not satisfy the checkout's
    ``[build-system] requires``, pip builds in an isolated environment (which needs the index, or
    ``PIP_FIND_LINKS`` with the backend's wheels). A failure names pip's first error, not its last line."""
    root = source_checkout()
    if root is None:
        raise UsageError(
            "torchrig is not running from a source checkout, so its wheel cannot be built",
            hint="pass --torchrig-dist DIR with a torchrig wheel",
        )
    isolated = not _backend_installed(root)
    env = dict(os.environ, SOURCE_DATE_EPOCH=_EPOCH)
    with tempfile.TemporaryDirectory(prefix="torchrig-wheel-") as tmp:
        # pip builds a local project in place (setuptools writes build/ and *.egg-info into it): two builds
        # at once collided there, and a read-only checkout could not build at all. Build from a copy.
        try:
            source = _copy_source(root, Path(tmp) / "source")
        except OSError as err:
            raise EngineUnavailable(
                f"copying torchrig's source for its wheel failed: {err}", hint="pass --torchrig-dist DIR"
            ) from None
        try:
            proc = subprocess.run(
                wheel_command(source, out_dir, isolated=isolated),
                capture_output=True,
                text=True,
                env=env,
                cwd=tmp,
                timeout=300,
            )
        except subprocess.TimeoutExpired:
            raise EngineUnavailable(
                "building torchrig's wheel took over 300 s", hint="pass --torchrig-dist DIR"
            ) from None
    if proc.returncode != 0:
        from torchrig.image.steplog import first_error

        output = (proc.stdout + "\n" + proc.stderr).splitlines()
        found = first_error(output)
        last = next((ln.strip() for ln in reversed(output) if ln.strip()), "no output")
        how = "in an isolated build environment" if isolated else "with this Python's setuptools"
        hint = (
            "let pip reach an index for the build backend (or PIP_FIND_LINKS with its wheels), or pip "
            "install 'setuptools>=70.1' into this Python, or pass --torchrig-dist DIR"
            if isolated
            else "pip install -U 'setuptools>=70.1', or pass --torchrig-dist DIR"
        )
        raise EngineUnavailable(
            f"building torchrig's wheel {how} failed: {found.text if found else last}", hint=hint
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
    if ca_cert is not None:  # the certificates alone, re-serialised: nothing else of the file travels
        texts[render.CONTEXT_CA] = certificates(ca_cert)
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
            with open_regular(path, "build context file") as f:  # streamed in the tar, never held whole
                tar.addfile(_info(name, os.fstat(f.fileno()).st_size), f)


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
        certificates(ca_cert)


_PEM_CERT_RE = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]+-----END CERTIFICATE-----")
_PRIVATE_KEY_RE = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----|PuTTY-User-Key-File")


def certificates(ca_cert: Path) -> str:
    """The PEM certificates of ``--ca-cert`` and nothing else (what goes into the build context). A file
    that also holds a private key is refused: a key must never reach an image layer."""
    if not os.path.lexists(ca_cert):
        raise UsageError(f"--ca-cert {ca_cert}: no such file")
    data = read_bytes(ca_cert, "--ca-cert file", max_bytes=16 * 2**20)  # a CA bundle is ~200 KB
    if _PRIVATE_KEY_RE.search(data):
        raise UsageError(
            f"--ca-cert {ca_cert}: the file holds a PRIVATE KEY; torchrig will not put it in a build",
            hint="give a file with the CA's certificate only (openssl x509 -in FILE -out ca.crt)",
        )
    certs = _PEM_CERT_RE.findall(data)
    if not certs:
        raise UsageError(f"--ca-cert {ca_cert}: not a PEM certificate", hint="export the proxy's CA as PEM")
    return "".join(c.decode("ascii").replace("\r\n", "\n") + "\n" for c in certs)
