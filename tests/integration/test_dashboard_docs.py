"""docs/dashboard.md's start command as the page writes it, on the fixed port it names.

Tests run side by side, so no test may take a fixed port of this machine: the command runs in a network
namespace of its own (``unshare --net``, root), whose loopback only it uses. The page's URL is fetched there
with the printed key, and the page answers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import docblocks  # tests/docblocks.py

pytestmark = pytest.mark.integration
ROOT = docblocks.ROOT
NODE = "tests/integration/test_dashboard_docs.py::test_the_dashboard_starts_as_the_page_says"

# Runs in the namespace: loopback up, the page's command through bash, its first line, the URL fetched.
IN_NETNS = r"""
import subprocess, sys, time, urllib.request, http.cookiejar
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
proc = subprocess.Popen(["bash", "-c", sys.argv[1]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
try:
    line = proc.stdout.readline()
    print(line, end="", flush=True)
    url = line.split(": ", 1)[1].strip()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with opener.open(url, timeout=30) as page:
        print(f"page {page.status} {len(page.read())} bytes")
finally:
    proc.terminate()
    proc.wait(timeout=30)
"""


def test_the_dashboard_starts_as_the_page_says(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("needs root, unshare and ip (a network namespace of the test's own)")
    (block,) = [b for b in docblocks.tested_by(ROOT / "docs" / "dashboard.md", NODE)]
    ((cmd, shown),) = block.steps()
    home = tmp_path / "home"
    home.mkdir()
    shutil.copytree(ROOT / "tests" / "fixtures" / "bench" / "h200x1-run1" / "bench", home / "bench-results")
    env = dict(os.environ, HOME=str(home), TORCHRIG_STATE_DIR=str(tmp_path / "state"))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    r = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", IN_NETNS, cmd],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert not docblocks.missing(r.stdout, shown, {r"dashboard for \S+:": "dashboard for USER:"}), r.stdout
    assert "page 200" in r.stdout, r.stdout
