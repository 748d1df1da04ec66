"""``torchrig install``: the choice among the builds an index really serves, the installer's argv, the pins,
and the clear exit-2 errors. The planning is pure (the index's answer comes in as a callable); the adapters are
exercised on this machine's own interpreters (a venv without pip, a refused port) with --dry-run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from torchrig.compat import load_kb
from torchrig.compat.platforms import Platform
from torchrig.errors import InputError, UsageError
from torchrig.install.plan import (
    InstallRequest,
    PythonFacts,
    choose_build,
    constraint_text,
    installer_argv,
    pinned_in,
    served_version,
)

X86 = Platform("linux-x86_64")


@pytest.fixture(scope="module")
def kb():
    return load_kb()


def test_a_cpu_build_is_served_only_under_its_label(kb):
    build = kb.find_build("2.13.0+cpu", X86)
    assert served_version(build, ["2.14.1", "2.13.0+cpu"]) == "2.13.0+cpu"
    # PyPI's bare 2.13.0 on x86_64 is the CUDA build, not the CPU one
    assert served_version(build, ["2.13.0", "2.13.0.dev20250101+cpu"]) is None
    pypi = kb.find_build("2.13.0", X86)
    assert served_version(pypi, ["2.14.1", "2.13.0"]) == "2.13.0"


def test_resolve_walks_down_to_the_newest_build_the_index_serves(kb):
    # what this machine's pip reports for download.pytorch.org/whl/cpu when only a local wheel is there
    asked = []

    def available(index):
        asked.append(index)
        return ["2.14.1", "2.13.0+cpu"]

    choice = choose_build(kb, InstallRequest(), [], None, X86, "3.11", available)
    assert choice.build.label == "2.13.0+cpu"
    assert choice.requirement == "torch==2.13.0+cpu"
    assert choice.index_url == "https://download.pytorch.org/whl/cpu"
    assert choice.skipped and all("+cpu" in s for s in choice.skipped)
    assert "not served" in choice.why
    assert set(asked) == {"https://download.pytorch.org/whl/cpu"}


def test_when_the_index_cannot_be_asked_resolves_pick_is_trusted(kb):
    choice = choose_build(kb, InstallRequest(), [], None, X86, "3.11", lambda index: None)
    assert choice.build.label == kb.releases[0].version + "+cpu"
    assert not choice.skipped


def test_a_gpu_gets_a_cuda_build_from_its_own_index(kb):
    gpu = kb.find_gpu("RTX 4090")
    served = {"https://download.pytorch.org/whl/cu126": ["2.8.0+cu126"]}
    choice = choose_build(
        kb, InstallRequest(torch="==2.8.*"), [gpu], "550.54.14", X86, "3.11", lambda i: served.get(i, [])
    )
    assert choice.build.label == "2.8.0+cu126"
    assert choice.requirement == "torch==2.8.0+cu126"


def test_nothing_served_is_one_line_saying_what_to_do(kb):
    with pytest.raises(InputError, match="no build in range is served") as err:
        choose_build(kb, InstallRequest(torch=">=2.12"), [], None, X86, "3.11", lambda index: [])
    assert "--index-url" in err.value.one_line()


def test_an_exact_build_that_fails_on_the_gpu_is_refused_with_the_fix(kb):
    gpu = kb.find_gpu("RTX 5090")
    with pytest.raises(InputError, match="fails here"):
        choose_build(
            kb, InstallRequest(torch="2.6.0+cu124"), [gpu], "570.86.10", X86, "3.11", lambda index: None
        )
    with pytest.raises(InputError, match="CUDA build but no NVIDIA GPU"):
        choose_build(kb, InstallRequest(torch="2.8.0+cu128"), [], None, X86, "3.11", lambda index: None)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"driver": "550.54.14"}, "--driver needs --gpu"),
        ({"torch": ">=banana"}, "malformed torch specifier"),
        ({"torch": "2.8.0+potato"}, "malformed torch build"),
        ({"index_url": "download.pytorch.org"}, "is not a URL"),
        ({"installer": "conda"}, "unknown --installer"),
    ],
)
def test_bad_requests_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        InstallRequest(**kwargs)


def test_the_installer_argv_is_a_list_of_words():
    argv = installer_argv("pip", "/v/bin/python", "torch==2.13.0+cpu", "https://x/whl/cpu", "c.txt")
    assert argv == (
        "/v/bin/python", "-m", "pip", "install", "torch==2.13.0+cpu",
        "--index-url", "https://x/whl/cpu", "--constraint", "c.txt",
    )  # fmt: skip
    assert installer_argv("uv", "/v/bin/python", "torch==2.8.0", None, None) == (
        "uv", "pip", "install", "--python", "/v/bin/python", "torch==2.8.0",
    )  # fmt: skip


def test_the_constraints_file_keeps_other_pins_and_replaces_torchs():
    old = "numpy<2\ntorch==2.8.0+cu128\ntorchvision==0.23.0\n"
    new = constraint_text(old, "torch==2.13.0+cpu")
    assert new.splitlines() == ["numpy<2", "torchvision==0.23.0", "torch==2.13.0+cpu"]
    assert pinned_in(new) == "torch==2.13.0+cpu"
    assert pinned_in("torchvision==0.23\n# torch==1\n") is None


def _torchrig(*args, env=None):
    r = subprocess.run(
        [sys.executable, "-m", "torchrig", "install", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    return r


def test_no_python_at_the_path_is_exit_2(tmp_path):
    r = _torchrig("--python", str(tmp_path / "nope" / "python"), "--dry-run")
    assert r.returncode == 2 and "no python at --python" in r.stderr
    assert "Traceback" not in r.stderr


def test_an_interpreter_without_pip_is_exit_2_with_what_to_do(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    r = _torchrig("--python", str(tmp_path / "v" / "bin" / "python"), "--installer", "pip", "--dry-run")
    assert r.returncode == 2, r.stderr
    assert "has no pip" in r.stderr and "ensurepip" in r.stderr


def test_an_unreachable_index_is_exit_2_with_what_to_do(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_RETRIES="0", NO_PROXY="*")
    r = _torchrig(
        "--index-url", f"http://127.0.0.1:{port}/simple", "--installer", "pip", "--dry-run", "--json", env=env
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"cannot reach http://127.0.0.1:{port}/simple" in r.stderr
    assert json.loads(r.stdout)["error"]["exit_code"] == 2


def test_a_working_torch_is_not_replaced_without_yes():
    pytest.importorskip("torch")
    import torch

    from torchrig.install.run import _action

    here = PythonFacts(sys.executable, "3.11.0", "24.0", "1.0.0+cpu")  # says another build is installed
    with pytest.raises(UsageError, match="already works") as err:
        _action(here, "torch==9.9.9+cpu", False, InstallRequest(), [])
    assert "--yes" in err.value.one_line()
    assert _action(here, "torch==9.9.9+cpu", False, InstallRequest(yes=True), []) == "replace"
    installed = PythonFacts(sys.executable, "3.11.0", "24.0", torch.__version__)
    assert _action(installed, f"torch=={torch.__version__}", False, InstallRequest(), []) == "keep"


def test_a_jetpack_6_jetson_installs_from_the_jetson_ai_lab_index(kb):
    orin = kb.find_gpu("Jetson AGX Orin")
    # the JetPack comes from the driver number nvidia-smi prints on JetPack 6 (540.4.0)
    choice = choose_build(kb, InstallRequest(), [orin], "540.4.0", X86, "3.10", lambda index: None)
    assert choice.index_url == "https://pypi.jetson-ai-lab.io/jp6/cu126"
    assert choice.requirement == "torch==2.8.0" and "JetPack 6" in choice.why
    served = choose_build(
        kb, InstallRequest(), [orin], None, Platform("jetson", "6"), "3.10", lambda index: ["2.5.0", "2.4.0"]
    )
    assert served.requirement == "torch==2.5.0" and served.skipped  # 2.8.0 is not served there now
    with pytest.raises(InputError, match="serves no torch version"):
        choose_build(
            kb, InstallRequest(), [orin], None, Platform("jetson", "6"), "3.10", lambda index: ["2.1.0"]
        )


def _simple_index(root, files: list[str]):
    """A PEP 503 simple index of torch with these file names (the names are all pip reads to list versions)."""
    page = root / "simple" / "torch"
    page.mkdir(parents=True)
    links = "".join(f'<a href="../../files/{f}">{f}</a>\n' for f in files)
    (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")


def test_the_versions_a_real_index_serves_come_from_pips_own_query(tmp_path, monkeypatch):
    """The adapters at the network boundary, against an index served over HTTP on loopback: pip's own
    ``pip index versions`` lists the builds this interpreter can install (not another Python's), newest first,
    and the HEAD check says the index answers; a folder that is not there is unreachable. (The argv fuzzer
    answers for the index from here on: it fuzzes what comes before and after the query, not the network.)"""
    import functools
    import http.server
    import threading

    from packaging.tags import sys_tags

    from torchrig.install import host

    here = next(iter(sys_tags()))
    files = [
        f"torch-2.13.0+cpu-{here}.whl",
        f"torch-2.12.1-{here}.whl",
        "torch-2.14.0-cp39-cp39-win_amd64.whl",  # another interpreter's: not served to this one
    ]
    _simple_index(tmp_path, files)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for k in [k for k in os.environ if k.startswith("PIP_")]:
            monkeypatch.delenv(k)
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no configured extra indexes or find-links
        monkeypatch.setenv("NO_PROXY", "*")
        index = f"http://127.0.0.1:{server.server_address[1]}/simple"
        facts = host.python_facts(None)
        assert host.served_versions(facts, "pip", index) == ["2.13.0+cpu", "2.12.1"]
        assert host.index_unreachable(index) is None
        assert host.index_unreachable(f"{index}/missing") == "HTTP 404"
        assert host.index_unreachable(f"file://{tmp_path}/simple") is None
        assert (
            host.index_unreachable(f"file://{tmp_path}/nothing")
            == f"file://{tmp_path}/nothing/torch/ does not exist"
        )
        assert host.served_versions(facts, "uv", index) is None  # uv has no such query: unknown, trusted
    finally:
        server.shutdown()
        server.server_close()
