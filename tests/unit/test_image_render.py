"""The Dockerfile is a pure function of the resolved spec: golden files, one per case.

Regenerate after an intended change with ``TORCHRIG_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_image_render.py``
and review the diff.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tarfile
from pathlib import Path

import pytest

from torchrig.image import context, render

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from imageplans import CASES, FIX, plan_for, stack


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_dockerfile(case):
    text = render.render_dockerfile(plan_for(case))
    golden = FIX / f"{case}.Dockerfile"
    if os.environ.get("TORCHRIG_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"{case}: rendered Dockerfile differs from {golden.name}"


def test_render_is_deterministic():
    assert render.render_dockerfile(plan_for("devel-cu128")) == render.render_dockerfile(
        plan_for("devel-cu128")
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_secure_defaults_in_every_case(case):
    plan = plan_for(case)
    text = render.render_dockerfile(plan)
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    stages = ("os", "torch", "tools", "packages")  # the pinned base, then stages built on it
    assert ":latest" not in text and all(f in (*stages, plan.base.image) for f in froms)
    assert re.search(r"^USER [1-9]\d*:[1-9]\d*$", text, re.M), "final stage must run as a non-root uid"
    assert 'ENTRYPOINT ["/usr/bin/tini", "--"]' in text
    assert "HEALTHCHECK" in text and "PIP_CONSTRAINT=/etc/torchrig/constraints.txt" in text
    final = text.rsplit("\nFROM os\n", 1)[1]
    assert "wheelhouse" not in final, "the wheelhouse must stay in the build stage"
    assert "rm -f /etc/ssh/ssh_host_*" in text or not plan.spec.services.ssh


def test_gpu_image_carries_toolkit_env_and_stack_labels():
    text = render.render_dockerfile(plan_for("runtime-jupyter-ssh-cu128"))
    assert "NVIDIA_VISIBLE_DEVICES=all" in text and "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in text
    for label in (
        'org.torchrig.torch="2.8.0+cu128"',
        'org.torchrig.cuda="12.8"',
        'org.torchrig.min-driver="570.26"',
        'org.torchrig.cudnn="9.10.2.21"',
        'org.torchrig.nccl="2.27.3"',
        'org.torchrig.arch-list="sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"',
    ):
        assert label in text


def test_cpu_image_has_no_gpu_env_and_torch_from_the_cpu_index():
    text = render.render_dockerfile(plan_for("cpu-only"))
    assert "NVIDIA_VISIBLE_DEVICES" not in text
    assert "--index-url https://download.pytorch.org/whl/cpu torch==2.8.0+cpu" in text
    assert "openssh-server" not in text and "EXPOSE 8888\n" in text


def test_devel_uses_the_cuda_devel_base_matching_the_wheel():
    plan = plan_for("devel-cu128")
    assert plan.base.image.startswith("nvidia/cuda:12.8.") and "devel" in plan.base.image
    text = render.render_dockerfile(plan)
    assert "build-essential" in text and "python3.12-dev" in text and "USER 1001:1001" in text


def test_wheelhouse_with_index_keeps_torch_offline():
    text = render.render_dockerfile(plan_for("wheelhouse-ca"))
    assert "--no-index --find-links /tmp/wheelhouse torch==2.8.0" in text
    assert (
        "--find-links /tmp/wheelhouse --index-url https://pypi.org/simple -c /etc/torchrig/constraints.txt"
        in text
    )
    assert "PIP_CERT=/usr/local/share/torchrig/build-ca.crt" in text
    assert "Acquire::https::CAInfo=/usr/local/share/torchrig/build-ca.crt" in text


def test_image_config_names_services_and_user():
    doc = json.loads(render.image_config(plan_for("cpu-only")))
    assert doc["services"] == ["jupyter"] and doc["user"] == "torch" and doc["workdir"] == "/workspace"


def test_context_tar_is_reproducible(tmp_path):
    wheel = tmp_path / "torchrig-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    house = tmp_path / "wh"
    house.mkdir()
    (house / "torch-2.8.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"x")
    ctx = context.plan_context(plan_for("wheelhouse-ca"), wheel, house, ca)
    a, b = io.BytesIO(), io.BytesIO()
    context.write_context_tar(ctx, a)
    context.write_context_tar(ctx, b)
    assert a.getvalue() == b.getvalue() and ctx.digest() == ctx.digest()
    with tarfile.open(fileobj=io.BytesIO(a.getvalue())) as tar:
        names = tar.getnames()
    assert {
        "Dockerfile",
        "build-ca.crt",
        "torchrig-dist/torchrig-0.1.0-py3-none-any.whl",
        "wheelhouse/torch-2.8.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torchrig-files/image.json",
        "torchrig-files/profile.sh",
    } <= set(names)


@pytest.mark.parametrize("label", ["2.8.0+cu128", "2.8.0+cpu"])
def test_recorded_stacks_agree_with_the_knowledge_base(label):
    from torchrig.compat.kb import load_kb
    from torchrig.image.spec import parse_spec
    from torchrig.image.stack import resolve_stack

    version, variant = label.split("+")
    spec = parse_spec({"torch": {"version": version, "variant": variant}, "python": {"version": "3.11"}})
    assert resolve_stack(spec, load_kb()) == stack(label, "3.11")


def test_the_docs_show_the_dockerfile_as_it_renders(tmp_path, monkeypatch):
    """docs/images.md shows a real render; it must stay what the code renders."""
    from torchrig.image.pipeline import ImageOptions, make_plan

    doc = (Path(__file__).resolve().parents[2] / "docs" / "images.md").read_text()
    section = doc[doc.index("## A real render, start to finish") :]
    spec_text = section.split("```toml\n", 1)[1].split("```", 1)[0]
    shown = section.split("--base torchrig-test/debian:bookworm\n", 1)[1].split(
        "\n$ torchrig image build", 1
    )[0]
    monkeypatch.chdir(tmp_path)
    Path("torchrig.toml").write_text(spec_text)
    Path("wh").mkdir()
    Path("wh/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    plan = make_plan(
        ImageOptions(spec=Path("torchrig.toml"), wheelhouse=Path("wh"), base="torchrig-test/debian:bookworm")
    )
    assert render.render_dockerfile(plan).rstrip("\n") == shown


def test_a_damaged_knowledge_base_leaves_the_wheelhouse_to_say_what_to_build(tmp_path, monkeypatch):
    """The knowledge base's own error (a data file missing or damaged: InputError) is no plan without a
    wheelhouse; with one, its torch wheel names the build."""
    from torchrig.compat import kb as kbmod
    from torchrig.errors import InputError
    from torchrig.image.pipeline import ImageOptions, make_plan

    def damaged():
        raise InputError("cannot read torchrig's data file 'torchrig.data/torch.toml'")

    monkeypatch.setattr(kbmod, "load_kb", damaged)
    monkeypatch.chdir(tmp_path)
    Path("torchrig.toml").write_text(
        '[torch]\nversion = "2.13.0"\nvariant = "cpu"\n[python]\nversion = "3.11"\n'
    )
    with pytest.raises(InputError, match=r"torch\.toml"):
        make_plan(ImageOptions(spec=Path("torchrig.toml"), base="torchrig-test/debian:bookworm"))
    Path("wh").mkdir()
    Path("wh/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    plan = make_plan(
        ImageOptions(spec=Path("torchrig.toml"), wheelhouse=Path("wh"), base="torchrig-test/debian:bookworm")
    )
    assert plan.stack.label == "2.13.0+cpu"
