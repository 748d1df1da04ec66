"""The Docker Engine adapter for ``torchrig image build``: send the context, follow the build, read the lock.

The Docker SDK for Python speaks the Engine API's ``/build`` endpoint, which is the classic builder (the
SDK cannot open the session BuildKit's ``version=2`` builds need). Progress goes to stderr; a failing step
is reported with the tail of its log.
"""

from __future__ import annotations

import collections
import io
import re
import tarfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from torchrig.errors import EngineUnavailable, JobFailed

_STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_NONZERO_RE = re.compile(r"returned a non-zero code: (\d+)")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
LOG_TAIL_LINES = 25


class Progress(Protocol):
    def step(self, number: int, total: int, text: str) -> None: ...
    def log(self, line: str) -> None: ...
    def close(self) -> None: ...


@dataclass
class BuildFailure:
    step: str  # "Step 7/21 : RUN ..."
    message: str  # the engine's error
    log_tail: list[str] = field(default_factory=list)


class BuildFailed(JobFailed):
    """The build ran and a step failed (exit 1); carries the step and its log tail."""

    def __init__(self, failure: BuildFailure) -> None:
        step = failure.step or "before the first step"
        super().__init__(
            f"image build failed at {_short(step)}: {failure.message.strip()}",
            hint="the step's log tail is above; fix the spec or the step and build again",
        )
        self.failure = failure


def _short(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def connect() -> Any:
    """A Docker SDK client talking to the engine, or EngineUnavailable with what to do."""
    try:
        import docker
    except ImportError:
        raise EngineUnavailable(
            "the Docker SDK for Python is not installed", hint="pip install 'torchrig[docker]'"
        ) from None
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as err:
        raise EngineUnavailable(
            f"no Docker engine answers ({type(err).__name__})",
            hint="start dockerd (or set DOCKER_HOST) and retry",
        ) from None
    return client


def base_reference(client: Any, image: str) -> str | None:
    """The base's digest (``repo@sha256:...``) where it came from a registry, else its image ID; None if absent."""
    try:
        attrs = client.images.get(image).attrs
    except Exception:
        return None
    digests = attrs.get("RepoDigests") or []
    return str(digests[0]) if digests else str(attrs.get("Id"))


def _error_text(message: str) -> str:
    """The engine's error without the echoed command (which can be a screenful)."""
    m = _NONZERO_RE.search(message)
    return f"the step exited with status {m.group(1)}" if m else " ".join(message.split())


def follow(chunks: Iterable[dict[str, Any]], progress: Progress) -> str:
    """Consume the engine's build stream; the built image ID, or BuildFailed with the failing step's log."""
    step, image_id, pending = "", None, ""
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)

    def line_done(line: str) -> None:
        nonlocal step, image_id
        line = _ANSI_RE.sub("", line).rstrip()
        m = _STEP_RE.match(line.strip())
        if m:
            step = line.strip()
            tail.clear()
            progress.step(int(m.group(1)), int(m.group(2)), m.group(3))
        elif line.strip():
            tail.append(line)
            progress.log(line)
        if line.startswith("Successfully built "):
            image_id = image_id or line.split()[-1]

    for chunk in chunks:
        if "error" in chunk:
            if pending:
                line_done(pending)
            raise BuildFailed(
                BuildFailure(step=step, message=_error_text(str(chunk["error"])), log_tail=list(tail))
            )
        aux = chunk.get("aux")
        if isinstance(aux, dict) and aux.get("ID"):
            image_id = str(aux["ID"])
        pending += str(chunk.get("stream", ""))
        *lines, pending = pending.split("\n")
        for line in lines:
            line_done(line)
    if pending:
        line_done(pending)
    if not image_id:
        raise BuildFailed(
            BuildFailure(
                step=step, message="the engine ended the build without an image", log_tail=list(tail)
            )
        )
    return image_id


def run_build(
    client: Any,
    context: IO[bytes],
    tag: str,
    *,
    buildargs: dict[str, str],
    labels: dict[str, str],
    no_cache: bool,
    progress: Progress,
) -> str:
    """Send the context tar to ``/build`` and follow it; returns the image ID."""
    context.seek(0)
    chunks: Iterator[dict[str, Any]] = client.api.build(
        fileobj=context,
        custom_context=True,
        tag=tag,
        rm=True,
        forcerm=True,
        pull=False,
        nocache=no_cache,
        buildargs=buildargs,
        labels=labels,
        decode=True,
    )
    try:
        return follow(chunks, progress)
    finally:
        progress.close()


def read_files(client: Any, image: str, directory: str) -> dict[str, str]:
    """The text files under ``directory`` in ``image``, read from a created (never started) container."""
    container = client.containers.create(image, command=["true"], entrypoint=[])
    try:
        stream, _stat = container.get_archive(directory)
        buf = io.BytesIO(b"".join(stream))
    finally:
        container.remove(force=True)
    out = {}
    with tarfile.open(fileobj=buf) as tar:
        for member in tar.getmembers():
            if member.isfile():
                f = tar.extractfile(member)
                if f is not None:
                    out[member.name.split("/", 1)[-1]] = f.read().decode("utf-8", "replace")
    return out


class TextProgress:
    """Build progress on stderr: rich's live status where stderr is a terminal, else one line per step."""

    def __init__(self, verbose: bool = False) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.verbose = verbose
        self.started = time.monotonic()
        self.status = self.console.status("sending the build context") if self.console.is_terminal else None
        if self.status is not None:
            self.status.start()

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.started:6.1f}s"

    def step(self, number: int, total: int, text: str) -> None:
        line = f"[{self._elapsed()}] step {number}/{total}: {_short(text, 90)}"
        if self.status is not None:
            self.status.update(line)
        self.console.print(line, markup=False)

    def log(self, line: str) -> None:
        if self.verbose:
            self.console.print("    " + line, markup=False, style="dim")

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()

    def failure(self, failure: BuildFailure) -> None:
        self.console.print(f"build failed at {failure.step}", markup=False, style="bold red")
        for line in failure.log_tail:
            self.console.print("  | " + line, markup=False)
