"""One lock per spec: ``team.toml`` and ``cpu.toml`` in one folder never share ``torchrig.lock.json``, and
a lock refuses a spec edited since its build (``up --spec`` would otherwise run the old image)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from torchrig.errors import SpecError
from torchrig.image.pipeline import lock_path, spec_digest
from torchrig.image.ref import image_of_spec


def _spec(cli, path: Path) -> Path:
    assert cli("init", "--variant", "cpu", "--python", "3.11", str(path)).code == 0
    return path


def _lock(spec: Path, tag: str, digest: str | None = None) -> None:
    doc = {"tags": [tag], "spec": {"file": spec.name, "sha256": digest or spec_digest(spec)}}
    lock_path(spec).write_text(json.dumps(doc))


def test_each_spec_has_its_own_lock(tmp_path):
    assert lock_path(tmp_path / "torchrig.toml") == tmp_path / "torchrig.lock.json"
    assert lock_path(tmp_path / "team.toml") == tmp_path / "team.lock.json"
    assert lock_path(tmp_path / "cpu.v2.toml") == tmp_path / "cpu.v2.lock.json"


def test_up_spec_runs_the_image_of_that_spec(cli, tmp_path):
    team, cpu = _spec(cli, tmp_path / "team.toml"), _spec(cli, tmp_path / "cpu.toml")
    _lock(cpu, "cpu/img:1")
    with pytest.raises(Exception, match=r"team\.toml has not been built yet"):
        image_of_spec(team, must_be_built=True)
    _lock(team, "team/pytorch:latest")
    assert image_of_spec(team, must_be_built=True) == "team/pytorch:latest"
    assert image_of_spec(cpu, must_be_built=True) == "cpu/img:1"


def test_a_spec_edited_since_its_build_is_refused(cli, tmp_path):
    team = _spec(cli, tmp_path / "team.toml")
    _lock(team, "team/pytorch:latest", hashlib.sha256(b"another spec").hexdigest())
    with pytest.raises(SpecError, match=r"changed since team\.lock\.json was written") as err:
        image_of_spec(team, must_be_built=True)
    assert "torchrig image build" in (err.value.hint or "")
    r = cli("up", "--spec", str(team), "--dry-run")
    assert r.code == 2 and "changed since team.lock.json" in r.err and "Traceback" not in r.err


def test_a_lock_without_a_spec_digest_is_still_read(tmp_path, cli):
    spec = _spec(cli, tmp_path / "torchrig.toml")
    (tmp_path / "torchrig.lock.json").write_text(json.dumps({"tags": ["old/img:1"]}))
    assert image_of_spec(spec, must_be_built=True) == "old/img:1"
