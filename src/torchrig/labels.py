"""``$TORCHRIG_LABELS``: extra labels for everything torchrig makes on the engine, one contract for all.

``TORCHRIG_LABELS=team=vision,cost.center=42`` puts ``team=vision`` and ``cost.center=42`` on the containers
and volumes ``torchrig up`` makes and on the images ``torchrig image build`` makes (accounting, clean-up:
``docker ps -a --filter label=team=vision``, ``docker images --filter label=team=vision``). The test suite
labels what it makes with its session id and checks at its end that nothing with that label is left.

Keys are lower-case DNS-like names as Docker recommends (https://docs.docker.com/engine/manage-resources/labels/);
torchrig's own keys are refused, so an extra label never overrides what torchrig records.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from torchrig.contract import ENV_LABEL_PREFIX, IMAGE_LABEL_PREFIX
from torchrig.errors import UsageError

LABELS_ENV = "TORCHRIG_LABELS"
_LABEL_KEY_RE = re.compile(r"[a-z0-9]([a-z0-9._-]{0,126}[a-z0-9])?")
# what torchrig writes itself: a container's owner (torchrig.managed/.user), an image's stack and
# provenance (org.torchrig.*, org.opencontainers.image.*); build labels would override the Dockerfile's
RESERVED_PREFIXES = (
    ENV_LABEL_PREFIX + "managed",
    ENV_LABEL_PREFIX + "user",
    IMAGE_LABEL_PREFIX,
    "org.opencontainers.image.",
)


def parse_labels(text: str) -> tuple[tuple[str, str], ...]:
    """``key=value,key=value`` (the value of ``$TORCHRIG_LABELS``) -> ((key, value), ...); UsageError if
    an entry is malformed or uses one of torchrig's own keys."""
    out = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq or not _LABEL_KEY_RE.fullmatch(key) or key.startswith(RESERVED_PREFIXES):
            raise UsageError(
                f"malformed {LABELS_ENV} entry {item!r}",
                hint="expected key=value[,key=value], keys lower-case like team.project, not torchrig's own "
                "(torchrig.managed, torchrig.user, org.torchrig.*, org.opencontainers.image.*)",
            )
        out.append((key, value))
    return tuple(out)


def labels_from_env(environ: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """The labels ``$TORCHRIG_LABELS`` asks for (none when it is unset)."""
    import os

    env = os.environ if environ is None else environ
    return parse_labels(env.get(LABELS_ENV, ""))
