"""One GPU, one call: the hand-written baseline, `torchrig train`'s default and each speed lever, alternating.

Run by tools/gpu/train_levers.sh (repository root, 1 GPU). Each run item is a tag, or tags joined by "+",
with an optional "@MB" micro-batch (16 when absent): `base` (shared/baselines/gpt_ddp.py), `cg` (torchrig's
defaults: --compile-mode auto = CUDA graphs on one GPU, fused loss), and levers added to the defaults:
  w16    TORCHRIG_BF16_WEIGHTS=1: bf16 weight copies kept by the optimizer step (train/optim.py)
  pdl    TORCHINDUCTOR_ENABLE_PDL=1: Inductor's Triton kernels with programmatic dependent launch (Hopper)
  tune   --compile-tuning: Inductor's coordinate-descent tuning of its kernels
  mag    TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1: Triton GEMM templates with fused epilogues against cuBLAS
  tma    mag, and Inductor's persistent TMA matmul templates (Hopper's bulk tensor copies) among the choices
  mixs   TORCHINDUCTOR_MIX_ORDER_REDUCTION_AUTOTUNE_SPLIT_SIZE=1: autotuned split of the LayerNorm
         backward's fused row/column reductions
  bk     TORCHINDUCTOR_BENCHMARK_KERNEL=1: the default's kernels, each with Inductor's estimate of the bytes it
         moves (`kernel_num_gb` in the code that speed_round.sh brings back): for a profiled run (`prof:bk`)
  nomix  TORCHINDUCTOR_MIX_ORDER_REDUCTION=0: no mix-order reduction (the LayerNorm backward's row and
         column sums in separate kernels; the trainer's default on Hopper GPUs)
  mix    TORCHINDUCTOR_MIX_ORDER_REDUCTION=1: Inductor's mix-order reduction on (its own default; the
         trainer's before it turned it off on Hopper)
  combo  TORCHRIG_INDUCTOR_CONFIG=combo_kernels=1,benchmark_combo_kernel=1: Inductor's combo kernels
  aggr   TORCHRIG_INDUCTOR_CONFIG=aggressive_fusion=1: Inductor fuses kernels even without common reads
  bfus   TORCHRIG_INDUCTOR_CONFIG=benchmark_fusion=1: Inductor times each fusion it may make, keeps the faster
  plain  --loss plain (the head's cross-entropy over kept logits: the trainer before the fused loss)
  lt     TORCH_BLAS_PREFER_CUBLASLT=1: every GEMM through cuBLASLt instead of cuBLAS
  fp8    --precision fp8 --fp8-recipe tensorwise (torchao's float8 training of the Linear layers)
  sg     --step-graph on: the whole optimizer step captured as one CUDA graph (train/stepgraph.py)
  fmlp   TORCHRIG_FUSED_MLP=1: the MLP's GELU in cuBLASLt's GEMM epilogues (train/fusedmlp.py)
  fmlpd  TORCHRIG_FUSED_MLP=dgelu: the same, the backward epilogue without the bias sum (compiled apart)
  fmlpf  TORCHRIG_FUSED_MLP=plain: the forward epilogue only, the GELU's backward compiled as before
  fmlpt  TORCHRIG_FUSED_MLP=triton: the forward epilogue; the GELU's backward and fc's bias gradient in one
         Triton kernel (train/gelubias.py)
  ltg    TORCHRIG_TUNED_GEMMS=1: each GEMM shape by the fastest of cuBLASLt's algorithms, timed at start
         (train/ltgemm.py)
  fa     --attention flash: FlashAttention-2 (PyTorch's flash SDPA kernel) instead of cuDNN's
  fmlpw  TORCHRIG_FUSED_MLP=wbgrad: dgelu, and every Linear of a block sums its bias gradient in its
         weight-gradient GEMM (cuBLASLt's BGRADB epilogue), both gradients written in fp32
  nosg   --step-graph off (the default's reference when the default captures the step)
  ws0    CUBLASLT_WORKSPACE_SIZE=0 CUBLAS_WORKSPACE_CONFIG=:0:0: cuBLAS and cuBLASLt (PyTorch's and the fused
         MLP's, train/cublaslt.py) without a workspace, so only algorithms that need none. In the default's
         profile a ~1 us memset comes before nearly every GEMM (123 a step) and the next kernel starts ~3 us
         after it inside the CUDA graph: ~0.38 ms a step of gaps. Whether those memsets are the workspace's
         (a split-K or stream-K kernel's counters) is what this run shows
  log1   --log-every 1: a host sync after every step, as the baseline has (its timing synchronizes each
         step), where the default syncs every 5th; the steady rate is then the median step's, the
         baseline's measure. What it costs against `cg` is what the log step's sync costs the GPU
and the model tags `med` (--size medium, GPT-2 medium) and `large` (--size large), compared with the default
of the same size (`cg+med`): the baseline script is GPT-2 small only, so they have no "vs base" figure.
e.g. `w16+pdl+tune@64`. Every distinct item is first compiled (3 steps, several at once, Inductor's cache in
TORCHINDUCTOR_CACHE_DIR), then the timed runs go one at a time in RUNS's order; a run that would start past
BUDGET_S seconds is skipped. A RUNS item written `prof:ITEM` is a profiled run at that place in the order
(PROFILE's items run after all of RUNS); its device events (every kernel, copy and memset of the profiled steps,
tools/gpu/trace_kernels.py's form) go to $OUT/train_levers/NAME-kernels.json.gz. After every run $OUT/train_levers/summary.txt (the table, the loss curves) and
results.json are rewritten, so a call cut short still returns what ran. The torchrig runs train on
--data generated with the same seed; each curve (mean loss per 5 steps, whatever the run's --log-every) is
compared with `cg`'s at the same micro-batch. The baseline trains on one fixed random batch, so its loss is not on the same data.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

LEVERS = {  # tag: (environment, torchrig options)
    "cg": ({}, []),
    "w16": ({"TORCHRIG_BF16_WEIGHTS": "1"}, []),
    "pdl": ({"TORCHINDUCTOR_ENABLE_PDL": "1"}, []),
    "tune": ({}, ["--compile-tuning"]),
    "mag": ({"TORCHINDUCTOR_MAX_AUTOTUNE_GEMM": "1"}, []),
    "tma": (
        {
            "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM": "1",
            "TORCHRIG_INDUCTOR_CONFIG": "triton.enable_persistent_tma_matmul=1",
        },
        [],
    ),
    "mixs": ({"TORCHINDUCTOR_MIX_ORDER_REDUCTION_AUTOTUNE_SPLIT_SIZE": "1"}, []),
    "nomix": ({"TORCHINDUCTOR_MIX_ORDER_REDUCTION": "0"}, []),
    "mix": ({"TORCHINDUCTOR_MIX_ORDER_REDUCTION": "1"}, []),
    "bk": ({"TORCHINDUCTOR_BENCHMARK_KERNEL": "1"}, []),
    "plain": ({}, ["--loss", "plain"]),
    "combo": ({"TORCHRIG_INDUCTOR_CONFIG": "combo_kernels=1,benchmark_combo_kernel=1"}, []),
    "aggr": ({"TORCHRIG_INDUCTOR_CONFIG": "aggressive_fusion=1"}, []),
    "bfus": ({"TORCHRIG_INDUCTOR_CONFIG": "benchmark_fusion=1"}, []),
    "lt": ({"TORCH_BLAS_PREFER_CUBLASLT": "1"}, []),
    "fp8": ({}, ["--precision", "fp8", "--fp8-recipe", "tensorwise"]),
    "sg": ({}, ["--step-graph", "on"]),
    "nofmlp": ({"TORCHRIG_FUSED_MLP": "0"}, []),  # the default before the fused MLP's auto (2026-12-06)
    "fmlp": ({"TORCHRIG_FUSED_MLP": "1"}, []),
    "fmlpd": ({"TORCHRIG_FUSED_MLP": "dgelu"}, []),
    "fmlpf": ({"TORCHRIG_FUSED_MLP": "plain"}, []),
    "fmlpt": ({"TORCHRIG_FUSED_MLP": "triton"}, []),
    "fmlpw": ({"TORCHRIG_FUSED_MLP": "wbgrad"}, []),
    "ltg": ({"TORCHRIG_TUNED_GEMMS": "1"}, []),
    "fa": ({}, ["--attention", "flash"]),
    "nosg": ({}, ["--step-graph", "off"]),
    "log1": ({}, ["--log-every", "1"]),
    "ws0": ({"CUBLASLT_WORKSPACE_SIZE": "0", "CUBLAS_WORKSPACE_CONFIG": ":0:0"}, []),
    "med": ({}, ["--size", "medium"]),
    "large": ({}, ["--size", "large"]),
}
MODEL_TAGS = {"med": 2, "large": 3}  # size tag: GPU memory of its compile run in units of 16 GB


def model(item: str) -> tuple[frozenset[str], int]:
    """The model tags of an item and its micro-batch: the default run of the same model is its reference."""
    tags, mb = parse(item)
    return frozenset(t for t in tags if t in MODEL_TAGS), mb


def is_reference(item: str) -> bool:
    tags = set(parse(item)[0]) - {"cg"}
    return bool(parse(item)[0]) and tags <= set(MODEL_TAGS) and "base" not in tags


COMMON = [  # tools/gpu/train_speed.sh's options
    *("train", "--model", "gpt", "--size", "small", "--data", "generated", "--precision", "bf16"),
    *("--compile", "--log-every", "5", "--warmup-steps", "5", "--clip-grad", "0", "--no-ckpt-final"),
    *("--no-tensorboard", "--workers", "2", "--no-preflight"),
]


# the call planned for 1x H200 in under 9 minutes: compiles about 180 s (tune's coordinate descent is the
# longest), then about 30 s a timed run (start-up, Inductor's cache, CUDA graphs; 50 steps), so about ten
# runs fit: the first ten cover every item, the baseline and the default twice at micro-batch 16.
DEFAULT_RUNS = "base cg w16+pdl+tune w16 pdl base@64 cg@64 w16+pdl@64 base cg w16+pdl+tune pdl w16"


def parse(item: str) -> tuple[list[str], int]:
    tags, _, mb = item.partition("@")
    return tags.split("+"), int(mb or 16)


def fname(item: str) -> str:
    return item.replace("+", "_").replace("@", "-mb")


def command(
    item: str, steps: int, out: Path, base: str, extra: list[str]
) -> tuple[list[str], dict[str, str]]:
    tags, mb = parse(item)
    env = dict(os.environ)
    if tags == ["base"]:
        env.update(MICRO_BATCH=str(mb), STEPS=str(steps))
        return [sys.executable, base], env
    opts: list[str] = []
    for t in tags:
        if t not in LEVERS:
            raise SystemExit(f"train_levers: unknown tag {t!r} in {item!r} (known: base {' '.join(LEVERS)})")
        e, o = LEVERS[t]
        for k, v in e.items():  # two tags' Inductor settings add up
            env[k] = f"{env[k]},{v}" if k == "TORCHRIG_INDUCTOR_CONFIG" and env.get(k) else v
        opts += o
    argv = [
        sys.executable,
        "-m",
        "torchrig",
        "--json",
        *COMMON,
        "--micro-batch",
        str(mb),
        "--steps",
        str(steps),
    ]
    more = os.environ.get("TORCHRIG_ARGS", "").split()  # e.g. a CPU smoke run: --size tiny --device cpu
    return [*argv, "--out", str(out), "--overwrite", *opts, *extra, *more], env


def five_step_means(records: dict[int, float | None]) -> dict[int, float]:
    """The loss curve as the mean loss of each 5 steps, whatever the run's --log-every: a record at step s holds
    the mean over the steps since the record before it (from step 1). A bin of 5 steps that the records do not
    tile exactly (one record over several bins, a missing loss) is left out."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    broken: set[int] = set()
    prev = 0
    for s in sorted(records):
        first, last = (prev // 5) + 1, ((s - 1) // 5) + 1  # the bins that steps prev+1 .. s fall in
        loss = records[s]
        if first != last or loss is None:
            broken.update(range(first, last + 1))
        else:
            sums[last] = sums.get(last, 0.0) + loss * (s - prev)
            counts[last] = counts.get(last, 0) + (s - prev)
        prev = s
    return {5 * b: sums[b] / 5 for b in sorted(sums) if counts[b] == 5 and b not in broken}


def warm_units(memory_mib: int | None) -> int:
    """Compiles at once, in ``weight``'s units of 16 GB: the card's memory less 8 GB for the CUDA contexts
    and the allocators' slack (8 on a 141 GB H200, 4 on an 80 GB H100, where 8 ran out of memory on
    2026-12-06); 8 where the memory is not known."""
    if not memory_mib:
        return 8
    return max(1, (memory_mib // 1024 - 8) // 16)


def gpu_memory_mib() -> int | None:
    """The first GPU's memory (nvidia-smi's memory.total, MiB), or None without nvidia-smi."""
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return int(r.stdout.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def weight(item: str) -> int:
    """GPU memory of a compile run in units of 16 GB: GPT-2 small at micro-batch 16 needs about 10 GB
    (activations 4 GB, logits and their gradient 3.3 GB, weights and AdamW 2 GB), 64 about 32 GB; the
    baseline's plain loss keeps fp32 logits as well (about 50 GB at 64)."""
    tags, mb = parse(item)
    size = max([MODEL_TAGS.get(t, 1) for t in tags])
    return max(1, (mb * 3) // 64) if tags == ["base"] else size * max(1, mb // 32)


def main() -> int:
    out = Path(os.environ.get("OUT", "/tmp/gpu-out")) / "train_levers"
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("WORK", "/tmp/train_levers"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    steps, budget = int(os.environ.get("STEPS", "50")), float(os.environ.get("BUDGET_S", "480"))
    runs = os.environ.get("RUNS", DEFAULT_RUNS).split()
    profile = os.environ.get("PROFILE", "").split()
    capacity = int(os.environ.get("WARM_UNITS") or warm_units(gpu_memory_mib()))
    deadline = float(os.environ.get("DEADLINE_S", "520"))  # no run goes on past it (the call's limit)
    base = next(
        (
            c
            for c in (
                ".baselines/gpt_ddp.py",
                "../.baselines/gpt_ddp.py",
                "/work/shared/baselines/gpt_ddp.py",
            )
            if Path(c).is_file()
        ),
        "",
    )
    start = time.monotonic()
    log = open(out / "log.txt", "w")  # noqa: SIM115  # written to until the end of main

    def say(msg: str) -> None:
        line = f"[{time.monotonic() - start:5.0f}s] {msg}"
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    say(
        f"train_levers: baseline {base or 'MISSING'}, {steps} steps, runs {' '.join(runs)}, "
        f"TORCHINDUCTOR_CACHE_DIR={os.environ.get('TORCHINDUCTOR_CACHE_DIR')}"
    )
    results: list[dict] = []

    # 1. compile every distinct item (3 steps), several at once within WARM_UNITS of GPU memory
    pending = list(dict.fromkeys([r.removeprefix("prof:") for r in runs] + profile))
    running: list[tuple[str, subprocess.Popen, float]] = []
    while pending or running:
        for item in list(pending):
            if sum(weight(i) for i, _, _ in running) + weight(item) <= capacity or not running:
                warm_steps = 12 if parse(item)[0] == ["base"] else 3  # gpt_ddp.py's median skips 10 steps
                argv, env = command(item, warm_steps, work / f"warm-{fname(item)}", base, [])
                f = open(work / f"warm-{fname(item)}.log", "w")  # noqa: SIM115  # the child's output
                running.append(
                    (
                        item,
                        subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT),
                        time.monotonic(),
                    )
                )
                pending.remove(item)
        time.sleep(1)
        for r in list(running):
            item, p, t0 = r
            if p.poll() is None and (time.monotonic() - t0 > 330 or time.monotonic() - start > deadline):
                p.kill()
            if p.poll() is not None:
                running.remove(r)
                say(f"compiled {item}: rc={p.returncode} in {time.monotonic() - t0:.0f}s")
                if p.returncode:
                    tail = (work / f"warm-{fname(item)}.log").read_text(errors="replace").splitlines()[-15:]
                    log.write("\n".join(tail) + "\n")

    # 2. the timed runs, one at a time
    seen: dict[str, int] = {}
    for item in runs + [f"prof:{p}" for p in profile]:
        prof = item.startswith("prof:")
        item = item.removeprefix("prof:")
        seen[item] = seen.get(item, 0) + (0 if prof else 1)
        name = f"{'prof-' if prof else ''}{fname(item)}.{seen[item]}"
        if time.monotonic() - start > budget:
            say(f"{name}: skipped (past {budget:.0f}s)")
            continue
        argv, env = command(
            item, 30 if prof else steps, work / f"run-{name}", base, ["--profile-steps", "5"] if prof else []
        )
        t0 = time.monotonic()
        try:
            left = max(5.0, min(200.0, deadline - (time.monotonic() - start)))
            p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=left)
            rc, stdout, stderr = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, stdout, stderr = 124, text(e.stdout), text(e.stderr)
        row = {
            "name": name,
            "item": item,
            "rc": rc,
            "wall_s": round(time.monotonic() - t0, 1),
            "profiled": prof,
        }
        row.update(measure(item, stdout, work / f"run-{name}"))
        if rc:
            row["error_tail"] = (stderr or stdout).splitlines()[-6:]
        # what a lever says it did (e.g. TORCHRIG_TUNED_GEMMS=1: how many GEMM shapes got another algorithm)
        notes = [x for x in (stderr or "").splitlines() if x.startswith("torchrig train: TORCHRIG_")]
        if notes:
            row["notes"] = notes[-3:]
        if prof:
            kept = keep_kernels(work / f"run-{name}", out / f"{name}-kernels.json.gz")
            if kept:
                say(f"{name}: {kept}")
        results.append(row)
        say(f"{name}: rc={rc} {row.get('tokens_per_s')} tok/s MFU {row.get('mfu')} ({row['wall_s']}s)")
        for x in notes[-3:]:
            say(f"  {x}")
        write(out, results, budget)
    say(f"done; inductor cache {du(os.environ.get('TORCHINDUCTOR_CACHE_DIR'))}")
    write(out, results, budget)
    print((out / "summary.txt").read_text())
    return 0


def keep_kernels(run_dir: Path, dst: Path) -> str | None:
    """A profiled run's device events (kernels, copies, memsets: name, start, duration) as a small file, so
    that every kernel's time, not only the top 15, comes back from the GPU machine."""
    src = run_dir / "profile" / "rank0.trace.json.gz"
    if not src.is_file():
        return None
    r = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("trace_kernels.py")), str(src), str(dst)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return (r.stdout or r.stderr).strip().splitlines()[-1] if (r.stdout or r.stderr).strip() else None


def text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def measure(item: str, stdout: str, run_dir: Path) -> dict:
    if parse(item)[0] == ["base"]:
        lines = [x for x in stdout.splitlines() if x.startswith("{")]
        d = json.loads(lines[-1]) if lines else {}
        return {
            "tokens_per_s": d.get("tokens_per_s"),
            "mfu": d.get("mfu_vs_peak"),
            "final_loss": d.get("loss"),
        }
    try:
        s = json.loads(stdout).get("summary") or {}
    except ValueError:
        s = {}
    curve, check = {}, None
    m = run_dir / "metrics.jsonl"
    if m.exists():
        for x in m.read_text().splitlines():
            r = json.loads(x) if x.strip() else {}
            if "loss" in r and "step" in r:
                curve[r["step"]] = r["loss"]
            if r.get("event") == "compile_check":  # the compiled model's first loss against eager's
                check = {k: r.get(k) for k in ("eager_loss", "compiled_loss", "action")}
    curve = five_step_means(curve)
    pr = s.get("profile") or {}
    return {
        "tokens_per_s": s.get("tokens_per_s"),
        "mfu": s.get("mfu"),
        "final_loss": s.get("final_loss"),
        "bf16_weight_copies": s.get("bf16_weight_copies"),
        "fused_mlp_blocks": s.get("fused_mlp_blocks"),
        "step_graph": s.get("step_graph"),
        "compile_check": check,
        "curve": curve,
        "profile": {
            "step_ms": pr.get("step_ms"),
            "compute_ms": pr.get("compute_ms"),
            "idle_ms": pr.get("idle_ms"),
            "groups_ms": (pr.get("kernels") or {}).get("groups_ms"),
            "top_kernels_ms": ((pr.get("kernels") or {}).get("top_kernels_ms") or [])[:15],
        }
        if pr
        else None,
    }


def write(out: Path, results: list[dict], budget: float) -> None:
    timed = [r for r in results if not r["profiled"]]
    lines = [
        f"{'run':<26} {'tok/s':>10} {'MFU':>6} {'vs base':>8} {'final loss':>11} {'max|dloss| vs default':>22}  wall"
    ]
    for r in timed:
        mb = parse(r["item"])[1]
        bases = [
            x["tokens_per_s"]
            for x in timed
            if (x["item"] == f"base@{mb}" or (mb == 16 and x["item"] == "base")) and not model(r["item"])[0]
        ]
        bases = [b for b in bases if b]
        ref = next(
            (
                x.get("curve")
                for x in timed
                if is_reference(x["item"]) and model(x["item"]) == model(r["item"]) and x.get("curve")
            ),
            None,
        )
        dl = "-"
        if r.get("curve") and ref:
            common = sorted(set(r["curve"]) & set(ref))
            if common:
                dl = f"{max(abs(r['curve'][k] - ref[k]) for k in common):.4f} ({len(common)})"
        t = r.get("tokens_per_s")
        vs = f"{t / (sum(bases) / len(bases)):.3f}" if t and bases else "-"
        fl = r.get("final_loss")
        lines.append(
            f"{r['name']:<26} {t or 0:>10,.0f} {(r.get('mfu') or 0):>6.1%} {vs:>8} "
            f"{(f'{fl:.4f}' if isinstance(fl, float) else '-'):>11} {dl:>22}  {r['wall_s']}s"
            + (f"  rc={r['rc']} {' | '.join(r.get('error_tail', []))[-300:]}" if r["rc"] else "")
        )
    curves = {r["name"]: r["curve"] for r in timed if r.get("curve")}
    if curves:
        lines += [
            "",
            "loss curves (mean loss of each 5 steps)",
            f"{'step':>5} " + " ".join(f"{n[:12]:>12}" for n in curves),
        ]
        for st in sorted(set().union(*[set(c) for c in curves.values()])):
            lines.append(
                f"{st:>5} "
                + " ".join(f"{c[st]:>12.4f}" if st in c else f"{'-':>12}" for c in curves.values())
            )
    for r in results:
        pr = r.get("profile")
        if r["profiled"] and pr:
            lines += [
                "",
                f"{r['name']}: {r.get('tokens_per_s')} tok/s; profiled step {pr['step_ms']} ms = compute "
                f"{pr['compute_ms']} + idle {pr['idle_ms']} ms",
            ]
            lines += [f"  {g:<28} {ms:8.3f} ms/step" for g, ms in (pr.get("groups_ms") or {}).items()]
            lines += [f"    {ms:7.3f}  {n[:110]}" for n, ms in pr.get("top_kernels_ms") or []]
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")


def du(path: str | None) -> str:
    if not path or not Path(path).exists():
        return "absent"
    n = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    return f"{path}: {n / 2**20:.0f} MiB"


if __name__ == "__main__":
    sys.exit(main())
