"""Every field of a cluster job, checked where it enters, before any render sees it.

A render is a program another engine runs (bash on each Slurm node, the kubelet in each pod), so a value
that reaches one must be one the engine reads as data. Each check accepts a stated grammar and refuses the
rest with a one-line :class:`~torchrig.errors.UsageError` that says what to type instead:

- Slurm names (``--partition``, ``--account``): letters, digits, ``_``, ``.`` and ``-`` (a partition may be
  a comma-separated list, as ``sbatch --partition`` takes). Slurm itself reads ``#SBATCH`` lines up to the
  end of the line and splits lists at commas, so nothing outside this set can be written there as data.
- Kubernetes names by its DNS rules (apimachinery ``validation.IsDNS1123Label`` / ``IsDNS1123Subdomain``):
  namespaces and job names are RFC 1123 labels (at most 63 characters), claims are subdomains (253).
- Paths: absolute (``--mount``, ``--volume``; the log dir may be relative to the job's working directory),
  no control characters, no ``,`` in mount lists (it separates mounts for pyxis and Apptainer).
- Arguments of the training command: any text, except NUL (no exec argument can hold one) and CR LF
  (sbatch refuses a script with a DOS line break anywhere: "Batch script contains DOS line breaks").
"""

from __future__ import annotations

import re

from torchrig.errors import UsageError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# re.ASCII: \d is 0-9 only; without it '٥' (Arabic-Indic five) or '１０' (fullwidth) match and reach
# '#SBATCH --time=', which Slurm then rejects far from the cause
_SLURM_TIME = re.compile(r"(\d+-)?\d{1,2}(:\d{2}){0,2}|\d+", re.ASCII)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
# What the rendered sbatch script, pod spec or the launcher on each node sets per node or per rank (the
# names the renders read as NodeVar, the script's exports, torchrun's PET_* options and the variables it
# gives each rank): an --env of one of them would give every node the same value - one node rank for all,
# one rendezvous endpoint - or override what torchrun tells each rank.
PER_NODE_ENV = frozenset(
    {
        "SLURM_NODEID", "SLURM_NNODES", "SLURM_JOB_ID", "SLURM_JOB_NODELIST",  # the sbatch script reads them
        "RDZV_ENDPOINT",  # the sbatch script exports it: the first node's host and the rendezvous port
        "JOB_COMPLETION_INDEX",  # an indexed Job's node rank (plain Job and JobSet)
        "MASTER_ADDR", "MASTER_PORT",  # torchrun sets them for each rank; the PyTorchJob operator too
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "NODE_RANK",
        "PWD",  # the submit directory the script runs the job in
    }
)  # fmt: skip
# prefixes as whole families: torchrun reads PET_<OPTION> as its options (PET_NODE_RANK, PET_MASTER_ADDR,
# PET_RDZV_ENDPOINT ...; torch/distributed/argparse_util.py env), TORCHELASTIC_* are its per-run values,
# SLURM_* are srun's and sbatch's own inputs and outputs
PER_NODE_ENV_PREFIXES = ("PET_", "TORCHELASTIC_", "SLURM_")
# A container reference: [registry[:port]/]path[:tag][@digest], pyxis' registry#path, or a scheme:// URL
# (Apptainer's docker://, oras://) - no whitespace, quotes, commas or shell metacharacters.
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@#+-]*")
# Kubernetes resource.Quantity (apimachinery resource/quantity.go): a number and a binary or decimal suffix;
# a size, so no minus sign.
_QUANTITY = re.compile(r"\+?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?")


def _show(value: str) -> str:
    """The value as the error message shows it: repr, so a newline is seen as ``\\n``, cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def text_arg(flag: str, value: str) -> str:
    """A word of the training command: any text a process can receive as one argument."""
    if "\x00" in value:
        raise UsageError(f"{flag} {_show(value)} contains a NUL byte, which no program argument can hold")
    if "\r\n" in value:
        raise UsageError(
            f"{flag} {_show(value)} contains a DOS line break (\\r\\n)",
            hint="sbatch refuses a script that holds one; use \\n",
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{flag} {_show(value)} is not valid UTF-8 text") from None
    return value


def no_control(flag: str, value: str) -> str:
    if _CONTROL.search(value):
        raise UsageError(f"{flag} {_show(value)} contains a control character (newline, tab, ...)")
    text_arg(flag, value)
    return value


def slurm_name(flag: str, value: str, *, allow_list: bool = False) -> str:
    items = value.split(",") if allow_list else [value]
    if not value or not all(_SLURM_NAME.fullmatch(i) and len(i) <= 64 for i in items):
        what = "a Slurm name (or a comma-separated list of them)" if allow_list else "a Slurm name"
        raise UsageError(
            f"{flag} {_show(value)} is not {what}",
            hint="use letters, digits, '_', '.' and '-' (at most 64 characters), as `sinfo`/`sacctmgr` list them",
        )
    return value


def slurm_time(value: str) -> str:
    if not value.isascii() or not _SLURM_TIME.fullmatch(value):
        raise UsageError(
            f"--time {_show(value)} is not a Slurm time", hint="use MINUTES, HH:MM:SS or D-HH:MM:SS"
        )
    return value


def dns_label(flag: str, value: str, *, max_len: int = 63) -> str:
    if not (_DNS1123_LABEL.fullmatch(value) and len(value) <= max_len):
        raise UsageError(
            f"{flag} {_show(value)} is not a DNS label",
            hint=f"use lowercase letters, digits and '-', starting and ending with a letter or digit, at most {max_len} characters",
        )
    return value


def dns_subdomain(flag: str, value: str) -> str:
    if not (_DNS1123_SUBDOMAIN.fullmatch(value) and len(value) <= 253):
        raise UsageError(
            f"{flag} {_show(value)} is not a DNS subdomain",
            hint="use lowercase letters, digits, '-' and '.', at most 253 characters",
        )
    return value


def env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise UsageError(
            f"--env {_show(value)} is not an environment variable name", hint="use [A-Za-z_][A-Za-z0-9_]*"
        )
    if value in PER_NODE_ENV or value.startswith(PER_NODE_ENV_PREFIXES):
        raise UsageError(
            f"--env {value} is set per node or per rank by the job itself (its scheduler, the rendered script "
            "or torchrun); one value for every node would give each the same rank or endpoint",
            hint="leave it out: use the options instead (--nodes, --rdzv-port, ...)",
        )
    return value


def image_ref(flag: str, value: str) -> str:
    if value.startswith("/"):
        return abs_path(flag, value, allow_comma=False)
    if not _IMAGE.fullmatch(value) or len(value) > 512:
        raise UsageError(
            f"{flag} {_show(value)} is not an image reference",
            hint="e.g. registry.example/team/img:tag, nvcr.io#org/img:tag or /images/img.sif",
        )
    return value


def quantity(flag: str, value: str) -> str:
    if not _QUANTITY.fullmatch(value):
        raise UsageError(f"{flag} {_show(value)} is not a Kubernetes quantity", hint="e.g. 16Gi or 512Mi")
    return value


def abs_path(flag: str, value: str, *, allow_comma: bool = True) -> str:
    no_control(flag, value)
    if not value.startswith("/"):
        raise UsageError(f"{flag} {_show(value)} is not an absolute path", hint="start it with /")
    if not allow_comma and "," in value:
        raise UsageError(f"{flag} {_show(value)} contains ',', which separates entries of a mount list")
    return value


def log_dir(value: str) -> str:
    """Relative to the job's working directory, or absolute; never read as an option."""
    no_control("--log-dir", value)
    if not value or value.startswith("-"):
        raise UsageError(
            f"--log-dir {_show(value)} is not a directory", hint="e.g. torchrig-logs or /shared/logs"
        )
    return value


def bind_mount(value: str) -> str:
    """``SRC[:DST[:OPTIONS]]`` with absolute paths, as pyxis' ``--container-mounts`` and Apptainer's ``--bind``
    read each entry of their comma-separated lists."""
    parts = value.split(":")
    if not 1 <= len(parts) <= 3:
        raise UsageError(
            f"--mount {_show(value)} is not SRC[:DST[:OPTIONS]]", hint="e.g. --mount /data:/data:ro"
        )
    for part in parts[:2]:
        abs_path("--mount", part, allow_comma=False)
    if len(parts) == 3 and not re.fullmatch(r"[a-z+]+", parts[2]):
        raise UsageError(f"--mount {_show(value)}: options must be letters, e.g. ro or rw")
    return value


def claim_mount(value: str) -> str:
    claim, sep, path = value.partition(":")
    if not sep or not claim:
        raise UsageError(
            f"--volume {_show(value)} is not CLAIM:/path", hint="e.g. --volume shared-runs:/shared"
        )
    dns_subdomain("--volume claim", claim)
    abs_path("--volume", path)
    if ":" in path:
        raise UsageError(
            f"--volume {_show(value)} is not CLAIM:/path", hint="the mount path cannot contain ':'"
        )
    return value
