#!/usr/bin/env bash
# 2-GPU scaling of `torchrig train` (GPT-2 small, bf16, compiled, micro-batch 16, 50 steps) against the
# hand-written baseline gpt_ddp.py, with the DDP variants that decide it. One call on a 2-GPU machine:
#   1. baseline 1 GPU (GPU 0) and torchrig 1 GPU (GPU 1) side by side (separate GPUs, same time)
#   2. baseline on 2 GPUs
#   3. torchrig on 2 GPUs: --ddp-compile inner (DDP(compile(model)): gradients leave the compiled backward at
#      once and are all-reduced after it), --ddp-compile outer (the default: compile(DDP(model)), the
#      all-reduce overlaps the backward), and --ddp-comm-hook bf16 on the default (half the bytes on the
#      wire; changes numerics slightly)
# Prints tokens/s, MFU and the scaling efficiency (2-GPU tok/s / (2 x 1-GPU tok/s)) of each.
# Usage (repository root, 2 GPUs): OUT=/some/dir tools/gpu/train_scaling.sh     about 5-6 min
#   the README's figure (about 4 min): OUT=... MICRO_BATCH=64 STEPS=100 BOTH=1 ONE_TAG=cg \
#     VARIANTS="baseline2 cg outer" tools/gpu/train_scaling.sh
#   EXTRA=1 adds outer + --ddp-static-graph; HANG=1 adds the NCCL hang demo (HANG_BUDGET_S: only if started by then)
#   VARIANTS="outer ctas8 bucket100 baseline2" picks the 2-GPU runs and their order (default:
#   "baseline2 inner outer bf16hook"); ONE=0 skips the 1-GPU pair; tags: baseline2, inner, outer, bf16hook,
#   outer-static,
#   bucketN (--ddp-bucket-mb N), ctas8/ctas4/ctas16 (NCCL_MAX_CTAS=N: fewer SMs for NCCL while it overlaps the backward),
#   cgctas8 (cg + NCCL_MAX_CTAS=8), ctapol/cgctapol (NCCL_CTA_POLICY=1, NCCL's "efficiency" CTA policy: the fewest
#   CTAs that reach decent bandwidth, for overlap with compute; NCCL >= 2.27), noovl/cgnoovl
#   (--no-ddp-overlap-embeddings: DDP all-reduces the embeddings' gradient too, after the backward), TAG+N (a
#   further run of TAG in the same call, e.g. cg+2),
#   fsdp (--parallel fsdp), nogc (--gc-every 0: Python's automatic garbage collection), cgnogc (cg + nogc), cpp (TORCHINDUCTOR_CPP_WRAPPER=1: Inductor's
#   C++ wrapper launches the kernels instead of Python), cg (--compile-mode reduce-overhead: CUDA graphs),
#   prof (the default with --profile-steps ${PROFILE:-5});
#   ONE_VARIANTS="cpp cg" runs those tags on 1 GPU too (two at a time), and each 2-GPU row's efficiency is then
#   against its own tag's 1-GPU figure
#   Each torchrig row ends with its ranks' median SM clock and the share of time the driver held the clocks
#   down for power ({SM r0/r1 MHz, power-capped r0/r1}, from summary.json's gpus).
#   BOTH=1 measures each 1-GPU figure on both GPUs (baseline on GPU 0 beside torchrig's ONE_TAG on GPU 1, then
#   the other way round): a 2-GPU run is as fast as its slower GPU, and two GPUs of one machine differ, so
#   the efficiency is then tok/s on 2 GPUs / (GPU 0's 1-GPU tok/s + GPU 1's), and the table adds it against
#   each GPU alone. AGAIN=1 runs that 1-GPU pair once more at the end of the call (files *.end.json): the
#   GPUs are warmer then, and at a power limit a warmer GPU runs a lower clock.
#   PROFILE=N adds --profile-steps N to every torchrig run: the table then shows where rank 0's step time went
#   (compute, NCCL, NCCL not hidden behind compute, GPU idle; ms per step) and the traces stay in the run folders
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
R="${OUT:-/tmp/gpu-out}/train_scaling"
mkdir -p "$R"
MB="${MICRO_BATCH:-16}"
STEPS="${STEPS:-50}"
BUDGET_S="${BUDGET_S:-280}"   # variants that would start after this many seconds are skipped
BASE=""
for cand in .baselines/gpt_ddp.py ../shared/baselines/gpt_ddp.py /work/shared/baselines/gpt_ddp.py; do
  [ -f "$cand" ] && { BASE="$cand"; break; }
done
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
echo "train_scaling: $(python3 -c 'import torch; print(torch.cuda.device_count())') GPU(s), micro-batch $MB," \
  "$STEPS steps, baseline ${BASE:-MISSING}"
gpu_state() { nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader 2>/dev/null | sed "s/^/  $1 GPU /"; }
gpu_state start

baseline() {  # $1 = number of GPUs, $2 = CUDA_VISIBLE_DEVICES for one GPU, $3 = file-name suffix
  local n=$1 log="$R/baseline-${1}gpu${3:-}.log"
  [ -n "$BASE" ] || { echo '{"error": "baseline not found"}' >"$R/baseline-${n}gpu${3:-}.json"; return; }
  if [ "$n" = 1 ]; then
    CUDA_VISIBLE_DEVICES=$2 MICRO_BATCH=$MB STEPS=$STEPS timeout 150 python3 "$BASE" >"$log" 2>&1
  else
    MICRO_BATCH=$MB STEPS=$STEPS timeout 150 python3 -m torch.distributed.run --standalone \
      --nproc-per-node="$n" "$BASE" >"$log" 2>&1
  fi
  local rc=$?
  echo "[$(elapsed)s] baseline ${n} GPU${2:+ (GPU $2)}${3:+ $3} rc=$rc"
  grep '^{' "$log" | tail -n 1 >"$R/baseline-${n}gpu${3:-}.json"
}

ours() {  # $1 = number of GPUs (1: the GPU index in $GPU), $2 = tag, then extra options; SUFFIX: file names
  local n=$1 tag=$2${SUFFIX:-}
  shift 2
  if [ "$(elapsed)" -gt "$BUDGET_S" ]; then
    echo "[$(elapsed)s] torchrig ${n} GPU $tag: skipped (past ${BUDGET_S}s)"
    echo '{"error": "skipped: time budget"}' >"$R/torchrig-${n}gpu-$tag.json"
    return
  fi
  local pin=()
  [ "$n" = 1 ] && pin=(CUDA_VISIBLE_DEVICES="${GPU:-0}")
  # shellcheck disable=SC2086  # XENV: extra NAME=VALUE settings for this run, split on spaces
  env "${pin[@]}" ${XENV:-} timeout 200 python3 -m torchrig --json train --gpus "$n" --model gpt --size small --data synthetic \
    --micro-batch "$MB" --steps "$STEPS" --precision bf16 --compile --log-every 5 --warmup-steps 5 \
    --clip-grad 0 --no-ckpt-final --no-tensorboard --workers 2 --no-preflight --out "$R/run-${n}gpu-$tag" \
    ${PROFILE:+--profile-steps "$PROFILE"} "$@" \
    >"$R/torchrig-${n}gpu-$tag.json" 2>"$R/torchrig-${n}gpu-$tag.log"
  local rc=$?
  echo "[$(elapsed)s] torchrig ${n} GPU $tag rc=$rc (${XENV:-}${XENV:+ }$*)"
  tail -n 1 "$R/torchrig-${n}gpu-$tag.log"
}

# The runs: torchrig with the options of a variant tag (see the header).
VARIANTS="${VARIANTS:-baseline2 inner outer bf16hook}"
[ "${EXTRA:-0}" = 1 ] && VARIANTS="$VARIANTS outer-static"
variant() {  # $1 = GPUs, $2 = tag: runs torchrig with the tag's options
  local n=$1 v=$2 b=${2%%+*}
  case "$b" in  # cg+2: a second cg run in the same call (its own files)
    inner) ours "$n" "$v" --ddp-compile inner ;;
    outer) ours "$n" "$v" --ddp-compile outer ;;
    prof) PROFILE="${PROFILE:-5}" ours "$n" "$v" ;;
    bf16hook) ours "$n" "$v" --ddp-comm-hook bf16 ;;
    outer-static) ours "$n" "$v" --ddp-compile outer --ddp-static-graph ;;
    bucket[0-9]*) ours "$n" "$v" --ddp-bucket-mb "${b#bucket}" ;;
    ctas[0-9]*) XENV="NCCL_MAX_CTAS=${b#ctas}" ours "$n" "$v" ;;
    cgctas[0-9]*) XENV="NCCL_MAX_CTAS=${b#cgctas}" ours "$n" "$v" --compile-mode reduce-overhead ;;
    ctapol) XENV="NCCL_CTA_POLICY=1" ours "$n" "$v" ;;
    cgctapol) XENV="NCCL_CTA_POLICY=1" ours "$n" "$v" --compile-mode reduce-overhead ;;
    noovl) ours "$n" "$v" --no-ddp-overlap-embeddings ;;
    cgnoovl) ours "$n" "$v" --compile-mode reduce-overhead --no-ddp-overlap-embeddings ;;
    fsdp) ours "$n" "$v" --parallel fsdp ;;
    nogc) ours "$n" "$v" --gc-every 0 ;;
    cgnogc) ours "$n" "$v" --compile-mode reduce-overhead --gc-every 0 ;;
    cpp) XENV="TORCHINDUCTOR_CPP_WRAPPER=1" ours "$n" "$v" ;;
    cg) ours "$n" "$v" --compile-mode reduce-overhead ;;
    cgstatic) ours "$n" "$v" --compile-mode reduce-overhead --ddp-static-graph ;;
    cgcpp) XENV="TORCHINDUCTOR_CPP_WRAPPER=1" ours "$n" "$v" --compile-mode reduce-overhead ;;
    cgcppstatic) XENV="TORCHINDUCTOR_CPP_WRAPPER=1" ours "$n" "$v" --compile-mode reduce-overhead --ddp-static-graph ;;
    *) echo "unknown variant $v (see the header)" ;;
  esac
}
# 1. both 1-GPU figures at once, each on its own GPU (ONE=0 skips them).
export ONE_TAG="${ONE_TAG:-default}"  # the torchrig run beside the baseline's 1-GPU run: default, or a variant tag
one_pair() {  # $1 = file-name suffix of the second pass (BOTH=1) and of the repeat (AGAIN=1)
  baseline 1 0 "${1:-}" &
  if [ "$ONE_TAG" = default ]; then GPU=1 SUFFIX="${1:-}" ours 1 default & else GPU=1 SUFFIX="${1:-}" variant 1 "$ONE_TAG" & fi
  wait
  if [ "${BOTH:-0}" = 1 ]; then
    baseline 1 1 "${1:-}.gpu1" &
    if [ "$ONE_TAG" = default ]; then GPU=0 SUFFIX="${1:-}.gpu0" ours 1 default & else GPU=0 SUFFIX="${1:-}.gpu0" variant 1 "$ONE_TAG" & fi
    wait
  fi
}
[ "${ONE:-1}" = 1 ] && one_pair
# 2. ONE_VARIANTS: 1-GPU runs of the same tags, two at a time (GPU 0 and GPU 1); a 2-GPU row's efficiency is
# against the 1-GPU run of its own tag when there is one.
set -- ${ONE_VARIANTS:-}
while [ $# -gt 0 ]; do
  GPU=0 variant 1 "$1" &
  [ $# -gt 1 ] && { GPU=1 variant 1 "$2" & }
  wait
  shift; [ $# -gt 0 ] && shift
done
# 3. the 2-GPU runs in the order of VARIANTS.
for v in $VARIANTS; do
  case "$v" in
    baseline2) if [ "$(elapsed)" -gt "$BUDGET_S" ]; then echo "[$(elapsed)s] baseline 2 GPU: skipped"; else baseline 2; fi ;;
    *) variant 2 "$v" ;;
  esac
done
# AGAIN=1: the 1-GPU figures once more, now that the GPUs are warm (the table shows both).
[ "${AGAIN:-0}" = 1 ] && [ "${ONE:-1}" = 1 ] && one_pair .end
# HANG=1 (about 1 min more): the planted NCCL hang (rank 1 stops joining collectives at step 5) with
# torchrig's defaults, the NCCL flight recorder's dump on timeout included: the report must name rank 1 and
# list the flight records, which launch writes next to the rank logs.
if [ "${HANG:-0}" = 1 ] && [ "$(elapsed)" -le "${HANG_BUDGET_S:-9999}" ]; then
  hs=$(date +%s)
  timeout 150 python3 -m torchrig --json launch --gpus 2 --no-preflight --log-dir "$R/hang-logs" \
    --rdzv-id hang --collective-timeout 15 --hang-timeout 40 \
    -m torchrig.train --model gpt --size tiny --steps 40 --log-every 5 --workers 0 --no-tensorboard \
    --out "$R/hang" --test-hang-at-step 5 >"$R/hang.json" 2>"$R/hang.log"
  hrc=$?
  echo "[$(elapsed)s] planted hang: rc=$hrc after $(( $(date +%s) - hs ))s"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])).get("result") or {}; s=r.get("summary") or {}; print(" ", s.get("headline"), "|", s.get("likely_cause")); print("  flight records:", r.get("flight_records"))' "$R/hang.json"
fi

python3 - "$R" <<'EOF'
import json, os, sys
from pathlib import Path
r = Path(sys.argv[1])
def load(name):
    try:
        return json.loads((r / name).read_text())
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
def ours(name):
    d = load(name)
    s = d.get("summary") or {}
    return s.get("tokens_per_s"), s.get("mfu"), s.get("final_loss"), d.get("error")
def clocks(name):  # each rank's median SM clock and temperature, and the share of time held down for power
    g = [x for x in ((load(name).get("summary") or {}).get("gpus") or []) if x and x.get("sm_clock_mhz")]
    if not g:
        return ""
    temp = "/".join(f"{x['temperature_c'][1]:.0f}" for x in g if x.get("temperature_c"))
    return "  {SM " + "/".join(f"{x['sm_clock_mhz'][1]:.0f}" for x in g) + " MHz" + (
        f", {temp} C" if temp else "") + ", power-capped " + "/".join(
        f"{x.get('power_capped_share') or 0:.0%}" for x in g) + "}"
def prof(name):
    p = ((load(name).get("summary") or {}).get("profile")) or {}
    if not p.get("device_events"):
        return clocks(name)
    return clocks(name) + (f"  [step {p['step_ms']:.2f} = compute {p['compute_ms']:.2f} + exposed NCCL {p['comm_exposed_ms']:.2f}"
            f" + idle {p['idle_ms']:.2f} ms; NCCL {p['comm_ms']:.2f} ms]")
f = lambda v, p: "-" if v is None else p.format(v)
def tok(name, key="tokens_per_s"):
    d = load(name)
    return d.get(key) if name.startswith("baseline") else (d.get("summary") or {}).get(key)
def one_gpu(prefix, suffix=""):
    """The 1-GPU figures of a run on each GPU it ran on: {gpu: tok/s}. Without the .gpuN file the run is on
    the GPU the pair put it on (baseline GPU 0, torchrig GPU 1)."""
    first = 0 if prefix.startswith("baseline") else 1
    out = {first: tok(f"{prefix}{suffix}.json")}
    other = r / f"{prefix}{suffix}.gpu{1 - first}.json"
    if other.exists():
        out[1 - first] = tok(other.name)
    return {g: t for g, t in out.items() if t}
def eff(t2, ones):
    """Scaling efficiency against the sum of both GPUs' 1-GPU figures when both were measured (each 2-GPU
    step waits for the slower GPU, so the ideal is what the two do alone together), else 2 x the one GPU's;
    then against each GPU alone."""
    if not t2 or not ones:
        return None, ""
    ideal = sum(ones.values()) if len(ones) == 2 else 2 * next(iter(ones.values()))
    each = "" if len(ones) < 2 else " (" + ", ".join(f"vs 2x GPU {g}: {t2 / (2 * t):.1%}" for g, t in sorted(ones.items())) + ")"
    return t2 / ideal, each
b1, b2 = load("baseline-1gpu.json"), load("baseline-2gpu.json")
one_tag = os.environ.get("ONE_TAG") or "default"
print(f"\n== GPT-2 small, seq 1024, bf16, compiled, micro-batch {b1.get('micro_batch')} per GPU, no clipping")
print(f"{'run':<34} {'tok/s':>10} {'MFU':>6} {'scaling eff.':>12}  loss")
def row1(label, name, kind):
    if not (r / name).exists():
        return
    if kind == "baseline":
        d = load(name)
        print(f"{label:<34} {f(d.get('tokens_per_s'), '{:,.0f}'):>10} {f(d.get('mfu_vs_peak'), '{:.1%}'):>6} {'':>12}  {d.get('loss')}")
    else:
        t, m, lo, err = ours(name)
        print(f"{label:<34} {f(t, '{:,.0f}'):>10} {f(m, '{:.1%}'):>6} {'':>12}  {f(lo, '{:.4f}')} {err or ''}{prof(name)}")
for sfx, when in (("", ""), (".end", " at the end")):
    row1(f"baseline 1 GPU (GPU 0){when}", f"baseline-1gpu{sfx}.json", "baseline")
    row1(f"baseline 1 GPU (GPU 1){when}", f"baseline-1gpu{sfx}.gpu1.json", "baseline")
    row1(f"torchrig 1 GPU (GPU 1) {one_tag}{when}", f"torchrig-1gpu-{one_tag}{sfx}.json", "torchrig")
    row1(f"torchrig 1 GPU (GPU 0) {one_tag}{when}", f"torchrig-1gpu-{one_tag}{sfx}.gpu0.json", "torchrig")
for p in sorted(r.glob("torchrig-1gpu-*.json")):
    tag = p.name[len("torchrig-1gpu-"):-len(".json")]
    if tag.split(".")[0] == one_tag:
        continue
    row1(f"torchrig 1 GPU {tag}", p.name, "torchrig")
bt2 = b2.get("tokens_per_s")
e, each = eff(bt2, one_gpu("baseline-1gpu"))
print(f"{'baseline 2 GPU':<34} {f(bt2, '{:,.0f}'):>10} {f(b2.get('mfu_vs_peak'), '{:.1%}'):>6} "
      f"{f(e, '{:.1%}'):>12}  {b2.get('loss')}{each}")
names = {"inner": "--ddp-compile inner", "default": "default (inner; before 2871121)",
         "outer": "--ddp-compile outer (default)", "bf16hook": "--ddp-comm-hook bf16",
         "outer-static": "outer + --ddp-static-graph", "cpp": "TORCHINDUCTOR_CPP_WRAPPER=1",
         "cg": "--compile-mode reduce-overhead", "prof": "default, --profile-steps",
         "cgstatic": "reduce-overhead + --ddp-static-graph", "cgcpp": "reduce-overhead + C++ wrapper",
         "cgcppstatic": "reduce-overhead + C++ wrapper + static",
         "nogc": "--gc-every 0 (automatic GC)", "cgnogc": "reduce-overhead + --gc-every 0",
         "ctapol": "NCCL_CTA_POLICY=1", "cgctapol": "reduce-overhead + NCCL_CTA_POLICY=1",
         "noovl": "--no-ddp-overlap-embeddings", "cgnoovl": "reduce-overhead, --no-ddp-overlap-embeddings"}
tags = sorted((p.name[len("torchrig-2gpu-"):-len(".json")] for p in r.glob("torchrig-2gpu-*.json")),
              key=lambda p: (r / f"torchrig-2gpu-{p}.json").stat().st_mtime)
for tag in tags:
    base, _, again = tag.partition("+")
    what = names.get(base) or (f"NCCL_MAX_CTAS={base[4:]}" if base.startswith("ctas") else
                               f"reduce-overhead + NCCL_MAX_CTAS={base[6:]}" if base.startswith("cgctas") else
                               f"--ddp-bucket-mb {base[6:]}" if base.startswith("bucket") else
                               {"fsdp": "--parallel fsdp"}.get(base, base))
    what += f" (run {again})" if again else ""
    t, m, lo, err = ours(f"torchrig-2gpu-{tag}.json")
    # the 1-GPU run of the same compile mode: DDP/NCCL options do not apply on 1 GPU (cgctas8 -> cg)
    t1 = base.replace("static", "") or base
    t1 = "cg" if t1.startswith("cg") and not (r / f"torchrig-1gpu-{t1}.json").exists() else t1
    t1 = t1 if (r / f"torchrig-1gpu-{t1}.json").exists() else one_tag
    e, each = eff(t, one_gpu(f"torchrig-1gpu-{t1}"))
    vs_base = f" vs baseline 2 GPU {t / bt2:.3f}" if t and bt2 else ""
    print(f"{'torchrig 2 GPU ' + what:<34} {f(t, '{:,.0f}'):>10} {f(m, '{:.1%}'):>6} {f(e, '{:.1%}'):>12}  "
          f"{f(lo, '{:.4f}')} {err or ''}{vs_base}{each}{prof(f'torchrig-2gpu-{tag}.json')}")
EOF
gpu_state end
echo "train_scaling: done in $(elapsed)s"
