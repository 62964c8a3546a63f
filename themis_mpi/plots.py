"""PNG pictures of traces with matplotlib: timelines, per-dim utilization, queue depth.

Every picture has labelled axes with units. Times are virtual microseconds since the collective
was issued.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from .analysis import queue_levels
from .output import atomic_path
from .units import format_size


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def timeline(trace, collective: int, path: str, ranks: Sequence[int] = (0,), max_ranks: int = 8) -> str:
    """One row per dim (and per rank when several are asked for), one bar per stage, colored by chunk."""
    plt = _pyplot()
    ev = trace.events[trace.events["collective"] == collective]
    ranks = list(ranks)[:max_ranks]
    single = len(ranks) == 1
    n_dims = len(trace.topology_table)
    row = trace.collective_row(collective)
    chunks = max(1, row["chunks"])
    cmap = plt.get_cmap("viridis")
    rows = [(r, d) for r in ranks for d in range(n_dims)]
    fig, ax = plt.subplots(figsize=(12, 0.5 + 0.45 * len(rows)))
    for y, (r, d) in enumerate(rows):
        sel = ev[(ev["rank"] == r) & (ev["dim"] == d)]
        ax.broken_barh(
            list(zip(sel["start_us"], sel["end_us"] - sel["start_us"])),
            (y - 0.4, 0.8),
            facecolors=[cmap(c / max(1, chunks - 1)) for c in sel["chunk"]],
            edgecolor="white",
            linewidth=0.3,
        )
    ax.set_yticks(range(len(rows)), [f"dim {d}" if single else f"rank {r} dim {d}" for r, d in rows])
    ax.invert_yaxis()
    ax.set_xlabel("virtual time since issue (us)")
    who = f"rank {ranks[0]}" if single else f"ranks {', '.join(map(str, ranks))}"
    ax.set_title(
        f"{row['op']} {row['size_bytes']} B, {row['policy']}/{row['intra']}, {chunks} chunks "
        f"({who}); color = chunk index"
    )
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, chunks - 1))
    fig.colorbar(sm, ax=ax, label="chunk", pad=0.01)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def utilization_bars(rows: list[dict], path: str) -> str:
    """Per-dim utilization (busy / collective time) for each analyzed collective, side by side."""
    plt = _pyplot()
    n_dims = max(len(r["dims"]) for r in rows)
    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(3 + 1.8 * n_dims, 4.5 + 0.2 * len(rows)))
    for i, r in enumerate(rows):
        ax.bar(
            [d + (i - (len(rows) - 1) / 2) * width for d in range(len(r["dims"]))],
            [100 * d["utilization"] for d in r["dims"]],
            width,
            label=f"{os.path.basename(r['trace'])}#{r['collective']} {format_size(r['size_bytes'])} "
            f"{r['policy']}/{r['intra']} ({100 * r['utilization']:.1f} % overall)",
        )
    ax.set_xticks(range(n_dims), [f"dim {d}" for d in range(n_dims)])
    ax.set_ylabel("dim busy time / collective time (%)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def queue_depth(trace, collective: int, path: str, rank: int = 0) -> str:
    """Stages waiting in each dim's queue over time (queued, not yet started)."""
    plt = _pyplot()
    ev = trace.events[(trace.events["collective"] == collective) & (trace.events["rank"] == rank)]
    fig, ax = plt.subplots(figsize=(12, 3.5))
    for d in range(len(trace.topology_table)):
        sel = ev[ev["dim"] == d]
        times, levels = queue_levels(sel["queued_us"], sel["start_us"])
        ax.step(np.concatenate([[0.0], times]), np.concatenate([[0], levels]), where="post", label=f"dim {d}")
    row = trace.collective_row(collective)
    ax.set_xlabel("virtual time since issue (us)")
    ax.set_ylabel("stages waiting")
    ax.set_title(
        f"queue depth per dim: {row['op']} {format_size(row['size_bytes'])}, {row['policy']}/{row['intra']}, "
        f"{row['chunks']} chunks, rank {rank}"
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path
