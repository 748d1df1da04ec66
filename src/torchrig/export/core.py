"""The export pipeline: checkpoint -> eager model -> .pt2 and .onnx -> verified against eager."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from torchrig.errors import EngineUnavailable, InputError


@dataclass(frozen=True)
class Artifact:
    format: str  # "pt2" or "onnx"
    path: str
    size_bytes: int
    max_abs_diff: float | None  # vs the eager model on the same input
    runtime: str  # what ran it for the check
    ok: bool
    export_s: float


@dataclass(frozen=True)
class ExportResult:
    checkpoint: str
    step: int
    model: str
    input_shape: tuple[int, ...]
    tolerance: float
    artifacts: tuple[Artifact, ...]

    @property
    def ok(self) -> bool:
        return all(a.ok for a in self.artifacts)


def _example(spec: dict, batch: int, seq_len: int | None):
    import torch

    g = torch.Generator().manual_seed(0)
    if spec["model"] == "gpt":
        t = min(seq_len or spec["context"], spec["context"])
        return torch.randint(0, int(spec["vocab"]), (batch, t), generator=g)
    return torch.randn(batch, 3, spec["image_size"], spec["image_size"], generator=g)


def _diff(a, b) -> float:
    import torch

    return float((torch.as_tensor(a).float() - torch.as_tensor(b).float()).abs().max())


def export_checkpoint(
    path: Path,
    out_dir: Path,
    *,
    formats: tuple[str, ...] = ("pt2", "onnx"),
    batch: int = 2,
    seq_len: int | None = None,
    tolerance: float = 1e-3,
) -> ExportResult:
    import torch

    from torchrig.train import checkpoint as ckpt
    from torchrig.train import rundir
    from torchrig.train.models import model_from_spec

    try:
        folder = ckpt.resolve(path)
    except FileNotFoundError:
        saved = rundir.checkpoints(path / rundir.CHECKPOINTS) or rundir.checkpoints(path)
        if saved:
            root = saved[-1].path.parent
            raise InputError(
                f"no checkpoint at {path}: {root / ckpt.LATEST} names {rundir.pointer(root)!r}, which is not "
                "a complete checkpoint",
                hint=f"export one that is, e.g. {saved[-1].path}",
            ) from None
        raise InputError(
            f"no checkpoint at {path}",
            hint="give a run folder, its checkpoints/ folder, or a step-N folder with meta.json",
        ) from None
    meta = ckpt.read_meta(folder)
    _verify(folder, meta)
    spec = meta.get("model_spec")
    if not isinstance(spec, dict) or spec.get("model") not in ("gpt", "resnet"):
        raise InputError(f"{folder / ckpt.META} has no usable model_spec", hint="the checkpoint is damaged")
    try:
        model = model_from_spec(spec)
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{folder / ckpt.META}: bad model_spec ({type(e).__name__}: {e})") from None
    ckpt.load_model_only(folder, model)
    model.eval()
    x = _example(spec, batch, seq_len)
    with torch.no_grad():
        ref = model(x)
    out_dir.mkdir(parents=True, exist_ok=True)
    arts = []
    if "pt2" in formats:
        arts.append(_pt2(model, x, ref, out_dir / "model.pt2", tolerance))
    if "onnx" in formats:
        arts.append(_onnx(model, x, ref, out_dir / "model.onnx", tolerance))
    return ExportResult(str(folder), int(meta["step"]), spec["model"], tuple(x.shape), tolerance, tuple(arts))


def _verify(folder: Path, meta: dict) -> None:
    """Refuse a checkpoint whose files differ from their recorded checksums, naming the file and an intact
    older checkpoint of the same run when there is one."""
    from torchrig.train import rundir

    problems = rundir.verify(folder, meta)
    if not problems:
        return
    older = [
        s.path
        for s in rundir.resume_order(folder.parent)
        if s.step < int(meta["step"]) and s.run_id == meta.get("run_id") and not rundir.verify(s.path)
    ]
    raise InputError(
        f"{folder} is damaged: {'; '.join(problems)}",
        hint=f"export the intact {older[0]} instead" if older else "restore it from a copy",
    )


def _pt2(model, x, ref, path: Path, tol: float) -> Artifact:
    import torch

    t0 = time.perf_counter()
    ep = torch.export.export(model, (x,))
    torch.export.save(ep, str(path))
    took = time.perf_counter() - t0
    with torch.no_grad():
        got = torch.export.load(str(path)).module()(x)
    d = _diff(got, ref)
    return Artifact(
        "pt2", str(path), path.stat().st_size, d, "torch.export.load(...).module()", d <= tol, round(took, 2)
    )


def _onnx(model, x, ref, path: Path, tol: float) -> Artifact:
    import torch

    try:
        import onnxruntime as ort
    except ImportError:
        raise EngineUnavailable(
            "onnxruntime is not installed", hint="pip install 'torchrig[train]'"
        ) from None
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (x,), str(path), dynamo=True, input_names=["input"], output_names=["output"], verbose=False
        )
    took = time.perf_counter() - t0
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    d = _diff(got, ref)
    data = path.with_name(path.name + ".data")  # weights go to an external-data file next to it
    size = path.stat().st_size + (data.stat().st_size if data.exists() else 0)
    return Artifact(
        "onnx", str(path), size, d, f"onnxruntime {ort.__version__} (CPU)", d <= tol, round(took, 2)
    )
