"""The grammars of the environment variables doctor checks, as pure functions, and their rules as data
(``data/env_vars.toml``: who reads each variable, what a bad value breaks, the page that documents it).

>>> select_interfaces("=eth0", ["lo", "eth0", "eth1"])
['eth0']
>>> select_interfaces("^docker,lo", ["lo", "docker0", "ens5"])
['ens5']
>>> parse_alloc_conf("expandable_segments:true")
["expandable_segments: 'true' is not True or False (the parser takes exactly True or False)"]
"""

from __future__ import annotations

import functools
import re
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA = Path(__file__).with_name("data") / "env_vars.toml"
RULES = frozenset(
    {
        "ifname",
        "ifname_exact",
        "ib_hca",
        "disable_p2p",
        "disable_shm",
        "disable_ib",
        "device_order",
        "alloc_conf",
        "debug_on",
        "preload",
    }
)
# What the probe records besides the named variables: every variable of these families (cheap: one pass over
# os.environ), so that a check added later finds them in facts recorded today.
PREFIXES = ("NCCL_", "TORCH_NCCL_", "PYTORCH_", "CUDA_", "GLOO_", "TORCH_DISTRIBUTED_", "TORCH_SHOW_")


@dataclass(frozen=True)
class VarRule:
    name: str
    reader: str
    rule: str
    breaks: str
    source: str
    verified: str
    on: tuple[str, ...] = ()  # debug_on: the values that switch it on ("*": any)
    needs: str | None = None  # debug_on: only matters when this variable is set too


@dataclass(frozen=True)
class AllocKey:
    name: str
    type: str
    source: str
    min: int | None = None
    max: int | None = None
    choices: tuple[str, ...] = ()


@functools.lru_cache(maxsize=1)
def load() -> dict[str, Any]:
    data = tomllib.loads(DATA.read_text())  # raw-read: package data
    rules = {
        r["name"]: VarRule(
            r["name"],
            r["reader"],
            r["rule"],
            r["breaks"],
            r["source"],
            r["verified"],
            tuple(r.get("on", ())),
            r.get("needs"),
        )
        for r in data["var"]
    }
    keys = {
        k["name"]: AllocKey(
            k["name"], k["type"], k["source"], k.get("min"), k.get("max"), tuple(k.get("choices", ()))
        )
        for k in data["alloc_key"]
    }
    return {"vars": rules, "alloc_keys": keys}


def rule(name: str) -> VarRule:
    return typing.cast(VarRule, load()["vars"][name])


def names() -> tuple[str, ...]:
    return tuple(load()["vars"])


# ---------------------------------------------------------------- NCCL's interface selection
def select_interfaces(spec: str, present: list[str] | tuple[str, ...]) -> list[str]:
    """The interfaces NCCL_SOCKET_IFNAME ``spec`` selects among ``present`` (NCCL's ``matchIfList``): a list
    of prefixes separated by ``,``; a leading ``^`` excludes what the list matches instead; an entry
    starting with ``=`` matches the exact name."""
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    entries = [e for e in body.split(",") if e]

    def matches(name: str) -> bool:
        for e in entries:
            if e.startswith("="):
                if name == e[1:]:
                    return True
            elif name.startswith(e):
                return True
        return False

    return [n for n in present if matches(n) != exclude]


@dataclass(frozen=True)
class HcaEntry:
    name: str
    port: int | None
    exact: bool


def parse_ib_hca(spec: str) -> tuple[bool, list[HcaEntry]]:
    """NCCL_IB_HCA: ``[^][=]name[:port],name[:port]...``; ``^`` excludes, ``=`` makes every entry an exact
    name (NCCL applies ``=`` to the whole list, after ``^``)."""
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    body = body[1:] if exact else body
    entries = []
    for raw in (e for e in body.split(",") if e):
        name, _, port = raw.partition(":")
        entries.append(HcaEntry(name, int(port) if port.isdigit() else (-1 if port else None), exact))
    return exclude, entries


def select_hcas(spec: str, present: dict[str, tuple[int, ...]]) -> list[str]:
    """The ``device:port`` pairs NCCL_IB_HCA ``spec`` selects among ``present`` (device -> ports)."""
    exclude, entries = parse_ib_hca(spec)
    out = []
    for dev, ports in present.items():
        for port in ports or (1,):
            hit = any(
                (dev == e.name if e.exact else dev.startswith(e.name)) and (e.port is None or e.port == port)
                for e in entries
            )
            if hit != exclude:
                out.append(f"{dev}:{port}")
    return out


# ---------------------------------------------------------------- PyTorch's allocator settings
def _tokens(value: str) -> list[str]:
    """The allocator's lexer: ``,`` ``:`` ``[`` ``]`` are tokens of their own, spaces are dropped."""
    out: list[str] = []
    buf = ""
    for ch in value:
        if ch in ",:[]":
            if buf:
                out.append(buf)
                buf = ""
            out.append(ch)
        elif ch != " ":
            buf += ch
    if buf:
        out.append(buf)
    return out


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _check_value(key: AllocKey, value: str) -> str | None:
    t = key.type
    if t == "bool":
        return (
            None
            if value in ("True", "False")
            else f"{value!r} is not True or False (the parser takes exactly True or False)"
        )
    if t == "choice":
        return None if value in key.choices else f"{value!r} is not one of {', '.join(key.choices)}"
    if t == "fraction":
        try:
            x = float(value)
        except ValueError:
            return f"{value!r} is not a number"
        return None if 0 < x < 1 else f"{value} is not between 0 and 1 (exclusive)"
    if not re.fullmatch(r"\d+", value):
        return f"{value!r} is not a whole number"
    n = int(value)
    if t == "size_mb" and key.min is not None and n < key.min:
        return f"{n} is below the minimum {key.min}"
    if t == "size" and n <= 0:
        return f"{n} must be above 0"
    if t in ("pow2", "pow2_list") and n != 0 and not _is_pow2(n):
        return f"{n} is not a power of 2"
    if t == "pow2" and key.max is not None and n > key.max:
        return f"{n} is above the maximum {key.max}"
    return None


def parse_alloc_conf(value: str, keys: dict[str, AllocKey] | None = None) -> list[str]:
    """What PyTorch's allocator parser rejects in ``value`` (``key:value,key:value``), one message per
    problem; [] when it is accepted. Unknown keys are rejected by the CUDA allocator's parser
    ("Unrecognized key ... in CUDA allocator config")."""
    keys = load()["alloc_keys"] if keys is None else keys
    toks = _tokens(value)
    problems: list[str] = []
    i = 0
    while i < len(toks):
        name = toks[i]
        if name == ",":
            i += 1
            continue
        if name in ":[]":
            problems.append(f"{name!r} where a key belongs (the form is key:value,key:value)")
            break
        key = keys.get(name)
        if i + 1 >= len(toks) or toks[i + 1] != ":":
            problems.append(
                f"{name}: no ':value' after it (the form is key:value, e.g. expandable_segments:True)"
            )
            break
        if i + 2 >= len(toks) or toks[i + 2] in ",:]":
            problems.append(f"{name}: no value after ':'")
            break
        if key is None:
            problems.append(f"{name!r} is not an allocator setting (known: {', '.join(sorted(keys))})")
            i = _skip_value(toks, i + 2)
            continue
        if key.type == "pow2_list" and toks[i + 2] == "[":
            end = toks.index("]", i + 2) if "]" in toks[i + 2 :] else len(toks)
            items = [t for t in toks[i + 3 : end] if t not in ",:"]
            for j in range(0, len(items) - 1, 2):
                interval, div = items[j], items[j + 1]
                if interval != ">" and not (interval.isdigit() and _is_pow2(int(interval))):
                    problems.append(f"{name}: interval {interval!r} is not a power of 2 (or >)")
                err = _check_value(key, div)
                if err:
                    problems.append(f"{name}: divisions {err}")
            if end >= len(toks):
                problems.append(f"{name}: '[' without ']'")
            i = end + 1
            continue
        err = _check_value(key, toks[i + 2])
        if err:
            problems.append(f"{name}: {err}")
        i += 3
    return problems


def _skip_value(toks: list[str], i: int) -> int:
    if i < len(toks) and toks[i] == "[":
        while i < len(toks) and toks[i] != "]":
            i += 1
    return i + 1


def alloc_backend(value: str) -> str | None:
    toks = _tokens(value)
    for i, t in enumerate(toks[:-2]):
        if t == "backend" and toks[i + 1] == ":":
            return toks[i + 2]
    return None
