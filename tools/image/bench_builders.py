"""Time ``torchrig image build`` with BuildKit and with the classic builder on this machine's engine.

Scenarios, each run with both builders on the same spec (a CPU torch image with JupyterLab and SSH from a
local wheelhouse, like the integration tests' image, under its own repository name):

  no-cache   ``--no-cache``: every step runs (the base image is local)
  unchanged  the same inputs again: every layer reused
  late       ``[image] workdir`` changed: only the final stage's late layers run again

    python tools/image/bench_builders.py --wheelhouse .ci-work/wheelhouse --base torchrig-test/debian:bookworm

torchrig's own wheel is built once at the start (``--torchrig-dist``), so edits to the checkout while it runs
do not change the context. Prints one JSON object (machine, engine, date, per-run seconds) and removes the images it tagged.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

# the classic builder's " ---> 0123456789ab" (an intermediate image), to remove them afterwards
_LAYER_RE = re.compile(r"^\s*---> ([0-9a-f]{12})\s*$")
SPEC = """\
schema_version = 1
[torch]
version = "2.13.0"
variant = "cpu"
[python]
version = "3.11"
[services]
jupyter = true
ssh = true
[image]
name = "torchrig-bench/{builder}"
workdir = "{workdir}"
"""


def build(spec_dir: Path, builder: str, workdir: str, args: argparse.Namespace, *extra: str) -> dict:
    spec = spec_dir / "torchrig.toml"
    spec.write_text(SPEC.format(builder=builder, workdir=workdir))
    cmd = [sys.executable, "-m", "torchrig", "image", "build", str(spec), "--json", "--builder", builder]
    cmd += ["--wheelhouse", str(args.wheelhouse), "--base", args.base, "-v", *extra]
    cmd += ["--torchrig-dist", str(args.torchrig_dist)]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall_s = round(time.monotonic() - started, 1)
    if proc.returncode != 0:
        raise SystemExit(f"{builder} build failed:\n{proc.stderr[-3000:]}")
    doc = json.loads(proc.stdout)
    states = [s["state"] for s in doc["steps"]]
    return {
        "wall_s": wall_s,
        "build_s": doc["elapsed_s"],
        "steps": len(states),
        "cached": states.count("cached"),
        "tags": doc["tags"],
        "layers": [m.group(1) for line in proc.stderr.splitlines() if (m := _LAYER_RE.match(line))],
    }


def engine_version() -> str:
    import docker

    v = docker.from_env().version()
    return f"dockerd {v.get('Version')} (API {v.get('ApiVersion')})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--wheelhouse", type=Path, required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    from torchrig.image.context import build_torchrig_wheel

    dist = tempfile.TemporaryDirectory(prefix="bench-dist-")
    args.torchrig_dist = build_torchrig_wheel(Path(dist.name)).parent
    runs: dict[str, dict[str, list[dict]]] = {}
    tags: set[str] = set()
    layers: list[str] = []
    try:
        for builder in ("buildkit", "classic"):
            with tempfile.TemporaryDirectory(prefix=f"bench-{builder}-") as tmp:
                spec_dir, out = Path(tmp), runs.setdefault(builder, {})
                for _ in range(args.repeat):
                    wd = f"/ws-{uuid.uuid4().hex[:8]}"
                    nocache = build(spec_dir, builder, wd, args, "--no-cache")
                    unchanged = build(spec_dir, builder, wd, args)
                    late = build(spec_dir, builder, f"/ws-{uuid.uuid4().hex[:8]}", args)
                    for name, r in (("no-cache", nocache), ("unchanged", unchanged), ("late", late)):
                        tags.update(r.pop("tags"))
                        layers += r.pop("layers")
                        out.setdefault(name, []).append(r)
    finally:
        if tags:
            subprocess.run(["docker", "rmi", "-f", *sorted(tags)], capture_output=True, check=False)
        for layer in reversed(dict.fromkeys(layers)):  # untagged intermediates; tagged ones fail to go
            tagged = subprocess.run(
                ["docker", "image", "inspect", "-f", "{{len .RepoTags}}", layer],
                capture_output=True,
                text=True,
            )
            if tagged.stdout.strip() == "0":
                subprocess.run(["docker", "rmi", layer], capture_output=True, check=False)
        dist.cleanup()
    print(
        json.dumps(
            {
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.platform()}",
                "engine": engine_version(),
                "runs": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
