#!/usr/bin/env bash
# One GPU: `torchrig train` (GPT-2 small, bf16, compiled, micro-batch 16) against the hand-written baseline
# gpt_ddp.py in the same call, for the speed levers of the trainer, timed one after another (alternating)
# with every compile done beforehand (two at a time, STEPS=3) so each timed run starts from Inductor's cache.
# Then a profiled run of the first and the last tag: where each step's GPU time went, by part of the model.
# Usage (repository root, 1 GPU): OUT=/some/dir tools/gpu/train_speed.sh          about 6-7 min
#   TAGS="default cg cgtune" picks the torchrig variants (default: that); ORDER="base default cg cgtune base
#   cgtune cg default" the timed runs; BUDGET_S (420): timed runs that would start later are skipped.
# Tags: default (--compile-mode default: the trainer before CUDA graphs became its default), cg
# (--compile-mode reduce-overhead), auto (--compile-mode auto), cgtune (cg + --compile-tuning),
# cgflash / cgcudnn (cg + --attention flash / cudnn), cgplain / cgfused / cgtuneplain (--loss plain or fused:
# the GPT head's cross-entropy over kept logits, or fused with the output projection; auto = fused on a GPU).
# fp8 / fp8tw (cg + --precision fp8: torchao float8 training, rowwise / tensorwise scaling; MFU is counted
# against the bf16 peak, so it compares with bf16's).
# fp8 needs torchao: when a tag needs it and it does not import, the script puts a carried wheel on
# PYTHONPATH (torchao-*.whl in $TORCHAO_WHEELS, .dev-fp8/wheels, wheels or ../.dev-fp8/wheels).
#   fp8 side by side with bf16 and the baseline: TAGS="cg fp8 fp8tw" ORDER="base cg fp8 fp8tw fp8tw fp8 cg base"
# The torchrig runs train on --data generated (the loss falls, so a loss curve says something); each run's
# loss curve (metrics.jsonl, every 5 steps) is compared with the first tag's: max |difference|; every run's
# curve is printed step by step and written to $R/curves.json.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
R="${OUT:-/tmp/gpu-out}/train_speed"
mkdir -p "$R"
MB="${MICRO_BATCH:-16}"
STEPS="${STEPS:-50}"
BUDGET_S="${BUDGET_S:-420}"
TAGS="${TAGS:-default cg cgtune}"
ORDER="${ORDER:-base default cg cgtune cgtune cg default base}"
BASE=""
for cand in .baselines/gpt_ddp.py ../.baselines/gpt_ddp.py ../shared/baselines/gpt_ddp.py /work/shared/baselines/gpt_ddp.py; do
  [ -f "$cand" ] && { BASE="$cand"; break; }
done
case " $TAGS " in
  *" fp8"*)
    if ! python3 -c 'import torchao' >/dev/null 2>&1; then
      WHL=""
      for d in ${TORCHAO_WHEELS:-} .dev-fp8/wheels wheels ../.dev-fp8/wheels; do
        for w in "$d"/torchao-*.whl; do [ -f "$w" ] && { WHL="$w"; break 2; }; done
      done
      if [ -n "$WHL" ]; then  # unpacked into a folder of its own on PYTHONPATH (a wheel is a zip; no pip,
        SITE=/tmp/train_speed-torchao  # no network): the machine's Python stays as it was
        rm -rf "$SITE" && python3 -m zipfile -e "$WHL" "$SITE" &&
          export PYTHONPATH="$SITE:$PYTHONPATH" && echo "train_speed: $WHL unpacked into $SITE"
      else
        echo "train_speed: torchao is not installed and no torchao-*.whl was carried: the fp8 runs will fail"
      fi
    fi ;;
esac
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
echo "train_speed: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader), torch" \
  "$(python3 -c 'import torch; print(torch.__version__)'), torchao" \
  "$(python3 -c 'import importlib.metadata as m; print(m.version("torchao"))' 2>/dev/null || echo none), micro-batch $MB, $STEPS steps, baseline ${BASE:-MISSING}, $(date -u +%FT%TZ)"

opts() {  # the options of a tag
  case "$1" in
    default) echo "--compile-mode default" ;;
    cg) echo "--compile-mode reduce-overhead" ;;
    auto) echo "--compile-mode auto" ;;
    cgtune) echo "--compile-mode reduce-overhead --compile-tuning" ;;
    cgplain) echo "--compile-mode reduce-overhead --loss plain" ;;
    cgfused) echo "--compile-mode reduce-overhead --loss fused" ;;
    cgtuneplain) echo "--compile-mode reduce-overhead --compile-tuning --loss plain" ;;
    cgmag) echo "--compile-mode reduce-overhead" ;;
    cgflash) echo "--compile-mode reduce-overhead --attention flash" ;;
    cgcudnn) echo "--compile-mode reduce-overhead --attention cudnn" ;;
    fp8) echo "--compile-mode reduce-overhead --precision fp8" ;;
    fp8tw) echo "--compile-mode reduce-overhead --precision fp8 --fp8-recipe tensorwise" ;;
    *) echo "UNKNOWN" ;;
  esac
}
tag_env() {  # environment of a tag: cgmag lets Inductor autotune the GEMMs (Triton templates with fused
  # epilogues against cuBLAS), keeping CUDA graphs
  case "$1" in
    cgmag) echo "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1" ;;
    *) echo "TORCHRIG_SPEED_TAG=$1" ;;
  esac
}
run() {  # $1 = tag (base = the baseline), $2 = file name, $3 = steps, then extra torchrig options
  local tag=$1 name=$2 steps=$3
  shift 3
  if [ "$tag" = base ]; then
    MICRO_BATCH=$MB STEPS=$steps timeout 240 python3 "$BASE" >"$R/$name.log" 2>&1
    echo "[$(elapsed)s] $name rc=$? $(grep '^{' "$R/$name.log" | tail -n 1)"
    grep '^{' "$R/$name.log" | tail -n 1 >"$R/$name.json"
    return
  fi
  # shellcheck disable=SC2046  # the tag's options, split on spaces
  # shellcheck disable=SC2046  # the tag's environment
  env $(tag_env "$tag") timeout 300 python3 -m torchrig --json train --model gpt --size small --data generated \
    --micro-batch "$MB" --steps "$steps" --precision bf16 --compile --log-every 5 --warmup-steps 5 \
    --clip-grad 0 --no-ckpt-final --no-tensorboard --workers 2 --no-preflight --out "$R/run-$name" --overwrite \
    $(opts "$tag") "$@" >"$R/$name.json" 2>"$R/$name.log"
  echo "[$(elapsed)s] $name rc=$? ($(opts "$tag") $*) $(tail -n 1 "$R/$name.log")"
}

# 1. compile everything first, WARM_PAR (2) at a time (CPU-bound; the GPU has room for two GPT-2 smalls at MB 16).
set -- base $TAGS
while [ $# -gt 0 ]; do
  for _ in $(seq "${WARM_PAR:-2}"); do  # WARM_PAR compiles at a time (2)
    [ $# -gt 0 ] || break
    run "$1" "warm-$1" 3 &
    shift
  done
  wait
done
# 2. the timed runs, one at a time, in ORDER (a tag twice: files TAG.1, TAG.2).
declare -A seen
for t in $ORDER; do
  seen[$t]=$(( ${seen[$t]:-0} + 1 ))
  if [ "$(elapsed)" -gt "$BUDGET_S" ]; then echo "[$(elapsed)s] $t.${seen[$t]}: skipped (past ${BUDGET_S}s)"; continue; fi
  run "$t" "$t.${seen[$t]}" "$STEPS"
done
# 3. profiles: the first and the last tag, 5 profiled steps each (left out of their throughput).
FIRST=${TAGS%% *}; LAST=${TAGS##* }
for t in $FIRST $LAST; do
  if [ "$(elapsed)" -gt $(( BUDGET_S + 60 )) ]; then echo "[$(elapsed)s] profile $t: skipped"; continue; fi
  run "$t" "prof-$t" 30 --profile-steps 5
done

python3 - "$R" "$FIRST" <<'EOF'
import json, sys
from pathlib import Path
r, first = Path(sys.argv[1]), sys.argv[2]
def load(p):
    try:
        return json.loads(p.read_text())
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
def curve(name):
    p = r / f"run-{name}" / "metrics.jsonl"
    if not p.exists():
        return {}
    rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    return {x["step"]: x["loss"] for x in rows if "loss" in x and "step" in x}
ref = curve(f"{first}.1")
print(f"\n{'run':<14} {'tok/s':>10} {'MFU':>6} {'vs base':>8} {'final loss':>11} {'max |dloss| vs ' + first:>20}")
timed = sorted((p for p in r.glob("*.json") if not p.name.startswith(("warm-", "prof-"))), key=lambda p: p.stat().st_mtime)
bases = [load(p).get("tokens_per_s") for p in timed if p.name.startswith("base.")]
bases = [b for b in bases if b]
base_mean = sum(bases) / len(bases) if bases else None
for p in timed:
    d, name = load(p), p.name[:-5]
    if name.startswith("base."):
        t, m, lo, dl = d.get("tokens_per_s"), d.get("mfu_vs_peak"), d.get("loss"), ""
    else:
        s = d.get("summary") or {}
        t, m, lo = s.get("tokens_per_s"), s.get("mfu"), s.get("final_loss")
        c = curve(name)
        common = sorted(set(c) & set(ref))
        dl = f"{max(abs(c[k] - ref[k]) for k in common):.4f} ({len(common)} pts)" if common else "-"
    vs = f"{t / base_mean:.3f}" if t and base_mean else "-"
    print(f"{name:<14} {t or 0:>10,.0f} {(m or 0):>6.1%} {vs:>8} {lo if lo is not None else '-':>11} {dl:>20} {d.get('error') or ''}")
curves = {p.name[:-5]: curve(p.name[:-5]) for p in timed if not p.name.startswith("base.")}
curves = {k: v for k, v in curves.items() if v}
(r / "curves.json").write_text(json.dumps({k: {str(s): x for s, x in v.items()} for k, v in curves.items()}, indent=1) + "\n")
if curves:
    names = list(curves)
    print(f"\nloss curves (metrics.jsonl; {r / 'curves.json'})")
    print(f"{'step':>5} " + " ".join(f"{n:>10}" for n in names))
    for st in sorted(set().union(*curves.values())):
        print(f"{st:>5} " + " ".join(f"{curves[n][st]:>10.4f}" if st in curves[n] else f"{'-':>10}" for n in names))
for p in sorted(r.glob("prof-*.json")):
    s = load(p).get("summary") or {}
    pr = s.get("profile") or {}
    print(f"\n{p.name[:-5]}: {s.get('tokens_per_s')} tok/s; profiled step {pr.get('step_ms')} ms = compute "
          f"{pr.get('compute_ms')} + idle {pr.get('idle_ms')} ms")
    k = pr.get("kernels") or {}
    for g, ms in (k.get("groups_ms") or {}).items():
        print(f"  {g:<28} {ms:8.3f} ms/step")
    for n, ms in (k.get("top_kernels_ms") or [])[:12]:
        print(f"    {ms:7.3f}  {n}")
EOF
echo "train_speed: done in $(elapsed)s"
