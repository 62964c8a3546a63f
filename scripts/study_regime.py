"""The regime of the paper's end-to-end speedups: gradient bucket size x compute speed.

Usage::

    python scripts/study_regime.py [--traces traces/per-layer] [--out docs/regime] [--jobs 2]
                                   [--zero-latency]

For each of the four workloads (one weight-gradient all-reduce per layer, traces/per-layer/) on
each paper topology (paper latencies; every latency 0 with --zero-latency), two training
iterations on the model with gradient
buckets of 0 (per layer), 4, 25, 64 and 256 MiB (`train --bucket-mib`) and compute 1x, 4x and
16x faster (`--compute-scale` 1, 1/4, 1/16), under every inter-dim policy of
`themis_mpi.policies` with every intra-dim queue policy. Speedups are iteration-time ratios over
the baseline (FIFO): Themis is Themis+SCF, "best" the fastest of all the combinations. Writes
regime.json (every run), regime.md (the tables and, for each paper number, the cells within
10 % of it) and one heat map per workload (speedup_<workload>.png) into --out.

Runs that repeat are run once: a bucket size that leaves every gradient alone is the per-layer
run, and two bucket sizes with the same plan are the same run; chunk orders are computed once per
collective and policy. The runs skip the per-dim analysis that `train` prints (a check at the
start asserts that the iteration time equals `model_training`'s).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from multiprocessing import get_context

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from themis_mpi import policies  # noqa: E402
from themis_mpi.driver import RunConfig  # noqa: E402
from themis_mpi.engine import INTRA_POLICIES, Engine  # noqa: E402
from themis_mpi.model import ModelTransport, model_training  # noqa: E402
from themis_mpi.output import atomic_path, write_json  # noqa: E402
from themis_mpi.topology import parse_topology  # noqa: E402
from themis_mpi.training import TrainingLoop, TrainingSpec, bucket_plan, distinct_collectives  # noqa: E402
from themis_mpi.workload import parse_workload  # noqa: E402

WORKLOADS = {
    "resnet152": ("ResNet-152", 1.49),
    "gnmt": ("GNMT", 1.30),
    "dlrm": ("DLRM", 1.30),
    "transformer_1t": ("Transformer-1T", 1.25),
}
TOPOLOGIES = ["3D-SW_SW_SW_hetero", "3D-FC_Ring_SW", "4D-Ring_SW_SW_SW", "4D-Ring_FC_Ring_SW"]
BUCKETS_MIB = [0, 4, 25, 64, 256]
SPEEDS = [1, 4, 16]
REFERENCE = ("baseline", "fifo")
THEMIS = ("themis", "scf")
TOLERANCE = 0.10

_ORDERS: dict = {}


def schedules() -> list[tuple[str, str]]:
    """Every (inter-dim, intra-dim) policy pair the package offers now, the reference first."""
    pairs = [(p, i) for p in policies.POLICIES for i in INTRA_POLICIES]
    return [REFERENCE, *[pair for pair in pairs if pair != REFERENCE]]


def iteration_us(wl, topo, policy: str, intra: str, spec: TrainingSpec) -> float:
    """Mean iteration time of `driver.run_training` on the model, without the per-dim analysis."""
    transport = ModelTransport(topo, RunConfig(intra=intra))
    orders = {}
    for coll in distinct_collectives(wl, topo, spec):
        key = (topo.spec(), policy, coll)
        if key not in _ORDERS:
            _ORDERS[key] = np.asarray(
                policies.chunk_orders(policy, topo, coll.op, coll.size_bytes, coll.n_chunks, coll.dims),
                dtype=np.int32,
            )
        orders[coll] = _ORDERS[key]
    engine = Engine(topo, transport, intra, 1, "")
    loop = TrainingLoop(wl, topo, spec, orders, policies.fuses_last_dim(policy))
    engine.process(loop.process(engine))
    engine.run()
    return engine.now_ns / spec.iterations / 1e3


def plan_key(wl, topo, spec: TrainingSpec) -> tuple | None:
    """The bucket plan's groups, or None when every gradient goes alone (the per-layer run)."""
    groups = tuple(b.layers for b in bucket_plan(wl, topo, spec))
    return None if all(len(g) == 1 for g in groups) else groups


def topology_of(name: str, zero_latency: bool):
    """A paper topology, with every latency 0 if asked."""
    topo = parse_topology(name)
    return topo.with_overrides(latency_ns=[0.0] * len(topo.dims)) if zero_latency else topo


def _run(task: tuple) -> tuple[tuple, float, float]:
    """One run (in a worker): the task, its iteration time in us, and the wall seconds it took."""
    path, topology, policy, intra, speed, bucket, chunks, iterations, zero = task
    wl = parse_workload(path)
    topo = wl.fit_topology(topology_of(topology, zero))
    spec = TrainingSpec(chunks, "float32", iterations, 1 / speed, 1.0, bucket)
    started = time.perf_counter()
    return task, iteration_us(wl, topo, policy, intra, spec), time.perf_counter() - started


def check_fast_path(path: str, chunks: int, iterations: int) -> None:
    """The study's runs give `model_training`'s iteration time (on one small configuration)."""
    wl = parse_workload(path)
    topo = wl.fit_topology(parse_topology(TOPOLOGIES[0]))
    spec = TrainingSpec(chunks, "float32", iterations, 0.25, 1.0, 25)
    for policy, intra in schedules():
        want = model_training(wl, topo, policy, spec, RunConfig(intra=intra)).iteration_us
        got = iteration_us(wl, topo, policy, intra, spec)
        assert got == want, (policy, intra, got, want)


def select(workloads: list[str], topologies: list[str], buckets: list[int]) -> None:
    """Restrict the study to subsets (for quick looks; the shipped copy runs everything)."""
    global WORKLOADS, TOPOLOGIES, BUCKETS_MIB
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        raise SystemExit(f"unknown workloads {sorted(unknown)}; use {', '.join(WORKLOADS)}")
    WORKLOADS = {w: WORKLOADS[w] for w in workloads}
    TOPOLOGIES, BUCKETS_MIB = topologies, buckets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="traces/per-layer", help="per-layer workloads (traces/per-layer)")
    ap.add_argument("--out", default="docs/regime")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--zero-latency", action="store_true", help="every link latency 0 (bandwidth-bound)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset (all four)")
    ap.add_argument("--topologies", default=",".join(TOPOLOGIES), help="comma-separated subset (all four)")
    ap.add_argument(
        "--buckets", default=",".join(map(str, BUCKETS_MIB)), help="bucket sizes in MiB (0,4,25,64,256)"
    )
    args = ap.parse_args()
    select(args.workloads.split(","), args.topologies.split(","), [int(b) for b in args.buckets.split(",")])
    started = time.perf_counter()
    paths = {w: os.path.join(args.traces, f"{w}.txt") for w in WORKLOADS}
    check_fast_path(os.path.join(args.traces, "dlrm.txt"), args.chunks, args.iterations)
    pairs = schedules()

    # distinct runs: bucket sizes with the same plan share one
    canon: dict[tuple, tuple] = {}  # (workload, topology, speed, bucket) -> task key part
    tasks: dict[tuple, None] = {}
    for w, path in paths.items():
        wl = parse_workload(path)
        for t in TOPOLOGIES:
            topo = wl.fit_topology(topology_of(t, args.zero_latency))
            first_of_plan: dict = {}
            for b in BUCKETS_MIB:
                key = plan_key(wl, topo, TrainingSpec(args.chunks, bucket_mib=b))
                first_of_plan.setdefault(key, b)
                for s in SPEEDS:
                    canon[(w, t, s, b)] = (w, t, s, first_of_plan[key])
                    for policy, intra in pairs:
                        tasks.setdefault(
                            (
                                path,
                                t,
                                policy,
                                intra,
                                s,
                                first_of_plan[key],
                                args.chunks,
                                args.iterations,
                                args.zero_latency,
                            )
                        )
    all_runs = len(WORKLOADS) * len(TOPOLOGIES) * len(BUCKETS_MIB) * len(SPEEDS) * len(pairs)
    sys.stderr.write(f"{all_runs} runs, {len(tasks)} distinct, on {args.jobs} worker(s)\n")
    times: dict[tuple, float] = {}
    wall = 0.0
    # the per-layer runs are the slowest: start them first
    order = sorted(tasks, key=lambda k: (k[5] != 0, "transformer" not in k[0]))
    with get_context("fork").Pool(args.jobs) as pool:
        for i, (task, us, secs) in enumerate(pool.imap_unordered(_run, order, chunksize=1)):
            times[task] = us
            wall += secs
            sys.stderr.write(f"\r{i + 1}/{len(tasks)} runs, {time.perf_counter() - started:6.1f} s")
    sys.stderr.write("\n")

    rows = []
    for (w, t, s, b), (_, _, _, b_run) in canon.items():
        us = {
            f"{p}/{i}": times[(paths[w], t, p, i, s, b_run, args.chunks, args.iterations, args.zero_latency)]
            for p, i in pairs
        }
        ref = us["/".join(REFERENCE)]
        best = min(us, key=lambda k: us[k])
        rows.append(
            {
                "workload": w,
                "topology": t,
                "bucket_mib": b,
                "compute_speed": s,
                "same_run_as_bucket_mib": b_run,
                "iteration_us": us,
                "themis_speedup": ref / us["/".join(THEMIS)],
                "best": best,
                "best_speedup": ref / us[best],
            }
        )
    elapsed = time.perf_counter() - started
    latency = "zero latency" if args.zero_latency else "paper latencies"
    md = tables(rows, pairs, latency)
    md.append(
        f"\n{all_runs} runs ({len(tasks)} distinct, {args.iterations} iterations, {args.chunks} chunks "
        f"per collective, {latency}) in {elapsed:.0f} s on {args.jobs} worker(s) "
        f"({wall:.0f} s of runs).\n"
    )
    text = "\n".join(md)
    os.makedirs(args.out, exist_ok=True)
    suffix = "-zero-latency" if args.zero_latency else ""
    with atomic_path(os.path.join(args.out, f"regime{suffix}.md")) as tmp, open(tmp, "w") as f:
        f.write(text)
    write_json(os.path.join(args.out, f"regime{suffix}.json"), rows)
    for w in WORKLOADS:
        heat_map(rows, w, os.path.join(args.out, f"speedup_{w}{suffix}.png"), latency)
    print(text)


def _mean(rows, w, b, s, field) -> float:
    vals = [r[field] for r in rows if (r["workload"], r["bucket_mib"], r["compute_speed"]) == (w, b, s)]
    return sum(vals) / len(vals)


def tables(rows: list[dict], pairs, latency: str) -> list[str]:
    """Markdown: per workload, mean speedups over the topologies; then the paper's numbers."""
    md = [
        f"Speedup of the iteration time over the baseline (FIFO), {latency}, mean over the four paper "
        "topologies; "
        "`Themis / best` (best: the fastest of " + ", ".join(f"{p}/{i}" for p, i in pairs) + ")."
    ]
    for w, (label, paper) in WORKLOADS.items():
        md.append(f"\n**{label}** (paper: {paper:.2f}x)\n")
        md.append("| bucket | " + " | ".join(f"compute {s}x" for s in SPEEDS) + " |")
        md.append("|---" * (len(SPEEDS) + 1) + "|")
        for b in BUCKETS_MIB:
            cells = [
                f"{_mean(rows, w, b, s, 'themis_speedup'):.2f}x / {_mean(rows, w, b, s, 'best_speedup'):.2f}x"
                for s in SPEEDS
            ]
            md.append(f"| {b or 'per layer'}{' MiB' if b else ''} | " + " | ".join(cells) + " |")
    md.append(
        f"\n**The paper's end-to-end numbers: cells within {TOLERANCE:.0%}** (Themis+SCF; mean over the "
        "topologies, and single topologies)\n"
    )
    md.append(
        "| workload | paper | closest mean (bucket, compute) | means within 10 % | topologies within 10 % |"
    )
    md.append("|---|---|---|---|---|")
    for w, (label, paper) in WORKLOADS.items():
        means = {(b, s): _mean(rows, w, b, s, "themis_speedup") for b in BUCKETS_MIB for s in SPEEDS}
        close = min(means, key=lambda k: abs(means[k] - paper))
        within = [k for k, v in means.items() if abs(v - paper) <= TOLERANCE * paper]
        singles = [
            r for r in rows if r["workload"] == w and abs(r["themis_speedup"] - paper) <= TOLERANCE * paper
        ]
        md.append(
            f"| {label} | {paper:.2f}x | {means[close]:.2f}x ({close[0]} MiB, {close[1]}x) | "
            + (", ".join(f"{b} MiB/{s}x: {means[(b, s)]:.2f}x" for b, s in within) or "none")
            + " | "
            + (
                ", ".join(
                    f"{r['topology']} {r['bucket_mib']} MiB/{r['compute_speed']}x: {r['themis_speedup']:.2f}x"
                    for r in singles
                )
                or "none"
            )
            + " |"
        )
    md.append("\nPer topology (Themis+SCF speedup; bucket MiB x compute speed):\n")
    md.append(
        "| workload | topology | " + " | ".join(f"{b}/{s}x" for b in BUCKETS_MIB for s in SPEEDS) + " |"
    )
    md.append("|---" * (2 + len(BUCKETS_MIB) * len(SPEEDS)) + "|")
    for w, (label, _) in WORKLOADS.items():
        for t in TOPOLOGIES:
            sel = {
                (r["bucket_mib"], r["compute_speed"]): r
                for r in rows
                if r["workload"] == w and r["topology"] == t
            }
            md.append(
                f"| {label} | {t} | "
                + " | ".join(f"{sel[(b, s)]['themis_speedup']:.2f}" for b in BUCKETS_MIB for s in SPEEDS)
                + " |"
            )
    return md


def heat_map(rows: list[dict], w: str, path: str, latency: str) -> None:
    """Two panels (Themis+SCF, best policy): mean speedup over the topologies, bucket x compute speed."""
    label, paper = WORKLOADS[w]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, (field, title) in zip(axes, (("themis_speedup", "Themis+SCF"), ("best_speedup", "best policy"))):
        grid = np.array([[_mean(rows, w, b, s, field) for s in SPEEDS] for b in BUCKETS_MIB])
        im = ax.imshow(grid, cmap="RdBu_r", vmin=0.5, vmax=1.5, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            near = abs(v - paper) <= TOLERANCE * paper
            ax.text(j, i, f"{v:.2f}" + ("*" if near else ""), ha="center", va="center", fontsize=9)
        ax.set_xticks(range(len(SPEEDS)), [f"{s}x" for s in SPEEDS])
        ax.set_yticks(range(len(BUCKETS_MIB)), [f"{b} MiB" if b else "per layer" for b in BUCKETS_MIB])
        ax.set_xlabel("compute speed")
        ax.set_title(f"{title}")
    axes[0].set_ylabel("gradient bucket")
    axes[1].set_yticklabels([])
    fig.colorbar(im, ax=axes, label="speedup over baseline (mean of 4 topologies)")
    fig.suptitle(f"{label}, {latency}: paper {paper:.2f}x (* within 10 %)")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
