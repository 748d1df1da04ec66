"""No input becomes code: property tests of the Slurm and Kubernetes renders (hypothesis).

For arbitrary text in each field and argument, ``torchrig cluster`` either refuses it with a one-line error
(exit 2) or writes a render that, run the way its engine runs it, hands every value through byte for byte
and runs nothing else:

- sbatch: the script runs under bash with a PATH of recording stubs only (``srun`` records its argv and
  runs its command as one task of node 0 would; ``scontrol``, ``torchrig``, ``apptainer``, ``python3``
  record theirs), with the variables Slurm sets. The launcher must receive exactly its command; no other
  program may run (bash would say ``command not found``: there is nothing else on PATH).
- Kubernetes: the pod's ``command`` + ``args`` are expanded as the kubelet expands them (``$(NAME)`` from the
  container's ``env``, itself expanded in order), then exec'd directly, as the kubelet does, with the stub
  ``torchrig`` first on PATH.

Bounded in time: each property runs a fixed number of examples (``MAX_EXAMPLES``), no deadline per example
(the machine may be slow).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchrig.cli import main
from torchrig.cluster import k8s, slurm

yaml = pytest.importorskip("yaml")

MAX_EXAMPLES = int(os.environ.get("TORCHRIG_PROPERTY_EXAMPLES", "40"))
SETTINGS = settings(
    max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
# Characters that mean something to bash, to sbatch, to YAML or to the kubelet, mixed into arbitrary text.
META = "$`'\"\\;|&()<>{}[]*?~!#%^=:,./- \t\n\r\x00\x1b" + "aZ09_é字"
TEXT = st.one_of(st.text(max_size=24), st.text(alphabet=META, max_size=24))
# Near-valid values too, so that the accepting path is exercised as often as the refusing one.
NAMEISH = st.one_of(TEXT, st.from_regex(r"[a-z0-9][-a-z0-9._]{0,12}[a-z0-9]", fullmatch=True))
PATHISH = st.one_of(
    TEXT, st.builds(lambda a: f"/{a}", TEXT), st.builds(lambda a, b: f"/{a}:/{b}", TEXT, TEXT)
)
ARGS = st.lists(TEXT, max_size=5)

STUB = """#!/bin/bash
printf '%s\\0' "$@" > "$RECORD/{name}"
/usr/bin/env -0 > "$RECORD/{name}.env"
"""
SRUN = """#!/bin/bash
printf '%s\\0' "$@" > "$RECORD/srun"
while [[ $# -gt 0 && $1 == --* ]]; do shift; done
SLURM_NODEID=0 exec "$@"
"""
SCONTROL = """#!/bin/bash
printf '%s\\0' "$@" > "$RECORD/scontrol"
echo node0
echo node1
"""


@pytest.fixture(scope="module")
def stubs(tmp_path_factory) -> Path:
    """A directory that is the whole PATH: recording stubs, and the tools the script itself uses."""
    bin_dir = tmp_path_factory.mktemp("stub-bin")
    for name in ("torchrig", "apptainer", "python3"):
        (bin_dir / name).write_text(STUB.format(name=name))
    (bin_dir / "srun").write_text(SRUN)
    (bin_dir / "scontrol").write_text(SCONTROL)
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    for tool in ("bash", "mkdir", "sed"):
        real = shutil.which(tool)
        assert real, tool
        (bin_dir / tool).symlink_to(real)
    return bin_dir


@dataclass
class Outcome:
    code: int
    out: str
    err: str


def torchrig(*argv: str) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return Outcome(code, out.getvalue(), err.getvalue())


def assert_one_line_error(r: Outcome) -> None:
    assert r.code == 2, r
    assert r.err.startswith("torchrig: error: ") and r.err.count("\n") == 1, r.err
    assert "Traceback" not in r.err and r.out == ""


def read_argv(path: Path) -> list[str]:
    data = path.read_bytes()
    assert data.endswith(b"\0") or data == b""
    return [w.decode("utf-8") for w in data.split(b"\0")[:-1]]


def read_env(path: Path) -> dict[str, str]:
    env = {}
    for item in read_argv(path):
        key, _, value = item.partition("=")
        env[key] = value
    return env


def run_sbatch_script(stubs: Path, script: Path, work: Path) -> dict[str, list[str]]:
    """Run the script as sbatch would (bash, in the submit directory, with Slurm's variables); the argv of
    every program that ran."""
    record = work / "record"
    record.mkdir()
    env = {"PATH": str(stubs), "RECORD": str(record), "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_NNODES": "2", "HOME": str(work)}  # fmt: skip
    proc = subprocess.run(
        [str(stubs / "bash"), str(script)], cwd=work, env=env, capture_output=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stderr == b"", (
        proc.returncode,
        proc.stderr.decode(errors="replace"),
    )
    ran = {p.name: read_argv(p) for p in record.iterdir() if not p.name.endswith(".env")}
    ran["env"] = list(read_env(next(record.glob("*.env"))).items()) if list(record.glob("*.env")) else []
    return ran


@dataclass
class SlurmCase:
    flags: list[str]
    script: str
    args: list[str]


def slurm_render(stubs: Path, case: SlurmCase) -> tuple[Outcome, dict[str, list[str]] | None, str]:
    with tempfile.TemporaryDirectory(prefix="tr-sbatch-") as tmp:
        work = Path(tmp)
        out = work / "job.sbatch"
        r = torchrig("cluster", "slurm", "--nodes", "2", "--gpus-per-node", "0", *case.flags,
                     "-o", str(out), "--", case.script, *case.args)  # fmt: skip
        if r.code != 0:
            assert_one_line_error(r)
            return r, None, ""
        text = out.read_text()
        return r, run_sbatch_script(stubs, out, work), text


def check_launcher(ran: dict, case: SlurmCase, *, log_dir: str = "torchrig-logs") -> list[str]:
    """The one launcher that ran received the user's command and the node's values, byte for byte."""
    launchers = [n for n in ("torchrig", "apptainer", "python3") if n in ran]
    assert launchers == ["torchrig"] or launchers == ["apptainer"], ran
    argv = ran[launchers[0]]
    if launchers[0] == "apptainer":
        argv = argv[argv.index("torchrig") + 1 :]
    assert argv[-len(case.args) - 2 :] == ["--", case.script, *case.args]
    assert argv[argv.index("--log-dir") + 1] == f"{log_dir}/4242/node0"
    for flag, value in (("--nnodes", "2"), ("--node-rank", "0"), ("--rdzv-endpoint", "node0:29500"),
                        ("--rdzv-id", "4242")):  # fmt: skip
        assert argv[argv.index(flag) + 1] == value
    assert set(ran) <= {"srun", "scontrol", "torchrig", "apptainer", "env"}, ran
    return argv


@SETTINGS
@given(script=TEXT, args=ARGS)
def test_sbatch_command_arguments_pass_through(stubs, script, args):
    case = SlurmCase([], script, args)
    _r, ran, _ = slurm_render(stubs, case)
    if ran is not None:
        check_launcher(ran, case)


@SETTINGS
@given(flag=st.sampled_from(["--partition", "--account", "--time", "--name"]), value=NAMEISH)
def test_sbatch_directives_are_names_or_refused(stubs, flag, value):
    case = SlurmCase([f"{flag}={value}"], "train.py", ["--lr", "$(id)"])
    _r, ran, text = slurm_render(stubs, case)
    if ran is None:
        return
    key = {"--time": "time", "--name": "job-name"}.get(flag, flag[2:])
    assert slurm.parse_sbatch_options(text)[key] == value  # sbatch reads back exactly the value
    check_launcher(ran, case)


@SETTINGS
@given(log_dir=TEXT, env_value=TEXT, env_name=st.one_of(st.just("MY_VAR"), TEXT), cpus=st.integers(-3, 4))
def test_sbatch_log_dir_env_and_cpus(stubs, log_dir, env_value, env_name, cpus):
    case = SlurmCase([f"--log-dir={log_dir}", f"--env={env_name}={env_value}", f"--cpus-per-task={cpus}"],
                     "train.py", [])  # fmt: skip
    _r, ran, text = slurm_render(stubs, case)
    if ran is None:
        return
    assert cpus >= 1 and slurm.parse_sbatch_options(text)["cpus-per-task"] == str(cpus)
    check_launcher(ran, case, log_dir=log_dir)
    assert dict(ran["env"])[env_name] == env_value


@SETTINGS
@given(runtime=st.sampled_from(["pyxis", "apptainer"]), image=NAMEISH, mounts=st.lists(PATHISH, max_size=2))
def test_sbatch_container_image_and_mounts(stubs, runtime, image, mounts):
    flags = [f"--container={image}", f"--container-runtime={runtime}", *(f"--mount={m}" for m in mounts)]
    case = SlurmCase(flags, "train.py", ["a b"])
    _r, ran, _ = slurm_render(stubs, case)
    if ran is None:
        return
    check_launcher(ran, case)
    srun = ran["srun"]
    if runtime == "pyxis":
        mount_opt = next(w for w in srun if w.startswith("--container-mounts="))
        assert mount_opt.split(",")[1:] == mounts
        assert f"--container-image={slurm.pyxis_image(image)}" in srun
    else:
        app = ran["apptainer"]
        assert app[app.index("--bind") + 1].split(",")[1:] == mounts
        assert app[app.index("--bind") + 2] == slurm.apptainer_image(image)


def test_sbatch_examples_from_the_issue(stubs):
    """The injections of the report: a newline in --partition, $(...) in an argument, a mount, a log dir."""
    for flag in ("--partition=gpu\ntouch /tmp/pwned", "--account=ml\nid", "--name=x\ny"):
        r, ran, _ = slurm_render(stubs, SlurmCase([flag], "t.py", []))
        assert ran is None and "is not" in r.err
    case = SlurmCase(["--log-dir=logs$(id)"], "t.py", ["$(touch /tmp/pwned)", '"', "`id`", "${HOME}", "'"])
    r, ran, _ = slurm_render(stubs, case)
    assert ran is not None
    check_launcher(ran, case, log_dir="logs$(id)")


# ---- Kubernetes: the pod command as the kubelet runs it

NODE_VARS = {  # what the operator / the Job controller set in each pod, per kind
    "pytorchjob": {"PET_NODE_RANK": "0", "PET_MASTER_ADDR": "master-0", "PET_MASTER_PORT": "23456"},
    "job": {"JOB_COMPLETION_INDEX": "0"},
    "jobset": {"JOB_COMPLETION_INDEX": "0"},
}


def pod_containers(doc: dict) -> list[dict]:
    if doc["kind"] == "PyTorchJob":
        return [r["template"]["spec"]["containers"][0] for r in doc["spec"]["pytorchReplicaSpecs"].values()]
    if doc["kind"] == "Job":
        return [doc["spec"]["template"]["spec"]["containers"][0]]
    if doc["kind"] == "JobSet":
        return [doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]]
    return []


def run_as_kubelet(stubs: Path, container: dict, node_vars: dict[str, str]) -> tuple[list[str], dict]:
    """Expand env (in order), then command and args, as the kubelet does; exec the result without a shell."""
    env: dict[str, str] = dict(node_vars)
    for var in container["env"]:
        env[var["name"]] = k8s.kubelet_expand(var["value"], env)
    argv = [k8s.kubelet_expand(w, env) for w in container["command"] + container.get("args", [])]
    with tempfile.TemporaryDirectory(prefix="tr-pod-") as tmp:
        full_env = {**env, "PATH": str(stubs), "RECORD": tmp}
        proc = subprocess.run(argv, env=full_env, capture_output=True, timeout=60, cwd=tmp)
        assert proc.returncode == 0, proc.stderr
        assert sorted(os.listdir(tmp)) == ["torchrig", "torchrig.env"]
        return read_argv(Path(tmp) / "torchrig"), read_env(Path(tmp) / "torchrig.env")


def k8s_render(*flags: str, kind: str, script: str = "train.py", args: tuple[str, ...] = ()) -> Outcome:
    return torchrig("cluster", "k8s", f"--kind={kind}", "--nodes", "2", "--gpus-per-node", "0", *flags,
                    "--", script, *args)  # fmt: skip


def check_pods(
    stubs: Path, r: Outcome, kind: str, script: str, args: list[str], log_dir: str, env: dict
) -> None:
    assert r.code == 0, r.err
    for doc in yaml.safe_load_all(r.out):
        for container in pod_containers(doc):
            argv, seen_env = run_as_kubelet(stubs, container, NODE_VARS[kind])
            assert argv[-len(args) - 2 :] == ["--", script, *args]
            name = doc["metadata"]["name"]
            assert argv[argv.index("--log-dir") + 1] == f"{log_dir}/{name}/node0"
            assert argv[argv.index("--node-rank") + 1] == "0"
            for key, value in env.items():
                assert seen_env[key] == value


KINDS = st.sampled_from(["pytorchjob", "job", "jobset"])


@SETTINGS
@given(kind=KINDS, script=TEXT, args=ARGS, log_dir=TEXT, env_value=TEXT)
def test_pod_command_arguments_pass_through(stubs, kind, script, args, log_dir, env_value):
    r = k8s_render("--image=img:1", f"--log-dir={log_dir}", f"--env=MY_VAR={env_value}", kind=kind,
                   script=script, args=tuple(args))  # fmt: skip
    if r.code != 0:
        assert_one_line_error(r)
        return
    check_pods(stubs, r, kind, script, args, log_dir, {"MY_VAR": env_value})


@SETTINGS
@given(
    kind=KINDS,
    flag=st.sampled_from(["--namespace", "--name", "--image", "--shm-size", "--volume"]),
    value=st.one_of(NAMEISH, PATHISH.map(lambda v: v[1:])),
)
def test_k8s_fields_are_valid_or_refused(stubs, kind, flag, value):
    flags = [f"{flag}={value}"] + ([] if flag == "--image" else ["--image=img:1"])
    r = k8s_render(*flags, kind=kind, args=("$(PET_NODE_RANK)", "$$"))
    if r.code != 0:
        assert_one_line_error(r)
        return
    docs = list(yaml.safe_load_all(r.out))  # validated against the schemas before it was printed
    if flag == "--namespace":
        assert {d["metadata"]["namespace"] for d in docs} == {value}
    check_pods(stubs, r, kind, "train.py", ["$(PET_NODE_RANK)", "$$"], "torchrig-logs", {})


def test_kubelet_expansion_port():
    """The port follows expand.go's cases (kubernetes/kubernetes third_party/forked/golang/expansion)."""
    env = {"A": "x", "B": "$(A)"}
    assert k8s.kubelet_expand("$(A)-$(B)-$(C)", env) == "x-$(A)-$(C)"  # no recursion; unknown kept
    assert k8s.kubelet_expand("$$(A) $$ $x $( $", env) == "$(A) $ $x $( $"
    assert k8s.kubelet_expand(k8s.kubelet_literal("$(A)$$ $"), env) == "$(A)$$ $"


def test_k8s_examples_from_the_issue(stubs):
    args = ["$(touch /tmp/pwned)", 'a"b', "`id`", "$(PET_NODE_RANK)"]
    r = k8s_render("--image=img:1", kind="pytorchjob", args=tuple(args))
    check_pods(stubs, r, "pytorchjob", "train.py", args, "torchrig-logs", {})
    for flag in ("--namespace=Bad_NS", "--namespace=" + "a" * 64, "--name=x\ny", "--image=img:1 $(id)"):
        assert_one_line_error(k8s_render(flag, *([] if "image" in flag else ["--image=img:1"]), kind="job"))
