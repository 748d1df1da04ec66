"""A GPU that exists only on Arm hosts (Grace Hopper, Grace Blackwell, DGX Spark) implies linux-aarch64 unless
--platform says otherwise, and the answer says it inferred it."""

from __future__ import annotations

import json

import pytest

from torchrig.cli import main
from torchrig.compat import load_kb
from torchrig.compat.evaluate import infer_platform
from torchrig.compat.platforms import Platform


@pytest.fixture(scope="module")
def kb():
    return load_kb()


@pytest.mark.parametrize("name", ["GH200", "NVIDIA GB200", "NVIDIA GB300", "DGX Spark", "NVIDIA GB10"])
def test_grace_and_spark_gpus_imply_aarch64_and_say_so(kb, name):
    plat, note = infer_platform([kb.find_gpu(name)], None, Platform("linux-x86_64"))
    assert plat.id == "linux-aarch64"
    assert note and "inferred" in note and "--platform" in note


def test_given_platform_and_an_aarch64_host_are_not_overridden(kb):
    gh = kb.find_gpu("GH200")
    assert infer_platform([gh], Platform("linux-x86_64"), Platform("linux-x86_64")) == (
        Platform("linux-x86_64"),
        None,
    )
    assert infer_platform([gh], None, Platform("linux-aarch64")) == (Platform("linux-aarch64"), None)
    h100 = kb.find_gpu("H100")  # exists on both: this machine's
    assert infer_platform([h100], None, Platform("linux-x86_64")) == (Platform("linux-x86_64"), None)


def test_check_and_resolve_report_the_inference(capsys, monkeypatch):
    monkeypatch.setattr("torchrig.compat.host.host_platform", lambda: Platform("linux-x86_64"))
    assert main(["check", "--gpu", "GH200", "--driver", "570.133.20", "--torch", "2.8.0", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["platform"] == "linux-aarch64"  # PyPI's 2.8.0 there is the CPU build: fails
    assert any("inferred" in n for n in out["notes"])
    assert main(["resolve", "--gpu", "GB200", "--driver", "570.133.20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["platform"] == "linux-aarch64" and any("inferred" in n for n in out["notes"])
    main(["check", "--gpu", "GH200", "--torch", "2.8.0+cu128", "--platform", "linux-x86_64", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["platform"] == "linux-x86_64" and not any("inferred" in n for n in out["notes"])
