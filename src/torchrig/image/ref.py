"""Which image a spec names, for ``up --spec`` and ``cluster --spec``: one answer for both.

``torchrig image build`` records the tags it gave the image in the spec's lock beside it (``team.toml`` ->
``team.lock.json``, with the spec's sha256: a spec edited since is refused, not run on the old image), first
the one the user asked for (``--tag``), then the stack tag (``2.8.0-cu128-py3.11-runtime``), then the content
tag. The first recorded tag is the spec's image. Before any build, a renderer that only writes a job file
(``cluster``) may name the stack tag the build will give it, resolved offline with the knowledge base; ``up``
runs the image, so it needs a build.
"""

from __future__ import annotations

from pathlib import Path

from torchrig.errors import InputError, SpecError


def image_of_spec(spec: Path, *, must_be_built: bool) -> str:
    """The first tag the spec's last build recorded; unbuilt, the stack tag (or an error if ``must_be_built``)."""
    from torchrig.image.pipeline import ImageOptions, lock_path, make_plan, spec_digest
    from torchrig.image.spec import load_spec
    from torchrig.inputfiles import field, read_json

    load_spec(spec)  # a broken or missing spec is its own one-line error
    lock = lock_path(spec)
    if not lock.exists():
        if must_be_built:
            raise InputError(
                f"{spec} has not been built yet (no {lock.name} beside it)",
                hint=f"build it: torchrig image build {spec}",
            )
        return str(make_plan(ImageOptions(spec=spec)).stack_tag)
    try:
        doc = read_json(lock, "lock file")
        tags = field(doc, "tags", list, str(lock), default=[])
        recorded = field(doc, "spec", dict, str(lock), default={})
    except InputError as err:
        raise SpecError(err.message, hint=f"rebuild: torchrig image build {spec}") from None
    digest = recorded.get("sha256")
    if digest is not None and digest != spec_digest(spec):
        raise SpecError(
            f"{spec} changed since {lock.name} was written (its image is of the spec as it was then)",
            hint=f"rebuild: torchrig image build {spec}",
        )
    if not tags or not isinstance(tags[0], str):
        raise SpecError(f"{lock} records no image tag", hint=f"rebuild: torchrig image build {spec}")
    return str(tags[0])
