"""The image spec, ``torchrig.toml``: parsed and validated into a frozen :class:`ImageSpec`.

Every mistake is a :class:`~torchrig.errors.SpecError` (exit 2) whose one line names the file, the key and
the allowed values, e.g. ``torchrig.toml: [image] variant = 'dev': allowed: runtime, devel``.

>>> spec = parse_spec({"torch": {"version": "2.8.0", "variant": "cu128"}}, "torchrig.toml")
>>> spec.torch.variant, spec.services.jupyter, spec.user.uid
('cu128', True, 1000)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchrig.compat.versions import DRIVER_RE, PYTHON_RE, RELEASE_RE
from torchrig.contract import DEFAULT_WORKDIR
from torchrig.errors import SpecError
from torchrig.fuzzy import did_you_mean

SPEC_SCHEMA_VERSION = 1
IMAGE_VARIANTS = ("runtime", "devel")
SERVICES = ("jupyter", "ssh")
AUTO = "auto"

_VARIANT_RE = re.compile(r"cpu|cu\d{2,4}")  # what an image can hold: no ROCm or XPU build
_USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# Debian's grammar (Debian Policy 5.6.1 Package, 5.6.12 Version): a name of lower-case letters, digits and
# + - . (two or more, starting alphanumeric); a version [epoch:]upstream[-revision] whose upstream starts with
# a digit. https://www.debian.org/doc/debian-policy/ch-controlfields.html
_APT_NAME_RE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
_APT_VERSION_RE = re.compile(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*(?:-[A-Za-z0-9.+~]+)?")
_IMAGE_REF_RE = re.compile(r"[a-z0-9]+([._/-][a-z0-9]+)*(:[A-Za-z0-9_.-]{1,128})?(@sha256:[0-9a-f]{64})?")
_REPO_RE = re.compile(r"[a-z0-9]+([._/-][a-z0-9]+)*")


@dataclass(frozen=True)
class TorchSpec:
    version: str = AUTO  # "2.8.0" or "auto"
    variant: str = AUTO  # "cu128", "cpu" or "auto"
    gpus: tuple[str, ...] = ()  # for auto: the GPUs the image must run on
    min_driver: str | None = None  # for auto: the oldest driver the image must run on


@dataclass(frozen=True)
class Services:
    jupyter: bool = True
    ssh: bool = True

    @property
    def enabled(self) -> tuple[str, ...]:
        return tuple(s for s in SERVICES if getattr(self, s))


@dataclass(frozen=True)
class User:
    name: str = "torch"
    uid: int = 1000
    gid: int = 1000


@dataclass(frozen=True)
class ImageSpec:
    """What the user asked for; :func:`torchrig.image.stack.resolve_stack` turns it into pinned versions."""

    path: str = "torchrig.toml"
    torch: TorchSpec = field(default_factory=TorchSpec)
    python: str = "3.11"
    variant: str = "runtime"  # runtime | devel
    pip: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()
    services: Services = field(default_factory=Services)
    user: User = field(default_factory=User)
    workdir: str = DEFAULT_WORKDIR
    name: str = "torchrig/pytorch"  # the repository part of the tag
    base: str | None = None  # None: torchrig's pinned default for the variant
    pip_index_url: str | None = None  # a mirror for the extra pip packages (and torch when on PyPI)


# key -> (allowed-values text, validator); a validator returns the value or raises ValueError.
Check = Callable[[Any], Any]


def _matching(regex: re.Pattern[str], *, auto: bool = False) -> Check:
    def check(v: Any) -> str:
        if not isinstance(v, str) or not (regex.fullmatch(v.strip()) or (auto and v == AUTO)):
            raise ValueError
        return v.strip()

    return check


def _choice(*choices: str) -> Check:
    def check(v: Any) -> str:
        if v not in choices:
            raise ValueError
        return str(v)

    return check


def _boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError
    return v


def _int_range(lo: int, hi: int) -> Check:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError
        return v

    return check


def _list_of(item: Check) -> Check:
    def check(v: Any) -> tuple[Any, ...]:
        if not isinstance(v, list):
            raise ValueError
        return tuple(item(x) for x in v)

    return check


_PATH_RE = re.compile(r"(/[A-Za-z0-9._+-]+)+/?|/")


def abs_path(v: Any) -> str:
    """An absolute path of letters, digits and ``._+-`` only (no spaces, quotes, ``$``, control characters
    or ``..``): safe in a RUN line, WORKDIR and the image's JSON config."""
    if not isinstance(v, str) or not _PATH_RE.fullmatch(v) or ".." in v.split("/"):
        raise ValueError
    return v.rstrip("/") or "/"


_URL_SAFE = "/:@%+~=,.-_"  # kept as they are; every other character is percent-encoded


def index_url(v: Any) -> str:
    """An ``http(s)://host/...`` or ``file:///...`` URL, parsed and re-serialised (anything outside RFC 3986
    is percent-encoded); no whitespace, control characters or quotes."""
    from urllib.parse import quote, urlsplit, urlunsplit

    if not isinstance(v, str) or not v.isprintable() or any(c in v for c in " \"'`\\<>{}|^$;&()!*#"):
        raise ValueError
    try:
        u = urlsplit(v)
        port = u.port  # raises ValueError on a malformed port
    except ValueError:
        raise ValueError from None
    if u.scheme not in ("http", "https", "file") or (u.scheme != "file" and not u.hostname):
        raise ValueError
    if u.scheme == "file" and (u.netloc or not u.path.startswith("/")):
        raise ValueError
    if u.hostname and not re.fullmatch(r"[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]", u.hostname):
        raise ValueError
    del port
    path = quote(u.path, safe=_URL_SAFE)
    query = quote(u.query, safe=_URL_SAFE + "&")
    return urlunsplit((u.scheme, u.netloc, path, query, ""))


def pip_requirement(v: Any) -> str:
    """A requirement as pip reads it (PEP 508, parsed with ``packaging``), normalised; no options (``-r``,
    ``--index-url``), no control characters."""
    from packaging.requirements import InvalidRequirement, Requirement

    if not isinstance(v, str) or not v.strip() or not v.isprintable():
        raise ValueError
    try:
        req = Requirement(v.strip())
    except InvalidRequirement:
        raise ValueError from None
    if req.url is not None and not req.url.startswith(("https://", "http://", "file://")):
        raise ValueError
    return str(req)


def apt_package(v: Any) -> str:
    """``name`` or ``name=version`` by Debian's grammar."""
    if not isinstance(v, str):
        raise ValueError
    name, eq, version = v.strip().partition("=")
    if not _APT_NAME_RE.fullmatch(name) or (eq and not _APT_VERSION_RE.fullmatch(version)):
        raise ValueError
    return v.strip()


_GPU_NAME = _matching(re.compile(r"[A-Za-z0-9 ._()/-]{2,64}"))

SCHEMA: dict[str, dict[str, tuple[str, Check]]] = {
    "torch": {
        "version": ("a release like '2.8.0', or 'auto'", _matching(RELEASE_RE, auto=True)),
        "variant": ("'cpu', a CUDA variant like 'cu128', or 'auto'", _matching(_VARIANT_RE, auto=True)),
        "gpus": ("a list of GPU names, e.g. ['H100', 'RTX 4090']", _list_of(_GPU_NAME)),
        "min_driver": ("a driver version like '535.104.05'", _matching(DRIVER_RE)),
    },
    "python": {"version": ("a Python version like '3.11'", _matching(PYTHON_RE))},
    "packages": {
        "pip": ("a list of pip requirements, e.g. ['transformers==4.46.0']", _list_of(pip_requirement)),
        "apt": (
            "a list of Debian/Ubuntu packages, 'name' or 'name=version', e.g. ['git', 'htop']",
            _list_of(apt_package),
        ),
    },
    "services": {
        "jupyter": ("true or false", _boolean),
        "ssh": ("true or false", _boolean),
    },
    "user": {
        "name": ("a Unix user name (lower case, up to 32 characters), not 'root'", _matching(_USER_RE)),
        "uid": ("an integer 1..65535 (0, root, is refused)", _int_range(1, 65535)),
        "gid": ("an integer 1..65535 (0, root, is refused)", _int_range(1, 65535)),
    },
    "image": {
        "variant": (", ".join(IMAGE_VARIANTS), _choice(*IMAGE_VARIANTS)),
        "workdir": ("an absolute path of letters, digits and ._+- (no spaces, quotes or '..')", abs_path),
        "name": ("an image repository like 'torchrig/pytorch' (no tag)", _matching(_REPO_RE)),
        "base": (
            "an image reference like 'debian:bookworm-slim' or 'repo@sha256:...' (never :latest)",
            _matching(_IMAGE_REF_RE),
        ),
        "pip_index_url": ("an http(s)://host/... or file:///... URL", index_url),
    },
}


def _fail(path: str, where: str, value: Any, allowed: str) -> SpecError:
    return SpecError(f"{path}: {where} = {value!r}: allowed: {allowed}")


def _validated(data: Mapping[str, Any], path: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for section, table in data.items():
        if section == "schema_version":
            if table != SPEC_SCHEMA_VERSION:
                raise _fail(path, "schema_version", table, str(SPEC_SCHEMA_VERSION))
            continue
        if section not in SCHEMA:
            hint = " ".join(
                filter(None, [did_you_mean(section, SCHEMA), f"allowed sections: {', '.join(SCHEMA)}"])
            )
            raise SpecError(f"{path}: unknown section [{section}]", hint=hint)
        if not isinstance(table, Mapping):
            raise SpecError(
                f"{path}: [{section}] must be a table", hint=f"keys: {', '.join(SCHEMA[section])}"
            )
        keys = SCHEMA[section]
        for key, value in table.items():
            if key not in keys:
                hint = " ".join(filter(None, [did_you_mean(key, keys), f"allowed keys: {', '.join(keys)}"]))
                raise SpecError(f"{path}: unknown key '{key}' in [{section}]", hint=hint)
            allowed, check = keys[key]
            try:
                out.setdefault(section, {})[key] = check(value)
            except ValueError:
                raise _fail(path, f"[{section}] {key}", value, allowed) from None
    return out


def parse_spec(data: Mapping[str, Any], path: str = "torchrig.toml") -> ImageSpec:
    """Validate a spec's TOML data; the errors name ``path``, the key and the allowed values."""
    v = _validated(data, path)
    t, img, usr = v.get("torch", {}), v.get("image", {}), v.get("user", {})
    torch = TorchSpec(
        version=t.get("version", AUTO),
        variant=t.get("variant", AUTO),
        gpus=t.get("gpus", ()),
        min_driver=t.get("min_driver"),
    )
    user = User(name=usr.get("name", "torch"), uid=usr.get("uid", 1000), gid=usr.get("gid", 1000))
    if user.name == "root":
        raise _fail(path, "[user] name", "root", SCHEMA["user"]["name"][0])
    base = img.get("base")
    if base and (base.endswith(":latest") or (":" not in base.rsplit("/", 1)[-1] and "@" not in base)):
        raise _fail(path, "[image] base", base, "a pinned tag or digest; ':latest' and untagged names move")
    needs_target = torch.variant == AUTO or (torch.version == AUTO and torch.variant != "cpu")
    if needs_target and torch.variant != "cpu" and not torch.gpus:
        raise SpecError(
            f"{path}: [torch] gpus is empty but version/variant is 'auto'",
            hint="list the GPUs the image must run on, e.g. gpus = ['H100'], or set variant = 'cpu'",
        )
    return ImageSpec(
        path=path,
        torch=torch,
        python=v.get("python", {}).get("version", "3.11"),
        variant=img.get("variant", "runtime"),
        pip=v.get("packages", {}).get("pip", ()),
        apt=v.get("packages", {}).get("apt", ()),
        services=Services(**v.get("services", {})),
        user=user,
        workdir=img.get("workdir", DEFAULT_WORKDIR),
        name=img.get("name", "torchrig/pytorch"),
        base=base,
        pip_index_url=img.get("pip_index_url"),
    )


def spec_path(path: str) -> str:
    """The spec's path as given; control characters (a newline, an escape) are refused."""
    if not path.isprintable():
        raise SpecError(
            f"{path!r}: a spec path with control characters", hint="rename the file or its directory"
        )
    return path


def load_spec(path: str | Path) -> ImageSpec:
    """Read and validate ``path``; a missing file or broken TOML is a one-line SpecError."""
    from torchrig.errors import InputError
    from torchrig.inputfiles import read_toml

    p = Path(spec_path(str(path)))
    if not p.exists():
        raise SpecError(f"{p}: no such spec file", hint="write one with 'torchrig init'")
    try:
        data = read_toml(p, "spec file")  # bounded size and depth, UTF-8 text
    except InputError as err:
        raise SpecError(err.message, hint=err.hint) from None
    return parse_spec(data, str(p))
