"""One PNG a person would rather look at than read: busbw vs. message size per collective, GEMM TFLOP/s by
dtype against the datasheet peak, the P2P one-way matrix as a heat map, and scaling efficiency.

matplotlib (the ``plots`` extra) is imported here only, with the Agg backend; a missing matplotlib is an
:class:`~torchrig.errors.EngineUnavailable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchrig.bench.busbw import format_size
from torchrig.bench.grading import Peaks
from torchrig.bench.records import Measurements
from torchrig.errors import EngineUnavailable


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise EngineUnavailable(
            "matplotlib is not installed", hint="pip install 'torchrig[plots]' or pass --no-plots"
        ) from err
    return plt


def _empty(ax: Any, title: str, why: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True, transform=ax.transAxes)
    ax.set_axis_off()


def _collectives(ax: Any, m: Measurements) -> None:
    if not m.collectives:
        _empty(ax, "collectives", "needs 2 or more GPUs")
        return
    for op in dict.fromkeys(c.op for c in m.collectives):
        rows = sorted((c for c in m.collectives if c.op == op), key=lambda c: c.size_bytes)
        ax.plot([c.size_bytes for c in rows], [c.busbw_gbps for c in rows], marker="o", ms=3, label=op)
    sizes = sorted({c.size_bytes for c in m.collectives})
    ax.set_xscale("log", base=2)
    ax.set_xticks(
        sizes[:: max(1, len(sizes) // 6)], [format_size(s) for s in sizes[:: max(1, len(sizes) // 6)]]
    )
    ax.set_xlabel("message size (nccl-tests S)")
    ax.set_ylabel("busbw GB/s")
    ax.set_title(f"collectives, {m.collectives[0].ranks} ranks ({m.collectives[0].dtype})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _gemm(ax: Any, m: Measurements, peaks: Mapping[int, Peaks | None]) -> None:
    if not m.gemm:
        _empty(ax, "GEMM", "not measured")
        return
    dtypes = list(dict.fromkeys(g.dtype for g in m.gemm))
    ranks = sorted({g.rank for g in m.gemm})
    width = 0.8 / len(ranks)
    for j, r in enumerate(ranks):
        best = {
            d: max((g.tflops for g in m.gemm if g.rank == r and g.dtype == d), default=0.0) for d in dtypes
        }
        xs = [i + j * width for i in range(len(dtypes))]
        values = [best[d] for d in dtypes]
        bars = ax.bar(xs, values, width, label=f"GPU {r}")
        ax.bar_label(bars, labels=[f"{v:.0f}" if v >= 10 else f"{v:.3g}" for v in values], fontsize=7)
    p = peaks.get(ranks[0])
    if p is not None:
        for i, d in enumerate(dtypes):
            peak = getattr(p, f"{d}_tflops", None)
            if peak:
                ax.hlines(peak, i - width / 2, i + 0.8 - width / 2, colors="k", linestyles="dashed", lw=1)
        ax.plot([], [], "k--", lw=1, label="datasheet peak")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(dtypes))], dtypes)
    ax.set_ylabel("TFLOP/s")
    ax.set_title("GEMM by dtype (best size)")
    ax.legend(fontsize=7, loc="upper left")  # the highest peak line (fp8) is on the right


def p2p_scale(m: Measurements, peaks: Mapping[int, Peaks | None]) -> tuple[float, float, str]:
    """The heat map's colour range: from 0 to the link's one-way peak (or the best pair when the datasheet
    has none), so equal links get one colour and a slow pair stands out by how far it falls short."""
    from torchrig.bench.grading import link_per_direction_gbps

    peak, name = link_per_direction_gbps(peaks.get(0))
    best = max(p.oneway_gbps for p in m.p2p)
    if peak and peak >= best:
        return 0.0, peak, f"0 to the {name} peak"
    return 0.0, best, "0 to the best pair"


def _p2p(ax: Any, m: Measurements, peaks: Mapping[int, Peaks | None]) -> None:
    if not m.p2p:
        _empty(ax, "P2P", "needs 2 or more GPUs")
        return
    n = max(max(p.src, p.dst) for p in m.p2p) + 1
    grid = [[float("nan")] * n for _ in range(n)]
    for p in m.p2p:
        grid[p.src][p.dst] = p.oneway_gbps
    low, high, scale = p2p_scale(m, peaks)
    im = ax.imshow(grid, cmap="viridis", vmin=low, vmax=high)
    for p in m.p2p:
        ax.text(p.dst, p.src, f"{p.oneway_gbps:.3g}", ha="center", va="center", color="w", fontsize=8)
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xlabel("destination GPU")
    ax.set_ylabel("source GPU")
    ax.set_title(f"P2P one way, GB/s (colour: {scale})")
    ax.figure.colorbar(im, ax=ax, fraction=0.046)


def _scaling(ax: Any, m: Measurements) -> None:
    if not m.scaling:
        _empty(ax, "scaling", "not measured")
        return
    xs = [s.gpus for s in m.scaling]
    ax.plot(xs, [s.tokens_per_s / 1e3 for s in m.scaling], marker="o", label="measured")
    ax.plot(xs, [m.scaling[0].tokens_per_s * k / 1e3 for k in xs], "k--", lw=1, label="linear")
    for s in m.scaling:
        if s.efficiency is not None:
            ax.annotate(f"{s.efficiency:.0%}", (s.gpus, s.tokens_per_s / 1e3), fontsize=8)
    ax.set_xticks(xs)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("thousand tokens/s")
    ax.set_title("training scaling (torchrig train)")
    ax.legend(fontsize=7)


def render_png(m: Measurements, peaks: Mapping[int, Peaks | None], path: str) -> str:
    """Write the four panels to ``path`` and return it."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    _collectives(axes[0][0], m)
    _gemm(axes[0][1], m, peaks)
    _p2p(axes[1][0], m, peaks)
    _scaling(axes[1][1], m)
    names = ", ".join(sorted({g.name for g in m.gpus}))
    fig.suptitle(f"torchrig bench: {len(m.gpus)}x {names} - {m.meta.hostname} - {m.meta.date_utc}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
