"""End-to-end training iterations: Themis vs baseline on the four workloads and four topologies.

Usage::

    python scripts/study_training.py [--traces traces] [--out docs/training] [--quick] [--workers N|mpi]

Runs traces/{resnet152,gnmt,dlrm,transformer_1t}.txt (see scripts/generate_workloads.py) for two
iterations on each paper topology, with the paper's latencies and with zero latency, baseline
(FIFO) against Themis (SCF), 64 chunks per collective, on the model. Writes training.json,
training.md and speedup.png into --out and prints the table. ``--quick`` runs the
`QUICK_WORKLOADS` on the `QUICK_TOPOLOGIES` only; its rows are those of the full study (a test
compares them with docs/training).
"""

import argparse
import os
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from themis_mpi.config import RunConfig  # noqa: E402
from themis_mpi.output import atomic_path, write_study  # noqa: E402
from themis_mpi.report import measured_on  # noqa: E402
from themis_mpi.run.pool import WORKERS_HELP, ordered_map, parse_workers  # noqa: E402
from themis_mpi.run.training import model_training  # noqa: E402
from themis_mpi.topology import parse_topology  # noqa: E402
from themis_mpi.workloads.text import parse_workload  # noqa: E402
from themis_mpi.workloads.training import TrainingSpec  # noqa: E402

WORKLOADS = {
    "resnet152": ("ResNet-152", 1.49),
    "gnmt": ("GNMT", 1.30),
    "dlrm": ("DLRM", 1.30),
    "transformer_1t": ("Transformer-1T", 1.25),
}
TOPOLOGIES = ["3D-SW_SW_SW_hetero", "3D-FC_Ring_SW", "4D-Ring_SW_SW_SW", "4D-Ring_FC_Ring_SW"]
LATENCY = {"paper latency": None, "zero latency": 0.0}
QUICK_WORKLOADS = ["resnet152", "dlrm"]
QUICK_TOPOLOGIES = ["3D-SW_SW_SW_hetero", "4D-Ring_FC_Ring_SW"]


def _point(point) -> dict:
    """One (workload, topology, latency) point: baseline and Themis, and the speedup."""
    traces, spec, w, name, lat = point
    wl = parse_workload(os.path.join(traces, f"{w}.txt"))
    topo = parse_topology(name)
    if LATENCY[lat] is not None:
        topo = topo.with_overrides(latency_ns=[LATENCY[lat]] * len(topo.dims))
    res = {
        p: model_training(wl, topo, p, spec, RunConfig(intra=intra))
        for p, intra in (("baseline", "fifo"), ("themis", "scf"))
    }
    return {
        "workload": w,
        "topology": name,
        "latency": lat,
        "baseline_us": res["baseline"].iteration_us,
        "themis_us": res["themis"].iteration_us,
        "compute_us": res["baseline"].compute_us,
        "speedup": res["baseline"].iteration_us / res["themis"].iteration_us,
        "baseline": res["baseline"].to_dict(),
        "themis": res["themis"].to_dict(),
    }


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="traces")
    ap.add_argument(
        "--out", default="results/training", help="output folder (docs/training is the shipped copy)"
    )
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--workers", default="1", help=WORKERS_HELP)
    ap.add_argument(
        "--quick", action="store_true", help=f"{', '.join(QUICK_WORKLOADS)} on {', '.join(QUICK_TOPOLOGIES)}"
    )
    args = ap.parse_args(argv)
    workloads = {w: WORKLOADS[w] for w in QUICK_WORKLOADS} if args.quick else WORKLOADS
    topologies = QUICK_TOPOLOGIES if args.quick else TOPOLOGIES
    spec = TrainingSpec(chunks=args.chunks, iterations=args.iterations)
    rows, started = [], time.perf_counter()
    points = [(args.traces, spec, w, t, lat) for w in workloads for t in topologies for lat in LATENCY]
    for i, row in enumerate(ordered_map(_point, points, parse_workers(args.workers))):
        rows.append(row)
        sys.stderr.write(f"\r{i + 1}/{len(points)} runs, {time.perf_counter() - started:5.1f} s")
    sys.stderr.write("\n")
    elapsed = time.perf_counter() - started
    md = []
    for lat in LATENCY:
        md.append(
            f"\n**Training iteration speedup of Themis+SCF over baseline, {lat}** "
            "(iteration time in ms: baseline / Themis; compute per iteration in brackets)\n"
        )
        md.append("| workload | " + " | ".join(topologies) + " | mean | paper |")
        md.append("|---" * (len(topologies) + 3) + "|")
        for w, (label, paper) in workloads.items():
            sel = {r["topology"]: r for r in rows if r["workload"] == w and r["latency"] == lat}
            cells = [
                f"{sel[t]['speedup']:.2f}x ({sel[t]['baseline_us'] / 1e3:.2f} / "
                f"{sel[t]['themis_us'] / 1e3:.2f}) [{sel[t]['compute_us'] / 1e3:.2f}]"
                for t in topologies
            ]
            mean = sum(sel[t]["speedup"] for t in topologies) / len(topologies)
            md.append(f"| {label} | " + " | ".join(cells) + f" | **{mean:.2f}x** | {paper:.2f}x |")
    md.append(
        f"\n{len(rows) * 2} training runs ({args.iterations} iterations each) in {elapsed:.1f} s "
        f"({measured_on()}).\n"
    )
    text = "\n".join(md)
    write_study(args.out, "training", text, rows)
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5), sharey=True)
    width = 0.8 / len(topologies)
    for ax, lat in zip(axes, LATENCY):
        for j, t in enumerate(topologies):
            vals = [
                next(
                    r["speedup"]
                    for r in rows
                    if r["workload"] == w and r["topology"] == t and r["latency"] == lat
                )
                for w in workloads
            ]
            offset = (j - (len(topologies) - 1) / 2) * width
            ax.bar([i + offset for i in range(len(workloads))], vals, width, label=t)
        ax.scatter(
            range(len(workloads)),
            [p for _, p in workloads.values()],
            marker="_",
            s=900,
            color="black",
            zorder=3,
            label="paper (ISCA 2022)",
        )
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(range(len(workloads)), [label for label, _ in workloads.values()])
        ax.set_title(f"{lat}, {args.chunks} chunks per collective")
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("iteration-time speedup, Themis+SCF over baseline")
    axes[0].set_ylim(0.6, 1.6)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    with atomic_path(os.path.join(args.out, "speedup.png")) as tmp:
        fig.savefig(tmp, dpi=110)
    print(text)


if __name__ == "__main__":
    main()
