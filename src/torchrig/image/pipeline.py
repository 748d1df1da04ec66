"""Spec -> plan -> build context -> image -> lock: the steps behind ``torchrig image render|build``.

>>> plan = make_plan(ImageOptions(spec=Path("torchrig.toml")))        # doctest: +SKIP
>>> print(render.render_dockerfile(plan))                            # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig.contract import IMAGE_ETC, LABEL_BASE_REFERENCE, LABEL_TORCH
from torchrig.image import context as ctx_mod
from torchrig.image import render
from torchrig.image.spec import load_spec
from torchrig.image.stack import ImagePlan, LockPins, choose_base, content_tag, load_bases, resolve_stack
from torchrig.inputfiles import read_bytes

LOCK_NAME = "torchrig.lock.json"  # the lock of the default spec, torchrig.toml


def lock_path(spec_path: Path) -> Path:
    """The lock of one spec, beside it and named after it: ``torchrig.toml`` -> ``torchrig.lock.json``,
    ``team.toml`` -> ``team.lock.json``; two specs in one folder never share (or overwrite) a lock."""
    resolved = spec_path.resolve()
    return resolved.parent / f"{resolved.stem}.lock.json"


def spec_digest(spec_path: Path) -> str:
    """sha256 of the spec file's bytes, recorded in its lock: a lock of another (or an edited) spec is
    refused rather than run."""
    return hashlib.sha256(read_bytes(spec_path, "image spec")).hexdigest()


@dataclass(frozen=True)
class ImageOptions:
    spec: Path
    wheelhouse: Path | None = None
    ca_cert: Path | None = None
    base: str | None = None
    pip_index_url: str | None = None
    torchrig_dist: Path | None = None
    tag: str | None = None
    no_cache: bool = False
    verbose: bool = False
    locked: bool = False  # build what the lock beside the spec records (pip/apt versions, base digest)
    builder: str = "auto"  # auto (BuildKit where the engine has it), buildkit, classic
    extra_labels: tuple[tuple[str, str], ...] = ()  # $TORCHRIG_LABELS (torchrig.labels): on the image too

    def __post_init__(self) -> None:
        if self.tag is not None:
            from torchrig.image.dockerref import check_tag

            check_tag("--tag", self.tag)  # a newline or another odd reference never reaches the engine


@dataclass(frozen=True)
class Layer:
    """One layer of the built image, from the engine's image history (``docker history``)."""

    created_by: str  # the instruction that made it
    size_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"created_by": self.created_by, "size_bytes": self.size_bytes}


_HISTORY_CLEAN = (
    (re.compile(r"^/bin/sh -c #\(nop\)\s+"), ""),  # the classic builder's metadata instructions
    (re.compile(r"^(?:RUN )?\|\d+ (?:\S+=\S*\s+)*/bin/sh -c "), "RUN "),  # a RUN with build args
    (re.compile(r"^/bin/sh -c "), "RUN "),
    (re.compile(r"\s*# buildkit$"), ""),
)


def layers_of(history: list[dict[str, Any]]) -> tuple[Layer, ...]:
    """The layers that hold files, oldest first, each named by the instruction that made it (as
    ``docker history`` shows it, less the shell and build-argument prefixes); the base's is "(base)"."""
    out = []
    for entry in reversed(history):
        size = int(entry.get("Size") or 0)
        if size <= 0:
            continue
        text = " ".join(str(entry.get("CreatedBy") or "").split())
        for pattern, repl in _HISTORY_CLEAN:
            text = pattern.sub(repl, text)
        out.append(Layer(created_by=text or "(base)", size_bytes=size))
    return tuple(out)


@dataclass(frozen=True)
class BuildResult:
    tags: tuple[str, ...]
    image_id: str
    size_bytes: int
    base: str
    base_reference: str | None
    elapsed_s: float
    lock_path: str
    stack: dict[str, str]
    builder: str = "classic"  # the builder that ran: buildkit or classic
    steps: tuple[Any, ...] = ()  # torchrig.image.build.BuildStep, in the order they ran
    layers: tuple[Layer, ...] = ()  # the image's layers that hold files, base first

    @property
    def size_mib(self) -> float:
        return self.size_bytes / 2**20


def make_plan(opts: ImageOptions, kb: Any = None) -> ImagePlan:
    """Load the spec, resolve the stack with the knowledge base, choose the base."""
    from torchrig.errors import UsageError

    spec = load_spec(opts.spec)
    ctx_mod.check_inputs(opts.wheelhouse, opts.ca_cert)
    if opts.base is not None:
        from torchrig.image.spec import SCHEMA

        try:
            SCHEMA["image"]["base"][1](opts.base)
        except ValueError:
            raise UsageError(
                f"--base {opts.base!r}: not an image reference",
                hint="e.g. --base debian:bookworm-slim or repo@sha256:...",
            ) from None
        if opts.base.endswith(":latest"):
            raise UsageError(f"--base {opts.base}: ':latest' moves", hint="pin a version tag or a digest")
    if opts.pip_index_url is not None:
        from torchrig.image.spec import index_url

        try:
            index_url(opts.pip_index_url)
        except ValueError:
            raise UsageError(
                f"--pip-index-url {opts.pip_index_url!r}: not an http(s)://host/... or file:///... URL",
                hint="e.g. --pip-index-url https://pypi.example.com/simple",
            ) from None
    if kb is None:
        from torchrig.compat.kb import load_kb
        from torchrig.errors import InputError

        try:
            kb = load_kb()
        except InputError:  # a data file missing or damaged: then only a wheelhouse's torch wheel can
            if opts.wheelhouse is None:  # say what to build
                raise
            kb = None
    stack = resolve_stack(spec, kb, opts.wheelhouse)
    pins = read_lock_pins(Path(spec.path), stack) if opts.locked else None
    rows, components = load_bases()
    base = choose_base(spec, stack, rows, opts.base)
    return ImagePlan(
        spec=spec,
        stack=stack,
        base=base,
        jupyterlab=components["jupyterlab"],
        wheelhouse=opts.wheelhouse is not None,
        ca_cert=opts.ca_cert is not None,
        pip_index_url=_index_url(opts.pip_index_url) or spec.pip_index_url,
        torchrig_requires=torchrig_requires(),
        locked=pins,
    )


def _index_url(value: str | None) -> str | None:
    from torchrig.image.spec import index_url

    return index_url(value) if value is not None else None


def torchrig_requires() -> tuple[str, ...]:
    """torchrig's run-time requirements (no extras): what ``serve`` needs beside the standard library."""
    from importlib import metadata

    try:
        reqs = metadata.requires("torchrig") or []
    except metadata.PackageNotFoundError:
        return ()
    return tuple(r for r in reqs if "extra ==" not in r)


def read_lock_pins(spec_path: Path, stack: Any) -> LockPins:
    """The pins of the lock beside the spec; its torch must be the build the spec resolves to now."""
    from torchrig.errors import UsageError
    from torchrig.inputfiles import InputError, field, read_json

    path = lock_path(spec_path)
    if not path.exists():
        raise UsageError(f"--locked: no {path.name} beside {spec_path}", hint="build once without --locked")

    def strings(value: Any) -> bool:
        return all(isinstance(x, str) for x in value)

    try:
        lock = read_json(path, "--locked: lock file")  # bounded size and depth, UTF-8, no NaN
        field(lock, "stack", dict, str(path))
        for key in ("pip_freeze", "apt_packages"):
            field(lock, key, list, str(path), default=[], check=strings, expected="a list of strings")
        field(lock, "base_reference", str, str(path), default="")
    except InputError as err:
        raise UsageError(err.message, hint="build again without --locked") from None
    locked_torch = lock.get("stack", {}).get(LABEL_TORCH)
    if locked_torch != stack.label:
        raise UsageError(
            f"--locked: {path} records torch {locked_torch!r} but the spec resolves to {stack.label}",
            hint="build without --locked to update the lock",
        )
    return lock_pins(lock, path)


def _lock_list(lock: dict[str, Any], key: str, where: Path) -> list[str]:
    from torchrig.errors import UsageError

    items = lock.get(key, [])
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise UsageError(
            f"--locked: {where}: {key} is not a list of strings", hint="build again without --locked"
        )
    return items


def lock_pins(lock: Any, where: Path) -> LockPins:
    """The lock's pins, each validated like the spec's own fields (a lock file is input like any other):
    pip lines ``name==version`` by ``packaging``, apt entries by Debian's grammar, the base a digest."""
    from packaging.requirements import InvalidRequirement, Requirement

    from torchrig.errors import UsageError
    from torchrig.image.spec import SCHEMA, apt_package

    def bad(key: str, value: str, allowed: str) -> UsageError:
        return UsageError(
            f"--locked: {where}: {key} entry {value[:80]!r}: allowed: {allowed}",
            hint="build again without --locked to write a fresh lock",
        )

    if not isinstance(lock, dict):
        raise UsageError(f"--locked: {where}: not a JSON object", hint="build again without --locked")
    pip = []
    for line in _lock_list(lock, "pip_freeze", where):
        try:
            req = Requirement(line) if line.isprintable() else None
        except InvalidRequirement:
            req = None
        if req is not None and req.name == "torchrig":  # installed from the build's own wheel, never pinned
            continue
        spec = list(req.specifier) if req else []
        if req is None or req.url or req.marker or req.extras or len(spec) != 1 or spec[0].operator != "==":
            raise bad("pip_freeze", line, "name==version")
        pip.append(f"{req.name}=={spec[0].version}")
    apt = []
    for entry in _lock_list(lock, "apt_packages", where):
        try:
            name, _, version = apt_package(entry).partition("=")
        except ValueError:
            raise bad("apt_packages", entry, "name=version by Debian's grammar") from None
        if not version:
            raise bad("apt_packages", entry, "name=version by Debian's grammar")
        apt.append((name, version))
    ref = lock.get("base_reference") or ""
    base = None
    if isinstance(ref, str) and "@sha256:" in ref:
        try:
            base = SCHEMA["image"]["base"][1](ref)
        except ValueError:
            raise bad("base_reference", ref, "repo@sha256:<64 hex digits>") from None
    return LockPins(pip=tuple(pip), apt=tuple(apt), base=base)


def lock_document(
    plan: ImagePlan,
    result_tags: tuple[str, ...],
    image_id: str,
    size_bytes: int,
    base_ref: str | None,
    files: dict[str, str],
) -> dict[str, Any]:
    """What went into the image: the stack, the base and its digest, pip freeze, apt versions."""

    def lines(name: str) -> list[str]:
        return sorted(line for line in files.get(name, "").splitlines() if line.strip())

    return {
        "schema_version": 1,
        "tags": list(result_tags),
        "image_id": image_id,
        "size_bytes": size_bytes,
        "base": plan.base.image,
        "base_reference": base_ref,
        "stack": render.labels(plan),
        "constraints": lines("constraints.txt"),
        "pip_freeze": lines("pip-freeze.txt"),
        "apt_packages": lines("apt-packages.txt"),
    }


def build_labels(opts: ImageOptions, base_ref: str | None) -> dict[str, str]:
    """The labels the build call adds to the Dockerfile's: the base's digest (known only at build time)
    and the extra labels ``$TORCHRIG_LABELS`` asked for (never one of torchrig's own keys)."""
    return {**dict(opts.extra_labels), LABEL_BASE_REFERENCE: base_ref or "unknown"}


def tag_digest(context_digest: str, extra_labels: tuple[tuple[str, str], ...]) -> str:
    """The digest behind the content tag: the context's, and the extra labels where there are any (they
    change the image's config, so the same tag never names two images); without them, the context's."""
    if not extra_labels:
        return context_digest
    h = hashlib.sha256(context_digest.encode())
    h.update(json.dumps(sorted(extra_labels)).encode())
    return h.hexdigest()


def build(plan: ImagePlan, opts: ImageOptions, progress: Any = None) -> BuildResult:
    """Build the image through the Docker Engine API, tag it, write the lock beside the spec."""
    from torchrig.image import build as engine
    from torchrig.image.buildkit import choose_builder, engine_build_info

    client = engine.connect()
    builder = choose_builder(opts.builder, engine_build_info(client), os.environ.get("DOCKER_BUILDKIT")).value
    steps: list[engine.BuildStep] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torchrig-build-") as tmp:
        wheel = (
            ctx_mod.find_wheel(opts.torchrig_dist)
            if opts.torchrig_dist
            else ctx_mod.build_torchrig_wheel(Path(tmp))
        )
        ctx = ctx_mod.plan_context(plan, wheel, opts.wheelhouse, opts.ca_cert)
        content = content_tag(plan, tag_digest(ctx.digest(), opts.extra_labels))
        tags = tuple(dict.fromkeys(t for t in (opts.tag, plan.stack_tag, content) if t))
        base_ref = engine.base_reference(client, plan.base.image)
        progress = progress or engine.TextProgress(verbose=opts.verbose)
        if hasattr(progress, "note"):
            progress.note(
                f"building {tags[0]} with {'BuildKit' if builder == 'buildkit' else 'the classic builder'}"
            )
        with tempfile.TemporaryFile(dir=tmp) as tar:
            ctx_mod.write_context_tar(ctx, tar)
            try:
                image_id = engine.run_build(
                    client,
                    tar,
                    tags[0],
                    no_cache=opts.no_cache,
                    progress=progress,
                    builder=builder,
                    steps=steps,
                    buildargs={"TORCHRIG_BASE_DIGEST": base_ref or "unknown"},
                    labels=build_labels(opts, base_ref),
                )
            except engine.BuildFailed as err:
                if hasattr(progress, "failure"):
                    progress.failure(err.failure)
                raise
    image = client.images.get(image_id)
    for tag in tags[1:]:
        repo, _, name = tag.rpartition(":")
        image.tag(repo, name)
    files = engine.read_files(client, image_id, IMAGE_ETC)
    size = int(image.attrs.get("Size") or 0)
    lock = lock_document(plan, tags, image_id, size, base_ref, files)
    spec_file = Path(plan.spec.path)
    with contextlib.suppress(OSError):
        lock["spec"] = {"file": spec_file.name, "sha256": spec_digest(spec_file)}
    written = lock_path(spec_file)
    written.write_text(json.dumps(lock, indent=2) + "\n", encoding="utf-8")
    return BuildResult(
        tags=tags,
        image_id=image_id,
        size_bytes=size,
        base=plan.base.image,
        base_reference=base_ref,
        elapsed_s=round(time.monotonic() - started, 1),
        lock_path=str(written),
        stack=render.labels(plan),
        builder=builder,
        steps=tuple(steps),
        layers=layers_of(image.history()),
    )
