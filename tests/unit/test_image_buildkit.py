"""BuildKit's progress stream: the protobuf decoder, the follower (steps, cache hits, a failing step's log), and
the choice of builder. The streams are real: recorded from dockerd 20.10.24 (Engine API 1.41) with
``curl --unix-socket /var/run/docker.sock -X POST -H 'Content-Type: application/x-tar' --data-binary @ctx.tar
'http://localhost/v1.41/build?version=2&t=TAG'``, for these Dockerfiles:

two-stages (first build, then the same context again: ``...-rebuild-cached``)::

    FROM torchrig-test/debian:bookworm AS base
    RUN echo hello-from-base > /hello.txt
    FROM base AS unused
    RUN echo never > /never.txt
    FROM base
    ARG STAMP=1
    COPY note.txt /note.txt
    RUN cat /hello.txt /note.txt && echo stamp=$STAMP
    LABEL org.example.k=v

run-exits-3::

    FROM torchrig-test/debian:bookworm
    RUN echo first-step-ok
    RUN echo line-one; echo line-two >&2; echo line-three; exit 3
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from torchrig.errors import EngineUnavailable
from torchrig.image.build import BuildFailed, BuildStep, StepState, follow
from torchrig.image.buildkit import (
    Builder,
    EngineBuildInfo,
    buildkit_support,
    choose_builder,
    follow_buildkit,
)
from torchrig.image.buildkit_status import ProtobufError, decode_status, decode_trace, fields

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "image"
IMAGE_ID = "sha256:7d0d163b92ba216f013076b683f45fe7d6c7abb7a87d03aef250caaa03762d39"


def stream(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIX / f"{name}.jsonl").read_text().splitlines() if line]


class Recorder:
    def __init__(self) -> None:
        self.steps: list[tuple[int, int, str]] = []
        self.lines: list[str] = []
        self.closed = False

    def step(self, number: int, total: int, text: str) -> None:
        self.steps.append((number, total, text))

    def log(self, line: str) -> None:
        self.lines.append(line)

    def close(self) -> None:
        self.closed = True


# --- the wire format, on bytes written by hand from the encoding guide ---------------------------------


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_decoder_reads_every_field_and_skips_unknown_ones():
    stamp = _varint(1 << 3) + _varint(1_700_000_000) + _varint(2 << 3) + _varint(500_000_000)
    vertex = (
        _len(1, b"sha256:aa")
        + _len(2, b"sha256:in1")
        + _len(2, b"sha256:in2")
        + _len(3, b"[build 2/5] RUN make")
        + _varint(4 << 3)
        + _varint(1)
        + _len(5, stamp)
        + _len(6, stamp)
        + _len(7, b"boom")
        + _len(8, b"\x0a\x01x")  # progressGroup: not read, skipped
        + _varint(99 << 3 | 1)
        + (7).to_bytes(8, "little")  # an unknown fixed64 field
    )
    status = _len(1, b"push") + _len(2, b"sha256:aa") + _varint(4 << 3) + _varint(300)
    status += _varint(5 << 3) + _varint(1000) + _len(8, stamp)
    log = _len(1, b"sha256:aa") + _len(2, stamp) + _varint(3 << 3) + _varint(2) + _len(4, b"err\n")
    msg = _len(1, vertex) + _len(2, status) + _len(3, log) + _len(4, b"\x0a\x00")  # + a warning
    r = decode_status(msg)
    (v,) = r.vertexes
    assert (v.digest, v.inputs, v.name, v.cached, v.error) == (
        "sha256:aa",
        ("sha256:in1", "sha256:in2"),
        "[build 2/5] RUN make",
        True,
        "boom",
    )
    assert v.started_s == v.completed_s == pytest.approx(1_700_000_000.5)
    (s,) = r.statuses
    assert (s.id, s.vertex, s.current, s.total) == ("push", "sha256:aa", 300, 1000) and s.completed_s
    (lg,) = r.logs
    assert (lg.vertex, lg.stream, lg.data) == ("sha256:aa", 2, b"err\n")
    assert decode_trace(base64.b64encode(msg).decode()) == r


def test_decoder_reads_negative_int64_and_empty_messages():
    assert decode_status(b"") == decode_status(b"")
    (entry,) = fields(_varint(4 << 3) + _varint(-5))
    assert entry[0] == 4
    status = decode_status(_len(2, _varint(4 << 3) + _varint(-5)))
    assert status.statuses[0].current == -5


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a\x05ab",  # length past the end
        b"\x20\xff",  # truncated varint
        b"\x0b",  # wire type 3 (groups): not used by proto3
        b"\x00\x01",  # field number 0
        _len(1, b"\x20"),  # a vertex whose varint field is cut off
    ],
)
def test_decoder_rejects_malformed_bytes(raw):
    with pytest.raises(ProtobufError):
        decode_status(raw)


def test_trace_that_is_not_base64_is_a_protobuf_error():
    with pytest.raises(ProtobufError):
        decode_trace("not base64!")


# --- recorded streams --------------------------------------------------------------------------------


def test_recorded_first_build_decodes_to_the_dockerfile_steps():
    names: list[str] = []
    logs = b""
    for chunk in stream("buildkit-stream-two-stages-first-build"):
        if chunk.get("id") == "moby.buildkit.trace":
            r = decode_trace(chunk["aux"])
            names += [v.name for v in r.vertexes if v.name not in names]
            logs += b"".join(lg.data for lg in r.logs)
    assert "[base 2/2] RUN echo hello-from-base > /hello.txt" in names
    assert "[stage-2 2/2] RUN cat /hello.txt /note.txt && echo stamp=1" in names
    assert not any("never" in n for n in names)  # the unused stage is never built
    assert logs == b"hello-from-base\nnote\nstamp=1\n"


def test_follow_first_build_gives_image_id_steps_and_progress():
    rec, steps = Recorder(), list[BuildStep]()
    image_id = follow_buildkit(stream("buildkit-stream-two-stages-first-build"), rec, steps)
    assert image_id == IMAGE_ID
    assert [(s.name.split("]")[0] + "]", s.state) for s in steps] == [
        ("[base 1/2]", StepState.CACHED),
        ("[base 2/2]", StepState.DONE),
        ("[stage-2 1/2]", StepState.DONE),
        ("[stage-2 2/2]", StepState.DONE),
    ]
    run = steps[-1]
    assert run.elapsed_s is not None and 0 < run.elapsed_s < 60
    assert (2, 2, "[stage-2] RUN cat /hello.txt /note.txt && echo stamp=1") in rec.steps
    assert [x for x in rec.lines if not x.startswith(("=>", "Succ"))] == [
        "hello-from-base",
        "note",
        "stamp=1",
    ]


def test_follow_rebuild_reports_every_step_cached():
    rec, steps = Recorder(), list[BuildStep]()
    assert follow_buildkit(stream("buildkit-stream-two-stages-rebuild-cached"), rec, steps) == IMAGE_ID
    assert [s.state for s in steps[1:]] == [StepState.CACHED] * 3
    assert all(text.startswith("CACHED ") for _, _, text in rec.steps[1:])


def test_follow_failing_run_names_the_step_and_keeps_its_log():
    rec, steps = Recorder(), list[BuildStep]()
    with pytest.raises(BuildFailed) as err:
        follow_buildkit(stream("buildkit-stream-run-exits-3"), rec, steps)
    f = err.value.failure
    assert f.step == "[3/3] RUN echo line-one; echo line-two >&2; echo line-three; exit 3"
    assert f.log_tail == ["line-one", "line-two", "line-three"]  # stdout and stderr, in order
    assert f.message == "the step exited with status 3"
    line = err.value.one_line()
    assert line.startswith("image build failed at [3/3] RUN echo line-one")
    assert "its last output: line-three" in line and "\n" not in line and err.value.exit_code == 1
    assert [s.state for s in steps] == [StepState.CACHED, StepState.DONE, StepState.ERROR]


def test_follow_without_an_image_id_fails():
    chunks = [
        c for c in stream("buildkit-stream-two-stages-rebuild-cached") if c.get("id") != "moby.image.id"
    ]
    with pytest.raises(BuildFailed, match="without an image ID"):
        follow_buildkit(chunks, Recorder())


def test_follow_keeps_going_past_an_unreadable_trace():
    chunks = [{"id": "moby.buildkit.trace", "aux": base64.b64encode(b"\x0a\x05ab").decode()}]
    chunks += stream("buildkit-stream-two-stages-rebuild-cached")
    rec = Recorder()
    assert follow_buildkit(chunks, rec) == IMAGE_ID
    assert any("could not be read" in line for line in rec.lines)


def test_error_before_any_step_is_reported_without_a_step():
    chunk = {"errorDetail": {"message": "failed to read dockerfile"}, "error": "failed to read dockerfile"}
    with pytest.raises(BuildFailed) as err:
        follow_buildkit([chunk], Recorder())
    assert "before the first step: failed to read dockerfile" in err.value.one_line()


def test_classic_stream_records_steps_with_cache_hits():
    steps: list[BuildStep] = []
    with pytest.raises(BuildFailed) as err:
        follow(stream("build-stream-apt-missing-package"), Recorder(), steps)
    assert [s.state for s in steps] == [StepState.DONE, StepState.CACHED, StepState.ERROR]
    assert steps[-1].name.startswith("Step 3/26 : RUN") and steps[1].elapsed_s is None
    # the one-line error names the step's first error, not the engine's bookkeeping
    assert "its first error: E: Unable to locate package no-such-package-torchrig" in err.value.one_line()
    assert not any(line.lstrip().startswith(("--->", "Removing")) for line in err.value.failure.log_tail)


# --- which builder -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "requested, api, os_type, header, expected",
    [
        ("auto", "1.41", "linux", None, Builder.BUILDKIT),
        ("auto", "1.39", "linux", "1", Builder.BUILDKIT),
        ("auto", "1.38", "linux", None, Builder.CLASSIC),
        ("auto", "1.38", "linux", "2", Builder.BUILDKIT),
        ("auto", "1.41", "windows", None, Builder.CLASSIC),
        ("auto", None, "linux", None, Builder.CLASSIC),
        ("classic", "1.43", "linux", "2", Builder.CLASSIC),
        ("buildkit", "1.41", "linux", None, Builder.BUILDKIT),
    ],
)
def test_choose_builder(requested, api, os_type, header, expected):
    assert choose_builder(requested, EngineBuildInfo(api, os_type, header)) is expected


@pytest.mark.parametrize(
    "env, requested, expected",
    [
        ("0", "auto", Builder.CLASSIC),
        ("false", "auto", Builder.CLASSIC),
        ("1", "auto", Builder.BUILDKIT),
        ("", "auto", Builder.BUILDKIT),
        ("0", "buildkit", Builder.BUILDKIT),  # an explicit --builder wins over the environment
    ],
)
def test_auto_honours_docker_buildkit_like_the_docker_cli(env, requested, expected):
    assert choose_builder(requested, EngineBuildInfo("1.41", "linux", None), env) is expected


def test_docker_buildkit_1_on_an_engine_without_it_is_an_error():
    with pytest.raises(EngineUnavailable) as err:
        choose_builder("auto", EngineBuildInfo("1.41", "windows", None), "1")
    assert err.value.one_line() == (
        "DOCKER_BUILDKIT=1: a Windows engine has no BuildKit; unset DOCKER_BUILDKIT or use --builder classic"
    )


def test_buildkit_on_an_engine_without_it_is_a_one_line_error():
    info = EngineBuildInfo("1.38", "linux", None)
    assert buildkit_support(info) == "Engine API 1.38 is older than 1.39"
    with pytest.raises(EngineUnavailable) as err:
        choose_builder("buildkit", info)
    assert err.value.one_line() == (
        "--builder buildkit: Engine API 1.38 is older than 1.39; use --builder classic (or auto)"
    )


def test_cli_rejects_an_unknown_builder(cli):
    r = cli("image", "build", "--builder", "kaniko")
    assert r.code == 2
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchrig: error:") and "buildkit" in lines[0]


def test_buildkit_request_asks_for_version_2_with_the_same_inputs_as_classic():
    from torchrig.image.buildkit import _params

    p = _params("t/x:1", "abc", {"TORCHRIG_BASE_DIGEST": "sha256:1"}, {"k": "v"}, no_cache=True)
    assert p["version"] == "2" and p["t"] == "t/x:1" and p["buildid"] == "abc" and p["nocache"] == "1"
    assert json.loads(p["buildargs"]) == {"TORCHRIG_BASE_DIGEST": "sha256:1"}
    assert json.loads(p["labels"]) == {"k": "v"} and p["dockerfile"] == "Dockerfile"
    assert "nocache" not in _params("t/x:1", "abc", {}, {}, no_cache=False)


def test_a_base_that_cannot_be_pulled_suggests_base_and_no_log_is_not_above():
    from torchrig.image.buildrecords import BuildFailure

    # what BuildKit said on a host without registry access (recorded)
    said = (
        "failed to solve with frontend dockerfile.v0: failed to create LLB definition: failed to do request: Head "
        '"https://registry-1.docker.io/v2/library/python/manifests/3.11.14-slim-bookworm": dial tcp: lookup '
        "registry-1.docker.io on 10.255.255.53:53: no such host"
    )
    err = BuildFailed(
        BuildFailure(
            step="[internal] load metadata for docker.io/library/python:3.11.14-slim-bookworm", message=said
        )
    )
    assert "pass --base IMAGE" in (err.hint or "") and "above" not in (err.hint or "")
    quiet = BuildFailed(BuildFailure(step="RUN pip install x", message="the step exited with status 1"))
    assert "above" not in (quiet.hint or "") and "printed no log" in (quiet.hint or "")
    loud = BuildFailed(BuildFailure(step="RUN pip install x", message="status 1", log_tail=["ERROR: boom"]))
    assert "log tail is above" in (loud.hint or "") and "--base" not in (loud.hint or "")


# ---- the boundary with docker-py: BuildKit builds use private methods of its APIClient


def test_the_installed_docker_py_has_the_private_api_and_is_in_the_pinned_range():
    """The methods torchrig calls exist on the installed docker-py's APIClient, that docker-py is inside the
    range pyproject pins, and the pin is the one the run-time error names."""
    import sys

    docker = pytest.importorskip("docker")
    from packaging.requirements import Requirement

    from torchrig.image.buildkit import SDK_PRIVATE_API, SDK_TESTED

    for name in SDK_PRIVATE_API:
        assert callable(getattr(docker.APIClient, name, None)), f"docker-py {docker.__version__} lacks {name}"
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["docker"] == [SDK_TESTED]
    assert Requirement(SDK_TESTED).specifier.contains(docker.__version__)


def test_a_docker_py_without_the_private_api_is_one_line_naming_it():
    """A future docker-py that drops a method: EngineUnavailable (exit 2) naming it and the tested range."""
    pytest.importorskip("docker")
    from types import SimpleNamespace

    from torchrig.image.buildkit import SDK_TESTED, engine_build_info

    api = SimpleNamespace(_get=print, _post=print, _url=print, _raise_for_status=print)  # no _stream_helper
    with pytest.raises(EngineUnavailable) as err:
        engine_build_info(SimpleNamespace(api=api))
    line = err.value.one_line()
    assert "has no APIClient._stream_helper" in line and SDK_TESTED in line and "\n" not in line
