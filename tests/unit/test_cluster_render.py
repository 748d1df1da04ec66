"""Slurm and Kubernetes renders: golden files, schema validation, bad input."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from torchrig.cluster import ClusterJob, ContainerRuntime, K8sKind, k8s, slurm, validate
from torchrig.errors import JobFailed, UsageError

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "cluster"

CASES = {
    "slurm-2x8-gpu.sbatch": lambda: slurm.render_sbatch(
        ClusterJob(
            script="train.py",
            script_args=("--lr", "3e-4"),
            nodes=2,
            gpus_per_node=8,
            partition="gpu",
            time_limit="04:00:00",
            account="ml",
        )
    ),
    "slurm-4x8-pyxis.sbatch": lambda: slurm.render_sbatch(
        ClusterJob(
            script="train.py",
            nodes=4,
            gpus_per_node=8,
            image="nvcr.io#team/torchrig:2.8.0-cu128",
            container_runtime=ContainerRuntime.PYXIS,
            container_mounts=("/data:/data",),
            max_restarts=2,
        )
    ),
    "slurm-2x4-apptainer-torchrun.sbatch": lambda: slurm.render_sbatch(
        ClusterJob(
            script="train.py",
            nodes=2,
            gpus_per_node=4,
            image="/images/torchrig.sif",
            container_runtime=ContainerRuntime.APPTAINER,
            use_torchrig_launch=False,
        )
    ),
    "k8s-pytorchjob-2x8.yaml": lambda: k8s.to_yaml(
        k8s.render(
            ClusterJob(
                script="train.py",
                script_args=("--steps", "1000"),
                nodes=2,
                gpus_per_node=8,
                image="registry.example/team/torchrig:2.8.0-cu128",
                namespace="ml",
                max_restarts=3,
            )
        )
    ),
    "k8s-indexed-job-2x8.yaml": lambda: k8s.to_yaml(
        k8s.render(
            ClusterJob(
                script="train.py",
                nodes=2,
                gpus_per_node=8,
                image="registry.example/team/torchrig:2.8.0-cu128",
                k8s_kind=K8sKind.JOB,
            )
        )
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    text = CASES[name]()
    path = GOLDEN / name
    if os.environ.get("TORCHRIG_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), (
        f"render changed; if intended, rerun with TORCHRIG_UPDATE_GOLDEN=1 ({path})"
    )


@pytest.mark.parametrize("name", [n for n in sorted(CASES) if n.endswith(".sbatch")])
def test_sbatch_parses_and_has_one_task_per_node(name):
    text = CASES[name]()
    slurm.check_shell_syntax(text)
    opts = slurm.parse_sbatch_options(text)
    assert opts["ntasks-per-node"] == "1"
    assert int(opts["nodes"]) >= 2
    assert "srun --kill-on-bad-exit=1" in text


def test_sbatch_parse_stops_at_first_command():
    opts = slurm.parse_sbatch_options("#!/bin/bash\n#SBATCH --nodes=2\necho hi\n#SBATCH --nodes=9\n")
    assert opts == {"nodes": "2"}


def test_broken_script_fails_syntax_check():
    with pytest.raises(JobFailed):
        slurm.check_shell_syntax("#!/bin/bash\nif then fi\n")


@pytest.mark.parametrize("kind", list(K8sKind))
def test_manifests_validate(kind):
    docs = k8s.render(ClusterJob(script="train.py", nodes=3, gpus_per_node=8, image="img:1", k8s_kind=kind))
    assert validate.validate_all(docs) == len(docs)
    pods = [d for d in docs if d["kind"] in ("PyTorchJob", "Job")]
    assert pods


def test_schema_catches_bad_replica_type_and_bad_container_field():
    docs = k8s.render(ClusterJob(script="train.py", nodes=2, image="img:1"))
    bad = copy.deepcopy(docs[0])
    bad["spec"]["pytorchReplicaSpecs"]["Chief"] = bad["spec"]["pytorchReplicaSpecs"].pop("Worker")
    with pytest.raises(JobFailed, match="PyTorchJob/torchrig-train is not valid"):
        validate.validate_manifest(bad)
    bad = copy.deepcopy(docs[0])
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["gpus"] = 8
    with pytest.raises(JobFailed, match="gpus"):
        validate.validate_manifest(bad)
    job = k8s.render(ClusterJob(script="t.py", image="img:1", k8s_kind=K8sKind.JOB))[1]
    job["spec"]["completionMode"] = 7
    with pytest.raises(JobFailed):
        validate.validate_manifest(job)


def test_gpu_and_shm_in_pod():
    doc = k8s.render(ClusterJob(script="t.py", nodes=2, gpus_per_node=4, image="img:1", shm_size="32Gi"))[0]
    pod = doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert pod["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert doc["spec"]["nprocPerNode"] == "4"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"nodes": 0}, "--nodes"),
        ({"name": "Bad_Name"}, "DNS label"),
        ({"time_limit": "soon"}, "Slurm time"),
        ({"rdzv_port": 80}, "rdzv-port"),
        ({"container_runtime": ContainerRuntime.PYXIS}, "needs --container"),
    ],
)
def test_job_validation(kwargs, match):
    with pytest.raises(UsageError, match=match):
        ClusterJob(script="t.py", **kwargs)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["cluster", "slurm"], "no training script"),
        (["cluster", "k8s", "--", "t.py"], "needs an image"),
        (["cluster", "slurm", "--nodes", "x", "--", "t.py"], "invalid int value"),
        (["cluster", "slurm", "--submit", "--", "t.py"], "--submit needs --output"),
        (["cluster", "slurm", "--env", "NOEQUALS", "--", "t.py"], "KEY=VALUE"),
        (["cluster", "mesos"], "invalid choice"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(cli, argv, needle):
    r = cli(*argv)
    assert r.code == 2, r
    assert needle in r.err and r.err.count("\n") == 1 and "Traceback" not in r.err


def test_cli_writes_and_submit_without_sbatch_says_how(cli, tmp_path):
    out = tmp_path / "job.sbatch"
    r = cli(
        "cluster",
        "slurm",
        "--nodes",
        "2",
        "-o",
        str(out),
        "--submit",
        "--",
        "train.py",
        env={"PATH": "/usr/bin:/bin"},
    )
    assert r.code == 2 and "sbatch is not on PATH" in r.err and f"sbatch {out}" in r.err
    assert out.read_text().startswith("#!/bin/bash")


def test_cli_json(cli):
    r = cli("cluster", "k8s", "--json", "--nodes", "2", "--image", "img:1", "--", "train.py")
    assert r.code == 0, r.err
    data = r.json()
    assert data["schema_version"] == 1 and data["target"] == "k8s" and "PyTorchJob" in data["render"]
