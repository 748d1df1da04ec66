"""Render the Dockerfile for an image spec, or build the image through the Docker Engine API.

`render` prints the Dockerfile (a pure function of the resolved spec: same spec, same bytes).
`build` builds it through the Docker Engine API (progress on stderr), tags it after the resolved
stack (torchrig/pytorch:2.8.0-cu128-py3.11-runtime, plus a tag with the digest of the context and of
$TORCHRIG_LABELS), reads the lock of what went in (pip freeze, apt versions, base digest) from the image and
writes it beside the spec as its lock (team.toml -> team.lock.json), and reports the image's size, its layers (torch with its
CUDA wheels, the tools and the spec's pip packages each in a layer of their own) and its steps (cached, done,
error; --json has them all).
A failing step is shown with the tail of its log, and the error line names it with its first error, e.g. an
untrusted proxy certificate rather than pip's "No matching distribution found" (exit 1).

Builders (--builder):
  auto       the default: BuildKit where the engine has it (Engine API >= 1.39 on Linux, or a /_ping that
             says Builder-Version: 2), else the classic builder; the report says which one ran
  buildkit   BuildKit (POST /build?version=2): skips stages the image does not need; an error on
             engines without it
  classic    the engine's classic builder (what `DOCKER_BUILDKIT=0 docker build` uses)
  Either builds an equivalent image (same config, labels and lock); their layer caches are separate.

The image: pinned base, Python venv in /opt/venv owned by the user (pip install works inside), torch and
everything it brought pinned by /etc/torchrig/constraints.txt (PIP_CONSTRAINT), numpy, non-root user, no
setuid files, tini as PID 1 (run it without docker's --init), `torchrig serve` (JupyterLab with a token,
SSH with keys only), a quiet HEALTHCHECK, labels recording torch, CUDA, arch list, minimum driver, cuDNN
and NCCL. Every value from the spec, the options and the lock is validated before it reaches the Dockerfile.

Air-gapped and proxied builds:
  --wheelhouse DIR     install every wheel from DIR with --no-index (no network needed for pip)
  --ca-cert FILE       trust a TLS-intercepting proxy's CA (PEM) for pip and apt during the build only
  --base IMAGE         another base (pinned tag or digest; it must have pythonX.Y or apt packages for it)
  --pip-index-url URL  a PyPI mirror for everything but a torch from the PyTorch index; with
                       --wheelhouse: the wheelhouse first, the index for what it lacks (torch: wheelhouse only)

TORCHRIG_LABELS=KEY=VALUE,... adds labels to the image build makes (accounting, test clean-up), as up does
to its containers; torchrig's own keys (org.torchrig.*, org.opencontainers.image.*) are refused.

examples:
  torchrig init && torchrig image render                 # the Dockerfile for ./torchrig.toml
  torchrig image render path/to/torchrig.toml --json     # Dockerfile, tag, resolved stack
  torchrig image build                                   # build, tag, lock, size
  torchrig image build --locked                          # again with the lock's pip/apt versions and base digest
  torchrig image build --builder classic -v              # the classic builder, every log line on stderr
  torchrig image build --json | jq '.builder, [.steps[] | select(.state != "cached") | .name]'
  torchrig image build --wheelhouse ./wheels --base debian:bookworm-slim
  torchrig image build --ca-cert /etc/ssl/certs/corp-proxy.pem
  docker run --gpus all -p 8888:8888 -p 2222:22 -v data:/workspace/data \\
      -v ~/.ssh/id_ed25519.pub:/run/secrets/authorized_keys:ro torchrig/pytorch:2.8.0-cu128-py3.11-runtime
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig import contract as K
from torchrig.report import SimpleReport


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action", choices=["render", "build"], help="render: print the Dockerfile; build: build the image"
    )
    parser.add_argument(
        "spec", nargs="?", default="torchrig.toml", help="the spec file (default: ./torchrig.toml)"
    )
    parser.add_argument(
        "--wheelhouse", metavar="DIR", type=Path, help="install from the wheels in DIR, with no index"
    )
    parser.add_argument("--ca-cert", metavar="FILE", type=Path, help="trust this CA (PEM) during the build")
    parser.add_argument(
        "--base", metavar="IMAGE", help="base image (pinned tag or digest), instead of the default"
    )
    parser.add_argument("--pip-index-url", metavar="URL", help="PyPI mirror for the image's pip installs")
    parser.add_argument(
        "--torchrig-dist",
        metavar="DIR",
        type=Path,
        help="a directory with a torchrig wheel to install (default: built from this checkout)",
    )
    parser.add_argument("--tag", help="an extra tag for the built image")
    parser.add_argument("--no-cache", action="store_true", help="build without the engine's layer cache")
    parser.add_argument(
        "--locked",
        action="store_true",
        help="build what the spec's lock (team.toml -> team.lock.json) records: its pip and apt versions, its base digest",
    )
    parser.add_argument(
        "--builder",
        choices=["auto", "buildkit", "classic"],
        default="auto",
        help="the engine's builder (default auto: BuildKit where the engine has it, else classic)",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="show every build log line on stderr")


def _options(args: argparse.Namespace) -> Any:
    from torchrig.image.pipeline import ImageOptions
    from torchrig.labels import labels_from_env

    return ImageOptions(
        spec=Path(args.spec),
        wheelhouse=args.wheelhouse,
        ca_cert=args.ca_cert,
        base=args.base,
        pip_index_url=args.pip_index_url,
        torchrig_dist=args.torchrig_dist,
        tag=args.tag,
        no_cache=args.no_cache,
        verbose=args.verbose,
        locked=args.locked,
        builder=args.builder,
        extra_labels=labels_from_env() if args.action == "build" else (),
    )


@dataclass(frozen=True)
class BuildReport:
    result: Any

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {
            "tags": list(r.tags),
            "image_id": r.image_id,
            "size_bytes": r.size_bytes,
            "size_mib": round(r.size_mib, 1),
            "base": r.base,
            "base_reference": r.base_reference,
            "elapsed_s": r.elapsed_s,
            "lock": r.lock_path,
            "stack": r.stack,
            "builder": r.builder,
            "steps": [s.to_json() for s in r.steps],
            "layers": [layer.to_json() for layer in r.layers],
        }

    def render_text(self) -> str:
        r = self.result
        cached = sum(1 for s in r.steps if s.state.value == "cached")
        lines = [
            f"built {r.tags[0]}  ({r.size_mib:,.0f} MiB, {r.elapsed_s:.0f} s, {r.builder}, "
            f"{len(r.steps)} steps, {cached} cached)"
        ]
        lines += [f"  tag   {t}" for t in r.tags[1:]]
        lines += [
            f"  id    {r.image_id}",
            f"  base  {r.base}" + (f" ({r.base_reference})" if r.base_reference else ""),
            f"  torch {r.stack[K.LABEL_TORCH]}  cuda {r.stack[K.LABEL_CUDA]}  "
            f"cudnn {r.stack[K.LABEL_CUDNN]}  nccl {r.stack[K.LABEL_NCCL]}  "
            f"min driver {r.stack[K.LABEL_MIN_DRIVER]}",
            f"  lock  {r.lock_path}",
            "  layers (base first; a new pip package re-ships only the last venv layer):",
        ]
        lines += [
            f"    {layer.size_bytes / 2**20:9,.1f} MiB  {_short(layer.created_by)}" for layer in r.layers
        ]
        return "\n".join(lines)

    @property
    def exit_code(self) -> int:
        return 0


def _short(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def run(args: argparse.Namespace) -> Any:
    from torchrig.image import pipeline, render

    opts = _options(args)
    plan = pipeline.make_plan(opts)
    if args.action == "render":
        text = render.render_dockerfile(plan)
        data = {
            "spec": str(opts.spec),
            "tag": plan.stack_tag,
            "base": plan.base.image,
            "stack": render.labels(plan),
            "dockerfile": text,
        }
        return SimpleReport(data=data, text=text.rstrip("\n"))
    return BuildReport(pipeline.build(plan, opts))
