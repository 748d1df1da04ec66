"""Between-GPU measurements inside the torchrun workers: the P2P matrix and the collective sweep.

Collectives run through ``torch.distributed`` (NCCL on GPUs, gloo on the CPU path), timed nccl-tests style:
warm-up, then blocks of ``iters`` operations launched back to back between two CUDA events, the time per
operation averaged over ranks (nccl-tests' default ``-a 1``) and the median block kept. The first
operation of every size runs on a known pattern and its result is checked. P2P runs send/recv between
each pair of ranks while the others wait: one way, both ways at once, and a ping-pong for latency.
``torch`` and ``dist`` are passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchrig.bench.busbw import Collective, algbw_gbps, busbw_gbps, effective_size, element_counts
from torchrig.bench.config import collective_iterations
from torchrig.bench.records import CollectiveResult, P2PResult
from torchrig.bench.timing import Timer, median

LATENCY_ITERATIONS = 50


def _dtype(torch: Any, name: str) -> Any:
    return {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[name]


def mean_across_ranks(torch: Any, dist: Any, device: Any, value: float, group: Any = None) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, group=group)
    return float(t.item()) / dist.get_world_size(group)


class CollectiveCase:
    """Buffers, the operation and its check for one collective at one size on this rank."""

    def __init__(self, torch: Any, dist: Any, device: Any, op: str, size_bytes: int, dtype_name: str) -> None:
        self.torch, self.dist, self.op = torch, dist, Collective(op)
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        self.dtype = _dtype(torch, dtype_name)
        elem = torch.empty((), dtype=self.dtype).element_size()
        self.size = effective_size(op, size_bytes, elem, self.n)
        n_in, n_out = element_counts(op, size_bytes, elem, self.n)
        self.inp = self._pattern(n_in, device)
        self.out = (
            self.inp
            if self.op in (Collective.ALL_REDUCE, Collective.BROADCAST)
            else torch.empty(n_out, dtype=self.dtype, device=device)
        )
        self.fn = self._operation()

    def _periodic(self, count: int, offset: int, device: Any) -> Any:
        """``(offset + j) % 7`` for ``j < count`` in the collective's dtype, built without int64 temporaries."""
        base = ((self.torch.arange(7, device=device) + offset) % 7).to(self.dtype)
        return base.repeat(-(-count // 7))[:count]

    def _chunks(self, flat: Any) -> Any:
        return flat.view(self.n, -1)

    def _pattern(self, count: int, device: Any) -> Any:
        """Small integers (exact in bf16) that encode rank, chunk and position, so misplaced data shows."""
        x = self._periodic(count, 0, device).clone()
        if self.op in (Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL):
            chunk = self.torch.arange(self.n, device=device).to(self.dtype)[:, None]
            self._chunks(x).add_(
                chunk + (self.rank * self.n if self.op is Collective.ALL_TO_ALL else self.rank)
            )
            return x
        return x.add_(self.rank + 1)

    def expected(self) -> Any:
        """What this rank's output must hold after one operation on the patterns."""
        t, n, r, dev = self.torch, self.n, self.rank, self.out.device
        count = self.out.numel()
        ranks = t.arange(n, device=dev).to(self.dtype)[:, None]
        if self.op is Collective.ALL_REDUCE:
            return self._periodic(count, 0, dev).mul_(n).add_(n * (n + 1) // 2)
        if self.op is Collective.BROADCAST:
            return self._periodic(count, 0, dev).add_(1)
        per = count // n
        if self.op is Collective.ALL_GATHER:
            return (self._periodic(per, 0, dev)[None, :] + ranks + 1).reshape(-1)
        if self.op is Collective.REDUCE_SCATTER:
            # sum over ranks s of (r + s + (r * count + j) % 7)
            return self._periodic(count, r * count, dev).mul_(n).add_(n * r + n * (n - 1) // 2)
        if self.op is Collective.ALL_TO_ALL:
            return (self._periodic(per, r * per, dev)[None, :] + ranks * n + r).reshape(-1)
        return self._periodic(count, 0, dev).add_((r - 1) % n + 1)  # sendrecv: the previous rank's pattern

    def _operation(self) -> Callable[[int], Any]:
        d, op = self.dist, self.op
        if op is Collective.ALL_REDUCE:
            return lambda i: d.all_reduce(self.inp)
        if op is Collective.BROADCAST:
            return lambda i: d.broadcast(self.inp, src=0)
        if op is Collective.ALL_GATHER:
            gather = getattr(d, "all_gather_single", None) or d.all_gather_into_tensor
            return lambda i: gather(self.out, self.inp)
        if op is Collective.REDUCE_SCATTER:
            scatter = getattr(d, "reduce_scatter_single", None) or d.reduce_scatter_tensor
            return lambda i: scatter(self.out, self.inp)
        if op is Collective.ALL_TO_ALL:
            return lambda i: d.all_to_all_single(self.out, self.inp)
        nxt, prv = (self.rank + 1) % self.n, (self.rank - 1) % self.n

        def sendrecv(i: int) -> None:
            for work in d.batch_isend_irecv(
                [d.P2POp(d.isend, self.inp, nxt), d.P2POp(d.irecv, self.out, prv)]
            ):
                work.wait()

        return sendrecv

    def check(self) -> bool:
        """Run once on the pattern and compare with the expected result (exact for small rank counts)."""
        self.fn(0)
        want = self.expected()
        if self.torch.equal(self.out, want):
            return True
        # Reductions over many ranks may round in bf16: compare within a bf16 step, a chunk at a time.
        step = 1 << 24
        return all(
            bool(
                self.torch.allclose(self.out[i : i + step].float(), want[i : i + step].float(), rtol=1 / 128)
            )
            for i in range(0, self.out.numel(), step)
        )


def measure_collective(
    torch: Any, dist: Any, device: Any, op: str, size_bytes: int, dtype_name: str, quick: bool
) -> CollectiveResult:
    case = CollectiveCase(torch, dist, device, op, size_bytes, dtype_name)
    ok = case.check()
    warmup, iters, blocks = collective_iterations(case.size, quick)
    timer = Timer(torch, device)
    for i in range(warmup):
        case.fn(i)
    timer.sync()
    dist.barrier()
    per_block = [timer.time_block(case.fn, iters) for _ in range(blocks)]
    t = mean_across_ranks(torch, dist, device, median(per_block))
    ok_all = mean_across_ranks(torch, dist, device, 1.0 if ok else 0.0) == 1.0
    n = dist.get_world_size()
    return CollectiveResult(
        op=case.op.value,
        size_bytes=case.size,
        dtype=dtype_name,
        ranks=n,
        time_us=t * 1e6,
        algbw_gbps=algbw_gbps(case.size, t),
        busbw_gbps=busbw_gbps(case.op, case.size, t, n),
        iterations=iters * blocks,
        check_ok=ok_all,
    )


def _p2p_pattern(torch: Any, count: int, src: int, device: Any) -> Any:
    base = ((torch.arange(251, device=device) + src) % 256).to(torch.uint8)
    return base.repeat(-(-count // 251))[:count].contiguous()


def _pair_times(
    torch: Any, dist: Any, device: Any, me: int, peer: int, src: int, size_bytes: int, iterations: int
) -> tuple[float, float, float, bool]:
    """(one-way s src->other, both-ways s, latency s, check) measured on this rank of the pair."""
    timer = Timer(torch, device)
    buf = _p2p_pattern(torch, size_bytes, me, device)
    recv = torch.empty(size_bytes, dtype=torch.uint8, device=device)

    def oneway(i: int) -> None:
        if me == src:
            dist.send(buf, peer)
        else:
            dist.recv(recv, peer)

    def both(i: int) -> None:
        for w in dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, buf, peer), dist.P2POp(dist.irecv, recv, peer)]
        ):
            w.wait()

    both(0)  # warm-up and the check: each side got the other's pattern
    timer.sync()
    ok = bool(torch.equal(recv, _p2p_pattern(torch, size_bytes, peer, device)))
    oneway(0)
    timer.sync()
    t_one = median([timer.time_block(oneway, iterations) for _ in range(3)])
    t_both = median([timer.time_block(both, iterations) for _ in range(3)])
    tiny, tiny_recv = buf[:4].clone(), recv[:4].clone()

    def pingpong(i: int) -> None:
        if me == src:
            dist.send(tiny, peer)
            dist.recv(tiny_recv, peer)
        else:
            dist.recv(tiny_recv, peer)
            dist.send(tiny, peer)

    pingpong(0)
    timer.sync()
    t_lat = timer.time_block(pingpong, LATENCY_ITERATIONS) / 2
    return t_one, t_both, t_lat, ok


def measure_p2p(
    torch: Any, dist: Any, device: Any, size_bytes: int, iterations: int, progress: Callable[[str], None]
) -> list[P2PResult]:
    """Every ordered pair (src, dst): one-way src->dst, both ways, latency. Returns the rows on rank 0."""
    rank, n = dist.get_rank(), dist.get_world_size()
    rows: list[P2PResult] = []
    for src in range(n):
        for dst in range(n):
            if src == dst:
                continue
            progress(f"p2p {src}->{dst}")
            mine = None
            if rank in (src, dst):
                mine = _pair_times(
                    torch, dist, device, rank, dst if rank == src else src, src, size_bytes, iterations
                )
            gathered: list[Any] = [None] * n
            dist.all_gather_object(gathered, mine)
            if rank == 0:
                a, b = gathered[src], gathered[dst]
                t_one, t_both, t_lat = ((x + y) / 2 for x, y in zip(a[:3], b[:3], strict=True))
                rows.append(
                    P2PResult(
                        src=src,
                        dst=dst,
                        size_bytes=size_bytes,
                        oneway_gbps=size_bytes / t_one / 1e9,
                        bidir_gbps=2 * size_bytes / t_both / 1e9,
                        latency_us=t_lat * 1e6,
                        check_ok=bool(a[3] and b[3]),
                    )
                )
    return rows
