"""torchrig's own wheel (what ``image build`` installs in the image) from a venv made by ``python3 -m venv``
with nothing added: an old setuptools (or none) and no ``wheel``. The build backend comes from an isolated
build environment; a failure names pip's first error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

BUILD = """
import sys, tempfile
from pathlib import Path
from torchrig.errors import TorchrigError
from torchrig.image.context import build_torchrig_wheel
try:
    print(build_torchrig_wheel(Path(tempfile.mkdtemp())).name)
except TorchrigError as err:
    print(err.one_line(), file=sys.stderr)
    sys.exit(2)
"""


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    """``python3 -m venv`` + ``pip install -e`` of this checkout, as the README's quick start does."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    have = subprocess.run(
        [str(py), "-c", "import importlib.util as u; print(u.find_spec('wheel') is not None)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert have.stdout.strip() == "False"  # the case of the issue: no `wheel` in a fresh venv
    r = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "-e", str(ROOT)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return py


def test_a_fresh_venv_builds_torchrigs_wheel(fresh_venv):
    r = subprocess.run([str(fresh_venv), "-c", BUILD], capture_output=True, text=True, timeout=600, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().startswith("torchrig-") and r.stdout.strip().endswith(".whl")


def test_a_failed_wheel_build_names_its_cause(fresh_venv):
    """No index reachable for the isolated build environment: the error says so (pip's last line would
    say only "No matching distribution found" or "See above for details")."""
    env = dict(
        os.environ,
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL="http://127.0.0.1:9/simple",
        PIP_EXTRA_INDEX_URL="",
        PIP_FIND_LINKS="",
        PIP_RETRIES="1",  # one "Retrying ... Connection refused" warning is enough
    )
    r = subprocess.run(
        [str(fresh_venv), "-c", BUILD], capture_output=True, text=True, timeout=600, cwd="/", env=env
    )
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "in an isolated build environment failed: Connection refused" in line, line
    assert "See above" not in line and "--torchrig-dist" in line


def test_builds_at_once_do_not_collide_and_leave_the_checkout_alone(tmp_path):
    """Two image builds at once (two users, or parallel tests) used to share setuptools' build/ folder in
    the checkout: one of them failed with 'File exists'. Each now builds from a copy of the source."""
    import concurrent.futures

    from torchrig.image.context import build_torchrig_wheel

    before = sorted(p.name for p in ROOT.iterdir())
    outs = [tmp_path / str(i) for i in range(3)]
    for out in outs:
        out.mkdir()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        wheels = list(pool.map(build_torchrig_wheel, outs))
    assert [w.parent for w in wheels] == outs and all(w.stat().st_size > 0 for w in wheels)
    assert sorted(p.name for p in ROOT.iterdir()) == before
