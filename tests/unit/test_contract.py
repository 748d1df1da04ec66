"""The image contract (torchrig.contract): what an image renders, what ``up`` and its pre-flight read and what
``torchrig serve`` expects are the same names, ports and paths, because each side imports them from one module.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

from torchrig import contract as K
from torchrig.compat import load_kb
from torchrig.image import render
from torchrig.runtime.inventory import load_snapshot
from torchrig.runtime.placement import NO_GPUS
from torchrig.runtime.plan import HostFacts, ImageFacts, UpRequest, make_plan
from torchrig.runtime.preflight import preflight
from torchrig.serve.config import make_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from imageplans import plan_for

SRC = Path(__file__).resolve().parents[2] / "src" / "torchrig"
FIX = Path(__file__).resolve().parents[1] / "fixtures"
CUDA_CASE = "runtime-jupyter-ssh-cu128"


def _instruction(dockerfile: str, word: str) -> str:
    """The final stage's ``WORD ...`` instruction, continuation lines joined."""
    text = dockerfile.replace("\\\n", " ")
    return [line for line in text.splitlines() if line.startswith(word + " ")][-1]


def test_rendered_image_carries_the_contracts_labels_ports_and_paths() -> None:
    plan = plan_for(CUDA_CASE)
    labels = render.labels(plan)
    prefixed = {k for k in labels if k.startswith(K.IMAGE_LABEL_PREFIX)}
    names = {getattr(K, n) for n in dir(K) if n.startswith("LABEL_") and isinstance(getattr(K, n), str)}
    assert prefixed <= names and {K.LABEL_OCI_TITLE, K.LABEL_OCI_BASE_NAME} <= set(labels)
    assert labels[K.LABEL_SERVICES] == "jupyter ssh" and labels[K.LABEL_USER].count(":") == 2

    dockerfile = render.render_dockerfile(plan)
    assert _instruction(dockerfile, "EXPOSE") == f"EXPOSE {K.JUPYTER_PORT} {K.SSH_PORT_IMAGE}"
    assert f"COPY torchrig-files/image.json {K.IMAGE_CONFIG}" in dockerfile
    assert f"PATH={K.VENV}/bin:$PATH" in dockerfile
    assert f"WORKDIR {K.DEFAULT_WORKDIR}" in dockerfile  # the case's spec keeps the default workdir
    for key, value in labels.items():  # every label reaches the LABEL instruction, JSON-quoted
        assert f"{key}={json.dumps(value)}" in dockerfile

    config = json.loads(render.image_config(plan))
    assert (config["jupyter_port"], config["ssh_port"]) == (K.JUPYTER_PORT, K.SSH_PORT_IMAGE)
    assert config["stack"] == labels


def test_serve_in_a_rendered_image_listens_where_the_image_says() -> None:
    """``docker run IMAGE`` (no environment): serve reads image.json and listens on EXPOSE's ports."""
    config = json.loads(render.image_config(plan_for(CUDA_CASE)))
    cfg = make_config(config, {}, Path("/home/torch"), "torch")
    assert (cfg.jupyter_port, cfg.ssh_port) == (K.JUPYTER_PORT, K.SSH_PORT_IMAGE)
    assert cfg.services == K.SERVICES
    assert str(cfg.state_dir / "ssh" / K.SSH_HOST_KEY_NAME) == K.host_key_path("/home/torch")


def test_serve_under_up_listens_on_the_ports_up_publishes() -> None:
    """``up`` publishes container ports and passes serve its environment: serve must listen exactly there."""
    image_config = json.loads(render.image_config(plan_for(CUDA_CASE)))
    image = ImageFacts("t:1", "sha256:abc", render.labels(plan_for(CUDA_CASE)), "1000:1000")
    host = HostFacts(uid=1000, gid=1000, memory_total_bytes=2**36, hostname="box", cdi=False)
    req = UpRequest(image="t:1", name="a-1", user="a", gpus=NO_GPUS)
    plan = make_plan(req, image, host, ())
    published = {p.service: p.container_port for p in plan.ports}
    assert published == {"jupyter": K.JUPYTER_PORT, "ssh": K.SSH_PORT_UP}
    assert K.SSH_PORT_UP != K.SSH_PORT_IMAGE  # up's sshd binds an unprivileged port (no sysctl needed)

    cfg = make_config(image_config, plan.env, Path("/home/torch"), "torch")
    assert {"jupyter": cfg.jupyter_port, "ssh": cfg.ssh_port} == published
    assert cfg.services == K.SERVICES
    assert plan.labels[f"{K.ENV_LABEL_PREFIX}ssh_port"] == str(K.SSH_PORT_UP)  # what ps reads back
    assert K.SERVE.secret_files(True, True) == (K.JUPYTER_TOKEN_FILE, K.AUTHORIZED_KEYS_FILE)


def test_up_pre_flight_reads_the_labels_render_writes() -> None:
    """A rendered CUDA image's labels are recognised (checked, not 'unlabelled'); a CPU build is refused."""
    inv = load_snapshot(FIX / "runtime" / "inventory-8xh200.json")
    units = inv.units()[:1]
    cuda = preflight(render.labels(plan_for(CUDA_CASE)), inv, units, load_kb)
    assert cuda.findings and all(f.id not in ("image_unlabelled", "cpu_only_image") for f in cuda.findings)
    cpu = preflight(render.labels(plan_for("cpu-only")), inv, units, load_kb)
    assert [f.id for f in cpu.failures()] == ["cpu_only_image"]


# Literals of the contract that must not be written anywhere in code but torchrig/contract.py (docstrings,
# help text and the `init` template may show them to users; tests below keep those equal to the contract).
_CONTRACT_LITERALS = re.compile(
    r"^(org\.torchrig\.|torchrig\.$|/run/secrets|/etc/torchrig|/opt/venv$|/workspace$)"
)


def _code_constants(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in docstrings:
            if isinstance(node.value, str) and _CONTRACT_LITERALS.search(node.value):
                out.append(node.value)
            elif isinstance(node.value, int) and node.value in (K.JUPYTER_PORT, K.SSH_PORT_UP):
                out.append(str(node.value))
    return out


def test_no_side_writes_its_own_copy_of_the_contract() -> None:
    hits = {
        str(p.relative_to(SRC)): found
        for p in sorted(SRC.rglob("*.py"))
        if p.name != "contract.py" and p.parent.name != "cli" and (found := _code_constants(p))
    }
    assert hits == {}


def test_user_facing_text_shows_the_contracts_values() -> None:
    from torchrig.cli import cmd_image, cmd_init, cmd_serve

    for doc in (cmd_image.__doc__ or "", cmd_serve.__doc__ or ""):
        assert f"-p {K.JUPYTER_PORT}:{K.JUPYTER_PORT} -p 2222:{K.SSH_PORT_IMAGE} " in doc
        assert f"{K.AUTHORIZED_KEYS_FILE}:ro" in doc
    assert f"(port {K.JUPYTER_PORT})" in (cmd_serve.__doc__ or "")
    assert f"sshd (port {K.SSH_PORT_IMAGE})" in (cmd_serve.__doc__ or "")
    assert f"JupyterLab on :{K.JUPYTER_PORT}, token from {K.JUPYTER_TOKEN_FILE}" in cmd_init.TEMPLATE
    assert f"OpenSSH on :{K.SSH_PORT_IMAGE}, public keys only ({K.AUTHORIZED_KEYS_FILE}" in cmd_init.TEMPLATE
    assert f'workdir = "{K.DEFAULT_WORKDIR}"' in cmd_init.TEMPLATE


def test_contract_imports_nothing_of_torchrig() -> None:
    """Render, pre-flight, serve and the CLI all import it: it must not pull in any of them (or torch)."""
    tree = ast.parse((SRC / "contract.py").read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"__future__", "collections.abc", "dataclasses"}
