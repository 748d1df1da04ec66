"""On the GPU machine: do the facts a torchrig image records in its labels (CUDA, arch list, cuDNN, NCCL,
minimum driver) agree with what the installed torch build reports on a real GPU? And what image does the
spec `gpus = [this GPU], min_driver = this driver` resolve to?

Usage: PYTHONPATH=src python tools/gpu/images_check.py OUT_DIR
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def main(out_dir: Path) -> int:
    import torch

    from torchrig.compat.kb import load_kb
    from torchrig.image import render
    from torchrig.image.pipeline import ImageOptions, make_plan
    from torchrig.image.spec import parse_spec
    from torchrig.image.stack import resolve_stack

    out_dir.mkdir(parents=True, exist_ok=True)
    kb = load_kb()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    version, _, variant = torch.__version__.partition("+")
    spec = parse_spec(
        {
            "torch": {"version": version, "variant": variant or "auto", "gpus": ["H100"]},
            "python": {"version": python},
        }
    )
    stack = resolve_stack(spec, kb)
    cudnn = torch.backends.cudnn.version()  # e.g. 91002 for 9.10.2
    nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
    seen = {
        "cuda": torch.version.cuda,
        "arch_list": [a for a in torch.cuda.get_arch_list() if a.startswith("sm_")],
        "ptx": [a for a in torch.cuda.get_arch_list() if a.startswith("compute_")],
        "cudnn_int": cudnn,
        "nccl": nccl,
    }
    driver = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.splitlines()[0]
        .split(", ")
    )
    checks = {
        "cuda": stack.cuda == ".".join(seen["cuda"].split(".")[:2]),
        "arch_list": list(stack.arch_list) == seen["arch_list"],
        "ptx": list(stack.ptx) == seen["ptx"],
        "cudnn": stack.cudnn is not None
        and _version_tuple(stack.cudnn)[:2] == (cudnn // 10000, cudnn // 100 % 100),
        "nccl": stack.nccl is not None and _version_tuple(stack.nccl)[:3] == _version_tuple(nccl)[:3],
        "min_driver_below_this_driver": stack.min_driver is not None
        and _version_tuple(stack.min_driver) <= _version_tuple(driver[0]),
    }
    result = {
        "torch": torch.__version__,
        "python": python,
        "gpu": driver[1],
        "driver": driver[0],
        "labels": {k: v for k, v in vars(stack).items()},
        "torch_reports": seen,
        "agree": checks,
    }
    (out_dir / "labels-vs-torch.json").write_text(json.dumps(result, indent=2, default=list) + "\n")

    spec_file = out_dir / "torchrig.toml"
    spec_file.write_text(
        f'[torch]\ngpus = ["{driver[1]}"]\nmin_driver = "{driver[0]}"\n[python]\nversion = "3.12"\n'
    )
    plan = make_plan(ImageOptions(spec=spec_file), kb=kb)
    (out_dir / "Dockerfile").write_text(render.render_dockerfile(plan))
    print(f"images: torch {torch.__version__} on {driver[1]} (driver {driver[0]})")
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'DIFF'} {name}: knowledge base/labels vs torch")
    print(f"  spec for this GPU and driver resolves to {plan.stack_tag} (min driver {plan.stack.min_driver})")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
