"""What a build reports, whichever builder ran it: its steps, a failing step and the one-line error.

Shared by the classic builder's adapter (:mod:`torchrig.image.build`) and BuildKit's
(:mod:`torchrig.image.buildkit`), so that neither imports the other's module.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from torchrig.errors import JobFailed
from torchrig.image.steplog import StepError

# classic: "... returned a non-zero code: 100"; BuildKit: "executor failed running [...]: exit code: 100"
_NONZERO_RE = re.compile(r"(?:returned a non-zero code|exit code): (\d+)")
LOG_TAIL_LINES = 25


class Progress(Protocol):
    def step(self, number: int, total: int, text: str) -> None: ...
    def log(self, line: str) -> None: ...
    def close(self) -> None: ...


class StepState(str, enum.Enum):
    CACHED = "cached"  # the engine reused the layer
    DONE = "done"
    ERROR = "error"
    NOT_FINISHED = "not finished"  # the build stopped (another step failed) before this one ended


@dataclass(frozen=True)
class BuildStep:
    """One Dockerfile instruction as it ran: "Step 3/26 : RUN ..." (classic) or "[build 3/7] RUN ..." (BuildKit)."""

    name: str
    state: StepState
    elapsed_s: float | None  # None where the engine does not say (classic cached steps, unfinished ones)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state.value, "elapsed_s": self.elapsed_s}


@dataclass
class BuildFailure:
    step: str  # "Step 7/21 : RUN ..."
    message: str  # the engine's error
    log_tail: list[str] = field(default_factory=list)
    first_error: StepError | None = None  # the cause in the step's whole log (pip's last line hides it)


class BuildFailed(JobFailed):
    """The build ran and a step failed (exit 1); carries the step and its log tail."""

    def __init__(self, failure: BuildFailure) -> None:
        step = failure.step or "before the first step"
        last = next((line for line in reversed(failure.log_tail) if line.strip()), "")
        cause = failure.first_error
        if cause is not None:
            said = f"; its first error: {_short(cause.text, 200)}"
        else:
            said = f"; its last output: {_short(last, 160)}" if last else ""
        hint = (
            "the step's log tail is above; fix the spec or the step and build again"
            if any(line.strip() for line in failure.log_tail)
            else "the step printed no log; fix the spec or the step and build again"
        )
        if base_unreachable(failure):
            hint = (
                "the base image could not be pulled (no network or registry access?): pass --base IMAGE with "
                "one this engine has or can pull ('docker images' lists the local ones)"
            )
            cause = None
        super().__init__(
            f"image build failed at {_short(step)}: {failure.message.strip()}{said}",
            hint=f"{cause.hint} ({hint})" if cause is not None and cause.hint else hint,
        )
        self.failure = failure


# What the engine says when it cannot fetch an image (BuildKit and the classic builder, docker pull): a
# registry that does not answer, a name it does not know, a refused login.
_PULL_ERRORS = (
    "failed to resolve source metadata", "failed to do request", "pull access denied", "manifest unknown",
    "not found: manifest", "dial tcp", "no such host", "i/o timeout", "toomanyrequests",
    "failed to authorize", "error pulling image", "tls handshake timeout",
)  # fmt: skip


def base_unreachable(failure: BuildFailure) -> bool:
    """Whether the build failed fetching its base (the FROM step, or before any step ran)."""
    step = (failure.step or "").lower()
    text = " ".join([failure.message, *failure.log_tail]).lower()
    at_base = not step or "from " in step or "load metadata" in step or step.startswith("[internal]")
    return at_base and any(e in text for e in _PULL_ERRORS)


def _short(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def error_text(message: str) -> str:
    """The engine's error without the echoed command (which can be a screenful)."""
    m = _NONZERO_RE.search(message)
    return f"the step exited with status {m.group(1)}" if m else " ".join(message.split())
