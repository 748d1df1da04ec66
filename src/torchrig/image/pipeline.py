"""Spec -> plan -> build context -> image -> lock: the steps behind ``torchrig image render|build``.

>>> plan = make_plan(ImageOptions(spec=Path("torchrig.toml")))        # doctest: +SKIP
>>> print(render.render_dockerfile(plan))                            # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig.image import context as ctx_mod
from torchrig.image import render
from torchrig.image.spec import load_spec
from torchrig.image.stack import ImagePlan, LockPins, choose_base, content_tag, load_bases, resolve_stack

LOCK_NAME = "torchrig.lock.json"


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
    if kb is None:
        from torchrig.compat.kb import load_kb

        try:
            kb = load_kb()
        except (
            FileNotFoundError
        ):  # a data file missing: only a wheelhouse's torch wheel can say what to build
            if opts.wheelhouse is None:
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
        pip_index_url=opts.pip_index_url or spec.pip_index_url,
        torchrig_requires=torchrig_requires(),
        locked=pins,
    )


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

    path = spec_path.resolve().parent / LOCK_NAME
    if not path.exists():
        raise UsageError(f"--locked: no {LOCK_NAME} beside {spec_path}", hint="build once without --locked")

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
    locked_torch = lock.get("stack", {}).get("org.torchrig.torch")
    if locked_torch != stack.label:
        raise UsageError(
            f"--locked: {path} records torch {locked_torch} but the spec resolves to {stack.label}",
            hint="build without --locked to update the lock",
        )
    pip = tuple(
        line for line in lock.get("pip_freeze", []) if "==" in line and not line.startswith("torchrig==")
    )
    apt = tuple((p.split("=", 1)[0], p.split("=", 1)[1]) for p in lock.get("apt_packages", []) if "=" in p)
    ref = lock.get("base_reference") or ""
    return LockPins(pip=pip, apt=apt, base=ref if "@sha256:" in ref else None)


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
        tags = tuple(
            dict.fromkeys(t for t in (opts.tag, plan.stack_tag, content_tag(plan, ctx.digest())) if t)
        )
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
                    labels={"org.torchrig.base.reference": base_ref or "unknown"},
                )
            except engine.BuildFailed as err:
                if hasattr(progress, "failure"):
                    progress.failure(err.failure)
                raise
    image = client.images.get(image_id)
    for tag in tags[1:]:
        repo, _, name = tag.rpartition(":")
        image.tag(repo, name)
    files = engine.read_files(client, image_id, render.ETC)
    size = int(image.attrs.get("Size") or 0)
    lock = lock_document(plan, tags, image_id, size, base_ref, files)
    lock_path = Path(plan.spec.path).resolve().parent / LOCK_NAME
    lock_path.write_text(json.dumps(lock, indent=2) + "\n", encoding="utf-8")
    return BuildResult(
        tags=tags,
        image_id=image_id,
        size_bytes=size,
        base=plan.base.image,
        base_reference=base_ref,
        elapsed_s=round(time.monotonic() - started, 1),
        lock_path=str(lock_path),
        stack=render.labels(plan),
        builder=builder,
        steps=tuple(steps),
    )
