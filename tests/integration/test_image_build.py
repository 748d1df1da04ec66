"""``torchrig image build`` on the real engine: tags, labels, the lock (in the image and beside the spec),
the size; a failing step with its log tail; and --ca-cert through this machine's TLS-intercepting proxy.
The session image comes from the default builder (BuildKit on this engine); the failing-step test pins the
classic builder (test_image_buildkit.py has BuildKit's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOST_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def test_build_reports_tags_size_and_lock(test_image_build, engine):
    r = test_image_build
    assert r["tags"][0] == "torchrig-test/pytorch:2.13.0-cpu-py3.11-runtime"
    assert r["tags"][1].startswith(r["tags"][0] + "-") and len(r["tags"]) == 2
    image = engine.images.get(r["tags"][0])
    assert image.id == r["image_id"] and r["size_bytes"] == image.attrs["Size"] > 100 * 2**20
    labels = image.labels
    assert labels["org.torchrig.torch"] == "2.13.0+cpu" and labels["org.torchrig.python"] == "3.11"
    assert labels["org.torchrig.services"] == "jupyter ssh" and labels["org.torchrig.cuda"] == "none"
    assert labels["org.torchrig.base.reference"].startswith("sha256:")
    lock = json.loads(Path(r["lock"]).read_text())
    assert Path(r["lock"]).parent == Path(r["spec_path"]).parent
    assert "torch==2.13.0+cpu" in lock["pip_freeze"] and "jupyterlab==4.6.6" in lock["pip_freeze"]
    assert any(p.startswith("openssh-server=") for p in lock["apt_packages"])
    assert any(p.startswith("tini=") for p in lock["apt_packages"])
    assert lock["base_reference"] == labels["org.torchrig.base.reference"]
    assert lock["constraints"] == ["torch==2.13.0+cpu"]


def test_image_has_no_baked_host_keys_or_wheelhouse(engine, test_image):
    out = engine.containers.run(
        test_image,
        ["sh", "-c", "ls /etc/ssh/ssh_host_* /tmp/wheelhouse 2>&1; cat /etc/torchrig/base-digest"],
        remove=True,
    ).decode()
    assert "No such file" in out and "ssh_host_ed25519_key\n" not in out
    assert out.strip().splitlines()[-1].startswith("sha256:")


def test_rebuild_with_the_same_inputs_hits_the_cache(test_image_build, image_build_cli):
    r = image_build_cli(
        Path(test_image_build["spec_path"]),
        "--wheelhouse",
        str(ROOT / ".ci-work" / "wheelhouse"),
        "--json",
        "--verbose",
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    again = json.loads(r.stdout)
    assert again["tags"][0] == test_image_build["tags"][0]
    assert again["builder"] == test_image_build["builder"]
    # every step up to torchrig's own layer is reused (torchrig's wheel is the only input that may change)
    steps = again["steps"]
    venv_steps = [s for s in steps if s["name"].split("] ", 1)[-1].startswith(("RUN", "COPY wheelhouse"))]
    assert len(venv_steps) >= 5, steps
    assert all(s["state"] == "cached" for s in venv_steps[:5]), steps
    assert again["elapsed_s"] < 180


def test_failing_step_shows_the_step_and_its_log(tmp_path, engine, wheelhouse, image_build_cli):
    spec = tmp_path / "torchrig.toml"
    spec.write_text(
        '[torch]\nversion = "2.13.0"\nvariant = "cpu"\n[packages]\napt = ["no-such-package-torchrig"]\n'
    )
    r = image_build_cli(spec, "--wheelhouse", str(wheelhouse), "--builder", "classic", timeout=600)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "build failed at Step 3/" in r.stderr and "apt-get install" in r.stderr
    assert "E: Unable to locate package no-such-package-torchrig" in r.stderr  # the log tail
    last = r.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("torchrig: error: image build failed at Step 3/")
        and "the step exited with status 100" in last
    )
    assert not (tmp_path / "torchrig.lock.json").exists()


@pytest.mark.skipif(not HOST_BUNDLE.exists(), reason="no host CA bundle")
def test_ca_cert_lets_pip_through_the_intercepting_proxy(tmp_path, engine, wheelhouse, image_build_cli):
    """Wheels for torch from the wheelhouse, one small package from PyPI: containers reach PyPI only through
    this machine's TLS-intercepting proxy, whose CA is in the host bundle, so pip needs --ca-cert."""
    spec = tmp_path / "torchrig.toml"
    spec.write_text(
        '[torch]\nversion = "2.13.0"\nvariant = "cpu"\n[packages]\npip = ["tomli-w==1.2.0"]\n'
        '[image]\nname = "torchrig-test/ca"\n'
    )  # the test image's services: its layers are reused
    common = ["--wheelhouse", str(wheelhouse), "--pip-index-url", "https://pypi.org/simple"]
    without = image_build_cli(spec, *common, timeout=900)
    if without.returncode == 0:
        pytest.skip("PyPI is reachable from containers without the proxy CA here: nothing to prove")
    assert without.returncode == 1 and "build failed at " in without.stderr
    r = image_build_cli(spec, *common, "--ca-cert", str(HOST_BUNDLE), "--json", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    tag = json.loads(r.stdout)["tags"][0]
    out = engine.containers.run(
        tag,
        [
            "python",
            "-c",
            "import tomli_w, os; print(tomli_w.dumps({'a': 1}).strip(), "
            "os.path.exists('/usr/local/share/torchrig/build-ca.crt'))",
        ],
        remove=True,
    )
    assert out.decode().split() == [
        "a",
        "=",
        "1",
        "False",
    ]  # installed; the build CA is not left in the image
