"""How fast one GPT-2 small training step could be at the card's power limit: its GEMMs and its attention alone.

Usage (GPU machine, repository root): PYTHONPATH=src python3 tools/gpu/step_floor.py [MB ...] > floor.jsonl

For each micro-batch MB (16 when none is given) three CUDA graphs are recorded and each is replayed for
SECONDS_EACH (env, default 8) seconds, long enough for the driver to settle the clock under its power limit:
- ``gemms``: exactly the GEMMs of one step: the forward, input-gradient and weight-gradient product of every
  Linear layer of the 12 blocks (qkv 768->2304, attention projection 768->768, fc 768->3072, projection
  3072->768) and of the tied head (768->50304), bf16, each layer with its own buffers (no L2 reuse a real
  step does not have);
- ``attention``: the 12 layers' causal attention, forward and backward, through cuDNN's fused SDPA kernel
  (the kernel the trainer's profile shows);
- ``both``: the two in one graph (every forward, then every backward).
Each prints one JSON line: ms a step, TFLOP/s, the SM clock (median of samples between replays), mean power
and energy a step from NVML's energy counter, and the share of the time the driver held the clocks down for
power. A training step cannot be shorter than ``both`` at the same power limit unless its GEMMs or its
attention change: the rest of the step (norms, GELU, residual adds, the loss, the optimizer) has to fit in
the difference between a target step and ``both``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

LAYERS, WIDTH, HEADS, SEQ, VOCAB = 12, 768, 12, 1024, 50304
LINEARS = ((WIDTH, 3 * WIDTH), (WIDTH, WIDTH), (WIDTH, 4 * WIDTH), (4 * WIDTH, WIDTH))  # (in, out)


def nvml():
    try:
        import pynvml as nv

        nv.nvmlInit()
        return nv, nv.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    except Exception as e:  # no bindings or no driver access: the figures go without power
        print(f"step_floor: no NVML ({e})", file=sys.stderr)
        return None, None


def read(nv, h) -> dict:
    if nv is None:
        return {}
    out = {}
    for key, fn in (
        ("energy_mj", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)),
        ("clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
        ("held_s", lambda: nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_POWER).violationTime / 1e9),
    ):
        try:
            out[key] = fn()
        except Exception:
            out[key] = None
    return out


def build(mb: int, part: str):
    """The work of one step as a function (no allocation inside), and its FLOPs."""
    dev, bf = torch.device("cuda"), torch.bfloat16
    m = mb * SEQ
    g = torch.Generator(device=dev).manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, device=dev, dtype=bf, generator=g) * 0.02

    fwd, bwd, flops = [], [], 0
    if part in ("gemms", "both"):
        for _ in range(LAYERS):
            for k, n in LINEARS:
                x, w, dy = r(m, k), r(n, k), r(m, n)
                y, dx, dw = torch.empty(m, n, device=dev, dtype=bf), torch.empty_like(x), torch.empty_like(w)
                fwd.append(lambda x=x, w=w, y=y: torch.mm(x, w.t(), out=y))
                bwd.append(lambda dy=dy, w=w, dx=dx: torch.mm(dy, w, out=dx))
                bwd.append(lambda dy=dy, x=x, dw=dw: torch.mm(dy.t(), x, out=dw))
                flops += 3 * 2 * m * n * k
        x, w, dy = r(m, WIDTH), r(VOCAB, WIDTH), r(m, VOCAB)
        y, dx, dw = torch.empty(m, VOCAB, device=dev, dtype=bf), torch.empty_like(x), torch.empty_like(w)
        fwd.append(lambda: torch.mm(x, w.t(), out=y))
        bwd.insert(0, lambda: torch.mm(dy, w, out=dx))
        bwd.insert(1, lambda: torch.mm(dy.t(), x, out=dw))
        flops += 3 * 2 * m * VOCAB * WIDTH
    if part in ("attention", "both"):
        hd = WIDTH // HEADS
        for _ in range(LAYERS):
            q, k, v = (r(mb, HEADS, SEQ, hd).requires_grad_() for _ in range(3))
            go = r(mb, HEADS, SEQ, hd)
            holder: dict = {}

            def f(q=q, k=k, v=v, holder=holder):
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    holder["o"] = F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def b(q=q, k=k, v=v, go=go, holder=holder):
                torch.autograd.grad(holder.pop("o"), (q, k, v), go)

            fwd.append(f)
            bwd.append(b)
            # causal: half of the 4·T²·D products a head, forward 1×, backward 2.5×
            flops += int(3.5 * 4 * mb * HEADS * SEQ * SEQ * hd / 2)
    ops = fwd + list(reversed(bwd))  # every forward, then the backward from the head down

    def step():
        for op in ops:
            op()

    return step, flops


def measure(mb: int, part: str, seconds: float, nv, h) -> dict:
    step, flops = build(mb, part)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(20):  # warm: the clock comes down to where the power limit holds it
        graph.replay()
    torch.cuda.synchronize()
    replays, clocks, powers = 0, [], []
    a, e0 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n0 = read(nv, h)
    t0 = time.perf_counter()
    a.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            graph.replay()
        replays += 10
        torch.cuda.synchronize()
        x = read(nv, h)
        clocks.append(x.get("clock_mhz"))
        powers.append(x.get("power_w"))
    e0.record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    n1 = read(nv, h)
    ms = a.elapsed_time(e0) / replays
    row = {
        "part": part,
        "micro_batch": mb,
        "ms_per_step": round(ms, 3),
        "tflops": round(flops / (ms / 1e3) / 1e12, 1),
        "step_tflop": round(flops / 1e12, 3),
        "replays": replays,
    }
    if n0.get("energy_mj") is not None and n1.get("energy_mj") is not None:
        joules = (n1["energy_mj"] - n0["energy_mj"]) / 1e3
        row.update(energy_j_per_step=round(joules / replays, 3), mean_power_w=round(joules / wall, 1))
    known = [c for c in clocks if c]
    if known:
        row["clock_mhz_min_med_max"] = [min(known), statistics.median(known), max(known)]
    if n0.get("held_s") is not None and n1.get("held_s") is not None:
        row["power_held_share"] = round((n1["held_s"] - n0["held_s"]) / wall, 3)
    del graph
    torch.cuda.empty_cache()
    return row


def main() -> int:
    mbs = [int(a) for a in sys.argv[1:]] or [16]
    seconds = float(os.environ.get("SECONDS_EACH", "8"))
    nv, h = nvml()
    info = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "seconds_each": seconds,
    }
    if nv is not None:
        try:
            info["power_limit_w"] = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
            info["max_sm_clock_mhz"] = nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)
        except Exception:
            pass
    print(json.dumps(info), flush=True)
    for mb in mbs:
        for part in ("gemms", "attention", "both"):
            print(json.dumps(measure(mb, part, seconds, nv, h)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
