"""torchrig dashboard in a real headless browser (Debian's chromium and chromedriver, through Selenium),
against a real ledger and real environments on the real engine, with the recorded 8x H200 inventory.

Shown: the tables say what 'torchrig gpus --json' and 'torchrig ps --json' say; a lease taken by 'up'
appears within the refresh interval; the page needs the printed key; the viewer's own environment shows its
Jupyter token and another user's environment never does; from a "laptop" (a network namespace of its own,
reaching this host only over a veth pair), the one ``ssh -L`` line the page prints, run through a real sshd,
makes the page and its Jupyter link work in the laptop's Chromium.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import docblocks  # tests/docblocks.py
import userpython  # tests/userpython.py

# one chromium at a time (its memory on the 2-core CI machine)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("chromium")]
ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "tests/fixtures/runtime/inventory-8xh200.json"
BASE = "torchrig-test/debian:bookworm"
OTHER = f"trdash-{uuid.uuid4().hex[:8]}"  # one per run: runs on one host do not share it


def _browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(flag)
    from selenium.webdriver.chrome.service import Service

    return webdriver.Chrome(service=Service(driver), options=opts)


def _torchrig(args, env, **kw):
    return subprocess.run(
        [sys.executable, "-m", "torchrig", *args], env=env, capture_output=True, text=True, timeout=300, **kw
    )


@contextlib.contextmanager
def _dashboard(env, *extra, user=None):
    argv = ["-m", "torchrig", "dashboard", "--port", "0", "--interval", "1", "--no-doctor"]
    argv += ["--inventory", str(INVENTORY), *extra]
    if user:  # another Unix user: a python they may run, torchrig from this checkout
        python, pythonpath = user["python"], user["pythonpath"]
        keep = {k: env[k] for k in ("TORCHRIG_STATE_DIR", "TORCHRIG_GPU_INVENTORY")}
        keep.update(PYTHONPATH=pythonpath, HOME=user["home"], PATH="/usr/bin:/bin")
        full = ["runuser", "-u", user["name"], "--", "env", "-i", *(f"{k}={v}" for k, v in keep.items())]
        full += [python, *argv]
    else:
        full = [sys.executable, *argv]
    proc = subprocess.Popen(full, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "?key=" not in line:
            proc.wait(10)
            raise AssertionError(f"no URL printed: {line!r} {proc.stderr.read() if proc.stderr else ''}")
        yield line.split(": ", 1)[1].strip()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _rows(browser, table):
    """The table's cells as text, read in one script run (the refresh swaps the tables in at any time)."""
    return browser.execute_script(
        "const t = document.getElementById(arguments[0]); if (!t) return [];"
        "return [...t.rows].slice(1).map(r => [...r.cells].map(c => c.innerText));",
        table,
    )


def _wait(predicate, timeout_s=15.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.3)
    return False


@pytest.fixture
def env():
    """A ledger folder every user of this machine can reach (pytest's own tmp folder is root's alone)."""
    scratch = Path(tempfile.mkdtemp(prefix="trdash-"))
    scratch.chmod(0o755)
    state = scratch / "state"
    state.mkdir()
    # as a team server's admin sets the ledger up (docs/environments.md): setgid to the group its users share
    os.chown(state, -1, grp.getgrnam("docker").gr_gid)
    state.chmod(0o2775)
    yield {
        **os.environ,
        "TORCHRIG_STATE_DIR": str(state),
        "TORCHRIG_GPU_INVENTORY": str(INVENTORY),
        "SCRATCH": str(scratch),
    }
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def names(engine):
    made: list[str] = []
    yield made
    for n in made:
        with contextlib.suppress(Exception):
            engine.containers.get(n).remove(force=True)
        for v in engine.volumes.list(filters={"label": f"torchrig.workspace={n}"}):  # its kept /workspace
            with contextlib.suppress(Exception):
                v.remove(force=True)


def test_the_page_shows_what_gpus_and_ps_say_and_a_new_lease_appears(engine, env, names):
    browser = _browser()
    try:
        with _dashboard(env) as url:
            import urllib.request

            with pytest.raises(urllib.error.HTTPError) as denied:  # no key, no page
                urllib.request.urlopen(url.split("?")[0], timeout=10)
            assert denied.value.code == 403
            browser.get(url)
            assert "?key=" not in browser.current_url  # the key moved into a cookie
            assert (
                browser.execute_script("return document.getElementById('viewer').innerText")
                == pwd.getpwuid(os.getuid()).pw_name
            )
            gpus = json.loads(_torchrig(["gpus", "--json"], env).stdout)
            assert len(_rows(browser, "gpus")) == 8 == len(gpus["gpus"])
            assert all(r[6] == "free" for r in _rows(browser, "gpus"))

            name = f"trdash-{os.getpid()}"
            names.append(name)
            r = _torchrig(["up", "--image", BASE, "--name", name, "--gpus", "2", "--no-jupyter", "--no-ssh", "--create-only"], env)  # fmt: skip
            assert r.returncode == 0, r.stderr
            held = [g for g in json.loads(_torchrig(["gpus", "--json"], env).stdout)["gpus"] if g["holders"]]
            assert _wait(lambda: sum(name in row[6] for row in _rows(browser, "gpus")) == 2, timeout_s=10)
            shown = {row[0] for row in _rows(browser, "gpus") if name in row[6]}
            assert shown == {g["gpu"] for g in held} and len(held) == 2
            ps = json.loads(_torchrig(["ps", "--json"], env).stdout)["environments"]
            # the page is a snapshot taken every interval: one taken between the lease and the container
            # shows the GPUs held and no environment yet, so wait for the next one (a snapshot asks the engine
            # for every container: under CI's load, with images building beside it, 10 s was once too few)
            assert _wait(
                lambda: {e["name"] for e in ps} <= {row[0] for row in _rows(browser, "envs")}, timeout_s=30
            )
            page_envs = {row[0]: row for row in _rows(browser, "envs")}
            for e in ps:
                assert e["name"] in page_envs and page_envs[e["name"]][1] == e["user"]
    finally:
        browser.quit()


@pytest.fixture
def other_user(engine, env):
    """A second Unix user in the docker group (as 'ps' needs), with a python they may run and torchrig."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("needs root, useradd and runuser to make a second Unix user")
    subprocess.run(["userdel", "-r", OTHER], capture_output=True)
    subprocess.run(["useradd", "-m", OTHER], check=True)
    subprocess.run(["usermod", "-aG", "docker", OTHER], capture_output=True)
    scratch = Path(env["SCRATCH"])
    home = f"/home/{OTHER}"
    src = str(ROOT / "src")

    def runs(python, path):
        probe = ["runuser", "-u", OTHER, "--", "env", "-i", f"PYTHONPATH={path}", f"HOME={home}", python, "-c", userpython.probe_code()]  # fmt: skip
        return subprocess.run(probe, capture_output=True).returncode == 0

    python, path = sys.executable, src
    if not runs(python, path):  # this interpreter lives where the user may not go: the system's python
        python = shutil.which("python3", path="/usr/bin:/bin") or ""
        deps = scratch / "deps"
        userpython.copy_packages([*userpython.DOCKER_SDK, *userpython.runtime_modules()], deps)
        path = f"{src}:{deps}"
        if not python or not runs(python, path):
            subprocess.run(["userdel", "-r", OTHER], capture_output=True)
            pytest.skip("no python the second user can run torchrig with")
    yield {"name": OTHER, "python": python, "pythonpath": path, "home": home}
    subprocess.run(["userdel", "-r", OTHER], capture_output=True)


def test_only_the_viewer_sees_their_own_token(engine, env, names, test_image, other_user):
    name = f"trdash-tok-{os.getpid()}"
    names.append(name)
    r = _torchrig(["up", "--image", test_image, "--name", name, "--no-ssh"], env)
    assert r.returncode == 0, r.stderr
    token = r.stdout.split("token=", 1)[1].split()[0]
    browser = _browser()
    try:
        with _dashboard(env) as url:  # the owner: the link carries the token
            browser.get(url)
            assert _wait(lambda: token in browser.page_source)
        with _dashboard(env, user=other_user) as url:  # another user: never
            browser.delete_all_cookies()
            browser.get(url)
            assert browser.execute_script("return document.getElementById('viewer').innerText") == OTHER
            assert name in {row[0] for row in _rows(browser, "envs")}
            time.sleep(2.5)  # two refreshes
            assert token not in browser.page_source
            import urllib.request

            base = url.split("?")[0].rstrip("/")
            key = url.split("key=")[1]
            opener = urllib.request.build_opener(
                urllib.request.HTTPCookieProcessor()
            )  # keeps the key's cookie
            for path in ("/", "/fragment", "/state.json"):
                with opener.open(f"{base}{path}?key={key}", timeout=10) as resp:
                    assert token not in resp.read().decode()
    finally:
        browser.quit()


def test_a_long_name_wraps_and_the_links_work_from_the_page(engine, env, names, test_image):
    """A 63-character name (the most 'up' takes) keeps the "how to get in" column on screen in an 800 px
    window; the page prints the one ssh -L with the Jupyter port its link names; the link opens JupyterLab."""
    name = f"trdash-{os.getpid()}-".ljust(63, "x")
    names.append(name)
    home = Path(env["TORCHRIG_STATE_DIR"]).parent / "home"  # an ssh key of its own: the ssh column shows
    (home / ".ssh").mkdir(parents=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh/id_ed25519")], check=True
    )
    env = {**env, "HOME": str(home)}
    r = _torchrig(["up", "--image", test_image, "--name", name, "--json"], env)
    assert r.returncode == 0, r.stderr
    port = json.loads(r.stdout)["host_ports"]["jupyter"]
    browser = _browser()
    try:
        browser.set_window_size(800, 900)
        with _dashboard(env) as url:
            browser.get(url)
            assert _wait(lambda: name in {row[0] for row in _rows(browser, "envs")})
            fits = browser.execute_script(
                "const t = document.getElementById('envs'); const last = t.rows[0].cells[5];"
                "return [t.getBoundingClientRect().right, last.getBoundingClientRect().right,"
                " document.documentElement.clientWidth, document.documentElement.scrollWidth];"
            )
            table_right, column_right, width, scroll = fits
            assert column_right <= width and table_right <= width and scroll <= width, fits
            forward = browser.execute_script("return document.getElementById('forward').innerText")
            assert f"-L {port}:127.0.0.1:{port}" in forward, forward
            link = browser.execute_script(
                "return [...document.querySelectorAll('#envs a')].map(a => a.href).find(h => h.includes(':' + arguments[0] + '/'))",
                port,
            )
            assert link and "token=" in link, link
            browser.get(link)
            assert _wait(
                lambda: "JupyterLab" in browser.title or "jupyter" in browser.page_source.lower(), 30
            )
            browser.quit()
            browser = None
            # from the laptop, through a real sshd, in the laptop's own Chromium: docs/dashboard.md's ssh -L
            # of the dashboard's port alone gives the page but a dead Jupyter link; the one line the page
            # prints makes the link work
            node = "tests/integration/test_dashboard_browser.py::test_a_long_name_wraps_and_the_links_work_from_the_page"
            (block,) = docblocks.tested_by(ROOT / "docs" / "dashboard.md", node)
            ((doc_ssh, _),) = block.steps()
            dash = url.split("://", 1)[1].split("/")[0].rsplit(":", 1)[1]
            only = doc_ssh.replace("8265", dash).replace("gpu-server", shlex.split(forward)[-1])
            said = _from_a_laptop(url, only, port, Path(env["SCRATCH"]))
            assert "page: ok" in said and "jupyterlab: ok" not in said, said
            said = _from_a_laptop(url, forward, port, Path(env["SCRATCH"]))
            assert "page: ok" in said and "jupyterlab: ok" in said, said
    finally:
        if browser is not None:
            browser.quit()
        assert _torchrig(["down", "--volumes", name], env).returncode == 0


# Runs in the laptop's namespace: its Chromium opens the dashboard's URL (through the forwarded port), takes
# the Jupyter link of the environment on PORT from the page, and follows it.
LAPTOP_BROWSER = r"""
import shutil, sys, time
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
url, port = sys.argv[1], sys.argv[2]
opts = webdriver.ChromeOptions()
opts.binary_location = shutil.which("chromium")
for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
    opts.add_argument(flag)
b = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
try:
    b.get(url)
    link, end = None, time.monotonic() + 30
    while not link and time.monotonic() < end:
        link = b.execute_script(
            "return [...document.querySelectorAll('#envs a')].map(a => a.href)"
            ".find(h => h.includes(':' + arguments[0] + '/'))", port)
        time.sleep(0.3)
    print("page: ok" if link else "page: no link", flush=True)
    b.set_page_load_timeout(30)
    try:
        b.get(link)
    except Exception as err:  # a dead link: nothing listens on the laptop's end
        print(f"jupyterlab: {type(err).__name__}", flush=True)
        sys.exit(0)
    end = time.monotonic() + 60
    while "JupyterLab" not in b.title and time.monotonic() < end:
        time.sleep(0.5)
    print("jupyterlab: ok" if "JupyterLab" in b.title else f"jupyterlab: title {b.title!r}", flush=True)
finally:
    b.quit()
"""


def _run(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


def _from_a_laptop(url: str, forward: str, jupyter_port: int, scratch: Path) -> str:
    """Run the page's ssh -L line in a fresh network namespace (the laptop) against a private sshd on this
    host's end of a veth pair, then the laptop's Chromium on the page's URL; what the browser reported."""
    if not (shutil.which("ip") and Path("/usr/sbin/sshd").exists() and shutil.which("ssh")):
        pytest.skip("needs ip, sshd and ssh for the laptop")
    tag = uuid.uuid4().hex[:6]
    ns, host_if, laptop_if = f"trlap{tag}", f"trl{tag}h", f"trl{tag}l"
    net = f"10.213.{int(tag[:2], 16)}"  # a /30 of its own
    host_ip, laptop_ip = f"{net}.1", f"{net}.2"
    keys = scratch / f"laptop-{tag}"
    keys.mkdir()
    procs: list[subprocess.Popen] = []
    try:
        assert _run("ip", "netns", "add", ns).returncode == 0
        for argv in (
            ["ip", "link", "add", host_if, "type", "veth", "peer", "name", laptop_if],
            ["ip", "link", "set", laptop_if, "netns", ns],
            ["ip", "addr", "add", f"{host_ip}/30", "dev", host_if],
            ["ip", "link", "set", host_if, "up"],
            ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{laptop_ip}/30", "dev", laptop_if],
            ["ip", "netns", "exec", ns, "ip", "link", "set", laptop_if, "up"],
            ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
        ):
            r = _run(*argv)
            assert r.returncode == 0, (argv, r.stderr)
        for key in ("host", "client"):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / key))
        (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
        with socket.socket() as s:  # a free port on the host's end
            s.bind((host_ip, 0))
            sshd_port = s.getsockname()[1]
        (keys / "sshd_config").write_text(
            f"Port {sshd_port}\nListenAddress {host_ip}\nHostKey {keys / 'host'}\n"
            f"AuthorizedKeysFile {keys / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "AllowTcpForwarding yes\nPidFile none\n"
        )
        # OpenSSH's privilege-separation directory, which Debian's service unit makes at boot; a machine that
        # never started the ssh service has none
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        procs.append(subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(keys / "sshd_config")],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))  # fmt: skip
        sshd = procs[-1]
        if (
            not _wait(lambda: _connects(host_ip, sshd_port) or sshd.poll() is not None, 60)
            or sshd.poll() is not None
        ):
            if sshd.poll() is None:
                sshd.kill()
            said = sshd.communicate(timeout=10)[0].decode(errors="replace")[-2000:]
            raise AssertionError(f"the laptop's sshd did not start (exit {sshd.returncode}): {said}")
        # the printed line, as the laptop runs it: its destination is this host's end of the veth
        argv = shlex.split(forward)
        assert argv[0] == "ssh" and "@" in argv[-1], argv
        login = ["-p", str(sshd_port), "-i", str(keys / "client"), "-o", "BatchMode=yes",
                 "-o", "StrictHostKeyChecking=no", "-o", f"UserKnownHostsFile={keys / 'known_hosts'}",
                 "-o", "ExitOnForwardFailure=yes"]  # fmt: skip
        argv = [argv[0], *login, *argv[1:-1], f"{argv[-1].split('@')[0]}@{host_ip}"]
        # stdin held open: a line without -N keeps its (remote shell) session, and so its forward, while it is
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))  # fmt: skip
        dash_port = int(url.split("://", 1)[1].split("/")[0].rsplit(":", 1)[1])
        probe = ["ip", "netns", "exec", ns, "bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{dash_port}"]
        assert _wait(lambda: _run(*probe).returncode == 0, 20), "the forward did not come up"
        r = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", LAPTOP_BROWSER, url, str(jupyter_port)],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        return r.stdout + r.stderr[-2000:]
    finally:
        for proc in reversed(procs):
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        _run("ip", "netns", "del", ns)
        _run("ip", "link", "del", host_if)


def _connects(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0
