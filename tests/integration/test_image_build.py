"""``torchrig image build`` on the real engine: tags, labels, the lock (in the image and beside the spec),
the size; a failing step with its log tail; and --ca-cert through this machine's TLS-intercepting proxy.
The session image comes from the default builder (BuildKit on this engine); the failing-step test pins the
classic builder (test_image_buildkit.py has BuildKit's)."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest

import docblocks  # tests/docblocks.py

ROOT = Path(__file__).resolve().parents[2]
HOST_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def test_build_reports_tags_size_and_lock(test_image_build, engine, test_labels):
    r = test_image_build
    assert r["tags"][0] == "torchrig-test/pytorch:2.13.0-cpu-py3.11-runtime"
    assert r["tags"][1].startswith(r["tags"][0] + "-") and len(r["tags"]) == 2
    # the content tag (the stack tag moves to the image of whichever session on this engine built last)
    image = engine.images.get(r["tags"][1])
    assert image.id == r["image_id"] and r["size_bytes"] == image.attrs["Size"] > 100 * 2**20
    labels = image.labels
    # $TORCHRIG_LABELS reached the image: the session's leak check finds it by them
    assert {k: labels.get(k) for k in test_labels} == test_labels
    assert labels["org.torchrig.torch"] == "2.13.0+cpu" and labels["org.torchrig.python"] == "3.11"
    assert labels["org.torchrig.services"] == "jupyter ssh" and labels["org.torchrig.cuda"] == "none"
    assert labels["org.torchrig.base.reference"].startswith("sha256:")
    lock = json.loads(Path(r["lock"]).read_text())
    assert Path(r["lock"]).parent == Path(r["spec_path"]).parent
    assert "torch==2.13.0+cpu" in lock["pip_freeze"] and "jupyterlab==4.6.6" in lock["pip_freeze"]
    assert any(p.startswith("openssh-server=") for p in lock["apt_packages"])
    assert any(p.startswith("tini=") for p in lock["apt_packages"])
    assert lock["base_reference"] == labels["org.torchrig.base.reference"]
    # the constraints are torch's install as it resolved: torch and every package it brought, nothing else
    names = {line.split("==")[0].lower() for line in lock["constraints"]}
    assert "torch==2.13.0+cpu" in lock["constraints"] and {"filelock", "sympy", "networkx"} <= names
    assert not names & {"numpy", "jupyterlab", "tqdm"}
    # torch (with what it brought), the tools, the torchrig wheel: separate layers, torch the big one
    layers = r["layers"]
    # docker history names a COPY --from by its paths: the venv (torch), then each stage's /opt/layer/
    torch_layer = next(x for x in layers if x["created_by"].startswith("COPY /opt/venv /opt/venv"))
    tools_layer = next(x for x in layers if x["created_by"].startswith("COPY /opt/layer/ /opt/venv/"))
    assert torch_layer["size_bytes"] > 500 * 2**20 > tools_layer["size_bytes"] > 20 * 2**20
    apt_layer = layers[1]  # the os stage's apt layer, on the base's: no apt caches in it
    assert apt_layer["created_by"].startswith("RUN set -eux;") and apt_layer["size_bytes"] < 120 * 2**20


def test_an_added_package_reships_only_itself(
    test_image_build, engine, wheelhouse, image_build_cli, tmp_path
):
    """The same spec plus one small pip package: every layer of the test image up to the venv's is reused
    as it is (same digests), and the new package comes in a small layer of its own."""
    spec = tmp_path / "torchrig.toml"
    text = Path(test_image_build["spec_path"]).read_text()
    spec.write_text(
        text.replace('name = "torchrig-test/pytorch"', 'name = "torchrig-test/pytorch-tqdm"')
        + '\n[packages]\npip = ["tqdm"]\n'
    )
    r = image_build_cli(spec, "--wheelhouse", str(wheelhouse), "--json", timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    added = json.loads(r.stdout)
    try:
        before = engine.images.get(test_image_build["image_id"]).attrs["RootFS"]["Layers"]
        after = engine.images.get(added["image_id"]).attrs["RootFS"]["Layers"]
        shared = len([1 for a, b in zip(before, after, strict=False) if a == b])
        assert shared >= 4, (before, after)  # base, apt, torch, tools
        new = [x for x in added["layers"] if x["created_by"].startswith("COPY /opt/layer/ /opt/venv/")]
        assert len(new) == 2 and new[1]["size_bytes"] < 5 * 2**20, added["layers"]  # tools, then tqdm
        out = engine.containers.run(
            added["image_id"], ["python", "-c", "import tqdm; print(tqdm.__version__)"], remove=True
        )
        assert out.decode().strip()
    finally:  # by ID: its tags only, never a stack tag another session's build has since taken
        engine.images.remove(added["image_id"], force=True)


def test_no_setuid_binaries_and_no_apt_caches(engine, test_image):
    out = engine.containers.run(
        test_image,
        [
            "sh",
            "-c",
            "find / -xdev -perm /6000 -type f; find /var/lib/apt/lists /var/cache/apt -type f ! -name lock; echo end",
        ],
        remove=True,
    ).decode()
    assert out.split() == ["end"], out


def test_no_private_key_in_any_layer(engine, test_image):
    """``docker save`` of the image, every file of every layer read: no PEM/OpenSSH private key anywhere
    (the SSH host keys are made per container, never built in; --ca-cert refuses key files)."""
    import re
    import tarfile

    # a whole PEM/OpenSSH key block (binaries such as ssh-keygen hold the marker strings alone)
    key = re.compile(
        rb"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----\r?\n(?:[A-Za-z0-9+/=:, -]*\r?\n)+?-----END \1PRIVATE KEY-----"
    )
    # public test fixtures shipped inside Python packages' own test suites (tornado's wheel carries the key
    # its TLS tests use): known to everyone, so not secrets; any other key fails the test
    package_tests = re.compile(r"^opt/venv/lib/python3\.\d+/site-packages/[^/]+/tests?/")
    found: list[str] = []
    layers = 0

    class Stream:  # a file object over the engine's save stream, for tarfile's stream mode
        def __init__(self, chunks):
            self.chunks, self.buf = iter(chunks), b""

        def read(self, n: int = -1) -> bytes:
            while n < 0 or len(self.buf) < n:
                try:
                    self.buf += next(self.chunks)
                except StopIteration:
                    break
            out, self.buf = (self.buf, b"") if n < 0 else (self.buf[:n], self.buf[n:])
            return out

    with tarfile.open(
        fileobj=Stream(engine.images.get(test_image).save(chunk_size=1 << 20)), mode="r|"
    ) as outer:
        for member in outer:
            if not member.isfile() or member.name.endswith((".json", "VERSION", "repositories")):
                continue
            try:
                inner = tarfile.open(fileobj=outer.extractfile(member), mode="r|")  # noqa: SIM115
            except tarfile.ReadError:  # not a layer
                continue
            layers += 1
            with inner:
                for entry in inner:
                    if entry.isfile() and entry.size < 1 << 20:
                        data = inner.extractfile(entry).read()  # type: ignore[union-attr]
                        if key.search(data) and not package_tests.match(entry.name):
                            found.append(entry.name)
    assert layers >= 5
    assert found == [], found


def test_image_has_no_baked_host_keys_or_wheelhouse(engine, test_image):
    out = engine.containers.run(
        test_image,
        ["sh", "-c", "ls /etc/ssh/ssh_host_* /tmp/wheelhouse 2>&1; cat /etc/torchrig/base-digest"],
        remove=True,
    ).decode()
    assert "No such file" in out and "ssh_host_ed25519_key\n" not in out
    assert out.strip().splitlines()[-1].startswith("sha256:")


def test_rebuild_with_the_same_inputs_hits_the_cache(test_image_build, tmp_path):
    """docs/images.md's real render and build, as the page writes them, in a folder holding the page's spec
    (the session image's): the render is the page's, and the build reuses every layer up to torchrig's own
    and prints the lines the page shows (sizes, times, hashes and paths are this build's)."""
    node = "tests/integration/test_image_build.py::test_rebuild_with_the_same_inputs_hits_the_cache"
    (block,) = docblocks.tested_by(ROOT / "docs" / "images.md", node)
    (tmp_path / "torchrig.toml").write_text(Path(test_image_build["spec_path"]).read_text())
    (tmp_path / ".ci-work").symlink_to(ROOT / ".ci-work")
    (render, render_shown), (build, build_shown) = block.steps()
    r = docblocks.run(render, tmp_path)
    assert r.returncode == 0 and not docblocks.missing(r.stdout, render_shown), r.stdout[-3000:] + r.stderr
    r = docblocks.run(build, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    vary = {
        r"\([\d,]+ MiB, \d+ s, (\w+), \d+ steps, \d+ cached\)": r"(SIZE, \1, STEPS)",
        r"runtime-[0-9a-f]{10}\b": "runtime-HASH",
        r"sha256:[0-9a-f]{64}": "sha256:ID",
        r"lock\s+\S+": "lock PATH",
    }
    assert not docblocks.missing(r.stdout + r.stderr, build_shown, vary), r.stdout + r.stderr[-3000:]
    said = f"{r.stdout}\n{r.stderr}"
    built = re.search(r"^built (\S+) +\([\d,]+ MiB, (\d+) s, (\w+), \d+ steps", said, re.M)
    assert built, said[-3000:]
    assert built.group(1) == test_image_build["tags"][0] and built.group(3) == test_image_build["builder"]
    # every step up to torchrig's own layer is reused (torchrig's wheel is the only input that may change)
    venv_steps = re.findall(r"step \d+/\d+: (CACHED )?\[[\w-]+\] (?:RUN|COPY wheelhouse)", said)
    assert len(venv_steps) >= 4 and all(venv_steps[:4]), said[-3000:]
    assert int(built.group(2)) < 180
    assert (tmp_path / "torchrig.lock.json").is_file()


def test_failing_step_shows_the_step_and_its_log(
    tmp_path, engine, stand_in_wheelhouse, image_build_cli, remove_classic_intermediates
):
    wheelhouse = stand_in_wheelhouse  # the build stops at apt: torch's wheels would only fill the context
    spec = tmp_path / "torchrig.toml"
    spec.write_text(
        '[torch]\nversion = "2.13.0"\nvariant = "cpu"\n[packages]\napt = ["no-such-package-torchrig"]\n'
    )
    # -v: the log names the images of the steps before the failing one, which the classic builder keeps
    r = image_build_cli(spec, "--wheelhouse", str(wheelhouse), "--builder", "classic", "-v", timeout=600)
    remove_classic_intermediates(engine, r.stderr.splitlines())
    assert r.returncode == 1, r.stderr[-3000:]
    assert "build failed at Step 3/" in r.stderr and "apt-get install" in r.stderr
    *above, last = r.stderr.strip().splitlines()
    cause = "Unable to locate package no-such-package-torchrig"  # apt's, in the log tail above the error line
    assert any(cause in line for line in above), r.stderr[-3000:]
    assert (
        last.startswith("torchrig: error: image build failed at Step 3/")
        and "the step exited with status 100" in last
    )
    assert not (tmp_path / "torchrig.lock.json").exists()


@pytest.mark.skipif(not HOST_BUNDLE.exists(), reason="no host CA bundle")
def test_ca_cert_lets_pip_through_the_intercepting_proxy(
    tmp_path, engine, stand_in_wheelhouse, image_build_cli
):
    """Torch from a wheelhouse, one small package from PyPI: containers reach PyPI only through this
    machine's TLS-intercepting proxy, whose CA is in the host bundle, so pip needs --ca-cert. The question
    is the CA, not torch: a stand-in torch wheel keeps each build to seconds (a real one took minutes)."""
    wheelhouse = stand_in_wheelhouse
    spec = tmp_path / "torchrig.toml"
    spec.write_text(
        '[torch]\nversion = "2.13.0"\nvariant = "cpu"\n[packages]\npip = ["tomli-w==1.2.0"]\n'
        '[services]\njupyter = false\nssh = false\n[image]\nname = "torchrig-test/ca"\n'
    )  # no services: the only package pip asks PyPI for is tomli-w (JupyterLab's ~80 would take many minutes)
    common = ["--wheelhouse", str(wheelhouse), "--pip-index-url", "https://pypi.org/simple"]
    without = image_build_cli(spec, *common, timeout=900)
    if without.returncode == 0:
        pytest.skip("PyPI is reachable from containers without the proxy CA here: nothing to prove")
    assert without.returncode == 1 and "build failed at " in without.stderr
    # the one-line error names the cause (pip's last line would be "No matching distribution found")
    last = without.stderr.strip().splitlines()[-1]
    assert "its first error: certificate verify failed" in last and "--ca-cert" in last, last
    r = image_build_cli(spec, *common, "--ca-cert", str(HOST_BUNDLE), "--json", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    built = json.loads(r.stdout)
    try:
        out = engine.containers.run(
            built["image_id"],
            [
                "python",
                "-c",
                "import tomli_w, os; print(tomli_w.dumps({'a': 1}).strip(), "
                "os.path.exists('/usr/local/share/torchrig/build-ca.crt'))",
            ],
            remove=True,
        )
    finally:  # the image goes with the test, by ID (every tag on it)
        with contextlib.suppress(Exception):
            engine.images.remove(built["image_id"], force=True)
    assert out.decode().split() == [
        "a",
        "=",
        "1",
        "False",
    ]  # installed; the build CA is not left in the image
