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


# Short names of a sweep's columns, with their axis labels (`sweep_plot`).
SWEEP_COLUMNS = {
    "size": ("size_bytes", "size per NPU (bytes)"),
    "time": ("time_us", "time (us)"),
    "ideal": ("ideal_us", "ideal time (us)"),
    "busbw": ("busbw_gbps", "busbw (GB/s, 2^30 B)"),
    "algbw": ("algbw_gbps", "algbw (GB/s, 2^30 B)"),
    "util": ("utilization", "utilization (ideal / actual)"),
    "chunks": ("chunks", "chunks"),
    "iteration": ("iteration_us", "iteration time (us)"),
}


def sweep_column(name: str) -> tuple[str, str]:
    """(column, axis label) of a short name (`SWEEP_COLUMNS`) or of a column named as it is."""
    return SWEEP_COLUMNS.get(name, (name, name))


GRID_COLUMNS = ("policy", "intra", "topology", "op", "requested_chunks", "dtype", "network", "workload")


def sweep_lines(rows: list[dict], x: str, y: str, hue: str) -> dict[str, list[tuple[float, float]]]:
    """The lines of `sweep_plot`: label -> (x, y) points in x order.

    One line per value of `hue`; rows that also differ in another grid column (topology, op,
    requested chunks...) within one hue value get lines of their own, labelled with those values,
    so that no line joins points of different runs.
    """
    xcol, ycol, hcol = sweep_column(x)[0], sweep_column(y)[0], sweep_column(hue)[0]
    others = [  # grid columns that differ between rows of one hue value
        c
        for c in GRID_COLUMNS
        if c not in (xcol, hcol)
        and any(len({str(r.get(c)) for r in rows if r[hcol] == h}) > 1 for h in {r[hcol] for r in rows})
    ]
    lines: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        key = ", ".join(f"{name} {r.get(c)}" for name, c in zip((hue, *others), (hcol, *others)))
        lines.setdefault(key, []).append((float(r[xcol]), float(r[ycol])))
    return {label: sorted(points) for label, points in lines.items()}


def log_axis(column: str) -> bool:
    """Whether `sweep_plot` draws a column on a log axis: sizes and times (their values must be > 0)."""
    return column == "size_bytes" or column.endswith("_us")


def sweep_plot(rows: list[dict], x: str, y: str, hue: str, path: str) -> str:
    """One line per value of `hue` (`sweep_lines`), y against x; log axes for sizes and times."""
    plt = _pyplot()
    (xcol, xlabel), (ycol, ylabel) = sweep_column(x), sweep_column(y)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, points) in enumerate(sweep_lines(rows, x, y, hue).items()):
        style = ("-", "--", ":", "-.")[i // 10 % 4]  # the colours repeat after ten lines
        ax.plot([a for a, _ in points], [b for _, b in points], style, marker="o", label=label)
    for col, setter in ((xcol, ax.set_xscale), (ycol, ax.set_yscale)):
        if log_axis(col):
            setter("log", base=2 if col == "size_bytes" else 10)
    if xcol == "size_bytes":
        ticks = sorted({float(r[xcol]) for r in rows})
        ax.set_xticks(ticks, [format_size(int(t)) for t in ticks], rotation=45, fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path
