"""What ``docker tag`` accepts as a reference, checked where ``image build --tag`` enters (no I/O)."""

from __future__ import annotations

import re

from torchrig.errors import UsageError

# A Docker image reference as `docker tag` takes it: [registry[:port]/]path[:tag], the grammar of
# distribution/reference (regexp.go: path components of [a-z0-9] joined by '.', '_', '__' or '-'s; a domain
# of DNS components and an optional port; a tag of [A-Za-z0-9_] then up to 127 of [A-Za-z0-9_.-]), with the
# name at most 255 characters. ASCII only; fullmatch, so a trailing newline is refused too.
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOCKER_REF = re.compile(
    rf"(?P<name>(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?/)?"
    rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?",
    re.ASCII,
)


def check_tag(flag: str, value: str) -> str:
    """``value`` if it is a reference ``docker tag`` accepts, else a one-line :class:`UsageError`."""
    m = _DOCKER_REF.fullmatch(value)
    if m is None or len(m.group("name")) > 255:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise UsageError(
            f"{flag} {shown} is not a Docker image reference",
            hint="use [registry[:port]/]name[:tag] in lowercase, e.g. team/trainer:v2 or registry.example:5000/ml/img",
        )
    return value
