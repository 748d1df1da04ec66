"""One GPU: where torch.compile's forward of GPT-2 large goes wrong (its first loss is 11.97 where eager's is 11.08).

On 2026-12-05 (1x H200, torch 2.11.0+cu130) eager GPT-2 large trained and every compiled variant diverged
(tools/gpu/large_diverge.sh), with the compiled model's loss at initialisation already 0.9 above eager's
(tools/gpu/large_grads.py), while each kernel family run on its own in eager mode matched fp32
(tools/gpu/large_parts.py). This compares compiled against eager on the same weights and batch, forward only:
  [1] two-block models of large's, medium's and small's shapes (and large's width with other head counts);
      large itself when none of them shows it
  [4] the smallest model of [1] that compiles wrong, with one Inductor setting changed (the names
      TORCHRIG_INDUCTOR_CONFIG takes); prints ``FIX=NAME=VALUE`` for the first that brings it back to eager
  [3] a two-block large under each SDPA backend
  [2] one block of large's shape, and each of its parts (LayerNorm, attention, MLP)
Usage (repository root): PYTHONPATH=src python3 tools/gpu/large_bisect.py   (about 4 minutes)
  PARTS ("models settings backends parts"): which of them; SHAPES=N: the first N models of [1] only
"""

import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torchrig.train.models import GPT, GPTConfig

DEV = os.environ.get("DEVICE", "cuda")  # cpu: a smoke run (SMOKE=1 shrinks the shapes)
SMOKE = os.environ.get("SMOKE") == "1"
MB = int(os.environ.get("MICRO_BATCH", "2" if SMOKE else "16"))
T = 64 if SMOKE else 1024
V = 512 if SMOKE else 50304
REPRO: list[tuple[int, int, int]] = []  # the smallest model of [1] that compiles wrong
BAD = 0.02  # relative difference (outputs) or loss difference above which compiled is wrong
torch.backends.cuda.matmul.allow_tf32 = True


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(
        (a.detach().float() - b.detach().float()).norm() / b.detach().float().norm().clamp(min=1e-30)
    )


def model(layers: int, heads: int, width: int, fused: bool = True) -> GPT:
    torch.manual_seed(0)
    m = GPT(GPTConfig(layers=layers, heads=heads, width=width, block_size=T, vocab=V)).to(DEV)
    m.fused_loss = fused
    return m


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randint(0, V, (MB, T), device=DEV, generator=g)
    return x, torch.roll(x, -1, dims=1)


def fresh_compile(fn):  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    return torch.compile(fn, backend=os.environ.get("BACKEND", "inductor"))


def losses(m: GPT, ctx=None) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    x, y = batch()
    with torch.autocast(DEV, dtype=torch.bfloat16), ctx or torch.autocast(DEV, dtype=torch.bfloat16):
        eager = float(m(x, y))
        compiled = float(fresh_compile(m)(x, y))
    return eager, compiled


def say(label: str, eager: float, compiled: float) -> bool:
    wrong = abs(eager - compiled) > BAD
    print(f"{label}: eager loss {eager:.4f}, compiled {compiled:.4f}{'  WRONG' if wrong else ''}", flush=True)
    return wrong


def models() -> None:
    w = 64 if SMOKE else 1280
    shapes = [
        ("two blocks of large (20 heads, 1280)", 2, 20 if not SMOKE else 2, w, True),
        ("the same, plain loss", 2, 20 if not SMOKE else 2, w, False),
        ("two blocks of medium (16 heads, 1024)", 2, 16 if not SMOKE else 2, 1024 if not SMOKE else 64, True),
        ("two blocks, 10 heads of 128, 1280", 2, 10 if not SMOKE else 2, w, True),
        ("two blocks, 16 heads of 80, 1280", 2, 16 if not SMOKE else 2, w, True),
        ("two blocks of small (12 heads, 768)", 2, 12 if not SMOKE else 2, 768 if not SMOKE else 64, True),
    ]
    for label, layers, heads, width, fused in shapes[: int(os.environ.get("SHAPES", len(shapes)))]:
        if say(f"[1] {label}", *losses(model(layers, heads, width, fused))) and fused and not REPRO:
            REPRO.append((layers, heads, width))
        torch.cuda.empty_cache() if DEV == "cuda" else None
    deep = (3, 2, w) if SMOKE else (36, 20, w)
    if not REPRO and say("[1] large, 36 blocks (only the whole depth shows it)", *losses(model(*deep))):
        REPRO.append(deep)


def parts() -> None:
    heads, width = (2, 64) if SMOKE else (20, 1280)
    m = model(2, heads, width)
    x, _ = batch()
    with torch.no_grad():
        h = (m.wte(x) + m.wpe(torch.arange(T, device=DEV))).detach()
    blk = m.blocks[0]

    def attn(z: torch.Tensor) -> torch.Tensor:
        b, t, d = z.shape
        q, k, v = blk.qkv(blk.ln1(z)).split(d, dim=2)
        q, k, v = (u.view(b, t, heads, d // heads).transpose(1, 2) for u in (q, k, v))
        return blk.proj(
            F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        )

    def mlp(z: torch.Tensor) -> torch.Tensor:
        return blk.out(F.gelu(blk.fc(blk.ln2(z)), approximate="tanh"))

    for label, fn in (("block", blk), ("ln1", blk.ln1), ("attention part", attn), ("mlp part", mlp)):
        with torch.autocast(DEV, dtype=torch.bfloat16):
            e = fn(h)
            c = fresh_compile(fn)(h)
        r = rel(c, e)
        print(
            f"[2] {label}: compiled vs eager relative difference {r:.4f}{'  WRONG' if r > BAD else ''}",
            flush=True,
        )


def backends() -> None:
    heads, width = (2, 64) if SMOKE else (20, 1280)
    for b in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            say(f"[3] two blocks of large, SDPA {b.name}", *losses(model(2, heads, width), sdpa_kernel(b)))
        except Exception as e:  # a backend that does not run this shape here
            print(f"[3] SDPA {b.name}: not run ({str(e).splitlines()[0][:120]})", flush=True)


def settings() -> None:
    import torch._inductor.config as ic

    from torchrig.train.setup import inductor_settings

    if not REPRO:
        print("[4] not run: no model of [1] compiled wrong", flush=True)
        return
    layers, heads, width = REPRO[0]
    fixed = None
    for spec in (
        "triton.persistent_reductions=0",
        "pattern_matcher=0",
        "split_reductions=0",
        "triton.mix_order_reduction=0",
        "shape_padding=0",
        "comprehensive_padding=0",
    ):
        name = spec.split("=")[0]
        *path, leaf = name.split(".")
        owner = ic
        for p in path:
            owner = getattr(owner, p, None)
        if owner is None or not hasattr(owner, leaf):
            print(f"[4] {spec}: no such setting in this torch", flush=True)
            continue
        before = getattr(owner, leaf)
        inductor_settings(spec)
        try:
            wrong = say(
                f"[4] {layers} blocks of {heads} heads, {width}, {spec}", *losses(model(layers, heads, width))
            )
        finally:
            setattr(owner, leaf, before)
        if not wrong and fixed is None:
            fixed = spec
    if fixed:
        print(f"FIX={fixed}", flush=True)


def main() -> None:
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name() if DEV == 'cuda' else 'cpu'}", flush=True
    )
    for part in os.environ.get("PARTS", "models settings backends parts").split():
        globals()[part]()


if __name__ == "__main__":
    main()
