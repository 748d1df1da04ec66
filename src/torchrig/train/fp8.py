"""``--precision fp8``: torchao's float8 training for the model's Linear layers, bf16 autocast for the rest.

What changes: every ``nn.Linear`` whose input and output widths are multiples of 16 (fp8 tensor-core GEMMs
need that; torchao's and torchtitan's filter) becomes torchao's ``Float8Linear``, which casts the input,
the weight and the output gradient to float8 (e4m3) with dynamic scales on every call and runs the three
GEMMs of the forward and backward with ``torch._scaled_mm``. The parameters stay in fp32 as before (the
weight is cast on the fly; the optimizer and the checkpoints see the same tensors under the same names),
so a checkpoint of an fp8 run resumes in bf16 and exports like any other. Everything else (embeddings,
norms, attention, the loss) runs under bf16 autocast as with ``--precision bf16``.

Left in bf16: the output projection ``head`` (GPT's, tied to the token embedding), as torchtitan's float8
recipe leaves its output layer out (``filter_fqns=["output"]``) and torchao's example its last layer: the
logits feed the softmax directly, so their quantisation error is the loss's.

Recipes (``--fp8-recipe``, torchao's ``Float8LinearConfig.from_recipe_name``): ``tensorwise`` (one scale
per tensor, fastest), ``rowwise`` (a scale per row, handles outliers better, torchtitan's default), and
``rowwise_with_gw_hp`` (rowwise, weight gradient in high precision: the most accurate).

Needs: a CUDA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell: fp8 tensor cores) and
torchao. torchao 0.17.0 and later are built against PyTorch's stable ABI and load on torch 2.11 or newer
(https://github.com/pytorch/ao/issues/2919, closing comment 2026-05-12; torchao 0.18.0's
``torchao/__init__.py`` requires torch >= 2.11.0 to load its C++ extensions). The float8 training path does
not use those extensions: it is Python plus ``torch._scaled_mm`` and the Triton kernels Inductor generates.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from torchrig.errors import UsageError

# torchao's training recipes (torchao docs/source/workflows/training.md, v0.18.0: "three recipes to trade
# off performance vs accuracy: tensorwise (fastest), rowwise, rowwise_with_gw_hp (most accurate)").
RECIPES = ("rowwise", "tensorwise", "rowwise_with_gw_hp")
# fp8 tensor cores: compute capability 8.9 (Ada) and newer. torchtitan refuses float8 below it
# (torchtitan/components/quantization/float8.py: has_cuda_capability(8, 9)); so does torchrig's bench.
MIN_CAPABILITY = (8, 9)
# The torchao release this was written and tested against (PyPI, 2026-07-31; verified 2026-12-01): its
# C++ extensions need torch >= 2.11 (torchao/__init__.py: min_torch_version), float8 training does not.
TORCHAO_VERSION = "0.18.0"
INSTALL_HINT = (
    f"pip install torchao=={TORCHAO_VERSION} (torch 2.11 or newer; on a machine without network: "
    f"'pip download torchao=={TORCHAO_VERSION} --no-deps' elsewhere, then 'pip install --no-deps "
    "torchao-*.whl')"
)
NOT_INSTALLED = "--precision fp8 uses torchao's float8 training; torchao is not installed"
# Linear layers left in bf16 by name (see the module docstring).
SKIP = ("head",)
GEMM_MULTIPLE = 16  # fp8 GEMMs need both dimensions divisible by 16 (torchao's and torchtitan's filter)


def problem(
    device_type: str, capability: tuple[int, int] | None, torchao_version: str | None
) -> UsageError | None:
    """Why fp8 training cannot run here (None: it can), from the device and what is installed."""
    if device_type != "cuda":
        return UsageError(
            "--precision fp8 needs a CUDA GPU with fp8 tensor cores (compute capability 8.9 or newer)",
            hint="use --precision bf16 on the CPU",
        )
    if capability is not None and tuple(capability) < MIN_CAPABILITY:
        major, minor = capability
        return UsageError(
            f"--precision fp8 needs fp8 tensor cores (compute capability 8.9 or newer: Ada, Hopper, "
            f"Blackwell); this GPU is {major}.{minor}",
            hint="use --precision bf16 on this GPU",
        )
    if torchao_version is None:
        return UsageError(NOT_INSTALLED, hint=INSTALL_HINT)
    return None


def require_torchao() -> None:
    """Refuse ``--precision fp8`` before any rank starts when torchao is not installed (no torch import)."""
    if torchao_version() is None:
        raise UsageError(NOT_INSTALLED, hint=INSTALL_HINT)


def torchao_version() -> str | None:
    """The installed torchao's version, or None when it cannot be imported (looked up without importing it)."""
    if importlib.util.find_spec("torchao") is None:
        return None
    from importlib import metadata

    try:
        return metadata.version("torchao")
    except metadata.PackageNotFoundError:
        return "unknown"  # importable (e.g. a source checkout on the path) but not installed as a package


def qualifies(module: Any, fqn: str) -> bool:
    """torchao's ``module_filter_fn``: a Linear whose widths suit fp8 GEMMs and that is not left out by name."""
    if fqn in SKIP:
        return False
    return module.in_features % GEMM_MULTIPLE == 0 and module.out_features % GEMM_MULTIPLE == 0


def convert(model: Any, recipe: str, *, compiled: bool) -> list[str]:
    """Swap the model's qualifying Linear layers for torchao's ``Float8Linear`` in place (before compiling and
    wrapping, as torchao's docs and torchtitan do); returns the names of the converted layers.

    With a rowwise recipe and torch.compile, Inductor emulates eager's precision casts: without it the
    compiled backward may recompute a forward intermediate with different rounding than the forward used,
    which gave NaN losses with rowwise scales (https://github.com/pytorch/pytorch/issues/150859); torchtitan
    sets the same flag for its rowwise recipe (https://github.com/pytorch/torchtitan/pull/1110).
    """
    if recipe not in RECIPES:
        raise UsageError(f"unknown --fp8-recipe {recipe!r}", hint=f"choose from {', '.join(RECIPES)}")
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:  # installed but broken (e.g. built for another torch)
        raise UsageError(f"--precision fp8: torchao does not import ({e})", hint=INSTALL_HINT) from None
    from torch import nn

    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and qualifies(m, n)]
    if not names:
        return []
    convert_to_float8_training(
        model, config=Float8LinearConfig.from_recipe_name(recipe), module_filter_fn=qualifies
    )
    if compiled and recipe.startswith("rowwise"):
        import torch._inductor.config as inductor_config

        inductor_config.emulate_precision_casts = True
    return names
