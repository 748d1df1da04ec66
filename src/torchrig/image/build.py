"""The Docker Engine adapter for ``torchrig image build``: send the context, follow the build, read the lock.

Two builders behind the Engine API's ``/build``: BuildKit (``version=2``, :mod:`torchrig.image.buildkit`)
where the engine has it, else the classic builder, which the Docker SDK for Python's ``build`` speaks.
Both report the same steps (cached, done, error) and, for a failing step, the tail of its log. Progress
goes to stderr.
"""

from __future__ import annotations

import collections
import io
import re
import tarfile
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

from torchrig.image.buildrecords import (
    LOG_TAIL_LINES,
    BuildFailed,
    BuildFailure,
    BuildStep,
    Progress,
    StepState,
    _short,
    error_text,
)
from torchrig.image.steplog import ErrorScan

_STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
# the classic builder's own bookkeeping between a step's output lines, not output of the step
_ENGINE_LINE_RE = re.compile(r"^\s*(---> |Removing intermediate container )")


def connect() -> Any:
    """A Docker SDK client talking to the engine (``runtime.engine.Engine.connect``, the one connection every
    command makes, with a long timeout for builds), or EngineUnavailable with what to do."""
    from torchrig.runtime.engine import Engine

    return Engine.connect(timeout_s=600).client


def base_reference(client: Any, image: str) -> str | None:
    """The base's digest (``repo@sha256:...``) where it came from a registry, else its image ID; None if absent."""
    try:
        attrs = client.images.get(image).attrs
    except Exception:
        return None
    digests = attrs.get("RepoDigests") or []
    return str(digests[0]) if digests else str(attrs.get("Id"))


def follow(chunks: Iterable[dict[str, Any]], progress: Progress, steps: list[BuildStep] | None = None) -> str:
    """Consume the classic builder's stream; the built image ID, or BuildFailed with the failing step's log.

    ``steps`` (if given) receives each step with its final state, also on failure."""
    step, image_id, pending = "", None, ""
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    scan = ErrorScan()
    seen: list[list[Any]] = []  # [name, cached, started (monotonic)]

    def close_step(state: StepState | None) -> None:
        if seen and steps is not None:
            name, cached, began = seen[-1]
            final = state or (StepState.CACHED if cached else StepState.DONE)
            elapsed = None if final is StepState.CACHED else round(time.monotonic() - began, 3)
            steps.append(BuildStep(name=name, state=final, elapsed_s=elapsed))

    def line_done(line: str) -> None:
        nonlocal step, image_id, scan
        line = _ANSI_RE.sub("", line).rstrip()
        m = _STEP_RE.match(line.strip())
        if m:
            close_step(None)
            step = line.strip()
            seen.append([step, False, time.monotonic()])
            tail.clear()
            scan = ErrorScan()
            progress.step(int(m.group(1)), int(m.group(2)), m.group(3))
        elif line.strip():
            if not _ENGINE_LINE_RE.match(line):
                tail.append(line)
                scan.feed(line)
            progress.log(line)
            if line.strip() == "---> Using cache" and seen:
                seen[-1][1] = True
        if line.startswith("Successfully built "):
            image_id = image_id or line.split()[-1]

    for chunk in chunks:
        if "error" in chunk:
            if pending:
                line_done(pending)
            close_step(StepState.ERROR)
            raise BuildFailed(
                BuildFailure(
                    step=step,
                    message=error_text(str(chunk["error"])),
                    log_tail=list(tail),
                    first_error=scan.result,
                )
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
    close_step(None)
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
    builder: str = "classic",
    steps: list[BuildStep] | None = None,
) -> str:
    """Send the context tar to ``/build`` and follow it with ``builder`` (buildkit, classic); the image ID."""
    if builder == "buildkit":
        from torchrig.image.buildkit import run_buildkit

        return run_buildkit(
            client,
            context,
            tag,
            buildargs=buildargs,
            labels=labels,
            no_cache=no_cache,
            progress=progress,
            steps=steps,
        )
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
        return follow(chunks, progress, steps)
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

    def note(self, text: str) -> None:
        self.console.print(text, markup=False)

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
