"""Odd inputs a render must never take: non-ASCII digits in ``cluster slurm --time``, an ``--env`` that sets
what the job sets per node or per rank, an ``image build --tag`` that is no Docker reference. Each: exit 2,
one line, before anything is rendered."""

from __future__ import annotations

import pytest

from torchrig.cli import main
from torchrig.cluster import fields
from torchrig.errors import UsageError
from torchrig.image.dockerref import check_tag


def one_line_exit_2(argv, capsys, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("torchrig: error: ") and needle in err, err


@pytest.mark.parametrize("value", ["٥", "１０", "1:٣٠", "۱۰", "10\n", "１-00:00:00", "1_0"])
def test_slurm_time_takes_ascii_digits_only(value, capsys):
    one_line_exit_2(["cluster", "slurm", "--time", value, "--", "x.py"], capsys, "is not a Slurm time")


@pytest.mark.parametrize("value", ["10", "1:30", "01:30:00", "2-00:00:00", "2-12"])
def test_slurm_times_slurm_takes_pass(value):
    assert fields.slurm_time(value) == value


# every variable a render reads per node (its NodeVars) is among the refused ones
RENDERED_PER_NODE = [
    "SLURM_NODEID", "SLURM_NNODES", "SLURM_JOB_ID", "RDZV_ENDPOINT", "JOB_COMPLETION_INDEX", "PET_NODE_RANK",
    "PET_MASTER_ADDR", "PET_MASTER_PORT", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
    "PET_RDZV_ENDPOINT", "TORCHELASTIC_RUN_ID", "SLURM_PROCID",
]  # fmt: skip


@pytest.mark.parametrize("name", RENDERED_PER_NODE)
@pytest.mark.parametrize("kind", ["slurm", "k8s"])
def test_env_refuses_what_the_job_sets_per_node(kind, name, capsys):
    image = ["--image", "a:b"] if kind == "k8s" else []
    one_line_exit_2(
        ["cluster", kind, *image, "--env", f"{name}=0", "--", "x.py"], capsys, "set per node or per rank"
    )


def test_the_refused_names_cover_every_node_variable_the_renders_read():
    import re
    from pathlib import Path

    import torchrig.cluster as cluster

    src = "".join(p.read_text() for p in Path(cluster.__file__).parent.glob("*.py"))
    read = set(re.findall(r'NodeVar\("([A-Z_]+)"\)', src)) | set(re.findall(r"export ([A-Z_]+)=", src))
    assert read, "the renders read node variables"
    missing = {
        n for n in read if n not in fields.PER_NODE_ENV and not n.startswith(fields.PER_NODE_ENV_PREFIXES)
    }
    assert not missing, missing


def test_an_ordinary_env_still_renders():
    assert fields.env_name("NCCL_DEBUG") == "NCCL_DEBUG"
    assert fields.env_name("MY_RANKING") == "MY_RANKING"


@pytest.mark.parametrize(
    "tag",
    ["a\nb", "img:v1\n", "img/Upper", "img:", "img:-x", "a:b:c", " img", "img:" + "x" * 129, "ímg", "a//b",
     "img@sha256:" + "0" * 64, "x" * 256, "-img", "img;rm"],
)  # fmt: skip
def test_image_build_tag_refuses_what_docker_would(tag, capsys):
    with pytest.raises(UsageError, match="is not a Docker image reference"):
        check_tag("--tag", tag)
    one_line_exit_2(["image", "build", "--tag", tag, "c.toml"], capsys, "--tag")


@pytest.mark.parametrize(
    "tag",
    ["img", "team/trainer:v2", "registry.example:5000/ml/img:2.8.0-cu128", "localhost/a__b", "a-b--c/d.e:X_1",
     "Registry.Example/img"],
)  # fmt: skip
def test_image_build_tag_takes_docker_references(tag):
    assert check_tag("--tag", tag) == tag
