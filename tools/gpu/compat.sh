#!/usr/bin/env bash
# Compatibility engine on the GPU machine: does `torchrig check` agree with what the hardware does?
# For each GPU: the verdict of `torchrig check` for the installed torch build and the real driver, then a real
# workload (matmul in bf16/fp32, a cuDNN convolution) and torch's own view (get_arch_list / device capability,
# run through torchrig.compat.rules.arch_coverage). Also records `torchrig resolve` for this GPU and driver.
# Results: $OUT/compat/result.json and the raw command outputs. Needs no network; one GPU is enough.
# Usage (repository root): OUT=/tmp/out bash tools/gpu/compat.sh
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR="${OUT:-/tmp}/compat"
mkdir -p "$OUT_DIR"
export OUT_DIR
python3 - <<'PY'
import json, os, subprocess, sys, time

import torch

from torchrig.compat.rules import arch_coverage

out = os.environ["OUT_DIR"]
driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                        capture_output=True, text=True, check=True).stdout.split()[0]
build = torch.__version__
result = {"torch": build, "driver": driver, "arch_list": torch.cuda.get_arch_list(), "gpus": []}


def torchrig(*args):
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "torchrig", *args, "--json"], capture_output=True, text=True)
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {"stderr": p.stderr}, time.perf_counter() - t0


for i in range(torch.cuda.device_count()):
    name = torch.cuda.get_device_name(i)
    cc = "%d.%d" % torch.cuda.get_device_capability(i)
    rc, check, secs = torchrig("check", "--gpu", name, "--driver", driver, "--torch", build)
    cov = arch_coverage(cc, torch.cuda.get_arch_list())
    ran, error = True, None
    try:
        dev = torch.device("cuda", i)
        a = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
        (a @ a).float().sum().item()
        x = torch.randn(8, 16, 64, 64, device=dev)
        torch.nn.functional.conv2d(x, torch.randn(32, 16, 3, 3, device=dev)).sum().item()
        torch.cuda.synchronize(dev)
    except Exception as err:  # the point is to record whether it runs
        ran, error = False, f"{type(err).__name__}: {err}"
    verdict = check.get("verdict")
    agrees = (verdict in ("works", "works_with_caveats")) == ran
    result["gpus"].append({"index": i, "name": name, "cc": cc, "check_exit": rc, "verdict": verdict,
                           "reasons": [r["code"] for r in check.get("reasons", [])], "check_seconds": round(secs, 3),
                           "arch_coverage": cov.kind.value, "coverage_why": cov.why, "workload_ran": ran,
                           "workload_error": error, "agrees": agrees})
    print(f"compat: GPU{i} {name} (cc {cc}) driver {driver} torch {build}: check={verdict} "
          f"coverage={cov.kind.value} workload={'ran' if ran else 'FAILED'} -> {'AGREES' if agrees else 'DISAGREES'}")
    if i == 0:
        rc, res, _ = torchrig("resolve", "--gpu", name, "--driver", driver)
        result["resolve"] = {"exit": rc, "build": res.get("build", {}).get("label"), "pip_command": res.get("pip_command")}
        print(f"compat: resolve for {name} with driver {driver}: {result['resolve']['build']}")

with open(os.path.join(out, "result.json"), "w") as f:
    json.dump(result, f, indent=2)
bad = [g for g in result["gpus"] if not g["agrees"]]
print(f"compat: {len(result['gpus']) - len(bad)}/{len(result['gpus'])} GPUs agree with `torchrig check`")
sys.exit(1 if bad else 0)
PY
