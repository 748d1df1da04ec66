"""Slurm and Kubernetes renders: golden files, schema validation, bad input."""

from __future__ import annotations

import copy
import os
import sys
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
    "slurm-2x2-cpu-trainer.sbatch": lambda: slurm.render_sbatch(
        ClusterJob(
            script="torchrig.train",
            module=True,
            script_args=("--model", "gpt", "--size", "tiny", "--steps", "100", "--resume"),
            nodes=2,
            gpus_per_node=0,
            cpu_procs_per_node=2,
            rdzv_timeout_s=120,
            collective_timeout_s=60,
            hang_timeout_s=300,
            max_restarts=1,
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
                pvc_mounts=("shared-runs:/shared",),
            )
        )
    ),
    "k8s-jobset-2x8.yaml": lambda: k8s.to_yaml(
        k8s.render(
            ClusterJob(
                script="train.py",
                script_args=("--steps", "1000"),
                nodes=2,
                gpus_per_node=8,
                image="registry.example/team/torchrig:2.8.0-cu128",
                namespace="ml",
                max_restarts=3,
                pvc_mounts=("shared-runs:/shared",),
                k8s_kind=K8sKind.JOBSET,
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
    pods = [d for d in docs if d["kind"] in ("PyTorchJob", "Job", "JobSet")]
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


def test_pvc_volume_in_every_pod():
    docs = k8s.render(
        ClusterJob(script="t.py", nodes=2, image="img:1", pvc_mounts=("runs:/shared",), k8s_kind=K8sKind.JOB)
    )
    assert validate.validate_all(docs) == 2
    pod = docs[1]["spec"]["template"]["spec"]
    assert {"name": "pvc-0", "persistentVolumeClaim": {"claimName": "runs"}} in pod["volumes"]
    assert {"name": "pvc-0", "mountPath": "/shared"} in pod["containers"][0]["volumeMounts"]


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
        ({"container_runtime": ContainerRuntime.PYXIS}, "needs an image"),
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
        (["cluster", "k8s", "--spec", "x.toml", "--image", "i:1", "--", "t.py"], "both name the image"),
        (["cluster", "k8s", "--spec", "/nonexistent/torchrig.toml", "--", "t.py"], "torchrig.toml"),
        (["cluster", "slurm", "--nproc-per-node", "2", "--", "t.py"], "--nproc-per-node is for CPU jobs"),
        (["cluster", "slurm", "--rdzv-timeout", "0", "--", "t.py"], "--rdzv-timeout must be at least 1"),
        (["cluster", "slurm", "--container-runtime", "apptainer", "--", "t.py"], "needs an image"),
        (["cluster", "slurm", "--env", "1BAD=x", "--", "t.py"], "not an environment variable name"),
        (["cluster", "k8s", "--image", "i:1", "--volume", "runs", "--", "t.py"], "is not CLAIM:/path"),
        (["cluster", "k8s", "--kind", "jobsett", "--image", "i:1", "--", "t.py"], "did you mean: jobset"),
        (["cluster", "k8s", "--kind", "volcano", "--image", "i:1", "--", "t.py"], "unknown --kind 'volcano'"),
        (["cluster", "k8s", "--kind", "jobset", "--", "t.py"], "needs an image"),
        (["cluster", "k8s", "--kind", "jobset", "--image", "i:1", "--name", "9lives", "--", "t.py"],
         "must start with a letter"),
        (["cluster", "k8s", "--kind", "jobset", "--image", "i:1", "--nodes", "128", "--name", "a" * 47, "--",
          "t.py"], "use a --name of at most 46 characters"),
    ],
)  # fmt: skip
def test_cli_bad_input_is_one_line_exit_2(cli, argv, needle):
    r = cli(*argv)
    assert r.code == 2, r
    assert needle in r.err and r.err.count("\n") == 1 and "Traceback" not in r.err


def test_cli_writes_and_submit_without_sbatch_says_how(cli, tmp_path):
    out = tmp_path / "job.sbatch"
    bin_dir = tmp_path / "bin"  # a PATH with python and bash but without sbatch
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    (bin_dir / "bash").symlink_to("/bin/bash")
    r = cli(
        "cluster", "slurm", "--nodes", "2", "-o", str(out), "--submit", "--", "train.py",
        env={"PATH": str(bin_dir)},
    )  # fmt: skip
    assert r.code == 2 and "sbatch is not on PATH" in r.err and f"sbatch {out}" in r.err
    assert out.read_text().startswith("#!/bin/bash")


def test_cli_json(cli):
    r = cli("cluster", "k8s", "--json", "--nodes", "2", "--image", "img:1", "--", "train.py")
    assert r.code == 0, r.err
    data = r.json()
    assert data["schema_version"] == 1 and data["target"] == "k8s" and "PyTorchJob" in data["render"]


# ---- the renders speak `torchrig launch`'s and torchrun's real command lines


def _node_argv(job: ClusterJob) -> list[str]:
    """The per-node command with the shell variables a node would expand filled in."""
    from torchrig.cluster.job import launcher_argv, literal

    argv = launcher_argv(job, nnodes="2", node_rank="1", endpoint="head:29500", rdzv_id="42", log_dir="lg/42")
    return [literal(w, {}) for w in argv]


@pytest.mark.parametrize(
    "job",
    [
        ClusterJob(script="train.py", script_args=("--lr", "3e-4"), nodes=2, gpus_per_node=8, max_restarts=2),
        ClusterJob(
            script="torchrig.train",
            module=True,
            script_args=("--size", "tiny", "--resume"),
            nodes=2,
            gpus_per_node=0,
            cpu_procs_per_node=3,
            rdzv_timeout_s=60,
            collective_timeout_s=30,
            hang_timeout_s=120,
            preflight=False,
        ),
    ],
    ids=["gpu-script", "cpu-module"],
)
def test_launcher_command_is_what_torchrig_launch_parses(job):
    import argparse

    from torchrig.cli import cmd_launch

    argv = _node_argv(job)
    assert argv[:2] == ["torchrig", "launch"]
    parser = argparse.ArgumentParser()
    cmd_launch.configure(parser)
    args = parser.parse_args(argv[2:])
    req = cmd_launch.request_from_args(args)  # LaunchRequest validates as it would on the node
    assert (req.nnodes, req.node_rank, req.rdzv_endpoint, req.rdzv_id) == (2, 1, "head:29500", "42")
    assert (req.max_restarts, req.log_dir, req.module) == (job.max_restarts, "lg/42", job.module)
    assert (req.script, req.script_args) == (job.script, job.script_args)
    if job.gpus_per_node:
        assert (req.gpus, req.cpu) == ("8", False)
    else:
        assert (req.cpu, req.nproc_per_node) == (True, 3)
        assert (req.rdzv_timeout_s, req.collective_timeout_s, req.hang_timeout_s) == (60, 30, 120)
        assert args.no_preflight


def test_launcher_left_out_options_are_launchs_defaults():
    import argparse

    from torchrig.cli import cmd_launch
    from torchrig.launch.plan import LaunchRequest

    argv = _node_argv(ClusterJob(script="t.py", nodes=2, gpus_per_node=0))
    parser = argparse.ArgumentParser()
    cmd_launch.configure(parser)
    req = cmd_launch.request_from_args(parser.parse_args(argv[2:]))
    default = LaunchRequest(script="t.py")
    assert req.rdzv_timeout_s == default.rdzv_timeout_s
    assert req.collective_timeout_s == default.collective_timeout_s
    assert req.hang_timeout_s == default.hang_timeout_s


def test_plain_torchrun_command_is_what_torchrun_parses():
    run = pytest.importorskip("torch.distributed.run")
    job = ClusterJob(
        script="torchrig.train",
        module=True,
        script_args=("--size", "tiny"),
        nodes=2,
        gpus_per_node=4,
        rdzv_timeout_s=90,
        max_restarts=1,
        use_torchrig_launch=False,
    )
    argv = _node_argv(job)
    assert argv[:3] == ["python3", "-m", "torch.distributed.run"]
    args = run.get_args_parser().parse_args(argv[3:])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.rdzv_endpoint) == (
        "2",
        "4",
        "c10d",
        "head:29500",
    )
    assert (args.rdzv_id, args.rdzv_conf, args.max_restarts, args.log_dir) == (
        "42",
        "join_timeout=90",
        1,
        "lg/42",
    )
    assert (args.redirects, args.tee, args.module) == ("3", "3", True)
    assert (args.training_script, args.training_script_args) == ("torchrig.train", ["--size", "tiny"])


def test_environment_is_launchs_defaults():
    from torchrig.launch.envdefaults import defaults_for

    gpu = {
        v.name: v.value for v in ClusterJob(script="t.py", env={"NCCL_DEBUG": "INFO", "X": "1"}).environment()
    }
    launch = {d.name: d.value for d in defaults_for(uses_nccl=True, omp_threads=1)}
    assert gpu.pop("NCCL_DEBUG") == "INFO" and gpu.pop("X") == "1"  # the user's --env wins
    launch.pop("NCCL_DEBUG")
    assert gpu == {k: v for k, v in launch.items() if k != "OMP_NUM_THREADS"}  # OMP: per node, by launch
    cpu = {v.name for v in ClusterJob(script="t.py", gpus_per_node=0).environment()}
    assert not any(n.startswith(("NCCL_", "TORCH_NCCL_")) for n in cpu)
    # NCCL picks the interface itself (InfiniBand first, never lo/docker*); a filter would bypass that.
    assert "NCCL_SOCKET_IFNAME" not in gpu


@pytest.mark.parametrize(
    "ref, pyxis, apptainer",
    [
        ("registry.example/team/torchrig:2.8.0-cu128", "registry.example#team/torchrig:2.8.0-cu128",
         "docker://registry.example/team/torchrig:2.8.0-cu128"),
        ("localhost:5000/torchrig:1", "localhost:5000#torchrig:1", "docker://localhost:5000/torchrig:1"),
        ("torchrig/pytorch:2.8.0-cu128-py3.11-runtime", "torchrig/pytorch:2.8.0-cu128-py3.11-runtime",
         "docker://torchrig/pytorch:2.8.0-cu128-py3.11-runtime"),
        ("nvcr.io#nvidia/pytorch:25.01-py3", "nvcr.io#nvidia/pytorch:25.01-py3", "docker://nvcr.io#nvidia/pytorch:25.01-py3"),
        ("/images/torchrig.sqsh", "/images/torchrig.sqsh", "/images/torchrig.sqsh"),
        ("/images/torchrig.sif", "/images/torchrig.sif", "/images/torchrig.sif"),
        ("oras://ghcr.io/org/img:1", "oras://ghcr.io/org/img:1", "oras://ghcr.io/org/img:1"),
    ],
)  # fmt: skip
def test_image_references_per_runtime(ref, pyxis, apptainer):
    assert slurm.pyxis_image(ref) == pyxis
    if not ref.startswith("nvcr.io#"):
        assert slurm.apptainer_image(ref) == apptainer


def test_cpu_apptainer_has_no_nv_flag():
    text = slurm.render_sbatch(
        ClusterJob(
            script="t.py",
            nodes=2,
            gpus_per_node=0,
            image="img:1",
            container_runtime=ContainerRuntime.APPTAINER,
        )
    )
    assert "apptainer exec --bind" in text and "--nv" not in text and "docker://img:1" in text
    assert "#SBATCH --gpus-per-node" not in text


SPEC = """\
schema_version = 1
[torch]
version = "2.8.0"
variant = "cu128"
[image]
name = "registry.example/team/torchrig"
"""


def test_cli_spec_gives_the_image_name(cli, tmp_path):
    spec = tmp_path / "torchrig.toml"
    spec.write_text(SPEC)
    r = cli("image", "render", str(spec), "--json")
    assert r.code == 0, r.err
    tag = r.json()["tag"]
    assert tag.startswith("registry.example/team/torchrig:2.8.0-cu128-py")
    r = cli("cluster", "k8s", "--json", "--nodes", "2", "--spec", str(spec), "--", "train.py")
    assert r.code == 0, r.err
    assert f"image: {tag}\n" in r.json()["render"]
    r = cli("cluster", "slurm", "--json", "--nodes", "2", "--spec", str(spec), "--", "train.py")
    assert r.code == 0, r.err
    assert "--container-image=registry.example#team/torchrig:2.8.0-cu128-py" in r.json()["render"]


def test_cli_spec_takes_the_tag_its_build_recorded(cli, tmp_path):
    """Built, the spec's image is the first tag its lock records (`image build --tag` first), the one
    `up --spec` runs too."""
    import json

    spec = tmp_path / "torchrig.toml"
    spec.write_text(SPEC)
    lock = {
        "tags": ["registry.example/team/run:7", "registry.example/team/torchrig:2.8.0-cu128-py3.11-runtime"]
    }
    (tmp_path / "torchrig.lock.json").write_text(json.dumps(lock))
    r = cli("cluster", "k8s", "--json", "--nodes", "2", "--spec", str(spec), "--", "train.py")
    assert r.code == 0, r.err
    assert "image: registry.example/team/run:7\n" in r.json()["render"]
    (tmp_path / "torchrig.lock.json").write_text('{"tags": []}')
    r = cli("cluster", "k8s", "--nodes", "2", "--spec", str(spec), "--", "train.py")
    assert r.code == 2 and "records no image tag" in r.err and r.err.strip().count("\n") == 0


def test_cli_module_forms_are_the_same(cli):
    a = cli("cluster", "slurm", "--json", "--nodes", "2", "-m", "--", "torchrig.train", "--size", "tiny")
    b = cli("cluster", "slurm", "--json", "--nodes", "2", "--", "-m", "torchrig.train", "--size", "tiny")
    assert a.code == b.code == 0, a.err + b.err
    assert a.json()["render"] == b.json()["render"]
    assert "-m -- torchrig.train --size tiny 2>&1 |" in a.json()["render"]


def test_cli_apply_without_kubectl_says_how(cli, tmp_path):
    out = tmp_path / "job.yaml"
    bin_dir = tmp_path / "bin"  # a PATH with python but without kubectl
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    r = cli(
        "cluster", "k8s", "--image", "img:1", "-o", str(out), "--apply", "--", "train.py",
        env={"PATH": str(bin_dir)},
    )  # fmt: skip
    assert r.code == 2 and "kubectl is not on PATH" in r.err and f"kubectl apply -f {out}" in r.err
    assert r.err.count("\n") == 1
    assert out.read_text().startswith("apiVersion: kubeflow.org/v1")


# ---- JobSet (jobset.x-k8s.io/v1alpha2)


def _jobset(**kwargs):
    base = dict(script="t.py", nodes=3, gpus_per_node=4, image="img:1", k8s_kind=K8sKind.JOBSET)
    return k8s.render(ClusterJob(**{**base, **kwargs}))


def test_jobset_is_one_replicated_job_of_n_indexed_pods():
    (doc,) = _jobset(max_restarts=2)
    assert (doc["apiVersion"], doc["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    spec = doc["spec"]
    (rjob,) = spec["replicatedJobs"]
    assert (rjob["name"], rjob["replicas"]) == ("node", 1)
    job = rjob["template"]["spec"]
    assert (job["completionMode"], job["completions"], job["parallelism"]) == ("Indexed", 3, 3)
    # a failed pod fails its Job at once; the JobSet recreates all pods, up to --max-restarts times
    assert job["backoffLimit"] == 0 and spec["failurePolicy"] == {"maxRestarts": 2}
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["node"]}
    assert spec["network"]["enableDNSHostnames"] is True


def test_jobset_pod_is_the_indexed_jobs_pod():
    """Same container, GPUs, /dev/shm, volumes and env as the indexed Job: one code path renders both."""
    job = ClusterJob(script="t.py", nodes=2, gpus_per_node=4, image="img:1", shm_size="32Gi",
                     pvc_mounts=("runs:/shared",), env={"X": "1"})  # fmt: skip
    from dataclasses import replace

    indexed = k8s.render(replace(job, k8s_kind=K8sKind.JOB))[1]["spec"]["template"]["spec"]
    jobset = k8s.render(replace(job, k8s_kind=K8sKind.JOBSET))[0]
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["volumes"] == indexed["volumes"]
    assert pod["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    c, ic = pod["containers"][0], indexed["containers"][0]
    assert c["resources"] == ic["resources"] == {"limits": {"nvidia.com/gpu": 4}}
    assert c["env"] == ic["env"] and {"name": "X", "value": "1"} in c["env"]
    assert c["volumeMounts"] == ic["volumeMounts"]
    assert "subdomain" not in pod  # the JobSet controller sets the pods' hostname and subdomain


def test_jobset_rendezvous_is_pod_0s_dns_name():
    (doc,) = _jobset(name="llm", rdzv_port=29600)
    network = doc["spec"]["network"]
    assert network == {"enableDNSHostnames": True, "subdomain": "llm", "publishNotReadyAddresses": True}
    container = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    # <jobSet.name>-<replicatedJob.name>-<job-index>-<pod-index>.<subdomain> (the CRD's enableDNSHostnames)
    assert args[args.index("--rdzv-endpoint") + 1] == "llm-node-0-0.llm:29600"
    assert args[args.index("--node-rank") + 1] == "$(JOB_COMPLETION_INDEX)"
    assert k8s.jobset_pod_hostname("llm", "node", 0, 2) == "llm-node-0-2"


def test_jobset_crd_extract_names_its_source():
    crd = validate.jobset_crd()
    assert (crd["group"], crd["version"], crd["kind"]) == ("jobset.x-k8s.io", "v1alpha2", "JobSet")
    assert crd["source"].startswith("https://github.com/kubernetes-sigs/jobset/blob/")
    assert crd["source"].endswith("/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml")
    assert crd["verified"]
    spec = crd["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert {"replicatedJobs", "network", "failurePolicy", "successPolicy"} <= set(spec)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d["spec"]["failurePolicy"].update(maxRestart=1), "maxRestart"),  # a typo: strict fields
        (lambda d: d["spec"]["successPolicy"].update(operator="Most"), "Most"),
        (lambda d: d["spec"]["replicatedJobs"][0].pop("name"), "name"),
        (lambda d: d["spec"]["replicatedJobs"][0].update(replicas="1"), "'1'"),
        (lambda d: d["spec"]["network"].update(enableDNSHostnames="yes"), "yes"),
        (lambda d: d["spec"]["successPolicy"].update(targetReplicatedJobs=["workers"]), "workers"),
        (lambda d: d["spec"]["network"].update(subdomain="Bad_Sub"), "DNS-1035"),
        (lambda d: d.update(apiVersion="jobset.x-k8s.io/v1"), "jobset.x-k8s.io/v1alpha2"),
        (lambda d: d.pop("spec"), "needs metadata.name and spec"),
        # the embedded Job template, checked by kubernetes-validate as a batch/v1 Job
        (lambda d: d["spec"]["replicatedJobs"][0]["template"]["spec"].update(completionMode=7), "7"),
        (lambda d: d["spec"]["replicatedJobs"][0]["template"]["spec"].update(completions="3"), "'3'"),
        (lambda d: d["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
         .update(gpus=8), "gpus"),
    ],
)  # fmt: skip
def test_jobset_schema_and_webhook_checks_catch(mutate, match):
    (doc,) = _jobset()
    validate.validate_manifest(copy.deepcopy(doc))
    mutate(doc)
    with pytest.raises(JobFailed, match=match) as err:
        validate.validate_manifest(doc)
    assert str(err.value).startswith("JobSet/torchrig-train is not valid")


def test_jobset_cel_rules_are_evaluated_as_on_create():
    """The CRD's CEL rules run in a CEL engine: the rendered JobSet passes the one create-time rule; the
    transition rules (``self == oldSelf``: immutable fields) of the three such fields it sets (failurePolicy,
    network, successPolicy) apply only to updates and are skipped."""
    (doc,) = _jobset()
    crd = validate.jobset_crd()["openAPIV3Schema"]
    assert validate.check_cel_rules(doc, crd) == (1, 3)
    # startupPolicy InOrder with a dependsOn: the CRD's rule, with its own message
    bad = copy.deepcopy(doc)
    bad["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    bad["spec"]["replicatedJobs"][0]["dependsOn"] = [{"name": "init", "status": "Ready"}]
    with pytest.raises(JobFailed, match=r"\.spec: StartupPolicy and DependsOn APIs are mutually exclusive"):
        validate.validate_manifest(bad)
    # either one alone is accepted by the rule
    for key in ("startupPolicy", "dependsOn"):
        ok = copy.deepcopy(bad)
        ok["spec"].pop(key, None) if key == "startupPolicy" else ok["spec"]["replicatedJobs"][0].pop(key)
        assert validate.check_cel_rules(ok, crd)[0] == 1


def test_cel_rules_walk_items_and_additional_properties():
    schema = {
        "type": "object",
        "properties": {
            "xs": {
                "type": "array",
                "items": {"x-kubernetes-validations": [{"rule": "self.n > 0", "message": "n>0"}]},
            },
            "m": {"additionalProperties": {"x-kubernetes-validations": [{"rule": "self.size() < 3"}]}},
        },
    }
    doc = {"xs": [{"n": 1}, {"n": 2}], "m": {"a": "ab", "b": "x"}}
    assert validate.check_cel_rules(doc, schema) == (4, 0)
    doc["xs"][1]["n"] = 0
    with pytest.raises(ValueError, match=r"^\.xs\[1\]: n>0$"):
        validate.check_cel_rules(doc, schema)
    doc["xs"][1]["n"] = 5
    doc["m"]["b"] = "xyz"
    with pytest.raises(ValueError, match=r"^\.m\.b: self.size\(\) < 3$"):
        validate.check_cel_rules(doc, schema)


def test_jobset_webhook_pod_name_limit():
    """The longest pod name (hostname + 5 random characters) must fit 63: 'x'*k + '-node-0-127-abcde'."""
    limit = 63 - len("-node-0-127-abcde")
    assert validate.validate_all(_jobset(nodes=128, name="x" * limit)) == 1
    with pytest.raises(UsageError, match="pass 63 characters") as err:
        _jobset(nodes=128, name="x" * (limit + 1))
    assert err.value.one_line().endswith(f"use a --name of at most {limit} characters")
    (doc,) = _jobset(nodes=128, name="x" * limit)
    doc["metadata"]["name"] += "x"  # past the renderer's own check, the validator still catches it
    with pytest.raises(JobFailed, match="DNS-1035"):
        validate.validate_manifest(doc)


@pytest.mark.parametrize("kind, api", [("jobset", "jobset.x-k8s.io/v1alpha2"), ("job", "v1")])
def test_cli_cpu_render_runs_through_launch_dry_run(cli, tmp_path, kind, api):
    """The rendered pod command, expanded as pod 0's kubelet would, is accepted by `torchrig launch` itself."""
    import yaml

    r = cli("cluster", "k8s", "--json", "--kind", kind, "--nodes", "2", "--gpus-per-node", "0",
            "--image", "img:1", "--rdzv-timeout", "60", "-m", "--", "torchrig.train", "--size", "tiny")  # fmt: skip
    assert r.code == 0, r.err
    docs = list(yaml.safe_load_all(r.json()["render"]))
    assert docs[0]["apiVersion"] == api
    if kind == "jobset":
        assert "and the JobSet CRD (v1alpha2)" in r.json()["validation"][0]
        pod = docs[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        master = "torchrig-train-node-0-0.torchrig-train:29500"
    else:
        pod = docs[1]["spec"]["template"]["spec"]
        master = "torchrig-train-0.torchrig-train:29500"
    container = pod["containers"][0]
    assert container["command"] == ["torchrig"] and container["args"][0] == "launch"
    assert master in container["args"]
    words = [k8s.kubelet_expand(w, {"JOB_COMPLETION_INDEX": "0"}) for w in container["args"][1:]]
    words = [w.replace(master, "127.0.0.1:29577") for w in words]
    d = cli("launch", "--dry-run", "--json", *words, cwd=str(tmp_path))
    assert d.code == 0, d.err
    plan = d.json()["plan"]
    assert (plan["nnodes"], plan["node_rank"], plan["world_size"], plan["backend"]) == (2, 0, 2, "gloo")
    assert plan["log_dir"] == str(tmp_path / "torchrig-logs/torchrig-train/node0")  # made absolute
    assert plan["argv"][-4:] == ["--module", "torchrig.train", "--size", "tiny"]
    assert "--rdzv-conf=join_timeout=60,is_host=true" in plan["argv"]


def test_the_cluster_page_shows_what_cluster_renders(tmp_path):
    """docs/cluster.md's renders (and docs/tutorials/cluster.md's with a spec), as the pages write them, in
    one folder with a spec that names the pages' registry: each command prints the lines the page shows, and
    the script and the `srun` line the page shows are what the command before them wrote."""
    import docblocks  # tests/docblocks.py

    (tmp_path / "torchrig.toml").write_text(SPEC + '[python]\nversion = "3.11"\n')
    node = "tests/unit/test_cluster_render.py::test_the_cluster_page_shows_what_cluster_renders"
    docs = [docblocks.ROOT / "docs" / "cluster.md", docblocks.ROOT / "docs" / "tutorials" / "cluster.md"]
    ran = 0
    for block in [b for doc in docs for b in docblocks.shell_blocks(doc)]:
        if block.kind == "doctest" and "-o job.sbatch" in block.body:  # the script shown next is its output
            (cmd, _), *_ = block.steps()
            assert docblocks.run(cmd, tmp_path).returncode == 0
        if node not in block.detail.split() or block.kind != "tested-by":
            continue
        ran += 1
        if block.lang == "console":
            for cmd, shown in block.steps():
                r = docblocks.run(cmd, tmp_path)
                assert r.returncode == 0, f"{block.where}: {cmd}\n{r.stderr}"
                assert not docblocks.missing(r.stdout + r.stderr, shown), f"{block.where}: {r.stdout}"
        elif block.body.startswith("#!/bin/bash"):
            assert (tmp_path / "job.sbatch").read_text() == block.body, (
                f"{block.where}: not the rendered script"
            )
        else:
            assert block.body in (tmp_path / "job.sbatch").read_text(), f"{block.where}: not in the script"
    assert ran == 7
