"""Every inter-dim policy on the paper's topologies and small ones, and on training workloads.

Usage::

    python scripts/study_policies.py [--out results/policies] [--quick] [--search-evals N]
                                     [--workers N|mpi]

Collectives (model): all-reduce, sizes 1 MiB to 16 GiB (x4), chunks 1 to 256 (x2), with the
topologies' latencies and with zero latency, on the four paper topologies and 2x2x2, 4x4x4,
2x2x2-hetero. Each cell runs every built-in inter-dim policy with its own queue policy (predictive
chooses its own) and reports three yardsticks beside it: the bandwidth-only ideal, the per-dim
bound of the schedule (``max_d bytes_d / B_d``) and a best-found schedule (a local search over
chunk orders on the model, seeded and bounded by --search-evals model evaluations per cell, so
that re-running the study gives the same rows on any machine).

Workloads (model, 64 chunks, 2 iterations): ASTRA-sim's ResNet-50 data-parallel workload
(tests/data) and traces/*.txt, on the four paper topologies with their latencies.

Writes ``study.md`` (tables), ``study.json`` (every row) and ``heatmap-<policy>.png`` (geometric-mean
speedup over the baseline per size and chunk count, over the topologies; one panel with latency,
one without) into --out.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from themis_mpi.collectives import Collective  # noqa: E402
from themis_mpi.config import RunConfig  # noqa: E402
from themis_mpi.model import ModelTransport  # noqa: E402
from themis_mpi.output import write_study  # noqa: E402
from themis_mpi.policies import inter_class, policy_context  # noqa: E402
from themis_mpi.policies.predictive import best_found  # noqa: E402
from themis_mpi.report import measured_on  # noqa: E402
from themis_mpi.run.collective import model_collective  # noqa: E402
from themis_mpi.run.coordinator import (
    model_oracle,  # noqa: E402
    share_schedules,  # noqa: E402
)
from themis_mpi.run.pool import WORKERS_HELP, ordered_map, parse_workers  # noqa: E402
from themis_mpi.run.training import training_oracle  # noqa: E402
from themis_mpi.topology import parse_topology  # noqa: E402
from themis_mpi.workloads.text import parse_workload  # noqa: E402
from themis_mpi.workloads.training import TrainingSpec  # noqa: E402

PAPER = ["3D-SW_SW_SW_hetero", "3D-FC_Ring_SW", "4D-Ring_SW_SW_SW", "4D-Ring_FC_Ring_SW"]
SMALL = ["2x2x2", "4x4x4", "2x2x2-hetero"]
POLICIES = ["baseline", "themis", "themisFlex", "roundRobin", "themis-lat", "themis-ports", "predictive"]
MIB, GIB = 2**20, 2**30
LATENCY_BOUND_BYTES = 256 * MIB
QUICK_SKIPS_WORKLOADS = ("transformer_1t.txt",)  # its decision takes most of the workloads' time
SEARCH_EVALS = 16  # about the mean count the former 0.02 s budget per cell made (17 in 2026-11-22's run)


def gmean(values) -> float:
    """Geometric mean (nan for none)."""
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def topology(name: str, latency: bool):
    """The preset, or the preset with every latency set to 0."""
    topo = parse_topology(name)
    return topo if latency else topo.with_overrides(None, [0.0] * len(topo.dims), None)


def _cell_rows(point) -> list[dict]:
    """The rows of one (topology, latency, size, chunks) cell: every policy and the best found."""
    name, latency, size, chunks, search_evals = point
    topo = topology(name, latency)
    dims = tuple(range(len(topo.dims)))
    rows = []
    coll = Collective("all_reduce", size // 8, "float64", chunks, dims)
    cell = {"topology": name, "latency": latency, "size_bytes": size, "chunks": chunks}
    times = {}
    for policy in POLICIES:
        config = RunConfig(intra=inter_class(policy).default_intra)
        r, _ = model_collective(topo, coll, policy, config)
        times[policy] = r.time_us
        rows.append(
            {
                **cell,
                "policy": policy,
                "intra": r.intra,
                "schedule": r.schedule,
                "used_chunks": r.chunks,
                "time_us": r.time_us,
                "ideal_us": r.ideal_us,
                "dim_bound_us": r.dim_bound_us,
                "decision_s": r.decision_s,
            }
        )
        if policy == "predictive":
            pred_us = r.time_us
    config = RunConfig(intra="scf")
    ctx = policy_context(topo, config)
    ctx.evaluate_collective = model_oracle(topo, config)
    start = share_schedules(ModelTransport(topo, config), "predictive", [coll])[0][0]
    found, found_us, evals = best_found(ctx, coll, search_evals, start=(start, pred_us))
    for row in rows:
        row["speedup"] = times["baseline"] / row["time_us"]
        row["best_found_us"] = found_us
        row["best_found_evals"] = evals
    return rows


def collective_rows(topos, sizes, chunk_counts, search_evals: int, workers: int | str = 1) -> list[dict]:
    """One row per (topology, latency, size, chunks, policy); the cells on `workers` processes."""
    points = [
        (name, latency, size, chunks, search_evals)
        for name in topos
        for latency in (True, False)
        for size in sizes
        for chunks in chunk_counts
    ]
    return [row for rows in ordered_map(_cell_rows, points, workers) for row in rows]


def workload_rows(paths, topos, iterations: int) -> list[dict]:
    """Iteration time of every policy on every workload and topology (model, with latency)."""
    rows = []
    spec = TrainingSpec(chunks=64, iterations=iterations)
    for path in paths:
        wl = parse_workload(path)
        for name in topos:
            topo = wl.fit_topology(parse_topology(name))
            base = None
            for policy in POLICIES:
                config = RunConfig(intra=inter_class(policy).default_intra)
                oracle = training_oracle(topo, config, wl, spec)
                from themis_mpi.workloads.training import distinct_collectives

                colls = distinct_collectives(wl, topo, spec)
                t0 = time.perf_counter()
                schedules, decision_s = share_schedules(
                    ModelTransport(topo, config), policy, colls, evaluate=oracle
                )
                iteration_us = oracle(schedules)
                base = iteration_us if policy == "baseline" else base
                rows.append(
                    {
                        "workload": os.path.basename(path),
                        "topology": name,
                        "policy": policy,
                        "iteration_us": iteration_us,
                        "speedup": base / iteration_us,
                        "decision_s": decision_s,
                        "wall_s": time.perf_counter() - t0,
                    }
                )
    return rows


def decision_times(topos, sizes, repeats: int = 3) -> list[dict]:
    """The decision of `predictive` for one 64-chunk all-reduce on each 1024-NPU paper topology and size.

    The best of `repeats` runs, as wall time and as CPU time of this process (the machine may be
    shared, and rank 0's CPU is what the decision costs).
    """
    out = []
    for name in [t for t in PAPER if t in topos]:
        topo = parse_topology(name)
        config = RunConfig(intra="scf")
        for size in sizes:
            coll = Collective("all_reduce", size // 8, "float64", 64, tuple(range(len(topo.dims))))
            walls, cpus = [], []
            for _ in range(repeats):
                w0, c0 = time.perf_counter(), time.process_time()
                share_schedules(ModelTransport(topo, config), "predictive", [coll])
                walls.append(time.perf_counter() - w0)
                cpus.append(time.process_time() - c0)
            out.append({"topology": name, "size_bytes": size, "wall_s": min(walls), "cpu_s": min(cpus)})
    return out


def heatmaps(rows, sizes, chunk_counts, out: str) -> list[str]:
    """One PNG per policy: geometric-mean speedup over the baseline per (size, chunks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    written = []
    for policy in POLICIES[1:]:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
        for ax, latency in zip(axes, (True, False)):
            grid = np.array(
                [
                    [
                        gmean(
                            r["speedup"]
                            for r in rows
                            if r["policy"] == policy
                            and r["latency"] == latency
                            and r["size_bytes"] == s
                            and r["chunks"] == c
                        )
                        for c in chunk_counts
                    ]
                    for s in sizes
                ]
            )
            im = ax.imshow(np.log2(grid), cmap="RdBu", vmin=-1, vmax=1, aspect="auto", origin="lower")
            for i in range(len(sizes)):
                for j in range(len(chunk_counts)):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7)
            ax.set_xticks(range(len(chunk_counts)), [str(c) for c in chunk_counts])
            ax.set_yticks(range(len(sizes)), [_size(s) for s in sizes])
            ax.set_xlabel("chunks")
            ax.set_ylabel("all-reduce size per NPU")
            ax.set_title(
                f"{policy}: speedup over baseline ({'paper latency' if latency else 'zero latency'})"
            )
        fig.colorbar(im, ax=axes, label="log2 speedup (geometric mean over topologies)")
        path = os.path.join(out, f"heatmap-{policy}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _size(n: int) -> str:
    return f"{n // GIB} GiB" if n >= GIB else f"{n // MIB} MiB"


def summary_markdown(rows, wrows, topos, decision: list[dict]) -> str:
    """The tables of study.md."""
    lines = ["# Scheduling policies: study", ""]
    lines += [
        "Model times; speedup = baseline time / policy time at the same size and chunk count; "
        "gm = geometric mean over the cells, min = the worst cell.",
        "",
        "## All cells",
        "",
        "| policy | gm speedup (latency) | min (latency) | gm speedup (zero latency) | min (zero latency) |",
        "|---|---|---|---|---|",
    ]
    for p in POLICIES:
        cells = {
            lat: [r["speedup"] for r in rows if r["policy"] == p and r["latency"] == lat]
            for lat in (True, False)
        }
        lines.append(
            f"| {p} | {gmean(cells[True]):.3f}x | {min(cells[True]):.3f}x | "
            f"{gmean(cells[False]):.3f}x | {min(cells[False]):.3f}x |"
        )
    key = [
        (r["topology"], r["latency"], r["size_bytes"], r["chunks"])
        for r in rows
        if r["policy"] == "predictive"
    ]
    by = {(r["topology"], r["latency"], r["size_bytes"], r["chunks"], r["policy"]): r for r in rows}
    vs_base = [by[(*k, "baseline")]["time_us"] / by[(*k, "predictive")]["time_us"] for k in key]
    vs_themis = [by[(*k, "themis")]["time_us"] / by[(*k, "predictive")]["time_us"] for k in key]
    lat_bound = [
        by[(*k, "themis")]["time_us"] / by[(*k, "predictive")]["time_us"]
        for k in key
        if k[1] and k[2] <= LATENCY_BOUND_BYTES and k[0] in PAPER
    ]
    lines += [
        "",
        "## predictive",
        "",
        f"- cells: {len(key)}; min speedup over the baseline {min(vs_base):.4f}x, over Themis "
        f"{min(vs_themis):.4f}x (>= 1 means never slower).",
        f"- latency-bound cells (paper topologies, paper latencies, <= 256 MiB, {len(lat_bound)} cells): "
        f"geometric-mean speedup over Themis **{gmean(lat_bound):.3f}x** (min {min(lat_bound):.3f}x, "
        f"max {max(lat_bound):.3f}x).",
        f"- decision time of one 64-chunk all-reduce on the 1024-NPU paper topologies, best of 3 "
        f"({len(decision)} topology x size points): CPU median "
        f"{1e3 * statistics.median(d['cpu_s'] for d in decision):.1f} ms, max "
        f"{1e3 * max(d['cpu_s'] for d in decision):.1f} ms; wall median "
        f"{1e3 * statistics.median(d['wall_s'] for d in decision):.1f} ms, max "
        f"{1e3 * max(d['wall_s'] for d in decision):.1f} ms ({measured_on()}).",
        "",
        "## Distance to the bounds (paper topologies, paper latencies, 64 chunks)",
        "",
        "time / best-found time (1.00 = as good as the search found); ideal and per-dim bound in us.",
        "",
        "| topology | size | ideal_us | best_found_us | "
        + " | ".join(f"{p} (dimbound_us)" for p in POLICIES)
        + " |",
        "|---|---|---|---|" + "---|" * len(POLICIES),
    ]
    for name in PAPER:
        if name not in topos:
            continue
        for size in sorted({r["size_bytes"] for r in rows}):
            k = (name, True, size, 64)
            if (*k, "baseline") not in by:
                continue
            b = by[(*k, "baseline")]
            cells = " | ".join(
                f"{by[(*k, p)]['time_us'] / b['best_found_us']:.2f} ({by[(*k, p)]['dim_bound_us']:.0f})"
                for p in POLICIES
            )
            lines.append(
                f"| {name} | {_size(size)} | {b['ideal_us']:.1f} | {b['best_found_us']:.1f} | {cells} |"
            )
    if wrows:
        lines += [
            "",
            "## Workloads (model, paper latencies, 64 chunks): iteration speedup over the baseline",
            "",
            "| workload | topology | " + " | ".join(POLICIES[1:]) + " |",
            "|---|---|" + "---|" * (len(POLICIES) - 1),
        ]
        wby = {(r["workload"], r["topology"], r["policy"]): r for r in wrows}
        for w, t in dict.fromkeys((r["workload"], r["topology"]) for r in wrows):
            lines.append(
                f"| {w} | {t} | "
                + " | ".join(f"{wby[(w, t, p)]['speedup']:.3f}x" for p in POLICIES[1:])
                + " |"
            )
        pred = [r["speedup"] for r in wrows if r["policy"] == "predictive"]
        lines += ["", f"predictive on the workloads: min speedup over the baseline {min(pred):.4f}x."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/policies", help="output directory (never the repo root)")
    ap.add_argument(
        "--search-evals",
        type=int,
        default=SEARCH_EVALS,
        help=f"model evaluations of the best-found search per cell (default {SEARCH_EVALS})",
    )
    ap.add_argument("--iterations", type=int, default=2, help="training iterations per workload run")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="two topologies, three sizes, three chunk counts; the workloads but Transformer-1T",
    )
    ap.add_argument("--no-workloads", action="store_true", help="skip the workloads")
    ap.add_argument("--workers", default="1", help=WORKERS_HELP)
    args = ap.parse_args(argv)
    if args.search_evals < 0:
        sys.exit(f"study_policies.py: --search-evals must be >= 0, got {args.search_evals}")
    if os.path.abspath(args.out) == os.path.abspath(os.path.join(os.path.dirname(__file__), "..")):
        sys.exit("study_policies.py: --out must not be the repository root")
    os.makedirs(args.out, exist_ok=True)
    sizes = [MIB * 4**i for i in range(8)]  # 1 MiB .. 16 GiB
    chunk_counts = [2**i for i in range(9)]  # 1 .. 256
    topos = PAPER + SMALL
    if args.quick:
        topos, sizes, chunk_counts = ["3D-SW_SW_SW_hetero", "2x2x2"], [MIB, 64 * MIB, GIB], [2, 8, 64]
    t0 = time.perf_counter()
    rows = collective_rows(topos, sizes, chunk_counts, args.search_evals, parse_workers(args.workers))
    t_coll = time.perf_counter() - t0
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    paths = [os.path.join(here, "tests", "data", "astra-sim-1.0-text", "Resnet50_DataParallel.txt")]
    paths += sorted(glob.glob(os.path.join(here, "traces", "*.txt")))
    if args.quick:  # its rows are the full study's: a test compares them with docs/policies
        paths = [p for p in paths if os.path.basename(p) not in QUICK_SKIPS_WORKLOADS]
    t1 = time.perf_counter()
    wrows = (
        [] if args.no_workloads else workload_rows(paths, [t for t in PAPER if t in topos], args.iterations)
    )
    t_work = time.perf_counter() - t1
    decision = decision_times(topos, sizes)
    text = summary_markdown(rows, wrows, topos, decision)
    text += (
        f"\n{len(rows)} collective runs in {t_coll:.0f} s, {len(wrows)} workload runs in {t_work:.0f} s "
        f"({measured_on()}).\n"
    )
    write_study(args.out, "study", text, {"collectives": rows, "workloads": wrows, "decision": decision})
    written = heatmaps(rows, sizes, chunk_counts, args.out)
    print(text)
    print(
        "# wrote "
        + " ".join([os.path.join(args.out, "study.md"), os.path.join(args.out, "study.json"), *written])
    )


if __name__ == "__main__":
    main()
