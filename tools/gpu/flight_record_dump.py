"""How long a rank takes to dump its NCCL flight record while its collective waits behind GPU work.

One NCCL rank (1 GPU) queues an all_reduce behind a 20 s kernel and waits in ``.item()``; a helper thread
dumps the flight record 3 s in, in the order given: ``nostack`` (``_dump_nccl_trace`` without Python
stacks), ``full`` (with them, PyTorch's default) or ``fr`` (``_dump_fr_trace``, the generic recorder).
Run several at once on one GPU, each with its own port:

    export TORCH_FR_BUFFER_SIZE=2000 NCCL_NVLS_ENABLE=0
    python3 tools/gpu/flight_record_dump.py 29611 full,nostack & python3 tools/gpu/flight_record_dump.py 29612 nostack,full & wait
"""

import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

port, order = sys.argv[1], sys.argv[2]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1")
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=600), device_id=torch.device("cuda", 0))
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
t0 = time.time()


def log(*what: object) -> None:
    print(f"[{port} {time.time() - t0:5.1f}s]", *what, flush=True)


def dumps() -> None:
    time.sleep(3)
    for how in order.split(","):
        t = time.time()
        if how == "nostack":
            d = c10d._dump_nccl_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        elif how == "full":
            d = c10d._dump_nccl_trace()
        else:
            d = c10d._dump_fr_trace()
        log(how, len(d), "bytes in", round(time.time() - t, 2), "s")


threading.Thread(target=dumps, daemon=True).start()
torch.cuda._sleep(int(1.9e9 * 20))  # about 20 s at the H200's clocks
dist.all_reduce(x)
log("in item")
print(x[0].item())
log("item returned")
os._exit(0)
