"""The exception hierarchy, mapped to exit codes in one place (``torchrig.cli.main``).

Exit codes: 0 ok, 1 the job ran and found problems, 2 bad usage or input (or an engine that is not
there), 3 an internal error (a bug: rerun with ``--debug`` and report it).

Every message is one line that says what went wrong and what to do next.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3


class TorchrigError(Exception):
    """Base class: a user-facing failure with a one-line message and an exit code."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = self.message.rstrip(".")
        if self.hint:
            text += f"; {self.hint}"
        return " ".join(text.split())


class UsageError(TorchrigError):
    """Bad command-line usage or a bad value (unknown GPU, malformed version, invalid spec)."""


class InputError(UsageError):
    """A value that is well-formed but names nothing that exists (e.g. a torch release never published)."""


class SpecError(UsageError):
    """An invalid spec file: the message names the file, the key and the allowed values."""


class EngineUnavailable(TorchrigError):
    """A required engine (dockerd, sbatch, kubectl, torch) is not installed or not running."""


class JobFailed(TorchrigError):
    """The job ran and failed (a build step, a training rank): exit status 1."""

    exit_code = EXIT_PROBLEMS
