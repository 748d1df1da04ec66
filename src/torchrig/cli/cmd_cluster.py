"""Render a training job for a Slurm or Kubernetes cluster, validated, from the options `launch` takes.

torchrig does not run a cluster manager: it writes what the existing engines take.

  slurm   an sbatch script: one task per node, srun starting `torchrig launch` (torchrun underneath)
          with the c10d rendezvous on the first node, launch's environment defaults and pre-flight,
          per-rank logs, and optionally a container through pyxis/enroot (--container, the default
          runtime) or Apptainer (--container-runtime apptainer).
  k8s     Kubernetes manifests: a Kubeflow PyTorchJob (--kind pytorchjob, default), a SIG-Apps JobSet
          (--kind jobset: one replicatedJob of N indexed pods, stable DNS names, whole-set restarts), or
          a plain indexed Job with a headless Service (--kind job, no controller needed);
          nvidia.com/gpu resources, a memory-backed /dev/shm, the same environment.

The command after `--` is what `torchrig launch` runs on every node: a script with its arguments, or a
module with -m (torchrig's own trainer: -m torchrig.train ...). --spec torchrig.toml takes the image
the spec's last `torchrig image build` tagged first (as `up --spec` does), or before a build the tag a
build will give it (push it where the cluster can pull it).

Every render is validated before it is printed: sbatch scripts by `bash -n` and by parsing their
#SBATCH lines; manifests against Kubernetes' JSON schemas and the PyTorchJob or JobSet CRD (no network
needed).

examples:
  torchrig cluster slurm --nodes 2 --gpus-per-node 8 --partition gpu --time 04:00:00 -- train.py --lr 3e-4
  torchrig cluster slurm --nodes 2 -m -o job.sbatch -- torchrig.train --model gpt --size small --resume-if-possible
  torchrig cluster slurm --nodes 4 --container nvcr.io#org/img:tag -o job.sbatch --submit -- train.py
  torchrig cluster slurm --nodes 2 --gpus-per-node 0 --nproc-per-node 2 -o job.sbatch --submit --wait -- train.py
  torchrig cluster slurm --nodes 2 --spec torchrig.toml --container-runtime apptainer -- train.py
  torchrig cluster k8s --nodes 2 --gpus-per-node 8 --image registry.example/team/torchrig:2.8.0-cu128 -- train.py
  torchrig cluster k8s --kind jobset --nodes 4 --image registry.example/team/torchrig:2.8.0-cu128 --max-restarts 3 -- train.py
  torchrig cluster k8s --kind job --nodes 2 --spec torchrig.toml -o job.yaml --apply -- train.py
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchrig.argtypes import MAX_NODES, MAX_PROCS, MAX_SECONDS, int_in
from torchrig.errors import UsageError
from torchrig.launch.options import LAUNCH_OPTIONS, MAX_RESTARTS, from_args

DEFAULT_WAIT_S = 7 * 24 * 3600  # a week: past any usual partition time limit, yet --wait never hangs forever


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what runs on each node (the options of `torchrig launch`)")
    g.add_argument("--nodes", type=int_in(1, MAX_NODES), default=1, help="number of nodes (default 1)")
    g.add_argument(
        "--gpus-per-node",
        type=int_in(0, MAX_PROCS),
        default=8,
        help="GPUs per node, one process each; 0 = CPU (default 8)",
    )
    g.add_argument(
        "--nproc-per-node",
        type=int_in(1, MAX_PROCS),
        default=1,
        help="processes per node of a CPU job (default 1)",
    )
    g.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module, run as python -m")
    g.add_argument(
        "--rdzv-port", type=int_in(1, 65535), default=29500, help="c10d rendezvous port on the first node"
    )
    for option in LAUNCH_OPTIONS:  # declared once; left out of the command when not given (launch's default)
        option.add_to(g, default=option is MAX_RESTARTS)
    g.add_argument("--no-preflight", action="store_true", help="skip launch's pre-flight checks")
    g.add_argument("--log-dir", default="torchrig-logs", help="per-rank logs go under here (torchrig-logs)")
    g.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment")
    g.add_argument(
        "--plain-torchrun",
        action="store_true",
        help="start torchrun directly instead of `torchrig launch` (no torchrig needed on nodes)",
    )
    p.add_argument("--name", default="torchrig-train", help="job name, a DNS label (default torchrig-train)")
    p.add_argument("--spec", metavar="TOML", help="take the image from this torchrig.toml (`torchrig image`)")
    p.add_argument("-o", "--output", help="write the render to this file instead of stdout")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- script.py [args]")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="target", metavar="{slurm,k8s}")
    sub.required = True
    s = sub.add_parser("slurm", help="render an sbatch script")
    s.add_argument("--partition")
    s.add_argument("--account")
    s.add_argument("--time", dest="time_limit", help="wall-time limit (MINUTES, HH:MM:SS, D-HH:MM:SS)")
    s.add_argument("--cpus-per-task", type=int_in(1, 100_000))
    s.add_argument("--container", help="container image to run in (pyxis unless --container-runtime)")
    s.add_argument("--container-runtime", choices=["none", "pyxis", "apptainer"], default=None)
    s.add_argument("--mount", action="append", default=[], metavar="SRC:DST", help="container bind mount")
    s.add_argument(
        "--submit", action="store_true", help="submit with sbatch (needs --output and sbatch on PATH)"
    )
    s.add_argument(
        "--wait",
        action="store_true",
        help="with --submit: follow the job until it ends and summarise it from Slurm's records (exit 1 "
        "unless COMPLETED); requeues and lost nodes are named; a job Slurm can never start (more nodes than "
        "the partition has, a limit of its account or QOS) fails at once with Slurm's reason",
    )
    s.add_argument(
        "--wait-timeout",
        type=int_in(1, MAX_SECONDS),
        metavar="S",
        help=f"stop waiting after S seconds; the job keeps running (default with --wait: {DEFAULT_WAIT_S})",
    )
    _add_common(s)
    k = sub.add_parser("k8s", help="render Kubernetes manifests")
    k.add_argument("--image", help="container image (e.g. built by `torchrig image build`)")
    k.add_argument(
        "--kind",
        default="pytorchjob",
        metavar="{pytorchjob,jobset,job}",
        help="PyTorchJob (Kubeflow operator), JobSet (JobSet controller) or indexed Job (default pytorchjob)",
    )
    k.add_argument("--namespace", default="default")
    k.add_argument("--shm-size", default="16Gi", help="memory-backed /dev/shm size (default 16Gi)")
    k.add_argument(
        "--volume",
        action="append",
        default=[],
        metavar="CLAIM:PATH",
        help="mount a PersistentVolumeClaim in every pod (shared checkpoints and data)",
    )
    k.add_argument("--apply", action="store_true", help="kubectl apply the manifests (needs --output)")
    _add_common(k)
    for p in (s, k):  # subparsers do not inherit the frame's common options
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {pair!r} is not KEY=VALUE")
        env[key] = value
    return env


def _image(args: argparse.Namespace) -> str | None:
    image: str | None = args.container if args.target == "slurm" else args.image
    if args.spec:
        if image:
            flag = "--container" if args.target == "slurm" else "--image"
            raise UsageError(f"--spec and {flag} both name the image", hint="give one of them")
        from torchrig.image.ref import image_of_spec

        image = image_of_spec(Path(args.spec), must_be_built=False)
    return image


def _job(args: argparse.Namespace) -> Any:
    from torchrig.cluster.job import ClusterJob, ContainerRuntime

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    module = args.module
    if command and command[0] == "-m":  # `-- -m torchrig.train ...`, as python -m reads
        module, command = True, command[1:]
    if not command:
        raise UsageError("no training script given", hint="end the command with: -- train.py [args]")
    image = _image(args)
    common: dict[str, Any] = dict(
        script=command[0],
        script_args=tuple(command[1:]),
        module=module,
        name=args.name,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        cpu_procs_per_node=args.nproc_per_node,
        rdzv_port=args.rdzv_port,
        **from_args(args),
        preflight=not args.no_preflight,
        log_dir=args.log_dir,
        env=_env(args.env),
        use_torchrig_launch=not args.plain_torchrun,
        image=image,
    )
    if args.target == "slurm":
        runtime = args.container_runtime or ("pyxis" if image else "none")
        return ClusterJob(
            **common,
            partition=args.partition,
            account=args.account,
            time_limit=args.time_limit,
            cpus_per_task=args.cpus_per_task,
            container_runtime=ContainerRuntime(runtime),
            container_mounts=tuple(args.mount),
        )
    return ClusterJob(
        **common,
        namespace=args.namespace,
        shm_size=args.shm_size,
        pvc_mounts=tuple(args.volume),
        k8s_kind=_k8s_kind(args.kind),
    )


def _k8s_kind(value: str) -> Any:
    from torchrig.cluster.job import K8sKind
    from torchrig.fuzzy import did_you_mean

    kinds = [k.value for k in K8sKind]
    try:
        return K8sKind(value.lower())
    except ValueError:
        raise UsageError(
            f"unknown --kind {value!r}", hint=did_you_mean(value, kinds) or f"choose from {', '.join(kinds)}"
        ) from None


@dataclass(frozen=True)
class ClusterReport:
    target: str
    text: str
    output: str | None
    validation: list[str]
    submitted: str | None = None
    job: dict[str, Any] = field(default_factory=dict)
    outcome: Any = None  # slurmjob.JobOutcome after --wait
    job_output: dict[str, str] | None = None  # a submitted Slurm job: its output file and per-node logs

    def to_json(self) -> dict[str, Any]:
        from torchrig.report import jsonable

        return {
            "target": self.target,
            "output": self.output,
            "validation": self.validation,
            "submitted": self.submitted,
            "job": self.job,
            "render": self.text,
            "outcome": jsonable(self.outcome) if self.outcome is not None else None,
            "job_output": self.job_output,
        }

    def render_text(self) -> str:
        if self.output is None:
            return self.text.rstrip("\n")
        lines = [f"wrote {self.output}"] + [f"  valid: {v}" for v in self.validation]
        if self.submitted:
            lines.append(f"  submitted: {self.submitted}")
        if self.job_output:
            lines.append(f"  output: {self.job_output['output']} (per-node logs: {self.job_output['logs']})")
        if self.outcome is not None:
            lines.append(self.outcome.headline())
            lines += [f"  {e}" for e in self.outcome.events]
            if self.outcome.output and not self.job_output:
                lines.append(f"  output: {self.outcome.output}")
        return "\n".join(lines)

    @property
    def exit_code(self) -> int:
        return 1 if self.outcome is not None and not self.outcome.ok else 0


def _output_of(job: Any, job_id: str) -> str:
    """Where the submitted job's output goes: the script's ``--output=%x-%j.out`` in the submit directory."""
    return os.path.join(os.getcwd(), f"{job.name}-{job_id}.out")


def run(args: argparse.Namespace) -> ClusterReport:
    from torchrig.report import jsonable

    job = _job(args)
    validation: list[str] = []
    submitted = None
    outcome = None
    job_output: dict[str, str] | None = None
    if args.target == "slurm":
        from torchrig.cluster import slurm

        text = slurm.render_sbatch(job)
        slurm.check_shell_syntax(text)
        opts = slurm.parse_sbatch_options(text)
        validation = ["bash -n: ok", f"#SBATCH options parsed: {len(opts)} ({', '.join(opts)})"]
        wants_action, action_flag = args.submit, "--submit"
    else:
        from torchrig.cluster import k8s, validate

        docs = k8s.render(job)
        n = validate.validate_all(docs)
        text = k8s.to_yaml(docs)
        validation = [f"{n} manifest(s) valid against {validate.checked_against(job.k8s_kind.value)}"]
        wants_action, action_flag = args.apply, "--apply"
    if wants_action and not args.output:
        raise UsageError(f"{action_flag} needs --output FILE so the submitted render is kept")
    if args.target == "slurm" and (args.wait or args.wait_timeout is not None) and not args.submit:
        raise UsageError("--wait follows a submitted job", hint="add --submit")
    if args.target == "slurm" and args.wait_timeout is not None and args.wait_timeout < 1:
        raise UsageError(f"--wait-timeout must be at least 1 second, got {args.wait_timeout}")
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as err:
            raise UsageError(f"cannot write {args.output}: {err.strerror}") from err
        if args.target == "slurm":
            os.chmod(args.output, 0o755)
    if wants_action:
        if args.target == "slurm":
            import sys

            from torchrig.cluster import slurm

            job_id = slurm.submit(args.output)
            out = _output_of(job, job_id)
            logs = os.path.join(job.log_dir, job_id)
            submitted = f"job {job_id}"
            job_output = {"output": out, "logs": f"{logs}/node<N>/"}
            waiting = args.wait or args.wait_timeout is not None
            print(f"torchrig cluster: submitted job {job_id}" + ("; waiting for it to end" if waiting else ""),
                  file=sys.stderr)  # fmt: skip
            print(
                f"torchrig cluster: job {job_id} writes to {out} (per-node logs: {logs}/node<N>/)",
                file=sys.stderr,
            )
            if waiting:
                from torchrig.cluster import slurmjob

                outcome = slurmjob.wait(
                    job_id,
                    timeout_s=args.wait_timeout if args.wait_timeout is not None else DEFAULT_WAIT_S,
                    on_event=lambda e: print(f"torchrig cluster: job {job_id}: {e}", file=sys.stderr),
                )
        else:
            from torchrig.cluster import k8s

            submitted = k8s.apply(args.output)
    return ClusterReport(
        args.target,
        text,
        args.output,
        validation,
        submitted,
        job=jsonable(job),
        outcome=outcome,
        job_output=job_output,
    )
