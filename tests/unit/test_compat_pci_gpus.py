"""Every NVIDIA GPU of compute capability >= 3.5 in the PCI ID database answers ``check --gpu NAME`` under each
name pci.ids gives it, with the compute capability of its chip (data/pci_gpus.json, tools/gen_pci_gpus.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchrig.cli import main
from torchrig.compat import load_kb
from torchrig.compat.gpunames import norm as _norm
from torchrig.compat.gpunames import pci_gpus
from torchrig.compat.gpunames import strip_prefixes as _strip_prefixes

ROOT = Path(__file__).resolve().parents[2]
DATA = json.loads((ROOT / "src" / "torchrig" / "data" / "pci_gpus.json").read_text())


def test_the_list_is_sourced_and_large():
    assert DATA["schema_version"] == 1 and "pci.ids" in DATA["source"] and DATA["verified"]
    assert all(r["source"].startswith("https://developer.nvidia.com/") for r in DATA["rules"])
    assert len(DATA["gpu"]) >= 400
    assert all(float(r["compute_capability"]) >= 3.5 for r in DATA["gpu"])


def test_every_name_answers_with_its_chips_compute_capability():
    kb = load_kb()
    clashes = 0
    wrong = []
    for row in DATA["gpu"]:
        for name in row["names"]:
            if _norm(name) not in pci_gpus() and _strip_prefixes(name) not in pci_gpus():
                clashes += 1  # two boards of different capability share the name: not answerable by name
                continue
            for spelling in (name, f"NVIDIA {name}", f"{row['chip']} [{name}]"):
                gpu = kb.find_gpu(spelling)
                if gpu.compute_capability != row["compute_capability"]:
                    wrong.append((spelling, gpu.name, gpu.compute_capability, row["compute_capability"]))
    assert not wrong, wrong[:10]
    assert clashes <= 5, clashes


@pytest.mark.parametrize(
    "name, sm",
    [
        ("GP104GL [Tesla P4]", "sm_61"),
        ("GeForce GTX 1650 Mobile", "sm_75"),
        ("RTX 5000 Ada Generation Laptop GPU", "sm_89"),
    ],
)
def test_check_answers_a_pci_name(capsys, name, sm):
    assert main(["check", "--gpu", name, "--torch", "2.5.0+cu121", "--json"]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"][0]["compute_capability"].replace(".", "") == sm[3:]


def test_the_generator_reproduces_the_file_when_pci_ids_is_installed():
    pci = Path("/usr/share/misc/pci.ids")
    if not pci.exists():
        pytest.skip("pci.ids not installed (apt-get install pci.ids)")
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_pci_gpus.py"), "--check"], capture_output=True
    )
    assert r.returncode == 0, "data/pci_gpus.json is not what tools/gen_pci_gpus.py writes from this pci.ids"
