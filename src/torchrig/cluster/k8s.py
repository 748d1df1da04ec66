"""Render Kubernetes manifests for a torchrig training job.

Two kinds, chosen with ``--kind``:

``pytorchjob`` (default)
    A Kubeflow Training Operator ``PyTorchJob`` (kubeflow.org/v1): one Master and N-1 Worker pods. The
    operator creates a headless service per replica and sets ``PET_NNODES``, ``PET_NODE_RANK``,
    ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` in each pod, which the launcher below reads.
``jobset``
    A Kubernetes SIG-Apps ``JobSet`` (jobset.x-k8s.io/v1alpha2; needs the JobSet controller): one
    replicatedJob ``node`` whose indexed Job runs one pod per node. ``network.enableDNSHostnames`` gives
    pod *i* the stable name ``<jobset>-node-0-<i>.<subdomain>`` (the controller makes the headless service),
    so node 0 hosts the c10d rendezvous; ``failurePolicy.maxRestarts`` recreates all pods when one fails.
``job``
    A plain ``batch/v1`` indexed ``Job`` plus a headless ``Service`` for the rendezvous; needs no operator.
    Pod *i* gets the stable name ``<job>-<i>.<service>``, so node 0 hosts the c10d rendezvous.

All request ``nvidia.com/gpu`` (the NVIDIA device plugin's resource), mount a memory-backed ``/dev/shm``
(the default 64 MiB breaks DataLoader workers and NCCL), and carry the environment `torchrig launch` sets
(its defaults from ``torchrig.launch.envdefaults``).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

from torchrig.cluster.job import ClusterJob, K8sKind, NodeVar, Word, cat, launcher_argv
from torchrig.errors import EngineUnavailable, JobFailed, UsageError

CONTAINER = "pytorch"  # the container name the Training Operator looks for
JOBSET_API = "jobset.x-k8s.io/v1alpha2"  # schemas/jobset-x-k8s-io-v1alpha2.json, from the JobSet CRD
JOBSET_REPLICATED_JOB = "node"  # one replicatedJob; each of its pods is one node of `torchrig launch`


def kubelet_literal(text: str) -> str:
    """Text the kubelet passes through unchanged: each ``$`` doubled, since the kubelet expands ``$(NAME)``
    in ``command``, ``args`` and ``env[].value`` and reads ``$$`` as one literal ``$``."""
    return text.replace("$", "$$")


def kubelet_word(word: Word) -> str:
    """One ``command``/``args`` entry: literal text escaped, a :class:`NodeVar` as ``$(NAME)``."""
    if isinstance(word, str):
        return kubelet_literal(word)
    return "".join(kubelet_literal(p) if isinstance(p, str) else f"$({p.name})" for p in word)


def kubelet_expand(text: str, env: Mapping[str, str]) -> str:
    """What the kubelet makes of a ``command``/``args`` entry: ``$(NAME)`` replaced by the container's
    variable (left as written when there is none), ``$$`` read as ``$``, any other ``$`` kept.

    A port of Kubernetes' ``third_party/forked/golang/expansion/expand.go`` (``Expand`` with
    ``MappingFuncFor``), the function the kubelet applies to each entry; here so that a test can run a
    rendered pod's command exactly as a node would.
    """
    out: list[str] = []
    checkpoint = cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1 :]
            if rest[0] == "$":  # escaped operator
                out.append("$")
                advance = 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                if close == -1:  # incomplete reference: literal
                    out.append("$(")
                    advance = 1
                else:
                    name = rest[1:close]
                    out.append(env.get(name, f"$({name})"))
                    advance = close + 1
            else:  # not an expression: the operator and the next character
                out.append("$" + rest[0])
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def _container(job: ClusterJob, node_rank: Word, master: Word, port: Word, port_name: str) -> dict[str, Any]:
    if not job.image:
        raise UsageError(
            "Kubernetes needs an image",
            hint="pass --image REF, or --spec torchrig.toml for the image `torchrig image build` makes",
        )
    argv = launcher_argv(
        job,
        nnodes=str(job.nodes),
        node_rank=node_rank,
        endpoint=cat(*_parts(master), ":", *_parts(port)),
        rdzv_id=job.name,
        log_dir=cat(job.log_dir, "/", job.name, "/node", *_parts(node_rank)),
    )
    limits: dict[str, Any] = {}
    if job.gpus_per_node:
        limits["nvidia.com/gpu"] = job.gpus_per_node
    # env values are expanded by the kubelet too (against the variables before them): keep them literal.
    env = [{"name": v.name, "value": kubelet_literal(v.value)} for v in job.environment()]
    words = [kubelet_word(w) for w in argv]
    return {
        "name": CONTAINER,
        "image": job.image,
        "imagePullPolicy": "IfNotPresent",
        # No shell: the kubelet execs command + args itself, filling in the per-pod variables the operator
        # or the indexed Job provide ($(NAME)); every other word reaches the launcher as written.
        "command": words[:1],
        "args": words[1:],
        "env": env,
        "ports": [{"name": port_name, "containerPort": job.rdzv_port}],
        "resources": {"limits": limits} if limits else {},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]
        + [{"name": f"pvc-{i}", "mountPath": m.partition(":")[2]} for i, m in enumerate(job.pvc_mounts)],
    }


def _parts(word: Word) -> tuple[str | NodeVar, ...]:
    return (word,) if isinstance(word, str) else word


def _pod_spec(job: ClusterJob, container: dict[str, Any], restart: str) -> dict[str, Any]:
    return {
        "restartPolicy": restart,
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": job.shm_size}}]
        + [
            {"name": f"pvc-{i}", "persistentVolumeClaim": {"claimName": m.partition(":")[0]}}
            for i, m in enumerate(job.pvc_mounts)
        ],
    }


def _labels(job: ClusterJob) -> dict[str, str]:
    return {"app.kubernetes.io/name": job.name, "app.kubernetes.io/managed-by": "torchrig"}


def render_pytorchjob(job: ClusterJob) -> list[dict[str, Any]]:
    # The operator takes the master port from the container port with this name (pytorch_types.go).
    container = _container(
        job,
        cat(NodeVar("PET_NODE_RANK")),
        cat(NodeVar("PET_MASTER_ADDR")),
        cat(NodeVar("PET_MASTER_PORT")),
        "pytorchjob-port",
    )
    template = {"metadata": {"labels": _labels(job)}, "spec": _pod_spec(job, container, "OnFailure")}
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if job.nodes > 1:
        replicas["Worker"] = {"replicas": job.nodes - 1, "restartPolicy": "OnFailure", "template": template}
    spec: dict[str, Any] = {
        "nprocPerNode": str(job.nproc_per_node),
        "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": job.max_restarts},
        "pytorchReplicaSpecs": replicas,
    }
    return [
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": job.name, "namespace": job.namespace, "labels": _labels(job)},
            "spec": spec,
        }
    ]


def _indexed_job_spec(job: ClusterJob, master: str, backoff_limit: int) -> dict[str, Any]:
    """An indexed ``batch/v1`` JobSpec of one pod per node; ``$JOB_COMPLETION_INDEX`` is the node rank."""
    container = _container(job, cat(NodeVar("JOB_COMPLETION_INDEX")), master, str(job.rdzv_port), "rdzv")
    return {
        "completionMode": "Indexed",
        "completions": job.nodes,
        "parallelism": job.nodes,
        "backoffLimit": backoff_limit,
        "template": {"metadata": {"labels": _labels(job)}, "spec": _pod_spec(job, container, "Never")},
    }


def render_indexed_job(job: ClusterJob) -> list[dict[str, Any]]:
    svc = job.name
    spec = _indexed_job_spec(job, f"{job.name}-0.{svc}", backoff_limit=job.max_restarts)
    spec["template"]["spec"]["subdomain"] = svc  # pods resolve as <job>-<index>.<svc>
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc, "namespace": job.namespace, "labels": _labels(job)},
        "spec": {
            "clusterIP": "None",
            "selector": {"job-name": job.name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rdzv", "port": job.rdzv_port, "targetPort": job.rdzv_port}],
        },
    }
    batch = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job.name, "namespace": job.namespace, "labels": _labels(job)},
        "spec": spec,
    }
    return [service, batch]


def jobset_pod_hostname(jobset: str, replicated_job: str, job_index: int, pod_index: int) -> str:
    """A JobSet pod's hostname, ``<jobSet.name>-<replicatedJob.name>-<job-index>-<pod-index>`` (the CRD's
    ``network.enableDNSHostnames``; the Job is ``<jobset>-<replicatedJob>-<job-index>``, its pods indexed)."""
    return f"{jobset}-{replicated_job}-{job_index}-{pod_index}"


def check_jobset_names(job: ClusterJob) -> None:
    """The JobSet webhook's name check (api/jobset/v1alpha2/jobset_webhook.go, ValidateCreate): the longest
    pod name, its hostname plus the 5-character random suffix, must be a DNS-1035 label (<= 63 characters,
    starting with a letter). The JobSet name is also the headless service's name (the subdomain)."""
    if not job.name[0].isalpha():
        raise UsageError(
            f"job name {job.name!r} must start with a letter for a JobSet",
            hint="its name is also the headless service's, a DNS-1035 label",
        )
    longest = jobset_pod_hostname(job.name, JOBSET_REPLICATED_JOB, 0, job.nodes - 1) + "-abcde"
    if len(longest) > 63:
        room = 63 - (len(longest) - len(job.name))
        raise UsageError(
            f"job name {job.name!r} is too long for a JobSet of {job.nodes} node(s): pod names like "
            f"{longest!r} pass 63 characters",
            hint=f"use a --name of at most {room} characters",
        )


def render_jobset(job: ClusterJob) -> list[dict[str, Any]]:
    """One replicatedJob of one indexed Job with a pod per node (JobSet's own PyTorch examples'
    layout, kubernetes-sigs/jobset examples/pytorch/resnet.yaml)."""
    check_jobset_names(job)
    # The CRD's default subdomain, written out: JobSet's examples/pytorch/resnet.yaml once addressed pod 0
    # as <jobset>-<replicatedJob>-0-0.<jobset>-<replicatedJob>, so the default has not always been this.
    subdomain = job.name
    master = jobset_pod_hostname(job.name, JOBSET_REPLICATED_JOB, 0, 0) + f".{subdomain}"
    # backoffLimit 0: a pod that fails (its launcher out of --max-restarts) fails its Job at once, and the
    # JobSet then recreates every pod, so the nodes rendezvous again; failurePolicy.maxRestarts bounds that.
    spec = _indexed_job_spec(job, master, backoff_limit=0)
    replicated = {
        "name": JOBSET_REPLICATED_JOB,
        "replicas": 1,
        "template": {"metadata": {"labels": _labels(job)}, "spec": spec},
    }
    jobset_spec: dict[str, Any] = {
        # publishNotReadyAddresses: node 0's name resolves while the other pods are still starting.
        "network": {"enableDNSHostnames": True, "subdomain": subdomain, "publishNotReadyAddresses": True},
        "failurePolicy": {"maxRestarts": job.max_restarts},
        # Done when every node's pod has succeeded (the controller's default, written out).
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [JOBSET_REPLICATED_JOB]},
        "replicatedJobs": [replicated],
    }
    return [
        {
            "apiVersion": JOBSET_API,
            "kind": "JobSet",
            "metadata": {"name": job.name, "namespace": job.namespace, "labels": _labels(job)},
            "spec": jobset_spec,
        }
    ]


_RENDERERS = {
    K8sKind.PYTORCHJOB: render_pytorchjob,
    K8sKind.JOB: render_indexed_job,
    K8sKind.JOBSET: render_jobset,
}


def render(job: ClusterJob) -> list[dict[str, Any]]:
    return _RENDERERS[job.k8s_kind](job)


def to_yaml(docs: list[dict[str, Any]]) -> str:
    import yaml  # PyYAML: a light import, only on this path

    class _NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # repeat templates in full: readers expect no anchors
            return True

    return "---\n".join(
        yaml.dump(d, Dumper=_NoAliases, sort_keys=False, default_flow_style=False, width=100) for d in docs
    )


def apply(manifest_path: str) -> str:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        raise EngineUnavailable(
            "kubectl is not on PATH",
            hint=f"run on a machine with cluster access: kubectl apply -f {manifest_path}",
        )
    proc = subprocess.run(
        [kubectl, "apply", "-f", manifest_path], text=True, capture_output=True, timeout=120
    )
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines() or ["no output"]
        raise JobFailed(
            f"kubectl apply failed: {lines[-1][:400]}",
            hint=f"check the cluster with `kubectl cluster-info`; the manifests are in {manifest_path}",
        )
    return proc.stdout.strip()
