"""torchrig launch on scripts nobody here wrote, on CPU ranks with gloo: each failure's summary names the exact
culprit, its cause and where, and the rank's last lines in the order written.

The scripts run unedited, each kept with its licence and a SOURCE.md under tests/fixtures/thirdparty/:
nanoGPT's bench.py (MIT) for an exception and the signals; Lightning Fabric's language-model example
(Apache-2.0) in DDP over gloo, as `fabric run --accelerator=cpu --strategy=ddp --devices=2` starts it, for the
SIGSTOP hang; Hydra's instantiate example (MIT), which runs in a directory of Hydra's own, for the script that
changes directory. Faults come from outside: a signal the test sends to a rank's pid (read from the rank's own
log header, as a user would read it), or an argument or config value the script rejects."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

FIX = Path(__file__).resolve().parents[1] / "fixtures"
NANOGPT = FIX / "thirdparty" / "nanogpt"
FABRIC_LM = FIX / "thirdparty" / "lightning_fabric_lm"
HYDRA_APP = FIX / "thirdparty" / "hydra_instantiate"
# what `fabric run --accelerator=cpu --strategy=ddp --devices=2` sets before it starts torchrun
FABRIC_DDP = [
    f"--env=LT_{k}" for k in ("CLI_USED=1", "ACCELERATOR=cpu", "STRATEGY=ddp", "DEVICES=2", "NUM_NODES=1")
]
# bench.py on the CPU, small enough for a loaded 2-core machine: fixed random data, no compile, and its
# profiler loop (15 steps, one "k/15 loss" line each; its other loop calls torch.cuda.synchronize())
BENCH = (
    "bench.py",
    "--device=cpu",
    "--dtype=float32",
    "--compile=False",
    "--real_data=False",
    "--profile=True",
    "--batch_size=1",
    "--block_size=16",
)
_PID_RE = re.compile(r"torchrig-worker: rank=(\d+) .*? pid=(\d+)")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")}
    env["TORCHRIG_CACHE_DIR"] = "/nonexistent-torchrig-test-cache"  # CPU runs never probe GPUs anyway
    return env


def nanogpt(tmp_path: Path) -> Path:
    """A copy of the nanoGPT files to run from (bench.py reads configurator.py from, and writes its profile
    to, the working directory)."""
    job = tmp_path / "nanogpt"
    job.mkdir()
    for f in ("bench.py", "model.py", "configurator.py"):
        (job / f).write_bytes((NANOGPT / f).read_bytes())
    return job


def start(log_dir: Path, *argv: str, cwd: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torchrig", "--json", "launch", "--cpu", "--nproc-per-node", "2"]
    cmd += ["--no-preflight", "--log-dir", str(log_dir), *argv]
    return subprocess.Popen(
        cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen, timeout: float = 400) -> tuple[dict, str]:
    """The launch's result and its console (stderr)."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 1, err[-3000:]
    return json.loads(out)["result"], err


def output_log(log_dir: Path, local_rank: int) -> Path | None:
    found = sorted(log_dir.glob(f"torchrig_*/attempt_0/{local_rank}/output.log"))
    return found[-1] if found else None


def wait_for(
    log_dir: Path, local_rank: int, pattern: str, proc: subprocess.Popen, timeout: float = 300
) -> int:
    """The rank's pid (from its log header) once its merged log holds a line matching ``pattern``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, f"the job ended first: {proc.communicate()[1][-3000:]}"
        path = output_log(log_dir, local_rank)
        text = path.read_text() if path else ""
        m = _PID_RE.search(text)
        if m and re.search(pattern, text, re.M):
            return int(m[2])
        time.sleep(0.5)
    raise AssertionError(f"rank {local_rank} never printed {pattern!r}")


def by_rank(summary: dict) -> dict[int, dict]:
    return {v["rank"]: v for v in summary["ranks"]}


def loss_lines(text: str) -> list[str]:
    return re.findall(r"^\S+ out\| (\d+/\d+ loss: \S+)$", text, re.M)


def test_an_argument_the_script_rejects_names_the_exception_and_the_scripts_line(tmp_path):
    job = nanogpt(tmp_path)
    r, console = finish(start(tmp_path / "logs", *BENCH, "--no_such_key=1", cwd=job))
    s = r["summary"]
    assert (
        s["likely_cause"]
        == "an uncaught exception in the script: ValueError: Unknown config key: no_such_key"
    )
    v = by_rank(s)
    culprits = [k for k, x in v.items() if x["role"] == "culprit"]
    assert culprits, s
    for k in culprits:
        # nanoGPT runs configurator.py through exec(): the script's own line is bench.py's exec line
        assert v[k]["where"] == f"{job}/bench.py:21 in <module>"
        assert v[k]["last_lines"][-1].endswith("ValueError: Unknown config key: no_such_key")
    # torchrun's own traceback and report (naming the shim, not the script) stay in its log, off the console
    assert "ChildFailedError" in Path(r["agent_log"]).read_text() and "ChildFailedError" not in console
    assert "torchrig/launch/worker.py" not in console  # the ranks' tracebacks start at the script, as plain


@pytest.mark.parametrize(
    ("sig", "status", "cause"),
    [
        (
            signal.SIGKILL,
            "killed by SIGKILL from outside the job: neither torchrun nor torchrig sent it",
            "the process was killed with SIGKILL",
        ),
        (
            signal.SIGTERM,
            "killed by SIGTERM from outside the job: neither torchrun nor torchrig sent it",
            "the rank was terminated with SIGTERM from outside the job",
        ),
        (signal.SIGSEGV, "killed by SIGSEGV", "the process crashed with a segmentation fault"),
    ],
    ids=["SIGKILL", "SIGTERM", "SIGSEGV"],
)
def test_a_signal_to_one_rank_names_it_the_signal_and_its_last_lines_in_order(tmp_path, sig, status, cause):
    job, logs = nanogpt(tmp_path), tmp_path / "logs"
    proc = start(logs, *BENCH, cwd=job)
    try:
        os.kill(wait_for(logs, 1, r"out\| 3/15 loss: ", proc), sig)
        r, _ = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    s = r["summary"]
    assert s["headline"] == f"rank 1 failed ({status})"
    assert s["likely_cause"].startswith(cause)
    v = by_rank(s)
    assert v[1]["role"] == "culprit" and v[1]["status"] == status
    assert (
        v[0]["role"] == "bystander"
        and v[0]["status"] == "stopped by torchrun (SIGTERM) because rank 1 failed first"
    )
    # the last lines are the rank's own, stdout and stderr merged in the order written: its last loss line
    # is the last line it wrote (the summary keeps the time stamp)
    written = loss_lines(output_log(logs, 1).read_text())
    last = v[1]["last_lines"]
    assert written and all(re.match(r"\d\d:\d\d:\d\d\.\d{3} ", ln) for ln in last)
    in_script = rf"{job}/(bench|model)\.py:\d+ in \S+"
    if sig == signal.SIGKILL:  # no stack: nothing runs in a SIGKILLed process
        assert last[-1].endswith(written[-1]) and v[1]["where"] is None
    elif sig == signal.SIGTERM:  # the shim's faulthandler dumped the stack where the signal hit
        assert last[-1].endswith(written[-1]) and re.fullmatch(in_script, v[1]["where"]), v[1]
    else:  # faulthandler's report comes after the last loss line; its dump gives the script's frame
        texts = [ln[13:] for ln in last]
        assert texts.index("Fatal Python error: Segmentation fault") > texts.index(written[-1])
        assert re.fullmatch(in_script, v[1]["where"]), v[1]


def fabric_lm(tmp_path: Path) -> Path:
    """Lightning's Fabric language-model example, with the text file its WikiText2 dataset reads from
    ``data/wikitext-2.txt`` under the working directory (it downloads one only where none is there): random
    sentences over a 50-word vocabulary, 180k words (the script splits off 4,000 blocks of 35 for validation
    and test)."""
    job = tmp_path / "fabric_lm"
    (job / "data").mkdir(parents=True)
    (job / "train.py").write_bytes((FABRIC_LM / "train.py").read_bytes())
    rng = random.Random(0)
    words = [f"w{i}" for i in range(50)]
    lines = (" ".join(rng.choice(words) for _ in range(30)) for _ in range(6000))
    (job / "data" / "wikitext-2.txt").write_text("\n".join(lines) + "\n")
    return job


def test_a_rank_stopped_in_ddp_is_the_culprit_and_the_rank_in_backward_the_victim(tmp_path):
    """SIGSTOP to rank 1 of Lightning Fabric's language-model example in DDP on two CPU ranks: its training
    loop's collectives are DDP's (the gradient all-reduce; once, the buckets' order), so rank 0 waits in one,
    mostly inside backward(). After
    --stopped-grace the launcher stops the job on the evidence of the collectives (rank 1's process state,
    rank 0's flight record) and names rank 1, not rank 0."""
    job, logs = fabric_lm(tmp_path), tmp_path / "logs"
    proc = start(
        logs, "--stopped-grace", "10", "--env", "TORCH_FR_BUFFER_SIZE=2000", *FABRIC_DDP, "train.py", cwd=job
    )
    pid = None
    try:
        wait_for(logs, 0, r"out\| epoch: 0 - iteration: 0 - loss", proc)  # after both ranks' first backward
        pid = wait_for(logs, 1, r"torchrig-worker", proc)
        os.kill(pid, signal.SIGSTOP)
        r, _ = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert r["stopped_by"] == "stopped-rank", r
    s = r["summary"]
    assert (
        s["headline"]
        == "hang: rank 1 never arrived at the collective that rank 0 wait(s) in (rank 1 stopped by a signal)"
    ), s
    assert s["likely_cause"].startswith(
        "rank 1 was stopped by a signal (SIGSTOP or SIGTSTP; its process state is T: a debugger, a job manager "
        "or 'kill -STOP'), so it never reaches the collective the others wait in; flight record: "
    ), s["likely_cause"]
    v = by_rank(s)
    assert v[1]["role"] == "culprit" and v[1]["status"].startswith("stopped by a signal"), s
    assert v[0]["role"] == "victim", s
    # the script's own frame: the backward call in its training loop; or, where rank 1 stopped before its second
    # forward, the model call, where DDP rebuilds its gradient buckets at the second iteration and broadcasts
    # the new order to every rank (a collective outside backward(); a CI run saw it)
    assert (v[0]["status"], v[0]["where"]) in (
        (
            "hung: waiting in a collective inside backward() (DDP's gradient all-reduce)",
            f"{job}/train.py:41 in train_epoch",
        ),
        ("hung: waiting in a collective", f"{job}/train.py:39 in train_epoch"),
    ), v[0]
    assert r["flight"]["culprits"] == [1] and r["flight"]["waiting"] == [0], r["flight"]
    assert s["evidence"].startswith("rank 1 (pid "), s["evidence"]
    assert "flight records: " in s["evidence"], s["evidence"]


@pytest.mark.parametrize("full_error", [False, True], ids=["hydra-compact-error", "HYDRA_FULL_ERROR=1"])
def test_a_script_that_changes_directory_changes_nothing(tmp_path, full_error):
    """Hydra's instantiate example: ``@hydra.main`` changes into ``outputs/DATE/TIME`` before the app runs, and
    a config value the app cannot take (``+db.port=...``, a keyword its class lacks) fails it there. With a
    relative --log-dir the summary still names the exception and the script's own line: from the rank's error
    file in the (absolute) log folder. By default Hydra catches the exception, prints one message without a
    traceback and exits 1 (the worker records the exception it caught); with HYDRA_FULL_ERROR=1 it re-raises."""
    job = tmp_path / "hydra_app"
    shutil.copytree(HYDRA_APP, job, ignore=shutil.ignore_patterns("LICENSE", "SOURCE.md"))
    env = ["--env", "HYDRA_FULL_ERROR=1"] if full_error else []
    r, _ = finish(start(Path("logs"), *env, "my_app.py", "+db.port=3307", cwd=job))
    s = r["summary"]
    exc = """TypeError("MySQLConnection.__init__() got an unexpected keyword argument 'port'")"""
    if full_error:
        assert s["likely_cause"] == f"an uncaught exception in the script: {exc}"
    else:
        assert s["likely_cause"] == (
            "an exception in the script, which the script (or a framework it uses) caught before it exited "
            f"with status 1: {exc}"
        )
    # both ranks fail and exit 1, but torchrun stops the other rank as soon as it sees one fail: the other then
    # failed too (before, or while exiting: its error file written, its cause still its own exception, with no
    # exit status) or, stopped before it got that far, it is a bystander: nothing says it would have failed
    culprits = [v for v in s["ranks"] if v["role"] == "culprit"]
    bystanders = [v for v in s["ranks"] if v["role"] != "culprit"]
    assert culprits and len(s["ranks"]) == 2, s
    if bystanders:
        (first,), (other,) = culprits, bystanders
        assert s["headline"] == f"rank {first['rank']} failed (exit 1)", s["headline"]
        assert other["role"] == "bystander", other
        assert (
            other["status"] == f"stopped by torchrun (SIGTERM) because rank {first['rank']} failed first"
        ), other
    else:
        assert s["headline"] in (
            "rank 0, rank 1 failed (exit 1)",
            *(
                f"rank {a} failed (exit 1); rank {b} failed as well, stopped by torchrun while exiting"
                for a, b in ((0, 1), (1, 0))
            ),
        ), s["headline"]
    for v in culprits:
        assert v["where"] == f"{job}/my_app.py:36 in my_app", v
        assert v["status"] in (
            "exit 1",
            f"failed by itself, then stopped by torchrun (SIGTERM) while exiting because rank {1 - v['rank']} "
            "failed first",
        ), v
        assert v["cause"] in (s["likely_cause"], s["likely_cause"].replace(" with status 1: ", ": ")), v
        assert (Path(r["run_dir"]) / "attempt_0" / str(v["rank"]) / "error.json").is_file()
    assert r["run_dir"].startswith(str(job / "logs"))
    assert list(job.glob("outputs/*/*/.hydra/config.yaml"))  # the ranks did run in Hydra's output folder
