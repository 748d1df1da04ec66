#!/usr/bin/env python3
"""Rewrite inventory snapshots of the old ``torchrig gpus --record`` format as recordings (the one format,
``torchrig.hw.record``), in place. A file that is already a recording is left as it is.

Usage: python tools/convert_gpu_recordings.py FILE...          # rewrite each old snapshot
       python tools/convert_gpu_recordings.py --check FILE...  # exit 1 if one is still of the old format

The facts are kept as they were recorded, under the record's names (``mig_enabled`` is ``mig_mode``, ``mig``
is ``mig_instances``, ``utilization_gpu_pct`` is ``utilization_pct``); the ``note`` or ``_comment`` that
says how the file was made stays.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from torchrig.errors import InputError
from torchrig.hw.record import is_old_inventory, nvml_from_json, upgrade
from torchrig.inputfiles import read_json


def convert(path: Path) -> bool:
    """Rewrite ``path`` when it is an old snapshot; whether it was one."""
    data = read_json(path, "GPU inventory file")
    if not is_old_inventory(data):
        return False
    doc = upgrade(data)
    doc.pop("upgraded_from")
    doc["source"] = (
        f"{path.name}, converted from the inventory snapshot format by tools/convert_gpu_recordings.py"
    )
    nvml_from_json(doc, path.name)  # the converted file reads back, or this raises before writing
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="only say which files are of the old format")
    args = parser.parse_args(argv)
    old = []
    try:
        for path in args.files:
            if args.check:
                if is_old_inventory(read_json(path, "GPU inventory file")):
                    old.append(path)
            elif convert(path):
                print(f"converted {path}")
    except (InputError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in old:
        print(f"{path}: an inventory snapshot of the old format", file=sys.stderr)
    return 1 if old else 0


if __name__ == "__main__":
    sys.exit(main())
