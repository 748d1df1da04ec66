"""The suite's own machinery (tests/runwide.py, tests/conftest.py): a fixture built once per run whatever the
number of worker processes, a failed build reported to the others instead of repeated, and the README's test
command being the one `.ci/run` runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

# a worker of the run: asks for the same thing at the same time as the others, prints what it got
WORKER = """
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import runwide

run = runwide.RunIdentity("abc", "host:1", Path({shared!r}))

def build():
    with open(Path({shared!r}) / "builds.txt", "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    time.sleep(1)  # long enough for the others to be waiting on the lock
    if {fail!r}:
        raise RuntimeError("the engine said no")
    return {{"image_id": "sha256:1234", "built_by": os.getpid()}}

try:
    print(json.dumps(runwide.once(run, "test-image", build)))
except RuntimeError as err:
    print(json.dumps({{"error": str(err)}}))
"""


def _workers(shared: Path, n: int, fail: bool = False) -> list[dict]:
    code = WORKER.format(tests=str(TESTS), shared=str(shared), fail=fail)
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(n)
    ]
    return [json.loads(p.communicate(timeout=60)[0]) for p in procs]


def test_a_fixture_is_built_once_for_all_workers_of_a_run(tmp_path):
    got = _workers(tmp_path, 3)
    assert len((tmp_path / "builds.txt").read_text().split()) == 1
    assert got[0] == got[1] == got[2] and got[0]["image_id"] == "sha256:1234"


def test_a_failed_build_is_not_repeated_by_the_other_workers(tmp_path):
    got = _workers(tmp_path, 3, fail=True)
    assert len((tmp_path / "builds.txt").read_text().split()) == 1
    assert all("the engine said no" in g["error"] for g in got), got
    assert sum("built once for the run and failed there" in g["error"] for g in got) == 2


def test_what_a_run_registers_is_removed_at_its_end(tmp_path):
    sys.path.insert(0, str(TESTS))
    import runwide

    run = runwide.RunIdentity("abc", "host:1", tmp_path)
    made = tmp_path / "venv"
    (made / "bin").mkdir(parents=True)
    runwide.at_end(run, "path", str(made))
    runwide.run_at_end(run)
    assert not made.exists() and not (tmp_path / "at-end.jsonl").exists()


def test_the_readme_names_the_command_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    block = readme.split("The test command that `.ci/run` ends with is:", 1)[1]
    command = block.split("```bash\n", 1)[1].split("\n```", 1)[0].strip()
    assert ci[-1] == command
    assert 'python3 -m pytest -m "not integration"' in readme  # the fast layer, for contributors
