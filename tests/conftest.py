"""Shared test helpers: run the real CLI in a subprocess, and skip GPU tests without CUDA; the run's
identity, its once-per-run builds and its leak check across pytest-xdist workers (``tests/runwide.py``).

Tests run in parallel and in a random order (``-n``/``--dist loadgroup`` in pyproject's addopts,
pytest-randomly). A test that needs a resource the workers cannot use at the same time (the Slurm
cluster, chromium, ...) declares it: ``@pytest.mark.xdist_group("slurm-cluster")`` puts every test of that
group on one worker, one after the other. Integration tests that share a module- or class-scoped fixture
(or a session fixture defined in their own module) are grouped by module here, so the fixture is built
once per run instead of once per worker. An expensive session fixture of a conftest is built once per run
with ``runwide.once`` (see the test image in ``tests/integration/conftest.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests' helper modules (runwide, fuzzkit)
import runwide

ROOT = Path(__file__).resolve().parents[1]

# A runner that starts pytest with SIGINT ignored (a background job of a non-interactive shell, some CI
# agents) passes the ignored disposition on through exec to every child, so a Ctrl-C a test sends would do
# nothing. A handler is reset to the default on exec: installing Python's own makes children start with
# SIGINT at its default again, as under a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def run_cli(*args: str, env: dict | None = None, timeout: float = 120, cwd: str | None = None) -> Run:
    """Run ``python -m torchrig ARGS`` as a user would, returning exit code, stdout and stderr."""
    full_env = dict(os.environ)
    full_env.pop("TORCHRIG_DEBUG", None)
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", "torchrig", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def cli_in_process(capsys):
    """``torchrig.cli.main(ARGS)`` in this process: its exit code, stdout and stderr, as :func:`run_cli` gives
    them, without a new interpreter. For a command whose answer is the question and that imports torch to
    give it (a new interpreter would pay seconds for the import and prove nothing more)."""

    def run(*args: str) -> Run:
        from torchrig.cli import main

        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return run


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _module_group(item) -> str | None:
    """The test's module, when it uses a fixture built once per module or class (or a session fixture its
    own module defines): all of the module's tests then go to one worker, which builds it once."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module_id = item.nodeid.split("::", 1)[0]
    for name in info.names_closure:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            scope = fixturedef.scope
            own = fixturedef.baseid == module_id or fixturedef.baseid.startswith(module_id + "::")
            if scope in ("module", "class", "package") or (scope == "session" and own):
                return module_id
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks and `-m` deselects
def pytest_collection_modifyitems(config, items):
    gpu_items = [i for i in items if "tests/gpu" in str(i.fspath) or i.get_closest_marker("gpu")]
    has_cuda = _has_cuda() if gpu_items else False  # no torch import for a run without GPU tests
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "tests/gpu" in str(item.fspath) or item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.gpu)
            if not has_cuda:
                item.add_marker(skip_gpu)
        elif "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("integration") and not item.get_closest_marker("xdist_group"):
            group = _module_group(item)
            if group:
                item.add_marker(pytest.mark.xdist_group(group))


# -- the run across its workers: identity, SIGTERM, clean-up and the leak check ------------------------------

TERMINATED = False
_PYTEST_PID = os.getpid()


def _worker_pids() -> list[int]:
    """(controller) the pids of this process's children: its xdist workers."""
    me = str(os.getpid())
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            pids.append(int(stat.parent.name))
    return pids


def _terminated(signum, frame):
    """SIGTERM (a CI time limit, `timeout`, a job stop) ends the run like Ctrl-C: fixtures are torn down and
    the leak check runs, instead of dying with every image and container in place. The controller passes
    it on to its workers and waits for them to finish (they tear their fixtures down, then it checks)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    if os.getpid() != _PYTEST_PID:  # a forked child of a test: die as it would have
        os.kill(os.getpid(), signal.SIGTERM)
        return
    global TERMINATED
    TERMINATED = True
    workers = _worker_pids() if _CONFIG is not None and _XDIST_CONTROLLER else []
    if workers:
        dsession = _CONFIG.pluginmanager.getplugin("dsession")
        if dsession is not None:
            # the run stops: no new tests, and a worker that the signal ends before it could report (one
            # still collecting) is not replaced by a fresh one
            dsession.shouldstop = "stopped by SIGTERM"
            dsession._max_worker_restart = 0
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        return  # the workers end interrupted (fixtures torn down); xdist then ends the run as interrupted
    raise KeyboardInterrupt("SIGTERM")


_XDIST_CONTROLLER = False
_CONFIG = None


@pytest.hookimpl(trylast=True)  # after pytest's tmp_path plugin: the shared folder is in its base temp
def pytest_configure(config):
    global _XDIST_CONTROLLER, _CONFIG
    _CONFIG = config
    runwide.set_identity(config)
    _XDIST_CONTROLLER = runwide.is_controller(config) and bool(getattr(config.option, "numprocesses", None))
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(controller, xdist) the run's identity goes to every worker."""
    runwide.pass_to_worker(node.config, node)


@pytest.hookimpl(
    trylast=True
)  # after the fixtures are torn down (and the workers ended), also when interrupted
def pytest_sessionfinish(session, exitstatus):
    """(controller) remove what was built once for the run, then the leak check: the run fails when a test
    left a container, volume or image behind."""
    config = session.config
    if not runwide.is_controller(config):
        return
    run = runwide.identity_of(config)
    if run is None:
        return
    held = runwide.run_at_end(run)
    out = config.get_terminal_writer()
    out.line()  # the progress line (dots, [100%]) has no end of line yet
    line = out.line
    swept = runwide.swept(run)
    if swept:
        line(f"leak check: removed what ended test sessions left: {', '.join(swept)}", yellow=True)
    left = runwide.leftovers(run, held)
    if left:
        what = "; ".join(f"{k}: {', '.join(v)}" for k, v in left.items())
        line(f"LEAK CHECK FAILED: tests left {what}", red=True)
        session.exitstatus = 1
    elif left is not None:
        line(f"leak check: no container, volume or image labelled {runwide.TEST_LABEL}={run.session_id} left")
    if TERMINATED:
        session.exitstatus = 128 + signal.SIGTERM


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The order's seed at the end too (the header that pytest-randomly writes it in is hidden by -q)."""
    seed = getattr(config.option, "randomly_seed", None)
    if runwide.is_controller(config) and isinstance(seed, int) and config.pluginmanager.hasplugin("randomly"):
        terminalreporter.write_line(f"random order: replay it with --randomly-seed={seed}")
