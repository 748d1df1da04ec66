#!/usr/bin/env bash
# torchrig doctor on a GPU machine: the real report (text + JSON), the probed facts recorded as test fixtures,
# a planted fault (CUDA_VISIBLE_DEVICES=7) and timings. Runs from the repository root in well under 60 s.
#
#   OUT=/tmp/out bash tools/gpu/doctor.sh        # results in $OUT/doctor/
#
# Writes, with NAME=h200x<N>-driver<branch>-cu<torch CUDA, no dot> (e.g. h200x2-driver580-cu130):
#   NAME.json                         facts (--record): copy to tests/fixtures/doctor/ to replace the derived base
#   NAME.report.txt / .report.json    the report on the healthy machine
#   NAME-cuda-visible-devices-7.{json,report.txt,report.json}   the planted fault
#   NAME-shm-64m.{json,report.json}   /dev/shm remounted at 64 MB in a private mount namespace (if permitted;
#                                     --only container,gpu, so no torch probe; the facts come from the report)
#   timings.txt                       wall time of doctor with and without the torch probe, and of import torch
# NVML is read through nvidia-ml-py; if the machine lacks it, put pynvml.py into .gpu-deps/ (carried).
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-$(command -v python3 || command -v python)}
OUT=${OUT:-/tmp/torchrig-out}
D="$OUT/doctor"
mkdir -p "$D"

if ! "$PY" -c "import pynvml" 2>/dev/null; then
    if [ -f .gpu-deps/pynvml.py ]; then
        export PYTHONPATH="$PYTHONPATH:.gpu-deps"
        echo "doctor.sh: using .gpu-deps/pynvml.py (nvidia-ml-py is not installed here)"
    else
        echo "doctor.sh: WARNING nvidia-ml-py is not installed and .gpu-deps/pynvml.py is absent: NVML checks will be skipped"
    fi
fi

run() {  # run TAG [VAR=value...]: probe once (facts + JSON report), then render the text from the same facts
    local tag=$1; shift
    env "$@" "$PY" -m torchrig doctor --record "$D/$tag.json" --json > "$D/$tag.report.json" 2> "$D/$tag.stderr"
    echo "$?" > "$D/$tag.exit"
    "$PY" -m torchrig doctor --facts "$D/$tag.json" > "$D/$tag.report.txt" 2>> "$D/$tag.stderr"
}

run probe PATH="$PATH"
NAME=$("$PY" - "$D/probe.json" <<'PYEOF'
import json, sys
f = json.load(open(sys.argv[1]))
n = len(f["nvml"].get("gpus") or [])
drv = f["nvml"].get("driver_version") or f["kernel"].get("module_version") or "none"
cuda = (f["torch"].get("cuda_version") or "cpu").replace(".", "")
print(f"h200x{n}-driver{drv.split('.')[0]}-cu{cuda}" if cuda != "cpu" else f"h200x{n}-driver{drv.split('.')[0]}-cpu")
PYEOF
)
for ext in json report.json report.txt stderr exit; do mv "$D/probe.$ext" "$D/$NAME.$ext"; done
echo "doctor.sh: $NAME (exit $(cat "$D/$NAME.exit"))"
run "$NAME-cuda-visible-devices-7" CUDA_VISIBLE_DEVICES=7

# Planted fault 2 (needs root and mount rights; skipped otherwise): Docker's default 64 MB /dev/shm, in a
# private mount namespace so the machine's own /dev/shm is untouched.
SHM="$NAME-shm-64m"
if unshare -m sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm' 2>/dev/null; then
    unshare -m sh -c "mount -t tmpfs -o size=64m tmpfs /dev/shm && exec \"$PY\" -m torchrig doctor --only container,gpu --json" \
        > "$D/$SHM.report.json" 2> "$D/$SHM.stderr"
    echo "$?" > "$D/$SHM.exit"
    # its facts, as a fixture (--record would also run the torch probe; the report's "facts" are the same record)
    "$PY" -c 'import json, sys; f = json.load(open(sys.argv[1]))["facts"]
f["source"] = "recorded by torchrig doctor --json (its facts) at " + f["recorded_at"]
json.dump(f, open(sys.argv[2], "w"), indent=1)' \
        "$D/$SHM.report.json" "$D/$SHM.json"
else
    echo "doctor.sh: no mount rights here; skipping the /dev/shm fault"
    SHM=""
fi

if [ "$SECONDS" -gt 30 ]; then echo "doctor.sh: ${SECONDS} s used; skipping timings and unit tests to stay under 60 s"; else
{
    echo "# wall time of 'python -m torchrig doctor' on $NAME (seconds, 3 runs each)"
    for label in "with-torch:" "without-torch:--only driver,gpu,container"; do
        name=${label%%:*}; args=${label#*:}
        for i in 1 2 3; do
            "$PY" - "$name" $args <<'PYEOF'
import subprocess, sys, time
t0 = time.perf_counter()
subprocess.run([sys.executable, "-m", "torchrig", "doctor", *sys.argv[2:]], capture_output=True)
print(f"{sys.argv[1]} {time.perf_counter() - t0:.3f}")
PYEOF
        done
    done
    for i in 1 2 3; do  # the floor: what import torch alone costs in a fresh interpreter here
        "$PY" -c 'import subprocess, sys, time
t0 = time.perf_counter()
subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
print(f"import-torch-only {time.perf_counter() - t0:.3f}")'
    done
} > "$D/timings.txt"

if "$PY" -c "import pytest" 2>/dev/null; then
    "$PY" -m pytest -q -p no:cacheprovider tests/unit/test_doctor_checks.py tests/unit/test_doctor_facts.py tests/unit/test_doctor_p2p.py tests/unit/test_hw_nvml.py \
        > "$D/unit-tests.txt" 2>&1
    echo "unit tests: $(tail -1 "$D/unit-tests.txt")"
fi
fi

echo
echo "== summary"
for tag in "$NAME" "$NAME-cuda-visible-devices-7" $SHM; do
    "$PY" - "$D/$tag.report.json" "$(cat "$D/$tag.exit")" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
v = d["verdict"]
print(f"{sys.argv[1].rsplit('/', 1)[-1]}: exit {sys.argv[2]}, {v['status']}: "
      f"{v['error']} error(s), {v['warning']} warning(s), {v['info']} note(s), {v['ok']} passed")
for f in d["findings"]:
    print(f"  {f['severity']:<7} {f['id']}: {f['summary']}")
PYEOF
done
"$PY" - "$D/$NAME.json" <<'PYEOF'
import json, sys
f = json.load(open(sys.argv[1]))
print("probe ms:", f.get("probe_ms"), "| torch child steps ms:", f["torch"].get("steps_ms"))
PYEOF
cat "$D/timings.txt" 2>/dev/null
echo "doctor.sh: done in ${SECONDS} s; results in $D"
