"""The paper's single All-Reduce study on its four 1024-NPU topologies, from the model.

Usage::

    python scripts/study_allreduce.py [--out docs/study] [--workers N|mpi]

Sweeps size (1 MiB to 16 GiB, 64 chunks) and chunk count (1 to 256, at --chunk-sweep-size), with
the paper's link latencies and with zero latency, for baseline (FIFO), Themis+FIFO and
Themis+SCF. Writes study.json (every row), study.md (the tables) and three PNGs into --out, and
prints the tables.
"""

import argparse
import os
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from themis_mpi.collectives import Collective  # noqa: E402
from themis_mpi.config import RunConfig  # noqa: E402
from themis_mpi.output import atomic_path, write_study  # noqa: E402
from themis_mpi.report import measured_on  # noqa: E402
from themis_mpi.run.collective import model_collective  # noqa: E402
from themis_mpi.run.pool import WORKERS_HELP, ordered_map, parse_workers  # noqa: E402
from themis_mpi.topology import parse_topology  # noqa: E402
from themis_mpi.units import format_size  # noqa: E402

TOPOLOGIES = ["3D-SW_SW_SW_hetero", "3D-FC_Ring_SW", "4D-Ring_SW_SW_SW", "4D-Ring_FC_Ring_SW"]
POLICIES = [("baseline", "fifo"), ("themis", "fifo"), ("themis", "scf")]
LABELS = {
    ("baseline", "fifo"): "baseline",
    ("themis", "fifo"): "Themis+FIFO",
    ("themis", "scf"): "Themis+SCF",
}
PAPER = {"baseline": 56.31, "Themis+SCF": 95.14, "Themis+FIFO": 87.67}
LATENCY = {"paper latency": None, "zero latency": 0.0}


def progress(done: int, total: int, started: float) -> None:
    """A one-line progress bar on stderr, redrawn at each 2 % step."""
    width = 50
    filled = int(width * done / total)
    if done != total and filled == int(width * (done - 1) / total):
        return
    sys.stderr.write(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {time.perf_counter() - started:5.1f} s"
    )
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def topology(name: str, latency: str):
    topo = parse_topology(name)
    if LATENCY[latency] is None:
        return topo
    return topo.with_overrides(latency_ns=[LATENCY[latency]] * len(topo.dims))


def _point(point) -> dict:
    """One (latency, topology, policy, size, chunks) point's row."""
    latency, name, (policy, intra), size, chunks, sweep = point
    topo = topology(name, latency)
    coll = Collective("all_reduce", size // 4, "float32", chunks, tuple(range(len(topo.dims))))
    result, _ = model_collective(topo, coll, policy, RunConfig(intra=intra))
    row = result.to_dict()
    row.update(topology=name, latency=latency, label=LABELS[(policy, intra)], sweep=sweep)
    return row


def run_all(sizes, chunk_counts, chunk_sweep_size, workers: int | str = 1):
    """Every (latency, topology, policy, size, chunks) point, on `workers` processes; returns rows."""
    points = []
    for latency in LATENCY:
        for name in TOPOLOGIES:
            for pol in POLICIES:
                points += [(latency, name, pol, s, 64, "size") for s in sizes]
                points += [(latency, name, pol, chunk_sweep_size, c, "chunks") for c in chunk_counts]
    rows, started = [], time.perf_counter()
    for i, row in enumerate(ordered_map(_point, points, workers)):
        rows.append(row)
        progress(i + 1, len(points), started)
    return rows, time.perf_counter() - started


def pick(rows, **kw):
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]


def mean(xs):
    return sum(xs) / len(xs)


def tables(rows, sizes, chunk_counts, chunk_sweep_size) -> str:
    """The markdown tables of the study."""
    labels = list(LABELS.values())
    out = []
    for latency in LATENCY:
        out.append(
            f"\n**Utilization (%) per topology, 64 chunks, {format_size(chunk_sweep_size)}, {latency}**\n"
        )
        out.append("| topology | " + " | ".join(labels) + " | Themis+SCF speedup |")
        out.append("|---" * (len(labels) + 2) + "|")
        speedups = []
        for name in TOPOLOGIES:
            sel = {
                r["label"]: r
                for r in pick(rows, latency=latency, topology=name, sweep="size", size_bytes=chunk_sweep_size)
            }
            speed = sel["baseline"]["time_us"] / sel["Themis+SCF"]["time_us"]
            speedups.append(speed)
            out.append(
                f"| {name} | "
                + " | ".join(f"{100 * sel[lb]['utilization']:.2f}" for lb in labels)
                + f" | {speed:.2f}x |"
            )
        means = [
            mean(
                [
                    100 * r["utilization"]
                    for r in pick(rows, latency=latency, label=lb, sweep="size", size_bytes=chunk_sweep_size)
                ]
            )
            for lb in labels
        ]
        out.append(
            "| **mean** | "
            + " | ".join(f"**{m:.2f}**" for m in means)
            + f" | mean {mean(speedups):.2f}x, max {max(speedups):.2f}x |"
        )
        out.append(
            "| paper (ISCA 2022) | "
            + " | ".join(f"{PAPER[lb]:.2f}" for lb in labels)
            + " | mean 1.72x, max 2.70x |"
        )
    for latency in LATENCY:
        out.append(f"\n**Mean utilization (%) over the four topologies vs size, 64 chunks, {latency}**\n")
        out.append("| size | " + " | ".join(labels) + " |")
        out.append("|---" * (len(labels) + 1) + "|")
        for s in sizes:
            vals = [
                mean(
                    [
                        100 * r["utilization"]
                        for r in pick(rows, latency=latency, label=lb, sweep="size", size_bytes=s)
                    ]
                )
                for lb in labels
            ]
            out.append(f"| {format_size(s)} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
    for latency in LATENCY:
        out.append(f"\n**Mean utilization (%) vs chunks, {format_size(chunk_sweep_size)}, {latency}**\n")
        out.append("| chunks | " + " | ".join(labels) + " |")
        out.append("|---" * (len(labels) + 1) + "|")
        for c in chunk_counts:
            vals = [
                mean(
                    [
                        100 * r["utilization"]
                        for r in pick(rows, latency=latency, label=lb, sweep="chunks", chunks=c)
                    ]
                )
                for lb in labels
            ]
            out.append(f"| {c} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
    return "\n".join(out) + "\n"


def plot_sweep(rows, sweep, xkey, xlabel, path, xticks=None):
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2), sharey=True)
    colors = {"baseline": "tab:gray", "Themis+FIFO": "tab:blue", "Themis+SCF": "tab:red"}
    for ax, name in zip(axes, TOPOLOGIES):
        for latency, style in zip(LATENCY, ("-", "--")):
            for lb in LABELS.values():
                sel = sorted(
                    pick(rows, latency=latency, topology=name, label=lb, sweep=sweep), key=lambda r: r[xkey]
                )
                ax.plot(
                    [r[xkey] for r in sel],
                    [100 * r["utilization"] for r in sel],
                    style,
                    marker="o",
                    ms=3,
                    color=colors[lb],
                    label=f"{lb}, {latency}",
                )
        ax.set_xscale("log", base=2)
        if xticks:
            ax.set_xticks(xticks[0], xticks[1], rotation=45)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("network BW utilization (%) = ideal / actual")
    axes[0].set_ylim(0, 102)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def plot_busy(rows, size, path):
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    labels = list(LABELS.values())
    for ax, name in zip(axes, TOPOLOGIES):
        sel = {
            r["label"]: r
            for r in pick(rows, latency="zero latency", topology=name, sweep="size", size_bytes=size)
        }
        n_dims = len(sel["baseline"]["dims"])
        width = 0.8 / len(labels)
        for i, lb in enumerate(labels):
            busy = [d["busy_us"] / 1e3 for d in sel[lb]["dims"]]
            ax.bar([d + (i - 1) * width for d in range(n_dims)], busy, width, label=lb)
        for i, lb in enumerate(labels):
            ax.axhline(sel[lb]["time_us"] / 1e3, color=f"C{i}", ls=":", lw=1)
        ax.set_xticks(range(n_dims), [f"dim {d}" for d in range(n_dims)])
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel(f"busy time per dim (ms), {format_size(size)}, zero latency")
    axes[0].legend(fontsize=8, title="dotted: collective time", title_fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out",
        default="results/study",
        help="output folder (default results/study; docs/study is the shipped copy)",
    )
    ap.add_argument("--chunk-sweep-size", default=2**30, type=int, help="bytes (default 1 GiB)")
    ap.add_argument("--workers", default="1", help=WORKERS_HELP)
    args = ap.parse_args(argv)
    sizes = [2**20 * 4**i for i in range(8)]  # 1 MiB .. 16 GiB
    chunk_counts = [2**i for i in range(9)]  # 1 .. 256
    rows, elapsed = run_all(sizes, chunk_counts, args.chunk_sweep_size, parse_workers(args.workers))
    os.makedirs(args.out, exist_ok=True)
    md = tables(rows, sizes, chunk_counts, args.chunk_sweep_size)
    md += f"\n{len(rows)} model runs in {elapsed:.1f} s ({measured_on()}).\n"
    write_study(args.out, "study", md, rows)
    plot_sweep(
        rows,
        "size",
        "size_bytes",
        "all-reduce size per NPU",
        os.path.join(args.out, "utilization_vs_size.png"),
        (sizes, [format_size(s) for s in sizes]),
    )
    plot_sweep(
        rows,
        "chunks",
        "chunks",
        f"chunks ({format_size(args.chunk_sweep_size)} all-reduce)",
        os.path.join(args.out, "utilization_vs_chunks.png"),
        (chunk_counts, chunk_counts),
    )
    plot_busy(rows, args.chunk_sweep_size, os.path.join(args.out, "busy_per_dim.png"))
    print(md)


if __name__ == "__main__":
    main()
