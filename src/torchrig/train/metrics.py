"""Metrics out of the trainer (rank 0 only): JSONL, TensorBoard, a progress line, throughput and MFU."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def peak_tflops(device_name: str | None, precision: str, override: float | None) -> tuple[float | None, str]:
    """Dense peak TFLOP/s for MFU, and where it came from (``--peak-tflops`` wins over the knowledge base)."""
    if override:
        return override, "--peak-tflops"
    if not device_name:
        return None, "unknown (CPU; give --peak-tflops)"
    if precision == "fp8":
        # Against the bf16 peak, so an fp8 run's MFU compares with a bf16 run's on the same model (only the
        # Linear layers run in fp8), as torchtitan counts its float8 runs (tools/utils.py: get_peak_flops).
        precision = "bf16"
    from torchrig.errors import TorchrigError

    try:
        from torchrig.compat import load_kb

        peaks = load_kb().find_gpu(device_name).peaks
        value = (
            peaks.fp16_tflops
            if precision == "fp16"
            else (peaks.bf16_tflops if precision == "bf16" else getattr(peaks, "tf32_tflops", None))
        )
        if value:
            return float(value), f"knowledge base ({device_name}, dense {precision})"
    except TorchrigError as err:  # the knowledge base does not know this GPU, or is damaged: MFU is unknown
        return None, f"unknown ({err.message}; give --peak-tflops)"
    return None, f"unknown for {device_name} ({precision}); give --peak-tflops"


# A metrics record is a few hundred bytes; a longer line is damage, dropped without being held in memory.
MAX_LINE_BYTES = 1 << 20
# A record per log step, ~300 bytes: a million log steps are 300 MB. A bigger file is refused, not scanned.
MAX_METRICS_BYTES = 4 << 30


def rewind_jsonl(path: Path, step: int) -> None:
    """Drop step records after ``step`` (work lost with a crash), so the file shows the committed history.
    Lines that are not a record (cut short by a crash, damaged, not UTF-8, over :data:`MAX_LINE_BYTES`) are
    dropped too. Streamed: memory stays at one line whatever the file's size. A ``metrics.jsonl`` that is
    not a regular file (a FIFO, a device) is an InputError, never waited on."""
    import os

    from torchrig import inputfiles

    if not os.path.lexists(path):
        return
    tmp = path.with_suffix(".tmp")
    with inputfiles.open_regular(path, "metrics file") as src:
        size = os.fstat(src.fileno()).st_size
        if size > MAX_METRICS_BYTES:
            raise inputfiles.InputError(
                f"metrics file {str(path)!r} is {size:,} bytes, more than the {MAX_METRICS_BYTES:,} read",
                hint="move it aside: the run starts a new one",
            )
        with open(tmp, "wb") as dst:
            while raw := src.readline(MAX_LINE_BYTES + 1):
                if len(raw) > MAX_LINE_BYTES:  # the rest of an overlong line: skipped, then the next line
                    while (more := src.readline(MAX_LINE_BYTES)) and not more.endswith(b"\n"):
                        pass
                    continue
                if _keep(raw, step):
                    dst.write(raw.rstrip(b"\r\n") + b"\n")
    tmp.replace(path)


def _keep(raw: bytes, step: int) -> bool:
    try:
        rec = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False
    if not isinstance(rec, dict):
        return False
    s = rec.get("step")
    # a step after the checkpoint, or no step number at all, goes
    return not (rec.get("event") is None and "step" in rec and not (type(s) is int and s <= step))


class Metrics:
    """Writes records to ``metrics.jsonl`` and TensorBoard, and a progress line to stderr."""

    def __init__(self, out: Path, total_steps: int, *, enabled: bool, tensorboard: bool) -> None:
        self.enabled, self.total = enabled, total_steps
        self.path = out / "metrics.jsonl"
        self.tb: Any = None
        self.intervals: list[tuple[int, float]] = []  # (first step of interval, units per second)
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()
        if not enabled:
            return
        out.mkdir(parents=True, exist_ok=True)
        import os

        if os.path.lexists(self.path):  # appending to a FIFO would wait for a reader forever
            from torchrig import inputfiles

            inputfiles.open_regular(self.path, "metrics file").close()
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out / "tensorboard"))
            except Exception as err:  # tensorboard not installed: JSONL still has everything
                print(f"torchrig train: TensorBoard off ({type(err).__name__}: {err})", file=sys.stderr)

    def _append(self, rec: dict[str, Any]) -> None:
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        except OSError as e:
            from torchrig.train.rundir import disk_full_writing, is_disk_full

            if is_disk_full(e):
                raise disk_full_writing(self.path, self.path.parent) from None
            raise

    def event(self, **rec: Any) -> None:
        if self.enabled:
            self._append(rec)

    def step(self, rec: dict[str, Any], unit: str, interval_first_step: int) -> None:
        if not self.enabled:
            return
        self.intervals.append((interval_first_step, rec[f"{unit}_per_s"]))
        self._append(rec)
        if self.tb is not None:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and k != "step" and v is not None:
                    self.tb.add_scalar(f"train/{k}", v, rec["step"])
        self._progress(rec, unit)

    def _progress(self, rec: dict[str, Any], unit: str) -> None:
        s, n = rec["step"], self.total
        filled = int(24 * s / n)
        elapsed = time.perf_counter() - self.start
        eta = elapsed / max(s, 1) * (n - s)
        mfu = f" MFU {rec['mfu'] * 100:.1f}%" if rec.get("mfu") is not None else ""
        loss = "skipped" if rec["loss"] is None else f"{rec['loss']:.4f}"  # --on-nonfinite skip, every step
        line = (
            f"[{'#' * filled}{'.' * (24 - filled)}] step {s}/{n} loss {loss} lr {rec['lr']:.2e} "
            f"{rec[f'{unit}_per_s'] / 1e3:.1f}k {unit}/s{mfu} eta {eta:.0f}s"
        )
        end = "\r" if self.tty and s < n else "\n"
        print(line, end=end, file=sys.stderr, flush=True)

    def steady(self, after_step: int, before_step: int | None = None) -> float | None:
        """Median throughput over the intervals that start after ``after_step`` (compile and warm-up excluded)
        and before ``before_step`` (the profiled steps, when there are any)."""
        timed = [(first, v) for first, v in self.intervals if before_step is None or first < before_step]
        vals = [v for first, v in timed if first > after_step]
        if not vals and timed:
            vals = [v for _, v in timed[len(timed) // 2 :]]
        return statistics.median(vals) if vals else None

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
