"""Keep only the device events (kernels, copies, memsets) of a Chrome trace from ``torchrig train
--profile-steps``: a small file with the fields torchrig.train.profile.breakdown reads, used as a test fixture
recorded from a real GPU run.

usage: python3 tools/gpu/trace_kernels.py RUN/profile/rank0.trace.json.gz OUT.json.gz [STEPS WALL_S]
"""

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from torchrig.train.profile import DEVICE_CATEGORIES, read_trace

src, dst = sys.argv[1], sys.argv[2]
keep = [
    {k: e[k] for k in ("ph", "cat", "name", "ts", "dur") if k in e}
    for e in read_trace(Path(src))
    if e.get("ph") == "X" and str(e.get("cat", "")).lower() in DEVICE_CATEGORIES
]
meta = {"source": src}
if len(sys.argv) > 4:
    meta.update(steps=int(sys.argv[3]), wall_s=float(sys.argv[4]))
with gzip.open(dst, "wt") as f:
    json.dump({"traceEvents": keep, "torchrig": meta}, f)
print(f"{dst}: {len(keep)} device events")
