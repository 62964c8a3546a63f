"""The regime of the paper's end-to-end speedups: gradient bucket size x compute speed.

Usage::

    python scripts/study_regime.py [--traces traces/per-layer] [--out docs/regime] [--workers 2|mpi]
                                   [--zero-latency] [--workloads W,..] [--topologies T,..]
                                   [--buckets 0,4,25,64,256] [--speeds 1,4,16] [--intra all]

For each of the four workloads (one weight-gradient all-reduce per layer, traces/per-layer/) on
each paper topology (paper latencies; every latency 0 with --zero-latency), two training
iterations on the model, 64 chunks per collective, with gradient buckets of 0 (per layer), 4,
25, 64 and 256 MiB (`train --bucket-mib`) and compute 1x, 4x and 16x faster (`--compute-scale`
1, 1/4, 1/16), under every inter-dim policy of the registry (`themis-mpi policies`) with every
intra-dim policy of the registry (`--intra` restricts the latter). Speedups are iteration-time
ratios over the baseline with FIFO. "Themis" is Themis+SCF; "best" the fastest pair; "best at
64 chunks" the fastest pair whose schedules keep every collective's 64 chunks (`predictive` and
`themisFlex` may cut a collective into other chunks). Writes regime.json (every cell, every
pair's time), regime.md (the tables and, for each paper number, the cells within 10 % of it) and
one heat map per workload (speedup_<workload>.png) into --out.

Each run is `run.coordinator.share_schedules` (the policy's choice, with the training run as its oracle, as
`train` asks it) and the `run.training.training_oracle` of those schedules: `model_training`'s
iteration time without its per-dim analysis (a check at the start asserts the two agree); the
baseline run is `model_training` itself, for the compute time. Runs that repeat are run once: a
bucket size that leaves every gradient alone is the per-layer run, and two bucket sizes with the
same plan (`workloads.training.bucket_plan`) are the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import sys
import time
from collections import Counter

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402

from themis_mpi.config import RunConfig  # noqa: E402
from themis_mpi.model import ModelTransport  # noqa: E402
from themis_mpi.output import atomic_path, write_study  # noqa: E402
from themis_mpi.policies import inter_names, intra_names  # noqa: E402
from themis_mpi.report import measured_on  # noqa: E402
from themis_mpi.run.coordinator import share_schedules  # noqa: E402
from themis_mpi.run.pool import ordered_map, parse_workers  # noqa: E402
from themis_mpi.run.training import (
    model_training,  # noqa: E402
    training_oracle,  # noqa: E402
)
from themis_mpi.topology import parse_topology  # noqa: E402
from themis_mpi.workloads.text import parse_workload  # noqa: E402
from themis_mpi.workloads.training import TrainingSpec, bucket_plan, distinct_collectives  # noqa: E402

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
FIELDS = (("themis_speedup", "Themis+SCF"), ("best64_speedup", "best at 64 chunks"), ("best_speedup", "best"))

NETWORK = (
    "ideal"  # pinned: its shipped rows ran under ideal; re-running under packet takes too long to redo here
)


def pair_name(pair: tuple[str, str]) -> str:
    return "/".join(pair)


def schedules(intras: list[str] | None = None) -> list[tuple[str, str]]:
    """(inter, intra) pairs: every inter-dim policy of the registry x `intras`, the reference first.

    `intras` (None: every intra-dim policy of the registry) always gains fifo and scf, which the
    reference and Themis need.
    """
    chosen = intra_names() if intras is None else list(dict.fromkeys([*intras, "fifo", "scf"]))
    pairs = [(p, i) for p in inter_names() for i in chosen]
    return [REFERENCE, *[pair for pair in pairs if pair != REFERENCE]]


@functools.cache
def workload_of(path: str):
    """A parsed workload (once per process)."""
    return parse_workload(path)


def topology_of(name: str, zero_latency: bool):
    """A paper topology (or any topology spec), with every latency 0 if asked."""
    topo = parse_topology(name)
    return topo.with_overrides(latency_ns=[0.0] * len(topo.dims)) if zero_latency else topo


def iteration_us(wl, topo, policy: str, intra: str, spec: TrainingSpec) -> tuple[float, bool, Counter]:
    """One run: mean iteration time in us, whether every collective kept its chunk count, labels.

    `run.training.run_training`'s steps on the model without its per-dim analysis: the policy's
    schedules, chosen with the training run as its oracle, then the oracle's time of them.
    """
    config = RunConfig(intra=intra, network=NETWORK)
    collectives = distinct_collectives(wl, topo, spec)
    oracle = training_oracle(topo, config, wl, spec)
    chosen, _ = share_schedules(ModelTransport(topo, config), policy, collectives, evaluate=oracle)
    kept = all(s.n_chunks == c.n_chunks for s, c in zip(chosen, collectives))
    return oracle(chosen), kept, Counter(s.label or policy for s in chosen)


def load_runs(path: str | None, tasks) -> dict[tuple, dict]:
    """The finished runs of a `--resume` file that this study needs (none without one)."""
    if not path or not os.path.exists(path):
        return {}
    out = {}
    with open(path) as f:
        for line in f:
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by an interrupted run
                continue
            task = tuple(doc["task"])
            if task in tasks:
                out[task] = {**doc["out"], "labels": Counter(doc["out"]["labels"])}
    return out


def plan_key(wl, topo, spec: TrainingSpec) -> tuple | None:
    """The bucket plan's groups, or None when every gradient goes alone (the per-layer run)."""
    groups = tuple(b.layers for b in bucket_plan(wl, topo, spec))
    return None if all(len(g) == 1 for g in groups) else groups


def spec_of(speed: float, bucket: float, chunks: int, iterations: int) -> TrainingSpec:
    return TrainingSpec(chunks, "float32", iterations, 1 / speed, 1.0, bucket)


def _run(task: tuple) -> tuple[tuple, dict, float]:
    """One run (in a worker): the task, its result, and the CPU seconds it took."""
    path, topology, policy, intra, speed, bucket, chunks, iterations, zero = task
    started = time.process_time()
    wl = workload_of(path)
    topo = wl.fit_topology(topology_of(topology, zero))
    spec = spec_of(speed, bucket, chunks, iterations)
    if (policy, intra) == REFERENCE:  # the reference through `model_training` itself: its compute time too
        res = model_training(wl, topo, policy, spec, RunConfig(intra=intra, network=NETWORK))
        out = {
            "us": res.iteration_us,
            "kept": True,
            "labels": Counter([policy]),
            "compute_us": res.compute_us,
        }
    else:
        us, kept, labels = iteration_us(wl, topo, policy, intra, spec)
        out = {"us": us, "kept": kept, "labels": labels}
    return task, out, time.process_time() - started


def check_fast_path(path: str, topology: str, chunks: int, iterations: int, zero: bool, pairs) -> None:
    """The study's runs give `model_training`'s iteration time (on one small configuration)."""
    wl = workload_of(path)
    topo = wl.fit_topology(topology_of(topology, zero))
    spec = spec_of(4, 25, chunks, iterations)
    for policy, intra in pairs:
        want = model_training(wl, topo, policy, spec, RunConfig(intra=intra, network=NETWORK)).iteration_us
        got = iteration_us(wl, topo, policy, intra, spec)[0]
        assert got == want, (policy, intra, got, want)


def cost_rank(task: tuple) -> tuple:
    """Sort key: the fifo and scf pairs first, then the others; the slowest runs first in each half.

    Slowest: per layer, the big workloads, predictive. A study cut short then holds the
    `--intra fifo,scf` study whole (`--resume` takes its runs).
    """
    path, _, policy, intra, _, bucket, *_ = task
    name = os.path.splitext(os.path.basename(path))[0]
    slow = ["resnet152", "transformer_1t"]
    return (
        intra not in ("fifo", "scf"),
        bucket != 0,
        name not in slow,
        slow.index(name) if name in slow else 0,
        policy != "predictive",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="traces/per-layer", help="per-layer workloads (traces/per-layer)")
    ap.add_argument("--out", default="docs/regime")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument(
        "--workers", "--jobs", default="2", help="worker processes (default 2; 1: in this process), or mpi"
    )
    ap.add_argument("--zero-latency", action="store_true", help="every link latency 0 (bandwidth-bound)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset (all four)")
    ap.add_argument(
        "--topologies", default=",".join(TOPOLOGIES), help="comma-separated topologies (the four paper ones)"
    )
    ap.add_argument(
        "--buckets", default=",".join(map(str, BUCKETS_MIB)), help="bucket sizes in MiB (0,4,25,64,256)"
    )
    ap.add_argument("--speeds", default=",".join(map(str, SPEEDS)), help="compute speeds (1,4,16)")
    ap.add_argument(
        "--intra",
        default="all",
        help="intra-dim policies the best pair is searched over: all (every one of the registry, "
        "the default) or a comma-separated list (fifo and scf are always included)",
    )
    ap.add_argument(
        "--resume",
        metavar="JSONL",
        help="append every finished run to this file, and take the runs already in it instead of "
        "running them again (same --traces, chunks, iterations and latency)",
    )
    args = ap.parse_args(argv)
    args.workloads = args.workloads.split(",")
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        ap.error(f"unknown workloads {sorted(unknown)}; use {', '.join(WORKLOADS)}")
    args.topologies = re.split(r",(?![^(]*\))", args.topologies)  # inline specs hold commas
    args.buckets = [float(b) if "." in b else int(b) for b in args.buckets.split(",")]
    args.speeds = [float(s) if "." in s else int(s) for s in args.speeds.split(",")]
    args.intra = None if args.intra == "all" else args.intra.split(",")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    started = time.perf_counter()
    paths = {w: os.path.join(args.traces, f"{w}.txt") for w in args.workloads}
    pairs = schedules(args.intra)
    first = paths[args.workloads[0]]
    checked = [p for p in pairs if p in (REFERENCE, THEMIS, ("predictive", "scf"))]
    check_fast_path(first, args.topologies[0], args.chunks, args.iterations, args.zero_latency, checked)

    # distinct runs: bucket sizes with the same plan share one
    canon: dict[tuple, int | float] = {}  # (workload, topology, speed, bucket) -> the bucket run
    tasks: dict[tuple, None] = {}
    for w, path in paths.items():
        wl = workload_of(path)
        for t in args.topologies:
            topo = wl.fit_topology(topology_of(t, args.zero_latency))
            first_of_plan: dict = {}
            for b in args.buckets:
                key = plan_key(wl, topo, spec_of(1, b, args.chunks, args.iterations))
                b_run = first_of_plan.setdefault(key, b)
                for s in args.speeds:
                    canon[(w, t, s, b)] = b_run
                    for p, i in pairs:
                        tasks.setdefault(
                            (path, t, p, i, s, b_run, args.chunks, args.iterations, args.zero_latency)
                        )
    all_runs = len(canon) * len(pairs)
    results = load_runs(args.resume, tasks)
    todo = [k for k in tasks if k not in results]
    sys.stderr.write(
        f"{all_runs} runs, {len(tasks)} distinct, {len(tasks) - len(todo)} of them in {args.resume}, "
        f"on {args.workers} worker(s)\n"
    )
    last_note = started
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open(args.resume, "a")) if args.resume else None
        order = sorted(todo, key=cost_rank)
        done = ordered_map(_run, order, parse_workers(args.workers))
        for n, (task, out, secs) in enumerate(done, 1):
            results[task] = {**out, "s": secs}
            if log:
                log.write(json.dumps({"task": task, "out": results[task]}) + "\n")
                log.flush()
            now = time.perf_counter()
            if now - last_note > 30 or n == len(todo):
                last_note = now
                sys.stderr.write(f"{n}/{len(todo)} runs, {now - started:.0f} s\n")
                sys.stderr.flush()
    run_s = sum(results[k]["s"] for k in tasks)

    rows = []
    for (w, t, s, b), b_run in canon.items():
        runs = {
            pair_name((p, i)): results[
                (paths[w], t, p, i, s, b_run, args.chunks, args.iterations, args.zero_latency)
            ]
            for p, i in pairs
        }
        us = {k: r["us"] for k, r in runs.items()}
        ref = us[pair_name(REFERENCE)]
        best = min(us, key=lambda k: us[k])  # the first of equal times
        best64 = min((k for k in us if runs[k]["kept"]), key=lambda k: us[k])
        rows.append(
            {
                "workload": w,
                "topology": t,
                "bucket_mib": b,
                "compute_speed": s,
                "same_run_as_bucket_mib": b_run,
                "compute_us": runs[pair_name(REFERENCE)]["compute_us"],
                "iteration_us": us,
                "keeps_chunks": {k: r["kept"] for k, r in runs.items()},
                "themis_speedup": ref / us[pair_name(THEMIS)],
                "best": best,
                "best_speedup": ref / us[best],
                "best_schedules": dict(runs[best]["labels"]),
                "best64": best64,
                "best64_speedup": ref / us[best64],
                "cpu_s": {k: round(r["s"], 3) for k, r in runs.items()},
            }
        )
    elapsed = time.perf_counter() - started
    latency = "zero latency" if args.zero_latency else "paper latencies"
    md = tables(rows, args, pairs, latency)
    md.append(
        f"\n{all_runs} runs ({len(tasks)} distinct, {args.iterations} iterations, {args.chunks} chunks "
        f"per collective, {latency}): {run_s:.0f} CPU s of runs; {elapsed:.0f} s of wall time on "
        f"{args.workers} worker(s){' in the last invocation' if args.resume else ''} ({measured_on()}).\n"
    )
    text = "\n".join(md)
    os.makedirs(args.out, exist_ok=True)
    suffix = "-zero-latency" if args.zero_latency else ""
    write_study(args.out, f"regime{suffix}", text, rows)
    for w in args.workloads:
        heat_map(rows, args, w, os.path.join(args.out, f"speedup_{w}{suffix}.png"), latency)
    print(text)
    return rows


def _mean(rows, w, b, s, field) -> float:
    vals = [r[field] for r in rows if (r["workload"], r["bucket_mib"], r["compute_speed"]) == (w, b, s)]
    return sum(vals) / len(vals)


def _bucket(b) -> str:
    return f"{b:g} MiB" if b else "per layer"


def tables(rows: list[dict], args, pairs, latency: str) -> list[str]:
    """Markdown: per workload, mean speedups over the topologies; then the paper's numbers."""
    n_topo = len(args.topologies)
    md = [
        f"Speedup of the iteration time over the baseline (FIFO), {latency}, mean over {n_topo} "
        f"topolog{'ies' if n_topo > 1 else 'y'} ({', '.join(args.topologies)}): "
        "`Themis+SCF / best at 64 chunks / best`; best: the fastest of "
        + ", ".join(pair_name(p) for p in pairs)
        + "; best at 64 chunks: the fastest of those whose schedules keep every collective's chunks."
    ]
    for w in args.workloads:
        label, paper = WORKLOADS[w]
        md.append(f"\n**{label}** (paper: {paper:.2f}x)\n")
        md.append("| bucket | " + " | ".join(f"compute {s:g}x" for s in args.speeds) + " |")
        md.append("|---" * (len(args.speeds) + 1) + "|")
        for b in args.buckets:
            cells = [" / ".join(f"{_mean(rows, w, b, s, f):.2f}x" for f, _ in FIELDS) for s in args.speeds]
            md.append(f"| {_bucket(b)} | " + " | ".join(cells) + " |")
        mine = [r for r in rows if r["workload"] == w]
        for field, what in (("best", "best"), ("best64", "best at 64 chunks")):
            counts = Counter(r[field] for r in mine).most_common()
            md.append(
                f"\n{what}: "
                + ", ".join(f"{name} in {c}" for name, c in counts)
                + f" of {len(mine)} cells (topology x bucket x speed)"
            )
    md.append(
        f"\n**The paper's end-to-end numbers: cells within {TOLERANCE:.0%}** (Themis+SCF; mean over the "
        "topologies, and single topologies)\n"
    )
    md.append(
        "| workload | paper | closest mean (bucket, compute) | means within 10 % | topologies within 10 % |"
    )
    md.append("|---|---|---|---|---|")
    for w in args.workloads:
        label, paper = WORKLOADS[w]
        means = {(b, s): _mean(rows, w, b, s, "themis_speedup") for b in args.buckets for s in args.speeds}
        close = min(means, key=lambda k: abs(means[k] - paper))
        within = [k for k, v in means.items() if abs(v - paper) <= TOLERANCE * paper]
        singles = [
            r for r in rows if r["workload"] == w and abs(r["themis_speedup"] / paper - 1) <= TOLERANCE
        ]
        md.append(
            f"| {label} | {paper:.2f}x | {means[close]:.2f}x ({_bucket(close[0])}, {close[1]:g}x) | "
            + (", ".join(f"{_bucket(b)}/{s:g}x: {means[(b, s)]:.2f}x" for b, s in within) or "none")
            + " | "
            + (
                ", ".join(
                    f"{r['topology']} {_bucket(r['bucket_mib'])}/{r['compute_speed']:g}x: "
                    f"{r['themis_speedup']:.2f}x"
                    for r in singles
                )
                or "none"
            )
            + " |"
        )
    for field, what in FIELDS:
        md.append(f"\nPer topology ({what} speedup; bucket MiB / compute speed):\n")
        md.append(
            "| workload | topology | "
            + " | ".join(f"{b:g}/{s:g}x" for b in args.buckets for s in args.speeds)
            + " |"
        )
        md.append("|---" * (2 + len(args.buckets) * len(args.speeds)) + "|")
        for w in args.workloads:
            for t in args.topologies:
                sel = {
                    (r["bucket_mib"], r["compute_speed"]): r
                    for r in rows
                    if r["workload"] == w and r["topology"] == t
                }
                md.append(
                    f"| {WORKLOADS[w][0]} | {t} | "
                    + " | ".join(f"{sel[(b, s)][field]:.2f}" for b in args.buckets for s in args.speeds)
                    + " |"
                )
    return md


def heat_map(rows: list[dict], args, w: str, path: str, latency: str) -> None:
    """Three panels (Themis+SCF, best at 64 chunks, best): mean speedup, bucket x compute speed."""
    label, paper = WORKLOADS[w]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    norm = LogNorm(vmin=0.5, vmax=2.0, clip=True)
    for ax, (field, title) in zip(axes, FIELDS):
        grid = np.array([[_mean(rows, w, b, s, field) for s in args.speeds] for b in args.buckets])
        im = ax.imshow(grid, cmap="RdBu_r", norm=norm, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            near = abs(v - paper) <= TOLERANCE * paper
            ax.text(j, i, f"{v:.2f}" + ("*" if near else ""), ha="center", va="center", fontsize=9)
        ax.set_xticks(range(len(args.speeds)), [f"{s:g}x" for s in args.speeds])
        ax.set_yticks(range(len(args.buckets)), [_bucket(b) for b in args.buckets])
        ax.set_xlabel("compute speed")
        ax.set_title(title)
    axes[0].set_ylabel("gradient bucket")
    for ax in axes[1:]:
        ax.set_yticklabels([])
    n = len(args.topologies)
    fig.colorbar(im, ax=axes, label=f"speedup over baseline (mean of {n} topolog{'ies' if n > 1 else 'y'})")
    fig.suptitle(f"{label}, {latency}: paper {paper:.2f}x (* within 10 %)")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
