"""The GPT's GEMMs by the fastest of cuBLASLt's algorithms for their shape, chosen by timing on this GPU.

``TORCHRIG_TUNED_GEMMS=1`` (off by default: measured slower in the compiled step, docs/results/training-speed.md;
tools/gpu/train_levers.py's ``ltg``). PyTorch calls cuBLAS, which takes its heuristic's first algorithm for
each shape; the heuristic offers several (``cublasLtMatmulAlgoGetHeuristic``), and for some of a training
step's shapes a later one may be faster (tools/gpu/gemm_algos.py times them all). Before the first compiled step the trainer runs one eager forward
and backward of the model at the run's micro-batch (``tune_model``): every GEMM that goes through ``mm`` is met
there with its real shape and layout, and is timed, PyTorch's own call against each of the heuristic's
algorithms (``TUNE_ALGOS``) on the same operands. A cuBLASLt algorithm is kept for that shape only where it
is faster by ``MIN_GAIN`` and its result is PyTorch's within bf16 rounding (``MAX_REL_DIFF``); every other
shape keeps PyTorch's call. The compiled graph then calls the chosen algorithm as the custom operator
``torchrig::lt_mm``: opaque to Inductor, captured by CUDA graphs like any kernel.

The arithmetic is the same GEMM's (bf16 operands, fp32 accumulation, bf16 result, the bias added in the
epilogue as cuBLAS adds it for ``F.linear``); only the kernel, and so the order of the fp32 sums, differs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

TUNE_ALGOS = 16  # of the heuristic's algorithms, how many are timed per shape (its order: best guess first)
MIN_GAIN = 0.02  # an algorithm replaces PyTorch's call only where it is at least this much faster
MAX_REL_DIFF = 0.02  # largest element's relative difference to PyTorch's result that bf16 rounding explains

_choices: dict[
    tuple[Any, ...], int
] = {}  # shape key -> the heuristic's algorithm index; absent: PyTorch's call
_state: dict[str, Any] = {"active": False, "tuning": None}
_lock = threading.Lock()


@dataclass
class Tuned:
    """What ``tune_model`` found: per shape, PyTorch's time and the chosen algorithm's (``None``: kept)."""

    shapes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def chosen(self) -> int:
        return sum(1 for s in self.shapes if s["algo"] is not None)

    def saving_ms(self) -> float:
        """ms a step saved by the timing: each chosen shape's gain times its calls in the dry run."""
        return sum(s["calls"] * (s["torch_ms"] - s["ms"]) for s in self.shapes if s["algo"] is not None)

    def line(self) -> str:
        return (
            f"{self.chosen} of {len(self.shapes)} GEMM shapes run a faster cuBLASLt algorithm "
            f"({self.saving_ms():.2f} ms a step by their timing)"
        )


def pick(torch_ms: float, algo_ms: dict[int, float], rel_diff: dict[int, float]) -> int | None:
    """The algorithm to use instead of PyTorch's call: the fastest whose result is within ``MAX_REL_DIFF`` and
    which beats ``torch_ms`` by ``MIN_GAIN``; None keeps PyTorch's call."""
    good = [(ms, a) for a, ms in algo_ms.items() if rel_diff.get(a, float("inf")) <= MAX_REL_DIFF]
    if not good:
        return None
    ms, algo = min(good)
    return algo if ms <= torch_ms * (1 - MIN_GAIN) else None


def _key(x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None) -> tuple[Any, ...] | None:
    """The shape and layout that a choice is made for; None where cuBLASLt's matmul cannot take the operands
    (no exception on the way: this runs while torch.compile traces the model)."""
    from torchrig.train import cublaslt

    if not (x.is_cuda and x.dtype == y.dtype == torch.bfloat16 and x.dim() == y.dim() == 2):
        return None
    if bias is not None and (bias.dtype != torch.bfloat16 or bias.dim() != 1 or not bias.is_contiguous()):
        return None
    if x.shape[1] != y.shape[0] or cublaslt.operand_layout(x) is None or cublaslt.operand_layout(y) is None:
        return None
    return (*cublaslt._mm_key(x, y), bias is not None, x.device.index or 0)


def _torch_mm(x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x @ y if bias is None else torch.addmm(bias, x, y)


@torch.library.custom_op("torchrig::lt_mm", mutates_args=())
def lt_mm(x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None, algo: int) -> torch.Tensor:
    """``x @ y (+ bias)`` by the heuristic's ``algo``-th cuBLASLt algorithm; PyTorch's call where the operands'
    layout is not the one the algorithm was chosen for."""
    from torchrig.train import cublaslt

    try:
        return cublaslt.matmul(x, y, bias, algo=algo)
    except cublaslt.CublasLtError:
        return _torch_mm(x, y, bias)


@lt_mm.register_fake
def _lt_mm_fake(x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None, algo: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], y.shape[1])


def mm(x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ y`` (``torch.addmm(bias, x, y)`` with a bias): by the algorithm ``tune_model`` chose for this shape
    and layout where it chose one, else PyTorch's own call (always, unless the lever is on)."""
    if not _state["active"]:
        return _torch_mm(x, y, bias)
    key = _key(x, y, bias)
    if key is None:
        return _torch_mm(x, y, bias)
    tuning = _state["tuning"]
    if tuning is not None:  # the eager dry run: time this shape the first time it is met
        tuning(key, x, y, bias)
    algo = _choices.get(key)
    if algo is None:
        return _torch_mm(x, y, bias)
    return lt_mm(x, y, bias, algo)


def time_ms(fn: Any, reps: int = 5, calls: int = 10, warmup: int = 3) -> float:
    """Median ms per call of ``fn`` on the current GPU: CUDA events around ``calls`` calls, ``reps`` times,
    after ``warmup`` calls (also the benchmarks' timing: tools/gpu/lt_epilogue_bench.py)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / calls)
    return sorted(out)[len(out) // 2]


def _tune_shape(tuned: Tuned, seen: dict[tuple[Any, ...], dict[str, Any]]) -> Any:
    from torchrig.train import cublaslt

    def tune(key: tuple[Any, ...], x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None) -> None:
        if key in seen:
            seen[key]["calls"] += 1
            return
        ref = _torch_mm(x, y, bias)
        torch_ms = time_ms(lambda: _torch_mm(x, y, bias))
        algo_ms, diffs = {}, {}
        try:
            count = cublaslt.algorithm_count(x, y, bias is not None)
        except cublaslt.CublasLtError:  # no algorithm for this shape (e.g. a width cuBLASLt cannot align)
            count = 0
        for a in range(min(count, TUNE_ALGOS)):
            try:
                out = cublaslt.matmul(x, y, bias, algo=a)
                diffs[a] = float(
                    (out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)
                )
                algo_ms[a] = time_ms(lambda a=a: cublaslt.matmul(x, y, bias, algo=a))
            except (
                cublaslt.CublasLtError,
                RuntimeError,
            ):  # an algorithm that cannot run this GEMM is skipped
                continue
        algo = pick(torch_ms, algo_ms, diffs)
        row = {
            "m_n_k": [x.shape[0], y.shape[1], x.shape[1]],
            "layout": "".join("T" if t else "N" for t in key[:2]),
            "bias": bias is not None,
            "calls": 1,
            "torch_ms": round(torch_ms, 4),
            "algo": algo,
            "ms": round(algo_ms[algo], 4) if algo is not None else None,
        }
        seen[key] = row
        tuned.shapes.append(row)
        if algo is not None:
            _choices[key] = algo

    return tune


def enable() -> None:
    """Route ``mm``'s GEMMs through the chosen algorithms (none chosen yet: PyTorch's calls)."""
    _state["active"] = True


def disable() -> None:
    """Back to PyTorch's calls everywhere, the choices forgotten (tests)."""
    _state["active"] = False
    _choices.clear()


def tune_model(run: Any) -> Tuned:
    """Call ``run()`` (one eager forward and backward at the run's shapes) with timing on: every GEMM ``mm``
    meets is timed once and given an algorithm where one is faster (``pick``). The random state is left as
    it was. Call ``enable()`` first."""
    from torchrig.train import cublaslt

    tuned, seen = Tuned(), dict[tuple[Any, ...], dict[str, Any]]()
    with _lock:
        cublaslt.HEURISTIC_RESULTS = max(cublaslt.HEURISTIC_RESULTS, TUNE_ALGOS)
        _state["tuning"] = _tune_shape(tuned, seen)
        try:
            with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
                run()
            torch.cuda.synchronize()
        finally:
            _state["tuning"] = None
    return tuned


class _Linear(torch.autograd.Function):
    """``x @ wᵀ + b`` on 2-D bf16 tensors through ``mm``: the forward, the input and the weight gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:  # type: ignore[override,unused-ignore]
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return mm(x, w.t(), b)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override,unused-ignore]
        x, w = ctx.saved_tensors
        dy = dy.contiguous()
        return mm(dy, w), mm(dy.t(), x), dy.sum(0) if ctx.has_bias else None


def linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    """``layer(x)`` under bf16 autocast on a GPU, its three GEMMs through ``mm``; ``layer(x)`` itself anywhere
    else. The weight and bias are cast to bf16 as autocast casts them (the fp32 parameters get their
    gradients through the casts)."""
    kind = x.device.type
    if not (
        _state["active"] and kind == "cuda" and torch.is_autocast_enabled(kind)
        and torch.get_autocast_dtype(kind) == torch.bfloat16
    ):  # fmt: skip
        return layer(x)
    dt = torch.bfloat16
    shape = x.shape
    with torch.autocast(kind, enabled=False):
        b = layer.bias.to(dt) if layer.bias is not None else None
        y = _Linear.apply(x.reshape(-1, shape[-1]).to(dt).contiguous(), layer.weight.to(dt), b)
    return y.view(*shape[:-1], y.shape[-1])  # type: ignore[no-any-return,unused-ignore]
