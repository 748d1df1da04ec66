"""The Dockerfile: a pure function of the resolved plan (tested against golden files).

Three stages on one pinned base: ``os`` (Python, tini, OpenSSH and the spec's apt packages), ``build`` (a
venv with torch, then JupyterLab, the spec's pip packages and torchrig under a constraint file), and the
final image (the venv copied over, a non-root user, labels, health check, tini as PID 1). The wheelhouse
and the build CA live only in the build stage, so they never reach the final image's layers.
"""

from __future__ import annotations

import json
import shlex

from torchrig import __version__
from torchrig import contract as K
from torchrig.image.stack import ImagePlan

CONTEXT_WHEELHOUSE = "wheelhouse"
CONTEXT_TORCHRIG = "torchrig-dist"
CONTEXT_CA = "build-ca.crt"
CONTEXT_FILES = "torchrig-files"
CA_PATH = "/usr/local/share/torchrig/build-ca.crt"


def labels(plan: ImagePlan) -> dict[str, str]:
    """The image's labels: the resolved stack. 'none' where the build has none (a CPU build, no PTX);
    'unknown' where the build came from a wheel the knowledge base does not list."""
    s = plan.stack
    missing = K.LABEL_UNKNOWN if s.source == "wheelhouse" and not s.is_cpu else K.LABEL_NONE
    return {
        K.LABEL_OCI_TITLE: plan.repository,
        K.LABEL_OCI_BASE_NAME: plan.base.image,
        K.LABEL_VERSION: __version__,
        K.LABEL_TORCH: s.label,
        K.LABEL_PYTHON: s.python,
        K.LABEL_VARIANT: plan.spec.variant,
        K.LABEL_CUDA: s.cuda or missing,
        K.LABEL_ARCH_LIST: " ".join(s.arch_list) or missing,
        K.LABEL_PTX: " ".join(s.ptx) or missing,
        K.LABEL_MIN_DRIVER: s.min_driver or missing,
        K.LABEL_MIN_DRIVER_MINOR_COMPAT: s.min_driver_minor_compat or missing,
        K.LABEL_CUDNN: s.cudnn or missing,
        K.LABEL_NCCL: s.nccl or missing,
        K.LABEL_SERVICES: " ".join(plan.spec.services.enabled) or K.LABEL_NONE,
        K.LABEL_USER: f"{plan.spec.user.name}:{plan.spec.user.uid}:{plan.spec.user.gid}",
    }


def image_config(plan: ImagePlan) -> str:
    """``/etc/torchrig/image.json``: what ``torchrig serve`` reads inside the image."""
    spec = plan.spec
    doc = {
        "schema_version": 1,
        "services": list(spec.services.enabled),
        "user": spec.user.name,
        "workdir": spec.workdir,
        "jupyter_port": K.JUPYTER_PORT,
        "ssh_port": K.SSH_PORT_IMAGE,
        "stack": labels(plan),
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


PROFILE_SH = """\
# Login shells (ssh) get the container's environment back: /etc/profile resets PATH, and sshd starts
# sessions with an environment of its own. `torchrig serve` writes the file at start.
if [ -r "$HOME/.torchrig/env.sh" ]; then . "$HOME/.torchrig/env.sh"; fi
"""


def _q(value: str) -> str:
    return json.dumps(value)  # a Dockerfile-safe double-quoted string


def _run(*lines: str) -> str:
    body = "; \\\n    ".join(lines)
    return f"RUN set -eux; \\\n    {body}"


def _apt_block(plan: ImagePlan) -> str:
    spec, py = plan.spec, plan.stack.python
    want = ["ca-certificates", "tini"]
    if spec.services.ssh:
        want.append("openssh-server")
    if spec.variant == "devel":
        want += ["build-essential", "git"]
    want += [p for p in spec.apt if p not in want]
    pins = dict(plan.locked.apt) if plan.locked else {}

    def pinned(name: str) -> str:  # --locked: the version the lock recorded
        return f"{name}={pins[name]}" if name in pins and "=" not in name else name

    want = [pinned(p) for p in want]
    py_names = [f"python{py}", f"python{py}-venv"] + ([f"python{py}-dev"] if spec.variant == "devel" else [])
    py_pkgs = " ".join(pinned(p) for p in py_names)
    ca = f" -o Acquire::https::CAInfo={CA_PATH}" if plan.ca_cert else ""
    probe = "import ensurepip" + (
        '; import sysconfig, os; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")'
        if spec.variant == "devel"
        else ""
    )
    lines = [
        # the base's pythonX.Y if it is complete (venv; headers for devel), else the OS's packages
        f"if command -v python{py} >/dev/null 2>&1 && python{py} -c {shlex.quote(probe)} 2>/dev/null; "
        f"then py=''; else py='{py_pkgs}'; fi",
        f"apt-get{ca} update",
        f"apt-get{ca} install -y --no-install-recommends {' '.join(want)} $py",
        # no apt caches in the layer: the package lists, the .deb archives, the binary caches
        "apt-get clean",
        "rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb",
    ]
    if spec.services.ssh:  # host keys are made per container by `torchrig serve`, never baked in
        lines.append("rm -f /etc/ssh/ssh_host_*")
    # nothing in the image runs set-user-ID (sshd runs as the user, no su/sudo): no setuid/setgid bits
    lines.append("find / -xdev -perm /6000 -type f -exec chmod a-s {} +")
    lines.append(f"python{py} -c 'import sys; assert sys.version_info[:2] == ({py.replace('.', ', ')})'")
    return _run(*lines)


def _pip_source(plan: ImagePlan, *, torch: bool) -> str:
    """Where pip looks: the wheelhouse alone (no network), or with --pip-index-url the wheelhouse first and
    the index for the rest (torch itself always from the wheelhouse when one is given)."""
    house = f"--find-links /tmp/{CONTEXT_WHEELHOUSE}"
    index = shlex.quote(plan.pip_index_url) if plan.pip_index_url else None
    if plan.wheelhouse and (torch or not index):
        return f"--no-index {house}"
    if plan.wheelhouse:
        return f"{house} --index-url {index}"
    if torch and plan.stack.index_url:
        return f"--index-url {shlex.quote(plan.stack.index_url)}"
    return f"--index-url {index}" if index else ""


def _pip(plan: ImagePlan, args: str, *, torch: bool = False, constraints: tuple[str, ...] = ()) -> str:
    src = _pip_source(plan, torch=torch)
    con = "".join(f" -c {c}" for c in constraints)
    if plan.locked:
        con += f" -c {K.IMAGE_ETC}/locked.txt"
    return f"{K.VENV}/bin/pip install{' ' + src if src else ''}{con} {args}"


LAYER = "/opt/layer"  # in a layer stage: the files that stage's installs added to the venv, and no others
_BEFORE, _AFTER, _STAMP = "/tmp/torchrig-before.txt", "/tmp/torchrig-after.txt", "/tmp/torchrig-stamp"
LAYER_CONSTRAINTS = "/tmp/torchrig-layers.txt"  # build only: everything the earlier layers installed


def _torch_stage(plan: ImagePlan) -> list[str]:
    """torch alone, with what it brought (its CUDA wheels), and numpy: the big layer, cached across spec
    changes. The constraints are derived from that install, so they pin every nvidia-*/cuda-* wheel too."""
    py = plan.stack.python
    out = ["FROM os AS torch"]
    if plan.wheelhouse:
        out.append(f"COPY {CONTEXT_WHEELHOUSE}/ /tmp/{CONTEXT_WHEELHOUSE}/")
    env = ["PIP_NO_CACHE_DIR=1", "PIP_DISABLE_PIP_VERSION_CHECK=1"]
    if plan.ca_cert:
        env.append(f"PIP_CERT={CA_PATH}")
    out.append("ENV " + " \\\n    ".join(env))
    if plan.locked:
        out.append(f"COPY {CONTEXT_FILES}/locked.txt {K.IMAGE_ETC}/locked.txt")
    out.append(
        _run(
            f"python{py} -m venv {K.VENV}",
            f"mkdir -p {K.IMAGE_ETC}",
            _pip(plan, shlex.quote(plan.stack.torch_requirement), torch=True),
            # pin torch and everything its install brought, so later installs cannot move them
            f"{K.VENV}/bin/pip freeze > {K.IMAGE_ETC}/constraints.txt",
            f"cat {K.IMAGE_ETC}/constraints.txt",
            # torch warns at import without NumPy, and .numpy() needs it; not pinned: users may move it
            _pip(plan, "numpy", constraints=(f"{K.IMAGE_ETC}/constraints.txt",)),
        )
    )
    return out


def _layer_stage(plan: ImagePlan, name: str, parent: str, requirements: list[str]) -> list[str]:
    """A stage that installs ``requirements`` on top of ``parent``'s venv and collects the files they added
    under /opt/layer, so the final image gets them as a layer of their own. Every package of the earlier
    layers is pinned while they install, so no file of an earlier layer changes or goes."""
    reqs = " ".join(shlex.quote(r) for r in requirements)
    return [
        f"FROM {parent} AS {name}",
        _run(
            f"rm -rf {LAYER}",
            f"cd {K.VENV}",
            f"find . ! -type d | sort > {_BEFORE}",
            f"{K.VENV}/bin/pip freeze > {LAYER_CONSTRAINTS}",
            f"touch {_STAMP}",
            _pip(plan, reqs, constraints=(f"{K.IMAGE_ETC}/constraints.txt", LAYER_CONSTRAINTS)),
            f"{K.VENV}/bin/pip check",
            f"find . ! -type d | sort > {_AFTER}",
            f'gone=$(comm -23 {_BEFORE} {_AFTER} | head -n 3); if [ -n "$gone" ]; then '
            f'echo "error: the install removed files of an earlier layer: $gone" >&2; exit 1; fi',
            f"mkdir -p {LAYER}",
            f"{{ comm -13 {_BEFORE} {_AFTER}; find . ! -type d -newer {_STAMP}; }} | sort -u "
            f"| tar -cf - --no-recursion -T - | tar -C {LAYER} -xf -",
            f"du -sh {LAYER}",
        ),
    ]


def _build_stages(plan: ImagePlan) -> tuple[list[str], list[str]]:
    """The stages that make the venv, and the names of the layer stages the final image copies from."""
    spec = plan.spec
    out = _torch_stage(plan)
    tools = ([f"jupyterlab=={plan.jupyterlab}"] if spec.services.jupyter else []) + list(
        plan.torchrig_requires
    )
    layers, parent = [], "torch"
    # the tools (JupyterLab, torchrig's requirements) change rarely; the spec's packages change most often
    for name, reqs in (("tools", tools), ("packages", list(spec.pip))):
        if reqs:
            out += ["", *_layer_stage(plan, name, parent, reqs)]
            layers.append(name)
            parent = name
    return out, layers


def _final_stage(plan: ImagePlan, layers: list[str]) -> list[str]:
    spec, u, py = plan.spec, plan.spec.user, plan.stack.python
    own = f"--chown={u.uid}:{u.gid}"  # the venv is the user's: `pip install` works inside (constrained)
    out = [
        "FROM os",
        "ARG TORCHRIG_BASE_DIGEST=unknown",
        # one layer per stage: torch and its CUDA wheels, then the tools, then the spec's packages; a new
        # package re-ships only the last
        f"COPY --from=torch {own} {K.VENV} {K.VENV}",
        *(f"COPY --from={name} {own} {LAYER}/ {K.VENV}/" for name in layers),
        f"COPY --from=torch {K.IMAGE_ETC}/ {K.IMAGE_ETC}/",
        f"COPY {CONTEXT_FILES}/image.json {K.IMAGE_CONFIG}",
        f"COPY {CONTEXT_FILES}/profile.sh /etc/profile.d/torchrig.sh",
        # torchrig last and alone (its dependencies came with the tools): a new torchrig rebuilds
        # this small layer, not the venv
        f"COPY {CONTEXT_TORCHRIG}/ /tmp/{CONTEXT_TORCHRIG}/",
    ]
    site = f"{K.VENV}/lib/python{py}/site-packages"
    out.append(
        _run(
            f"{K.VENV}/bin/pip install --no-cache-dir --no-index --no-deps /tmp/{CONTEXT_TORCHRIG}/*.whl",
            f"rm -rf /tmp/{CONTEXT_TORCHRIG}",
            f"{K.VENV}/bin/pip check",
            f"{K.VENV}/bin/pip freeze --all > {K.IMAGE_ETC}/pip-freeze.txt",
            # a base may ship a user or group with our ids (ubuntu:24.04 has 'ubuntu', 1000:1000): replace it
            f'old=$(getent passwd {u.uid} | cut -d: -f1); if [ -n "$old" ]; then userdel -r "$old" 2>/dev/null || userdel "$old"; fi',
            f'old=$(getent group {u.gid} | cut -d: -f1); if [ -n "$old" ]; then groupdel "$old"; fi',
            f"groupadd -g {u.gid} {u.name}",
            f"useradd -m -u {u.uid} -g {u.gid} -s /bin/bash {u.name}",
            f"chown -R {u.uid}:{u.gid} {site}/torchrig {site}/torchrig-*.dist-info {K.VENV}/bin/torchrig",
            # data/ exists, owned by the user, so an empty named volume mounted there (-v data:WORKDIR/data)
            # starts with the user's ownership instead of root's
            f"mkdir -p {shlex.quote(spec.workdir + '/data')}",
            f"chown {u.uid}:{u.gid} {shlex.quote(spec.workdir)} {shlex.quote(spec.workdir + '/data')}",
            f"dpkg-query -W -f '${{Package}}=${{Version}}\\n' > {K.IMAGE_ETC}/apt-packages.txt",
            f'echo "$TORCHRIG_BASE_DIGEST" > {K.IMAGE_ETC}/base-digest',
            f"rm -f {CA_PATH}",
        )
    )
    return out + _runtime_config(plan)


def _runtime_config(plan: ImagePlan) -> list[str]:
    """ENV, LABEL, EXPOSE, USER, WORKDIR, HEALTHCHECK, ENTRYPOINT and CMD of the final image."""
    spec, u = plan.spec, plan.spec.user
    env = [
        f"PATH={K.VENV}/bin:$PATH",
        f"VIRTUAL_ENV={K.VENV}",
        f"PIP_CONSTRAINT={K.IMAGE_ETC}/constraints.txt",
        "PYTHONUNBUFFERED=1",
        "LANG=C.UTF-8",
    ]
    if not plan.stack.is_cpu:
        # what the NVIDIA Container Toolkit reads to give the container the GPUs and the driver's libraries
        env += ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
    out = ["ENV " + " \\\n    ".join(env)]
    out.append("LABEL " + " \\\n      ".join(f"{k}={_q(v)}" for k, v in labels(plan).items()))
    ports = ([str(K.JUPYTER_PORT)] if spec.services.jupyter else []) + (
        [str(K.SSH_PORT_IMAGE)] if spec.services.ssh else []
    )
    if ports:
        out.append(f"EXPOSE {' '.join(ports)}")
    out += [
        f"USER {u.uid}:{u.gid}",
        f"WORKDIR {spec.workdir}",  # validated: letters, digits, ._+- and /
        "HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 "
        'CMD ["torchrig", "serve", "--check"]',
        'ENTRYPOINT ["/usr/bin/tini", "--"]',
        'CMD ["torchrig", "serve"]',
    ]
    return out


def render_dockerfile(plan: ImagePlan) -> str:
    """The Dockerfile text for ``plan`` (deterministic: the same plan gives the same bytes)."""
    s, spec = plan.stack, plan.spec
    facts = [f"torch {s.label}", f"Python {s.python}", spec.variant]
    if s.cuda:
        facts.append(
            f"CUDA {s.cuda}, cuDNN {s.cudnn or 'unknown'}, NCCL {s.nccl or 'unknown'}, "
            f"driver >= {s.min_driver or 'unknown'}"
        )
    head = [
        f"# Rendered by torchrig {__version__} from {json.dumps(spec.path)}; edit the spec, not this file.",
        f"# Stack: {'; '.join(facts)}.",
        f"# Base: {plan.base.image} ({plan.base.source}).",
        "# Build context: Dockerfile, torchrig-files/, torchrig-dist/"
        + (", wheelhouse/" if plan.wheelhouse else "")
        + (", build-ca.crt" if plan.ca_cert else "")
        + ".",
    ]
    base = plan.locked.base if plan.locked and plan.locked.base else plan.base.image
    os_stage = [f"FROM {base} AS os", "ARG DEBIAN_FRONTEND=noninteractive"]
    if plan.ca_cert:
        os_stage.append(f"COPY {CONTEXT_CA} {CA_PATH}")
    os_stage.append(_apt_block(plan))
    build, layers = _build_stages(plan)
    blocks = [
        "\n".join(head),
        "\n".join(os_stage),
        "\n".join(build),
        "\n".join(_final_stage(plan, layers)),
    ]
    return "\n\n".join(blocks) + "\n"
