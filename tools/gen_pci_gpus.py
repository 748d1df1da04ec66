#!/usr/bin/env python3
"""Write src/torchrig/data/pci_gpus.json: every NVIDIA GPU of compute capability >= 3.5 in the PCI ID database
(vendor 10de of Debian's pci.ids), under the names it carries there, with its compute capability from the
per-chip rules below.

Each rule maps chip codenames (the first word of a pci.ids entry: GP104, TU117GLM, AD107M ...) to a compute
capability, and names witnesses: products NVIDIA's CUDA GPUs pages list at that capability. The tool checks
that every witness is a product of a chip the rule covers in pci.ids (the join of the two sources), so a rule
that maps a chip to the wrong capability fails here instead of shipping.

Usage: apt-get install pci.ids (or hwdata); python tools/gen_pci_gpus.py [--pci-ids /usr/share/misc/pci.ids]
       python tools/gen_pci_gpus.py --check     # exit 1 if the file is out of date
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "src" / "torchrig" / "data" / "pci_gpus.json"
LEGACY = "https://developer.nvidia.com/cuda-legacy-gpus"
CURRENT = "https://developer.nvidia.com/cuda-gpus"
VERIFIED = "2026-12-03"

# (chip codename regex, compute capability, architecture as gpus.toml names it, witnesses, source).
# GK208 (GeForce GT 710/720/730, CC 3.5) is left out: the GT 730 name also belongs to a Fermi (CC 2.1) board, so
# a name alone cannot say which one a user has.
RULES: list[tuple[str, str, str, tuple[str, ...], str]] = [
    (r"GK110B?|GK180", "3.5", "Kepler", ("Tesla K40c", "Tesla K20Xm"), LEGACY),
    (r"GK210", "3.7", "Kepler", ("Tesla K80",), LEGACY),
    (r"GM10[78]", "5.0", "Maxwell", ("GeForce GTX 750 Ti", "Quadro K2200"), LEGACY),
    (r"GM20[046]", "5.2", "Maxwell", ("GeForce GTX 980", "Tesla M60"), LEGACY),
    (r"GP100", "6.0", "Pascal", ("Tesla P100 PCIe 16GB",), LEGACY),
    (r"GP10[24678]", "6.1", "Pascal", ("GeForce GTX 1080 Ti", "Tesla P40"), LEGACY),
    (r"GV100", "7.0", "Volta", ("TITAN V", "Quadro GV100"), LEGACY),
    (r"TU1\d\d", "7.5", "Turing", ("Tesla T4", "GeForce RTX 2080 Ti"), CURRENT),
    (r"GA100", "8.0", "Ampere", ("A100 PCIe 40GB",), CURRENT),
    (r"GA10[2-7]", "8.6", "Ampere", ("GeForce RTX 3090", "RTX A6000"), CURRENT),
    (r"AD10\d", "8.9", "Ada Lovelace", ("GeForce RTX 4090", "L40"), CURRENT),
    (r"GH100", "9.0", "Hopper", ("H100 PCIe",), CURRENT),
    (r"GB10[02]", "10.0", "Blackwell", (), CURRENT),
    (r"GB20\d", "12.0", "Blackwell", (), CURRENT),
]

_NOT_A_GPU = re.compile(r"audio|usb|ucsi|switch|bridge|engineering sample", re.IGNORECASE)


def nvidia_entries(text: str) -> list[tuple[str, str]]:
    """(device id, name) of vendor 10de's devices (subsystems skipped)."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("10de  "))
    out = []
    for ln in lines[start + 1 :]:
        if ln and not ln.startswith(("\t", "#")):
            break
        m = re.match(r"^\t([0-9a-f]{4})  (.*)$", ln)
        if m:
            out.append((m.group(1), m.group(2).strip()))
    return out


def names_of(bracket: str) -> list[str]:
    """``GeForce RTX 2070 SUPER Mobile / Max-Q`` -> the full text, ``... Mobile`` and ``... Max-Q``;
    ``Quadro RTX 6000/8000`` -> ``Quadro RTX 6000`` and ``Quadro RTX 8000``."""
    names = [bracket]
    parts = [p.strip() for p in re.split(r"\s+/\s+", bracket)]
    first = parts[0]
    names.append(first)
    for part in parts[1:]:
        if " " in part:
            names.append(part)
        else:  # a one-word alternative replaces the first part's last word
            names.append(first.rsplit(" ", 1)[0] + " " + part)
    out: list[str] = []
    for n in names:
        m = re.fullmatch(r"(.*\s)?(\w+)/(\w+)", n)
        if m and m.group(2).isdigit() and m.group(3).isdigit():  # 6000/8000
            out += [f"{m.group(1) or ''}{m.group(2)}", f"{m.group(1) or ''}{m.group(3)}"]
        else:
            out.append(n)
    return list(dict.fromkeys(x for x in out if x))


def segment_of(name: str, chip: str) -> str:
    if re.search(r"Tesla|^[ABHL]\d|^T4G?$|GRID|CNX|^H\d00|^L\d|^A\d", name):
        return "datacenter"
    if re.search(r"Quadro|RTX A\d|RTX \d000|^T\d{3,4}|Ada Generation|NVS|TITAN", name) or "GL" in chip:
        return "workstation"
    return "consumer"


def build(text: str, source_label: str) -> dict:
    rows = []
    seen_chips: dict[str, set[str]] = {}
    for device, raw in nvidia_entries(text):
        m = re.match(r"(\S+?)\s*\[(.+)\]$", raw)
        if not m or _NOT_A_GPU.search(raw):
            continue
        chip, bracket = m.group(1), m.group(2)
        rule = next((r for r in RULES if re.match(rf"(?:{r[0]})(?:[A-Z]+)?$", chip)), None)
        if rule is None:
            continue
        seen_chips.setdefault(rule[0], set()).update(names_of(bracket))
        rows.append(
            {
                "device_id": f"10de:{device}",
                "chip": chip,
                "names": names_of(bracket),
                "compute_capability": rule[1],
                "arch": rule[2],
                "segment": segment_of(bracket, chip),
            }
        )
    for pattern, cc, _arch, witnesses, source in RULES:
        for w in witnesses:
            if w not in seen_chips.get(pattern, set()):
                raise SystemExit(
                    f"rule {pattern} -> {cc}: witness {w!r} ({source}) is not a product of those chips"
                )
    return {
        "schema_version": 1,
        "source": source_label,
        "verified": VERIFIED,
        "rules": [
            {"chips": p, "compute_capability": cc, "arch": a, "witnesses": list(w), "source": s}
            for p, cc, a, w, s in RULES
        ],
        "gpu": rows,
    }


def _package_version() -> str:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "pci.ids"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pci-ids", default="/usr/share/misc/pci.ids")
    ap.add_argument("--package-version", help="the pci.ids package version (default: dpkg's)")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if args.check:
        data = json.loads(TARGET.read_text())
        version = data["source"].rsplit(" ", 1)[-1]
    else:
        version = args.package_version or _package_version()
    label = f"https://packages.debian.org/bookworm/pci.ids (vendor 10de), Debian package pci.ids {version}"
    text = Path(args.pci_ids).read_text(encoding="utf-8", errors="replace")
    data = build(text, label)
    rendered = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    if args.check:
        return 0 if TARGET.read_text() == rendered else 1
    TARGET.write_text(rendered)
    print(f"wrote {TARGET.relative_to(ROOT)}: {len(data['gpu'])} GPUs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
