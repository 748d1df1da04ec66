"""The export pipeline: checkpoint -> eager model -> .pt2 and .onnx -> verified against eager."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    extra_files: tuple[str, ...] = ()  # files the artifact needs beside it (model.onnx.data: the weights)


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


# the example input's default length: the context, at most this (a checkpoint may describe a long context;
# the eager reference run's attention grows with its square)
EXAMPLE_SEQ_DEFAULT_MAX = 2048


def _example(spec: dict, batch: int, seq_len: int | None):
    import torch

    g = torch.Generator().manual_seed(0)
    if spec["model"] == "gpt":
        t = min(seq_len or EXAMPLE_SEQ_DEFAULT_MAX, spec["context"])
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
    from torchrig.train import rundir

    try:
        folder = rundir.resolve(path)  # a path with no checkpoint is refused before torch is imported
    except FileNotFoundError:
        saved = rundir.checkpoints(path / rundir.CHECKPOINTS) or rundir.checkpoints(path)
        if saved:
            root = saved[-1].path.parent
            raise InputError(
                f"no checkpoint at {path}: {root / rundir.LATEST} names {rundir.pointer(root)!r}, which is not "
                "a complete checkpoint",
                hint=f"export one that is, e.g. {saved[-1].path}",
            ) from None
        raise InputError(
            f"no checkpoint at {path}",
            hint="give a run folder, its checkpoints/ folder, or a step-N folder with meta.json",
        ) from None
    import torch

    from torchrig.train import checkpoint as ckpt
    from torchrig.train.models import model_from_spec

    meta = ckpt.read_meta(folder)
    _verify(folder, meta)
    spec = checked_spec(meta.get("model_spec"), str(folder / ckpt.META))
    _fits_checkpoint(folder, spec)  # before a single weight is allocated
    model = model_from_spec(spec)
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


# What a model_spec may ask for: far above any size torchrig trains (sizes.toml's largest GPT, XL: 48
# layers, 1600 wide, context 1024, vocabulary 50304; ResNet-34: 4 stages of up to 6 blocks) and small enough
# that describing one costs nothing. The weights themselves are bounded by the checkpoint's files below.
SPEC_LIMITS = {
    "layers": 256,
    "heads": 1024,
    "width": 65536,
    "context": 1 << 20,
    "vocab": 1 << 24,
    "num_classes": 1 << 20,
    "image_size": 4096,
}
MAX_STAGES, MAX_STAGE_BLOCKS = 8, 64


def _bounded_int(data: dict, key: str, where: str, label: str) -> int:
    value = data.get(key)
    top = SPEC_LIMITS[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise InputError(
            f"{where}: {label} must be an integer 1..{top}, found {value!r:.40}",
            hint="the checkpoint is damaged or was not written by torchrig train",
        )
    return value


def checked_spec(spec: Any, where: str) -> dict[str, Any]:
    """``meta.json``'s ``model_spec``, each number typed and within :data:`SPEC_LIMITS`; an
    :class:`InputError` naming the file and the key otherwise. Returns the spec the model is built from."""
    hint = "the checkpoint is damaged or was not written by torchrig train"
    if not isinstance(spec, dict) or spec.get("model") not in ("gpt", "resnet"):
        raise InputError(f"{where} has no usable model_spec (model 'gpt' or 'resnet')", hint=hint)
    size = spec.get("size_info")
    if not isinstance(size, dict):
        raise InputError(f"{where}: model_spec.size_info must be an object, found {size!r:.40}", hint=hint)
    out = dict(spec)
    if spec["model"] == "gpt":
        layers = _bounded_int(size, "layers", where, "model_spec.size_info.layers")
        heads = _bounded_int(size, "heads", where, "model_spec.size_info.heads")
        width = _bounded_int(size, "width", where, "model_spec.size_info.width")
        if width % heads:
            raise InputError(
                f"{where}: model_spec.size_info.width {width} is not a multiple of heads {heads}"
            )
        vocab_of = spec if spec.get("vocab") is not None else size
        out.update(
            size_info={"layers": layers, "heads": heads, "width": width},
            context=_bounded_int(spec, "context", where, "model_spec.context"),
            vocab=_bounded_int(vocab_of, "vocab", where, "model_spec.vocab"),
            num_classes=None,
        )
        return out
    blocks = size.get("blocks")
    if (
        not isinstance(blocks, list)
        or not 1 <= len(blocks) <= MAX_STAGES
        or not all(type(b) is int and 1 <= b <= MAX_STAGE_BLOCKS for b in blocks)
    ):
        raise InputError(
            f"{where}: model_spec.size_info.blocks must be 1..{MAX_STAGES} integers 1..{MAX_STAGE_BLOCKS}, "
            f"found {blocks!r:.60}",
            hint=hint,
        )
    out.update(
        size_info={
            "blocks": list(blocks),
            "width": _bounded_int(size, "width", where, "model_spec.size_info.width"),
        },
        context=None,
        vocab=None,
        num_classes=_bounded_int(spec, "num_classes", where, "model_spec.num_classes"),
        image_size=_bounded_int(spec, "image_size", where, "model_spec.image_size"),
    )
    return out


def _fits_checkpoint(folder: Path, spec: dict[str, Any]) -> None:
    """The model ``spec`` describes has exactly the weights the checkpoint's ``.metadata`` records, and they
    fit in its shard files: a crafted spec cannot make export allocate a model the files do not hold.
    Checked on PyTorch's ``meta`` device (shapes only, nothing allocated)."""
    import torch

    from torchrig.train import checkpoint as ckpt
    from torchrig.train.models import model_from_spec
    from torchrig.train.rundir import size_text

    where, md_path = folder / ckpt.META, folder / ".metadata"
    md = ckpt.read_dcp_metadata(md_path)
    saved = getattr(md, "state_dict_metadata", None)
    saved = saved if isinstance(saved, dict) else {}
    count, recorded = (
        _tensor_count(spec),
        sum(1 for k in saved if isinstance(k, str) and k.startswith("model.")),
    )
    if count != recorded:  # told apart before describing a large model tensor by tensor
        raise InputError(
            f"{where}: model_spec describes a model of {count} tensors, but {md_path} records {recorded}",
            hint="the checkpoint's files do not belong together: damaged, or not written by torchrig train",
        )
    with torch.device("meta"):
        shaped = model_from_spec(spec)
    need = 0
    for name, t in shaped.state_dict().items():
        entry = saved.get(f"model.{name}")
        try:
            have = tuple(int(d) for d in entry.size) if entry is not None else None
        except (AttributeError, TypeError, ValueError, OverflowError):
            have = None
        if have != tuple(t.shape):
            raise InputError(
                f"{where}: model_spec describes {name} as {list(t.shape)}, but {md_path} records "
                + (f"{list(have)}" if have is not None else "no such tensor"),
                hint="the checkpoint's files do not belong together: damaged, or not written by torchrig train",
            )
        need += t.numel() * t.element_size()
    shards = sum(p.stat().st_size for p in folder.glob("*.distcp") if p.is_file())
    if need > shards:
        raise InputError(
            f"{where}: model_spec describes {size_text(need)} of weights, more than the {size_text(shards)} "
            f"of shard files in {folder}",
            hint="the checkpoint is damaged, incomplete or crafted",
        )


def _tensor_count(spec: dict[str, Any]) -> int:
    """How many tensors the model of ``spec`` has in its state dict, from two small models on the ``meta``
    device: each further GPT layer, and each further ResNet block of a stage, adds the same number."""
    import torch

    from torchrig.train.models import model_from_spec

    size = spec["size_info"]
    if spec["model"] == "gpt":
        variants = [{**spec, "size_info": {**size, "layers": n}} for n in (1, 2)]
        extra = size["layers"] - 1
    else:
        stages = len(size["blocks"])
        variants = [
            {**spec, "size_info": {**size, "blocks": [1] * stages}},
            {**spec, "size_info": {**size, "blocks": [2] + [1] * (stages - 1)}},
        ]
        extra = sum(size["blocks"]) - stages
    with torch.device("meta"):
        one, two = (len(model_from_spec(v).state_dict()) for v in variants)
    return one + extra * (two - one)


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
        "onnx",
        str(path),
        size,
        d,
        f"onnxruntime {ort.__version__} (CPU)",
        d <= tol,
        round(took, 2),
        (str(data),) if data.exists() else (),
    )
