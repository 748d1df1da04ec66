"""BuildKit builds through the Docker Engine API: choose the builder, send the build, follow its progress.

``POST /build?version=2`` asks the engine for BuildKit (Engine API >= 1.39 on Linux engines; the ``/_ping``
header ``Builder-Version: 2`` says an engine prefers it). The context goes as the same uncompressed tar the
classic builder takes, so no BuildKit session is needed. The request goes through the Docker SDK's
``APIClient`` (its session and transport adapters), so DOCKER_HOST, TLS and SSH settings work as for the
classic builder. The engine streams JSON lines: ``moby.buildkit.trace`` progress (protobuf, decoded by
:mod:`torchrig.image.buildkit_status`), ``moby.image.id`` with the image ID, ``errorDetail`` on failure.
Equivalent shell command: ``DOCKER_BUILDKIT=1 docker build -t TAG - < context.tar``.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import json
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from torchrig.errors import EngineUnavailable, JobFailed
from torchrig.image.buildkit_status import ProtobufError, Vertex, decode_trace
from torchrig.image.buildrecords import (
    LOG_TAIL_LINES,
    BuildFailed,
    BuildFailure,
    BuildStep,
    Progress,
    StepState,
    error_text,
)
from torchrig.image.steplog import ErrorScan

# The docker CLI builds with BuildKit without the daemon's experimental mode from Engine API 1.39 on
# (docker/cli cli/command/image/build_session.go, isSessionSupported: ClientVersion >= "1.39"); daemons
# from 22.06 on also advertise "Builder-Version: 2" on Linux (https://github.com/moby/moby/pull/43992).
# Windows engines have no BuildKit.
BUILDKIT_MIN_API = (1, 39)
# docker-py has no public call for a BuildKit build (its APIClient.build() sends no version=2), so these
# methods of its APIClient carry the requests: not public API, so the docker extra in pyproject.toml is pinned
# to the range they are tested with (SDK_TESTED: 7.1.0 runs the tests; 7.2.0's APIClient defines the same
# methods, read from its source), and a docker-py without them is a one-line error (private_api).
SDK_PRIVATE_API = ("_get", "_post", "_url", "_raise_for_status", "_stream_helper")
SDK_TESTED = "docker>=7.1,<7.3"
# A Dockerfile instruction's vertex: "[build 3/7] RUN ..." (named stage) or "[2/3] RUN ..." (single stage)
_STEP_NAME_RE = re.compile(r"^\[(?:(\S+) )?(\d+)/(\d+)\] (.*)$", re.S)


class Builder(str, enum.Enum):
    BUILDKIT = "buildkit"
    CLASSIC = "classic"


@dataclass(frozen=True)
class EngineBuildInfo:
    """What ``GET /_ping`` says about the engine's builders (headers Api-Version, Ostype, Builder-Version)."""

    api_version: str | None
    os_type: str | None
    builder_version: str | None  # "2" where the engine prefers BuildKit, "1" classic, None not said


def _api_tuple(version: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (version or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def buildkit_support(info: EngineBuildInfo) -> str | None:
    """None where the engine can build with BuildKit, else why not (one phrase)."""
    if info.builder_version == "2":
        return None
    if (info.os_type or "").lower() == "windows":
        return "a Windows engine has no BuildKit"
    api = _api_tuple(info.api_version)
    if api is None:
        return "the engine did not say its API version"
    if api < BUILDKIT_MIN_API:
        return f"Engine API {info.api_version} is older than 1.39"
    return None


def choose_builder(requested: str, info: EngineBuildInfo, docker_buildkit: str | None = None) -> Builder:
    """``auto`` -> BuildKit where the engine has it, else classic; ``buildkit`` on an engine without it fails.

    ``docker_buildkit`` is the DOCKER_BUILDKIT environment variable, which ``auto`` honours as the docker
    CLI does: 0 (or false) asks for the classic builder, 1 (or true) for BuildKit."""
    why_not = buildkit_support(info)
    asked, hint = "--builder buildkit", "use --builder classic (or auto)"
    if requested == "auto" and docker_buildkit is not None:
        flag = docker_buildkit.strip().lower()
        if flag in ("0", "false"):
            requested = "classic"
        elif flag in ("1", "true"):
            requested = "buildkit"
            asked, hint = (
                f"DOCKER_BUILDKIT={docker_buildkit}",
                "unset DOCKER_BUILDKIT or use --builder classic",
            )
    if requested == "classic":
        return Builder.CLASSIC
    if requested == "buildkit":
        if why_not:
            raise EngineUnavailable(f"{asked}: {why_not}", hint=hint)
        return Builder.BUILDKIT
    return Builder.CLASSIC if why_not else Builder.BUILDKIT


def private_api(client: Any) -> Any:
    """``client.api`` (docker-py's APIClient), once it is known to have the private methods torchrig uses
    (:data:`SDK_PRIVATE_API`); a docker-py without one is EngineUnavailable naming it and the tested range."""
    api = client.api
    missing = [name for name in SDK_PRIVATE_API if not callable(getattr(api, name, None))]
    if missing:
        import docker

        raise EngineUnavailable(
            f"docker-py {getattr(docker, '__version__', '(version unknown)')} has no APIClient."
            f"{', '.join(missing)}, which torchrig's image builds use",
            hint=f"install the docker-py torchrig is tested with: pip install '{SDK_TESTED}'",
        )
    return api


def engine_build_info(client: Any) -> EngineBuildInfo:
    """Ask the engine (``GET /_ping``) through the SDK's APIClient; headers the engine leaves out are None."""
    api = private_api(client)
    response = api._get(api._url("/_ping"))
    api._raise_for_status(response)
    headers = response.headers
    return EngineBuildInfo(
        api_version=headers.get("Api-Version") or getattr(api, "api_version", None),
        os_type=headers.get("Ostype"),
        builder_version=headers.get("Builder-Version"),
    )


@dataclass
class _VertexState:
    name: str
    cached: bool = False
    started_s: float | None = None
    completed_s: float | None = None
    error: str = ""
    announced: bool = False
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL_LINES))
    partial: dict[int, str] = field(default_factory=dict)  # stream -> unfinished line
    scan: ErrorScan = field(default_factory=ErrorScan)

    def step(self) -> BuildStep:
        if self.error:
            state = StepState.ERROR
        elif self.completed_s is None:
            state = StepState.NOT_FINISHED
        else:
            state = StepState.CACHED if self.cached else StepState.DONE
        elapsed = None
        if self.started_s is not None and self.completed_s is not None:
            elapsed = round(max(0.0, self.completed_s - self.started_s), 3)
        return BuildStep(name=self.name, state=state, elapsed_s=elapsed)


def _clean(line: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line).rstrip("\r").rstrip()


class BuildkitFollower:
    """Folds the engine's BuildKit stream into vertex states, progress calls and, at the end, an image ID."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.vertexes: dict[str, _VertexState] = {}
        self.image_id: str | None = None
        self.undecodable = 0

    def steps(self) -> list[BuildStep]:
        """The Dockerfile's instructions as they ran (unused stages never appear: BuildKit skips them)."""
        return [v.step() for v in self.vertexes.values() if _STEP_NAME_RE.match(v.name)]

    def _vertex(self, vx: Vertex) -> None:
        state = self.vertexes.setdefault(vx.digest, _VertexState(name=vx.name))
        state.cached = state.cached or vx.cached
        state.started_s = vx.started_s if vx.started_s is not None else state.started_s
        state.completed_s = vx.completed_s if vx.completed_s is not None else state.completed_s
        state.error = vx.error or state.error
        if state.announced or state.started_s is None:
            return
        state.announced = True
        m = _STEP_NAME_RE.match(vx.name)
        if m is None:  # the engine's own work: loading the context, metadata, exporting the image
            self.progress.log(f"=> {vx.name}")
            return
        stage, number, total, text = m.groups()
        prefix = ("CACHED " if state.cached else "") + (f"[{stage}] " if stage else "")
        self.progress.step(int(number), int(total), prefix + " ".join(text.split()))

    def _log(self, digest: str, stream: int, data: bytes) -> None:
        state = self.vertexes.setdefault(digest, _VertexState(name=digest))
        text = state.partial.pop(stream, "") + data.decode("utf-8", "replace")
        *lines, rest = text.split("\n")
        if rest:
            state.partial[stream] = rest
        for line in lines:
            line = _clean(line)
            if line.strip():
                state.tail.append(line)
                state.scan.feed(line)
                self.progress.log(line)

    def _flush_partials(self) -> None:
        for state in self.vertexes.values():
            for stream in list(state.partial):
                line = _clean(state.partial.pop(stream))
                if line.strip():
                    state.tail.append(line)
                    state.scan.feed(line)

    def feed(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk or "errorDetail" in chunk:
            raise BuildFailed(self.failure(chunk))
        aux = chunk.get("aux")
        if chunk.get("id") == "moby.buildkit.trace" and isinstance(aux, str):
            try:
                status = decode_trace(aux)
            except ProtobufError as err:
                self.undecodable += 1
                self.progress.log(f"(a progress message could not be read: {err})")
                return
            for vx in status.vertexes:
                self._vertex(vx)
            for log in status.logs:
                self._log(log.vertex, log.stream, log.data)
        elif chunk.get("id") == "moby.image.id" and isinstance(aux, dict) and aux.get("ID"):
            self.image_id = str(aux["ID"])
        elif chunk.get("stream"):
            for line in str(chunk["stream"]).splitlines():
                if line.strip():
                    self.progress.log(_clean(line))

    def failure(self, chunk: dict[str, Any]) -> BuildFailure:
        """The failing vertex (the one with an error, else the last one still running) and its log tail."""
        self._flush_partials()
        detail = chunk.get("errorDetail") or {}
        message = str(chunk.get("error") or detail.get("message") or "the build failed")
        states = list(self.vertexes.values())
        failed = [v for v in states if v.error] or [
            v for v in states if v.started_s is not None and v.completed_s is None
        ]
        vx = failed[-1] if failed else None
        if vx is not None and not vx.error:
            vx.error = message
        return BuildFailure(
            step=vx.name if vx else "",
            message=error_text(message),
            log_tail=list(vx.tail) if vx else [],
            first_error=vx.scan.result if vx else None,
        )

    def finish(self) -> str:
        if not self.image_id:
            raise BuildFailed(BuildFailure(step="", message="the engine ended the build without an image ID"))
        return self.image_id


def follow_buildkit(
    chunks: Iterable[dict[str, Any]], progress: Progress, steps: list[BuildStep] | None = None
) -> str:
    """Consume a BuildKit build stream; the image ID, or BuildFailed with the failing step and its log.

    ``steps`` (if given) receives the Dockerfile's steps with their final state, also on failure."""
    follower = BuildkitFollower(progress)
    try:
        for chunk in chunks:
            follower.feed(chunk)
        return follower.finish()
    finally:
        if steps is not None:
            steps.extend(follower.steps())


def _params(
    tag: str, build_id: str, buildargs: dict[str, str], labels: dict[str, str], no_cache: bool
) -> dict[str, str]:
    params = {"t": tag, "version": "2", "buildid": build_id, "dockerfile": "Dockerfile"}
    params["buildargs"] = json.dumps(buildargs)
    params["labels"] = json.dumps(labels)
    if no_cache:
        params["nocache"] = "1"
    return params


def run_buildkit(
    client: Any,
    context: IO[bytes],
    tag: str,
    *,
    buildargs: dict[str, str],
    labels: dict[str, str],
    no_cache: bool,
    progress: Progress,
    steps: list[BuildStep] | None = None,
) -> str:
    """``POST /build?version=2`` with the context tar; follows the build, returns the image ID.

    Interrupted (Ctrl-C), it asks the engine to cancel the build (``POST /build/cancel``)."""
    from docker.errors import APIError

    api = private_api(client)
    build_id = uuid.uuid4().hex
    context.seek(0)
    try:
        response = api._post(
            api._url("/build"),
            params=_params(tag, build_id, buildargs, labels, no_cache),
            data=context,
            headers={"Content-Type": "application/x-tar"},
            stream=True,
            timeout=None,
        )
        api._raise_for_status(response)
    except APIError as err:
        raise JobFailed(
            f"the engine refused the BuildKit build: {err.explanation or err}",
            hint="retry with --builder classic",
        ) from None
    chunks: Iterator[dict[str, Any]] = api._stream_helper(response, decode=True)
    started = time.monotonic()
    try:
        return follow_buildkit(chunks, progress, steps)
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            api._post(api._url("/build/cancel"), params={"id": build_id}, timeout=10)
        raise
    finally:
        progress.log(f"(BuildKit build {build_id} ran {time.monotonic() - started:.1f} s)")
        progress.close()
