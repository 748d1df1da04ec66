"""A newcomer's journey, end to end, as the README tells it, on the real engine with its stock configuration.

From a copy of this checkout: the README's quick-start command, exactly as the README writes it (a venv made
by ``python3 -m venv`` with nothing added, ``pip install -e '.[all]'``, ``torchrig install`` (the CPU build
here, installed for real and verified), ``torchrig doctor`` exiting 0); then, with that
venv's ``torchrig`` only: resolve without a GPU → init → image build (the local base image and a local
wheelhouse: no registry is reachable here; torch's layers come from the session test image's build cache)
→ up with no extra flags but a workspace volume → Jupyter answers 200 with the token and 403 without → ssh
with the printed command → inside: ``import torch, numpy``, ``pip install`` a small package, ``torchrig
train`` a tiny model on the CPU, a file written to the workspace → down → up → the file is there and ssh
works with StrictHostKeyChecking=yes → down → nothing left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
BASE = os.environ.get("TORCHRIG_TEST_BASE", "torchrig-test/debian:bookworm")
SMALL_WHEEL = "tqdm"  # a small pure-Python package the image does not have


def quick_start_command() -> str:
    """The first command of the README's quick start (the one that runs doctor)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the README's quick start has no bash block"
    first = block.group(1).strip().splitlines()[0]
    assert "torchrig install" in first and "torchrig doctor" in first, first
    return first


def _copy_checkout(dest: Path) -> Path:
    ignore = shutil.ignore_patterns(
        ".git", ".venv", ".ci-work", "__pycache__", "*.egg-info", ".dev-*", ".gl", ".whl"
    )
    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)
    return dest


def _run(argv, *, cwd=None, env=None, timeout=900, check_rc=None):
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check_rc is not None:
        assert r.returncode == check_rc, (
            f"{shlex.join(map(str, argv))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        )
    return r


def _ssh(printed: str, key: Path, known_hosts: Path, remote: str, strict: str = "yes"):
    argv = shlex.split(printed)
    extra = [
        "-i",
        str(key),
        "-o",
        "BatchMode=yes",
        "-o",
        f"StrictHostKeyChecking={strict}",
        "-o",
        "ConnectTimeout=10",
    ]
    if not any(a.startswith("UserKnownHostsFile") for a in argv):
        extra += ["-o", f"UserKnownHostsFile={known_hosts}"]
    return subprocess.run([argv[0], *extra, *argv[1:], remote], capture_output=True, text=True, timeout=300)


def _wait_ssh(printed, key, known_hosts, timeout_s=60.0):
    end = time.monotonic() + timeout_s
    r = None
    while time.monotonic() < end:
        r = _ssh(printed, key, known_hosts, "true")
        if r.returncode == 0:
            return r
        time.sleep(1)
    return r


@pytest.fixture
def leftovers(engine):
    """Whatever the journey makes is removed, whatever happens: containers, volumes, images."""
    made = {"containers": [], "volumes": [], "images": []}
    yield made
    for n in made["containers"]:
        with contextlib.suppress(Exception):
            engine.containers.get(n).remove(force=True)
    for v in made["volumes"]:
        with contextlib.suppress(Exception):
            engine.volumes.get(v).remove(force=True)
    for i in made["images"]:
        with contextlib.suppress(Exception):
            engine.images.remove(i, force=True)


@pytest.mark.session_image_cache
def test_the_newcomers_journey(engine, wheelhouse, tmp_path, leftovers, request):
    import requests

    tag = f"journey{os.getpid()}"
    checkout = _copy_checkout(tmp_path / "torchrig")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check_rc=0)
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "TORCHRIG_STATE_DIR")
    }
    env.update(HOME=str(home), TORCHRIG_STATE_DIR=str(tmp_path / "state"))
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)

    # 1. The README's quick start, as written: a fresh venv, torchrig, 'torchrig install' (no GPU here: the
    #    CPU build, installed for real, verified with an op), doctor healthy: exit 0.
    started = time.monotonic()
    quick = _run(["bash", "-c", quick_start_command()], cwd=checkout, env=env, timeout=1800)
    assert quick.returncode == 0, quick.stdout[-3000:] + quick.stderr[-3000:]
    assert "Traceback" not in quick.stdout + quick.stderr
    venv_bin = checkout / ".venv" / "bin"
    assert "verify: torch.ones(2).add(1).sum(): ok" in quick.stdout, quick.stdout[-3000:]
    assert "healthy" in quick.stdout.splitlines()[-1], quick.stdout[-3000:]  # doctor's verdict, last
    r = _run([str(venv_bin / "python"), "-c", "import torch; print(torch.__version__)"], env=env, check_rc=0)
    assert r.stdout.strip().endswith("+cpu"), r.stdout
    torchrig = [str(venv_bin / "torchrig")]
    print(f"journey: quick start {time.monotonic() - started:.0f} s")

    # 2. resolve without a GPU: the CPU build for this machine.
    r = _run([*torchrig, "resolve", "--json"], env=env, check_rc=0)
    assert "cpu" in json.dumps(r.stdout)

    # 3. init and image build (the wheelhouse's torch; the local base image).
    work = tmp_path / "project"
    work.mkdir()
    _run(
        [*torchrig, "init", "--torch", "2.13.0", "--variant", "cpu", "--python", "3.11"],
        cwd=work,
        env=env,
        check_rc=0,
    )
    spec = work / "torchrig.toml"
    text = spec.read_text()
    spec.write_text(re.sub(r'(?m)^name = "[^"]*/[^"]*"$', f'name = "torchrig-journey/{tag}"', text))
    # init's spec renders the session test image's stages (the same torch, Python, services and user): once
    # that image is built (it started building when the run began, while the quick start ran), the build
    # below takes its torch and tools layers from the engine's cache instead of installing torch again
    session = request.getfixturevalue("test_image_build")
    started = time.monotonic()
    b = _run([*torchrig, "image", "build", str(spec), "--base", BASE, "--wheelhouse", str(wheelhouse), "--json"],
             cwd=work, env=env, timeout=1800)  # fmt: skip
    assert b.returncode == 0, b.stderr[-4000:]
    built = json.loads(b.stdout)
    leftovers["images"].extend(built["tags"])
    image = built["tags"][0]
    print(f"journey: image build {time.monotonic() - started:.0f} s")
    before = engine.images.get(session["image_id"]).attrs["RootFS"]["Layers"]
    after = engine.images.get(built["image_id"]).attrs["RootFS"]["Layers"]
    shared = len([1 for x, y in zip(before, after, strict=False) if x == y])
    assert shared >= 4, (before, after)  # base, apt, torch, tools: the session image's, as they are

    # 4. up with no extra flags (the engine's stock limits), a named workspace volume.
    name, volume = f"journey-{os.getpid()}", f"journey-ws-{os.getpid()}"
    leftovers["containers"].append(name)
    leftovers["volumes"].append(volume)
    up_args = [
        *torchrig,
        "up",
        "--image",
        image,
        "--name",
        name,
        "--volume",
        f"{volume}:/home/torch/work",
        "--json",
    ]
    up = _run(up_args, env=env, timeout=600)
    assert up.returncode == 0, up.stderr[-3000:]
    res = json.loads(up.stdout)
    url, ssh = res["jupyter_url"], res["ssh_command"]
    known_hosts = home / ".ssh" / "known_hosts"
    known_hosts.write_text(res["known_hosts_line"].rstrip("\n") + "\n")

    # 5. Jupyter: the token works, and no token is refused.
    base, token = url.split("/lab?token=")
    assert requests.get(f"{base}/api/status", params={"token": token}, timeout=30).status_code == 200
    assert requests.get(f"{base}/api/status", timeout=30).status_code == 403

    # 6. ssh with the printed command and strict host-key checking.
    r = _wait_ssh(ssh, key, known_hosts)
    assert r is not None and r.returncode == 0, r.stderr if r else "no ssh"

    # 7. Ordinary work inside: torch with numpy, pip install (torch stays pinned), train, a file kept.
    r = _ssh(ssh, key, known_hosts, "python -c 'import torch, numpy; print(torch.ones(2).numpy().sum())'")
    assert r.returncode == 0 and r.stdout.strip() == "2.0", r.stderr
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheels), SMALL_WHEEL], check_rc=0)  # fmt: skip
    wheel = next(wheels.glob("*.whl"))
    port = shlex.split(ssh)[shlex.split(ssh).index("-p") + 1]
    user_host = shlex.split(ssh)[-1]
    opts = ["-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}"]  # fmt: skip
    alias = [a for a in shlex.split(ssh) if a.startswith("HostKeyAlias=")]
    opts += ["-o", alias[0]] if alias else []
    _run(["scp", *opts, "-P", port, str(wheel), f"{user_host}:work/"], check_rc=0, timeout=120)
    r = _ssh(ssh, key, known_hosts, f"pip install -q --no-index ~/work/{wheel.name} && python -c 'import tqdm, torch; print(torch.__version__)'")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("2.13.0+cpu")
    r = _ssh(ssh, key, known_hosts, "torchrig train --device cpu --model gpt --size tiny --steps 4 --workers 0 --log-every 2 --out ~/work/run --json")  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = _ssh(ssh, key, known_hosts, "test -s ~/work/run/summary.json && echo kept > ~/work/kept.txt")
    assert r.returncode == 0, r.stderr

    # 8. down, up again: the workspace is there, and the host key is the same one.
    _run([*torchrig, "down", "--volumes", name], env=env, check_rc=0)
    again = _run(up_args, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    ssh = json.loads(again.stdout)["ssh_command"]
    r = _wait_ssh(ssh, key, known_hosts)
    assert r is not None and r.returncode == 0, r.stderr if r else "no ssh"
    r = _ssh(ssh, key, known_hosts, "cat ~/work/kept.txt")
    assert r.returncode == 0 and r.stdout.strip() == "kept", r.stderr
    _run([*torchrig, "down", "--volumes", name], env=env, check_rc=0)
    assert not engine.containers.list(all=True, filters={"name": f"^{name}$"}, ignore_removed=True)
