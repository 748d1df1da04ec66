"""The first real error in a build step's log (pip, apt, a build backend), not the tool's last line.

pip ends most failures with a line that hides the cause: an untrusted proxy certificate shows up as five
``certificate verify failed`` retries and then ``No matching distribution found``; a build backend's failure
ends in ``hint: See above for details``. :func:`first_error` reads the whole log and returns the line that
names the cause, with a hint where the cause has a known fix.

>>> first_error(["WARNING: Retrying (Retry(total=4)) after connection broken by 'SSLError(SSLCertVerificationError(1, "
...              "'[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate "
...              "chain (_ssl.c:1006)'))': /simple/tomli-w/",
...              "ERROR: No matching distribution found for tomli-w==1.2.0"]).text
'certificate verify failed: self-signed certificate in certificate chain'
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# A cause pip reports only in warnings before its final error: (pattern, the text to keep, hint).
_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"certificate verify failed:?\s*([^'\"()]*)", re.I),
        "pass --ca-cert with the CA of the proxy or mirror that intercepts TLS",
    ),
    (
        re.compile(
            r"(Temporary failure in name resolution|Name or service not known|Could not resolve host)"
        ),
        "the build has no DNS: use --wheelhouse DIR, or --pip-index-url with a mirror the build can reach",
    ),
    (
        re.compile(r"(Connection refused|Network is unreachable|No route to host)"),
        "the build cannot reach the index: use --wheelhouse DIR, or --pip-index-url with a reachable mirror",
    ),
    (
        re.compile(r"(ProxyError[^'\"]*|407 Proxy Authentication Required)"),
        "check the proxy's address and credentials",
    ),
    (re.compile(r"(HTTP error \d{3}[^,]*)"), "check --pip-index-url"),
)
# Errors that only say "something above failed".
_WRAPPERS = re.compile(
    r"subprocess-exited-with-error|metadata-generation-failed|legacy-install-failure|"
    r"failed-wheel-build|Failed to build|Could not build wheels|See above for|"
    r"This error originates from a subprocess|process completed with exit code|returned a non-zero code",
    re.I,
)
_ERROR_LINE = re.compile(r"^(ERROR:|error:|E: |Error: |[A-Za-z]*Error: )")


@dataclass(frozen=True)
class StepError:
    text: str  # the cause, one line
    hint: str | None = None


def _clip(text: str, width: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def first_error(lines: Iterable[str]) -> StepError | None:
    """The first known cause in ``lines``, else the first error line that is not a wrapper, else None."""
    first_plain: str | None = None
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("+ "):  # `set -x` echoing the command, not its output
            continue
        for pattern, hint in _CAUSES:
            m = pattern.search(line)
            if m:
                return StepError(_clip(m.group(0).strip(" :'\"")), hint)
        body = line.lstrip("│║ ")  # pip frames a subprocess's output
        if first_plain is None and _ERROR_LINE.match(body) and not _WRAPPERS.search(body):
            first_plain = _clip(body)
    return StepError(first_plain) if first_plain else None


class ErrorScan:
    """Feeds a step's log line by line and keeps what :func:`first_error` needs (the logs can be long)."""

    def __init__(self) -> None:
        self.cause: StepError | None = None
        self.plain: StepError | None = None

    def feed(self, line: str) -> None:
        if self.cause is not None:
            return
        found = first_error([line])
        if found is None:
            return
        if found.hint is not None:
            self.cause = found
        elif self.plain is None:
            self.plain = found

    @property
    def result(self) -> StepError | None:
        return self.cause or self.plain
