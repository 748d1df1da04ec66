"""Record what NVML answers about GPU 0's clocks while something runs on it: the raw answers that
torchrig.train.gpuwatch reads (SM clock, power, the power and thermal violation counters, the SM clock
ceiling and the power limit), every INTERVAL seconds for SECONDS seconds, as JSON on stdout. The unit tests
replay such a recording at the pynvml boundary (tests/fixtures/train/nvml-clocks-*.json).

Usage (GPU machine): python3 tools/gpu/record_clocks.py SECONDS INTERVAL > clocks.json
"""

from __future__ import annotations

import json
import sys
import time

import pynvml as nv


def main() -> None:
    seconds, interval = float(sys.argv[1]), float(sys.argv[2])
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    out = {
        "gpu": nv.nvmlDeviceGetName(h),
        "driver": nv.nvmlSystemGetDriverVersion(),
        "nvmlDeviceGetMaxClockInfo_SM": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        "nvmlDeviceGetEnforcedPowerLimit": nv.nvmlDeviceGetEnforcedPowerLimit(h),
        "samples": [],
    }
    end = time.time() + seconds
    while time.time() < end:
        p = nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_POWER)
        t = nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_THERMAL)
        out["samples"].append(
            {
                "t": time.time(),
                "nvmlDeviceGetClockInfo_SM": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                "nvmlDeviceGetPowerUsage": nv.nvmlDeviceGetPowerUsage(h),
                "nvmlDeviceGetTemperature": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                "violation_power": [p.referenceTime, p.violationTime],
                "violation_thermal": [t.referenceTime, t.violationTime],
            }
        )
        time.sleep(interval)
    nv.nvmlShutdown()
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
