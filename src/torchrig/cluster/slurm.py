"""Render an sbatch script: one task per node, ``srun`` starting one launcher per node.

The launcher on every node is ``torchrig launch`` (torchrun underneath) with the c10d rendezvous hosted
on the first node of the allocation, so there is no separate rendezvous service to run. Options are the
ones `torchrig launch` takes on a single machine, so the same job moves from a box to a cluster unchanged.

Example::

    torchrig cluster slurm --nodes 2 --gpus-per-node 8 --partition gpu --time 04:00:00 -- train.py --lr 3e-4
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

from torchrig.cluster.job import ClusterJob, ContainerRuntime, NodeVar, Word, cat, launcher_argv
from torchrig.errors import EngineUnavailable, JobFailed, UsageError


def _sbatch_options(job: ClusterJob) -> list[tuple[str, str | None]]:
    opts: list[tuple[str, str | None]] = [
        ("job-name", job.name),
        ("nodes", str(job.nodes)),
        # One task per node: each task is a launcher that forks one worker per GPU itself.
        ("ntasks-per-node", "1"),
    ]
    if job.gpus_per_node:
        opts.append(("gpus-per-node", str(job.gpus_per_node)))
    if job.cpus_per_task:
        opts.append(("cpus-per-task", str(job.cpus_per_task)))
    if job.partition:
        opts.append(("partition", job.partition))
    if job.account:
        opts.append(("account", job.account))
    if job.time_limit:
        opts.append(("time", job.time_limit))
    # In the submit directory: sbatch does not create a missing directory for --output, and the job would
    # fail before its first line runs. Per-rank logs go under the log dir, which the launcher creates.
    opts.append(("output", "%x-%j.out"))
    # Slurm truncates the output file when it requeues a job (a lost node, preemption): appending keeps the
    # earlier runs' lines, the ones that say why the job was requeued.
    opts.append(("open-mode", "append"))
    # Whole nodes: a shared node would let another job take the NICs and GPUs NCCL expects.
    opts.append(("exclusive", None))
    return opts


def shell_word(word: Word) -> str:
    """One word for bash: literal text through ``shlex.quote``, a :class:`NodeVar` as ``"$NAME"``.

    The only expansions in a rendered script are of variables torchrig names; a ``$``, backquote or quote
    in a user's value stays literal text.
    """
    if isinstance(word, str):
        return shlex.quote(word)
    return "".join(shlex.quote(p) if isinstance(p, str) else f'"${{{p.name}}}"' for p in word)


def pyxis_image(ref: str) -> str:
    """An image reference as enroot/pyxis read it: ``[REGISTRY#]IMAGE[:TAG]`` or a squashfs path.

    ``registry.example/team/img:tag`` -> ``registry.example#team/img:tag``: enroot separates the registry
    with ``#`` (pyxis' ``--container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH``); without it the first
    component would be read as a Docker Hub namespace.
    """
    if "#" in ref or "://" in ref or ref.startswith(("/", "./", "../")):
        return ref
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return ref


def apptainer_image(ref: str) -> str:
    """A SIF path stays a path; a registry reference gets Apptainer's ``docker://`` scheme."""
    if "://" in ref or ref.startswith(("/", "./", "../")) or ref.endswith((".sif", ".simg")):
        return ref
    return f"docker://{ref}"


_PWD = NodeVar("PWD")  # the submit directory: sbatch starts the script there, srun runs each task there


def _srun_argv(job: ClusterJob) -> list[Word]:
    srun: list[Word] = ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1", f"--nodes={job.nodes}"]
    if job.container_runtime is ContainerRuntime.PYXIS:
        srun += [
            f"--container-image={pyxis_image(str(job.image))}",
            cat("--container-workdir=", _PWD),
            cat("--container-mounts=", _PWD, ":", _PWD, *(f",{m}" for m in job.container_mounts)),
        ]
    return srun


def _node_argv(job: ClusterJob) -> list[Word]:
    """What srun runs on each node: the launcher, inside Apptainer when asked."""
    job_id = NodeVar("SLURM_JOB_ID")
    inner = launcher_argv(
        job,
        nnodes=cat(NodeVar("SLURM_NNODES")),
        node_rank=cat(NodeVar("SLURM_NODEID")),
        endpoint=cat(NodeVar("RDZV_ENDPOINT")),
        rdzv_id=cat(job_id),
        # One folder per node: `torchrig launch` reads back the newest run folder of its log dir, which on
        # a shared filesystem could be another node's.
        log_dir=cat(job.log_dir, "/", job_id, "/node", NodeVar("SLURM_NODEID")),
    )
    if job.container_runtime is ContainerRuntime.APPTAINER:
        binds = cat(_PWD, *(f",{m}" for m in job.container_mounts))
        gpu: list[Word] = ["--nv"] if job.gpus_per_node else []
        inner = ["apptainer", "exec", *gpu, "--bind", binds, apptainer_image(str(job.image)), *inner]
    return inner


def _prefixed(launcher: str) -> str:
    """The node's bash program: the launcher, its output prefixed with the node's name."""
    return (
        "trap : TERM; set -o pipefail; "
        f"{launcher} 2>&1 | (trap '' TERM; exec sed -u \"s/^/[$SLURMD_NODENAME] /\")"
    )


def render_sbatch(job: ClusterJob) -> str:
    lines = [
        "#!/bin/bash",
        f"# Rendered by torchrig: {job.nodes} node(s) x {job.nproc_per_node} process(es).",
    ]
    for key, value in _sbatch_options(job):
        lines.append(f"#SBATCH --{key}" + (f"={value}" if value is not None else ""))
    lines += [
        "",
        "set -euo pipefail",
        f'mkdir -p -- {shlex.quote(job.log_dir)}/"$SLURM_JOB_ID"',
        "",
        "# The c10d rendezvous is hosted by the launcher on the first node of the allocation.",
        # No pipe into `head`: under pipefail, scontrol killed by SIGPIPE would fail the job.
        'nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "head_node=${nodes%%$'\\n'*}",
        f'export RDZV_ENDPOINT="$head_node:{job.rdzv_port}"',
        "",
        "# Environment of every rank: the defaults `torchrig launch` sets (torchrig.launch.envdefaults).",
    ]
    for var in job.environment():
        lines += [f"# {var.reason}", f"export {var.name}={shlex.quote(var.value)}"]
    # srun runs the command once per node; SLURM_NODEID differs per node, so it must be expanded there,
    # not in this batch shell: the node command is a bash program handed to `bash -c` on each node. It is
    # quoted twice, each time by shlex.quote: its words for the node's bash, the program for this one.
    launcher = " ".join(shell_word(w) for w in _node_argv(job))
    lines += [
        "",
        "# A requeued job (a lost node, preemption) appends to the same output: mark where its next run starts.",
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
        '    echo "=== torchrig: job $SLURM_JOB_ID was requeued by Slurm: run $((SLURM_RESTART_COUNT + 1)) starts'
        ' here ($(date -u +%Y-%m-%dT%H:%M:%SZ)); the lines above are from the earlier run(s) ==="',
        "fi",
        "",
        "# One launcher per node; node rank and rendezvous come from Slurm's variables on each node.",
        "# Per-rank logs: <log-dir>/$SLURM_JOB_ID/node<N>/; this script's output: <job-name>-<job-id>.out.",
        "# Each node's lines carry its name ([node0] ...). Slurm's stop (SIGTERM to every process of the step)",
        "# reaches the launcher; the node's bash and the prefixing sed outlive it to pass on its last lines",
        "# and its exit status (pipefail).",
        " ".join(shell_word(w) for w in _srun_argv(job)) + " \\",
        f"    bash -c {shlex.quote(_prefixed(launcher))}",
        "",
    ]
    return "\n".join(lines)


_SBATCH_LINE = re.compile(r"^#SBATCH\s+--([a-z-]+)(?:=(.*))?$")


def parse_sbatch_options(script: str) -> dict[str, str | None]:
    """Read the ``#SBATCH --key=value`` lines the way sbatch does: only before the first command."""
    opts: dict[str, str | None] = {}
    for line in script.splitlines():
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not stripped.startswith("#SBATCH")):
            continue
        if not stripped.startswith("#SBATCH"):
            break  # sbatch stops reading directives at the first command
        m = _SBATCH_LINE.match(stripped)
        if not m:
            raise UsageError(f"malformed sbatch directive: {stripped!r}")
        opts[m.group(1)] = m.group(2)
    return opts


def check_shell_syntax(script: str) -> None:
    """``bash -n``: a rendered script that bash cannot parse is a torchrig bug, raised as JobFailed."""
    bash = shutil.which("bash")
    if not bash:
        raise EngineUnavailable("bash is not installed", hint="install bash to syntax-check sbatch scripts")
    proc = subprocess.run([bash, "-n"], input=script, text=True, capture_output=True, timeout=30)
    if proc.returncode != 0:
        raise JobFailed(f"rendered sbatch script does not parse: {proc.stderr.strip().splitlines()[-1]}")


def submit(script_path: str) -> str:
    """Submit with sbatch; returns the job id."""
    sbatch = shutil.which("sbatch")
    if not sbatch:
        raise EngineUnavailable(
            "sbatch is not on PATH",
            hint=f"copy {script_path} to a Slurm login node and run: sbatch {script_path}",
        )
    proc = subprocess.run([sbatch, "--parsable", script_path], text=True, capture_output=True, timeout=60)
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines() or ["no output"]
        raise JobFailed(f"sbatch refused the job: {lines[-1][:400]}", hint=f"the script is {script_path}")
    return proc.stdout.strip().split(";")[0]
