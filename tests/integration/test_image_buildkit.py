"""BuildKit builds on the real engine, next to the classic builder: small Dockerfiles through the adapter
(same image config and files from both builders, unused stages skipped, cache hits, a failing RUN with its
log), then ``torchrig image build --builder`` end to end: a failing step, and the rendered test image built
with the classic builder compared with the session's (auto: BuildKit) one."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from torchrig.image.build import BuildFailed, BuildStep, StepState, run_build
from torchrig.image.buildkit import Builder, choose_builder, engine_build_info
from torchrig.image.context import ContextPlan, write_context_tar

ROOT = Path(__file__).resolve().parents[2]
BASE = "torchrig-test/debian:bookworm"

SMALL = f"""\
FROM {BASE} AS base
RUN echo hello-from-base > /hello.txt
FROM base AS unused
RUN echo never > /never.txt
FROM base
ARG STAMP=unset
COPY note.txt /note.txt
RUN groupadd -g 1234 app && useradd -u 1234 -g 1234 -M app && \\
    echo "stamp=$STAMP" > /stamp.txt && chown 1234:1234 /stamp.txt
ENV APP_MODE=test
WORKDIR /work
LABEL org.example.kind=small
USER 1234:1234
CMD ["cat", "/hello.txt", "/note.txt", "/stamp.txt"]
"""

FAILING = f"""\
FROM {BASE}
RUN echo first-step-ok
RUN echo line-one; echo line-two >&2; echo line-three; exit 3
"""


class Quiet:
    """Progress that keeps only the log lines (the classic builder's name its intermediate images)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def step(self, number: int, total: int, text: str) -> None: ...
    def log(self, line: str) -> None:
        self.lines.append(line)

    def close(self) -> None: ...


@pytest.fixture
def built(engine, test_labels, remove_classic_intermediates):
    """Builds a context with a builder, labelled with the session's labels; removes every image it made
    afterwards."""
    made: list[str] = []
    logs: list[list[str]] = []

    def build(
        texts: dict[str, str], builder: str, *, labels: dict[str, str] | None = None
    ) -> tuple[str, list[BuildStep]]:
        tag = f"torchrig-test/buildkit-{uuid.uuid4().hex[:10]}:1"
        made.append(tag)
        steps: list[BuildStep] = []
        tar = io.BytesIO()
        write_context_tar(ContextPlan(texts=texts), tar)
        progress = Quiet()
        logs.append(progress.lines)
        image_id = run_build(
            engine,
            tar,
            tag,
            buildargs={"STAMP": "42"},
            labels={**test_labels, **(labels or {"org.example.by": "torchrig-test"})},
            no_cache=False,
            progress=progress,
            builder=builder,
            steps=steps,
        )
        made.append(image_id)
        return image_id, steps

    build.engine = engine  # type: ignore[attr-defined]
    yield build
    from docker.errors import ImageNotFound

    for ref in reversed(made):
        with contextlib.suppress(ImageNotFound):  # a tag whose image was already removed by its ID
            engine.images.remove(ref, force=True)
    for lines in logs:
        remove_classic_intermediates(engine, lines)


def _layers(engine, image_id: str) -> list[str]:
    return engine.images.get(image_id).attrs["RootFS"]["Layers"]


def _config(engine, image_id: str) -> dict:
    cfg = engine.images.get(image_id).attrs["Config"]
    return {k: cfg.get(k) for k in ("User", "Env", "Cmd", "Entrypoint", "WorkingDir", "Labels")}


def test_this_engine_gets_buildkit_by_default(engine):
    assert choose_builder("auto", engine_build_info(engine)) is Builder.BUILDKIT


def test_both_builders_make_the_same_image_and_buildkit_skips_the_unused_stage(engine, built, test_labels):
    texts = {"Dockerfile": SMALL, "note.txt": "note\n"}
    bk_id, bk_steps = built(texts, "buildkit")
    classic_id, classic_steps = built(texts, "classic")
    assert _config(engine, bk_id) == _config(engine, classic_id)
    cfg = _config(engine, bk_id)
    assert cfg["User"] == "1234:1234" and cfg["WorkingDir"] == "/work" and "APP_MODE=test" in cfg["Env"]
    assert cfg["Labels"] == {"org.example.kind": "small", "org.example.by": "torchrig-test", **test_labels}
    for image_id in (bk_id, classic_id):
        out = engine.containers.run(image_id, remove=True).decode().split()
        assert out == ["hello-from-base", "note", "stamp=42"]
    assert not any("never" in s.name for s in bk_steps)  # BuildKit builds only what the target needs
    assert any("never" in s.name for s in classic_steps)  # the classic builder runs every stage
    assert all(s.state in (StepState.DONE, StepState.CACHED) for s in bk_steps + classic_steps)


def test_buildkit_rebuild_reuses_every_layer(built):
    texts = {"Dockerfile": SMALL, "note.txt": f"note {uuid.uuid4().hex}\n"}
    first, _ = built(texts, "buildkit")
    again, steps = built(texts, "buildkit")
    # the same layers (the image ID may differ: a vertex that a concurrent build shares brings that build's
    # history entry into the config)
    assert _layers(built.engine, again) == _layers(built.engine, first)
    # RUN, COPY, RUN, WORKDIR (BuildKit's vertexes; ENV, LABEL, USER, CMD only set the config)
    assert [s.state for s in steps if "FROM" not in s.name] == [StepState.CACHED] * 4


def test_buildkit_failing_run_reports_the_step_and_its_output(built):
    with pytest.raises(BuildFailed) as err:
        built({"Dockerfile": FAILING}, "buildkit")
    f = err.value.failure
    assert f.step == "[3/3] RUN echo line-one; echo line-two >&2; echo line-three; exit 3"
    # stdout and stderr reach the engine through separate pipes: their relative order is not fixed
    assert sorted(f.log_tail) == ["line-one", "line-three", "line-two"]
    assert err.value.exit_code == 1 and "the step exited with status 3" in err.value.one_line()


def test_cli_buildkit_failing_step_is_one_line_with_its_last_output(tmp_path, engine, stand_in_wheelhouse):
    """docs/images.md's failing BuildKit build, as the page writes it (this engine's default builder is
    BuildKit), in a folder whose spec adds a package apt cannot find: the lines the page shows (times, the
    cache and apt's download lines are this build's)."""
    import docblocks  # tests/docblocks.py

    node = "tests/integration/test_image_buildkit.py::test_cli_buildkit_failing_step_is_one_line_with_its_last_output"
    (block,) = docblocks.tested_by(ROOT / "docs" / "images.md", node)
    ((cmd, shown),) = block.steps()
    spec = tmp_path / "torchrig.toml"
    spec.write_text(
        '[torch]\nversion = "2.13.0"\nvariant = "cpu"\n[packages]\napt = ["no-such-package-torchrig"]\n'
    )
    # the page's .ci-work/wheelhouse, with a stand-in torch: the build stops at apt, and torch's real
    # wheels would only fill the build context
    (tmp_path / ".ci-work").mkdir()
    (tmp_path / ".ci-work" / "wheelhouse").symlink_to(stand_in_wheelhouse)
    r = docblocks.run(cmd, tmp_path, timeout=600)
    assert r.returncode == 1, r.stderr[-3000:]
    vary = {
        r"\[\s*[\d.]+s\]": "[T]",
        # BuildKit merges a vertex that concurrent builds share (the base image's FROM): its number, its
        # stage name and whether it was cached are those of whichever build made it first
        r"step \d+/\d+: ": "step N: ",
        r"step N: (CACHED )?(\[os\] )?FROM ": "step N: FROM ",
        r": CACHED \[": ": [",  # whether the engine had the base's layer at hand
        r"(?m)^\s*\| (Get|Hit|Ign|Fetched|Reading package lists).*$": "",
    }
    assert not docblocks.missing(r.stderr, shown, vary), r.stderr[-4000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("torchrig: error: image build failed at [os 2/2] RUN set -eux")
    assert "its first error: E: Unable to locate package no-such-package-torchrig" in last
    assert not (tmp_path / "torchrig.lock.json").exists()


def test_classic_builds_the_rendered_image_like_buildkit(
    tmp_path, engine, stand_in_wheelhouse, image_build_cli, remove_classic_intermediates
):
    """The classic builder makes the same image as BuildKit from the same spec: labels, user, config, lock,
    size. Both build a spec with the services and a stand-in torch wheel (the question is the builders, not
    torch: a real torch took minutes per build). Their own repository names keep other builds' tags."""
    built: dict[str, dict] = {}
    logs: list[str] = []
    try:
        for builder in ("buildkit", "classic"):
            spec = tmp_path / builder / "torchrig.toml"
            spec.parent.mkdir()
            spec.write_text(
                '[torch]\nversion = "2.13.0"\nvariant = "cpu"\n[packages]\npip = []\n'
                "[services]\njupyter = false\nssh = true\n"
                f'[image]\nname = "torchrig-test/builders-{builder}"\n'
            )
            r = image_build_cli(
                spec,
                "--wheelhouse",
                str(stand_in_wheelhouse),
                "--builder",
                builder,
                "--json",
                "-v",
                timeout=900,
            )
            logs += r.stderr.splitlines()
            assert r.returncode == 0, r.stderr[-3000:]
            built[builder] = {**json.loads(r.stdout), "spec": spec}
        auto, classic = built["buildkit"], built["classic"]
        assert auto["builder"] == "buildkit" and classic["builder"] == "classic"
        assert [s["state"] for s in classic["steps"]].count("error") == 0 and len(classic["steps"]) > 15
        a, c = _config(engine, auto["image_id"]), _config(engine, classic["image_id"])
        title = "org.opencontainers.image.title"
        assert c["Labels"].pop(title) == "torchrig-test/builders-classic"
        assert a["Labels"].pop(title) == "torchrig-test/builders-buildkit"
        assert a == c and a["User"] == "1000:1000"
        for key in ("Healthcheck", "ExposedPorts", "Volumes"):
            assert engine.images.get(auto["image_id"]).attrs["Config"].get(key) == engine.images.get(
                classic["image_id"]
            ).attrs["Config"].get(key)
        lock_a = json.loads(Path(auto["lock"]).read_text())
        lock_c = json.loads(Path(classic["lock"]).read_text())
        for key in ("pip_freeze", "apt_packages", "constraints", "base_reference"):
            assert lock_a[key] == lock_c[key], key
        assert abs(classic["size_bytes"] - auto["size_bytes"]) < 0.02 * auto["size_bytes"]
    finally:  # by ID: its tags only, never a stack tag another session's build has since taken
        for b in built.values():
            engine.images.remove(b["image_id"], force=True)
        remove_classic_intermediates(engine, logs)  # also those of a failed build
        shutil.rmtree(tmp_path, ignore_errors=True)


CANCEL_PROGRAM = """
import io, json, signal, sys
# A runner may start its children with SIGINT ignored (nohup, some CI agents): Ctrl-C must still reach us.
signal.signal(signal.SIGINT, signal.default_int_handler)
import docker
from torchrig.image.build import run_build
from torchrig.image.context import ContextPlan, write_context_tar

class Echo:
    def step(self, number, total, text): print("step", number, text, flush=True)
    def log(self, line): print(line, flush=True)
    def close(self): pass

base, marker, tag, labels = sys.argv[1:]
tar = io.BytesIO()
write_context_tar(ContextPlan(texts={"Dockerfile": f"FROM {base}\\nRUN sleep {marker}\\n"}), tar)
try:
    run_build(docker.from_env(), tar, tag, buildargs={}, labels=json.loads(labels), no_cache=True, progress=Echo(),
              builder="buildkit")
except KeyboardInterrupt:
    # stay alive: the engine must stop the step while this client still exists
    print("interrupted", flush=True)
    sys.stdin.read()
    sys.exit(130)
"""


def _sleepers(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    return out.stdout.split()


def test_ctrl_c_cancels_the_buildkit_build_on_the_engine(engine, test_labels):
    """Ctrl-C in the client stops the RUN step on the engine too, not only the client.

    Two things stop it: torchrig's ``/build/cancel`` and urllib3 closing the connection whose read was
    interrupted; the test checks the outcome (the step's process is gone while the client still lives)."""
    import signal
    import time

    from docker.errors import ImageNotFound

    marker = f"97.{uuid.uuid4().int % 10**6:06d}"  # a sleep this test alone runs
    tag = f"torchrig-test/buildkit-cancel-{uuid.uuid4().hex[:10]}:1"
    proc = (
        subprocess.Popen(  # the marker alone on its command line: only the RUN step matches "sleep <marker>"
            [sys.executable, "-c", CANCEL_PROGRAM, BASE, marker, tag, json.dumps(test_labels)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    )
    try:
        deadline = time.monotonic() + 120
        while not _sleepers(marker) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert _sleepers(marker), "the RUN step never started"
        proc.send_signal(signal.SIGINT)
        assert proc.stdout is not None
        for line in proc.stdout:  # until the client has handled the interrupt (it then waits on stdin)
            if line.strip() == "interrupted":
                break
        gone_by = time.monotonic() + 60
        while _sleepers(marker) and time.monotonic() < gone_by:
            time.sleep(0.5)
        assert not _sleepers(marker), "the engine kept running the cancelled step"
        assert proc.poll() is None  # ... while the client and its connection were still there
        out, _ = proc.communicate("", timeout=60)
        assert proc.returncode == 130, out[-2000:]
        with pytest.raises(ImageNotFound):
            engine.images.get(tag)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # a failed test must not leave the build's image behind either (e.g. a step that was not cancelled)
        with contextlib.suppress(ImageNotFound):
            engine.images.remove(tag, force=True)
