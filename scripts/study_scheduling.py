"""Scheduling between collectives: p3, bytescheduler and tictac against fifo, under baseline and Themis.

Usage::

    python scripts/study_scheduling.py [--out docs/scheduling] [--chunks 16] [--iterations 3]
    python scripts/study_scheduling.py --write-vgg19 traces/vgg19.txt

Workloads (data parallel, one weight-gradient all-reduce per layer, as P3 and TicTac see them):
ASTRA-sim's ResNet-50 (tests/data), ResNet-152 and GNMT (traces/per-layer, scripts/
generate_workloads.py) and VGG-19 (traces/vgg19.txt, written by ``--write-vgg19`` with the
constants of generate_workloads.py: 32 images of 224x224, 2-byte gradients; its three dense
layers hold 86 % of the gradient bytes, at the end of the network). Topology: the paper's
3D-SW_SW_SW_hetero. For each workload the compute is scaled so that communication (one
iteration of baseline + fifo with no compute) is 0.5x, 1x and 2x the compute.

Every cell runs `--iterations` iterations on the model under fifo, fifo with 4 MiB partitions
(slicing alone), p3 (4 MiB), bytescheduler (4 MiB, credit 8 MiB) and tictac, one stage per dim
at once (``--network ideal``: one stage per dim shares no link); and fifo, p3 and bytescheduler
with 4 stages per dim at once (``@4``, where the credit binds) under ``--network fair``, where
those stages share the dim's links; the ``@4`` speedups are over ``fifo@4``. It records the
steady iteration (the second to last, which has a next iteration to start early), the last
iteration (nothing to start early: ordering can only cost there), the mean, and when the next
iteration's layer 0 starts. Writes scheduling.json, scheduling.md and speedup.png into --out and
prints the tables.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import generate_workloads as gen  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from themis_mpi.config import RunConfig  # noqa: E402
from themis_mpi.output import atomic_path, write_study, write_text  # noqa: E402
from themis_mpi.policies import make_inter, policy_context  # noqa: E402
from themis_mpi.run.pool import WORKERS_HELP, ordered_map, parse_workers  # noqa: E402
from themis_mpi.run.training import loop_on_model  # noqa: E402
from themis_mpi.topology import parse_topology  # noqa: E402
from themis_mpi.workloads.text import parse_workload  # noqa: E402
from themis_mpi.workloads.training import TrainingSpec, distinct_collectives  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = {
    "ResNet-50": "tests/data/astra-sim-1.0-text/Resnet50_DataParallel.txt",
    "ResNet-152": "traces/per-layer/resnet152.txt",
    "GNMT": "traces/per-layer/gnmt.txt",
    "VGG-19": "traces/vgg19.txt",
}
TOPOLOGY = "3D-SW_SW_SW_hetero"
RATIOS = (0.5, 1.0, 2.0)  # communication / compute
POLICIES = (("baseline", "fifo"), ("themis", "scf"))
PARTITION_MIB, CREDIT_MIB = 4.0, 8.0
SCHEDULERS = {  # label: (scheduler, partition MiB, stages per dim at once)
    "fifo": ("fifo", 0.0, 1),
    "fifo+slices": ("fifo", PARTITION_MIB, 1),
    "p3": ("p3", PARTITION_MIB, 1),
    "bytescheduler": ("bytescheduler", PARTITION_MIB, 1),
    "tictac": ("tictac", 0.0, 1),
    "fifo@4": ("fifo", 0.0, 4),
    "p3@4": ("p3", PARTITION_MIB, 4),
    "bytescheduler@4": ("bytescheduler", PARTITION_MIB, 4),
}


def vgg19() -> list[str]:
    """VGG-19 (Simonyan and Zisserman 2015) in ASTRA-sim 1.0 text: data parallel, one line per layer."""
    gen.configure(bucket_mib=0)
    batch = 32
    lines = []
    cin, hw = 3, 224
    for stage, (convs, cout) in enumerate(((2, 64), (2, 128), (4, 256), (4, 512), (4, 512)), 1):
        for i in range(convs):
            params = 9 * cin * cout + cout
            flops = 2 * 9 * cin * cout * hw * hw * batch
            lines.append(
                gen.line(f"conv{stage}_{i + 1}", flops, wg=("ALLREDUCE", params * gen.BYTES), params=params)
            )
            cin = cout
        hw //= 2
    for name, a, b in (("fc6", 512 * 7 * 7, 4096), ("fc7", 4096, 4096), ("fc8", 4096, 1000)):
        params = a * b + b
        lines.append(gen.line(name, 2 * a * b * batch, wg=("ALLREDUCE", params * gen.BYTES), params=params))
    return ["DATA", str(len(lines)), *lines]


def run(path: str, topo, spec: TrainingSpec, config: RunConfig, policy: str) -> dict:
    """One training run on the model; iteration times and the next iterations' first-layer starts (us)."""
    wl = parse_workload(path)
    collectives = distinct_collectives(wl, topo, spec)
    schedules = make_inter(policy).schedule_all(policy_context(topo, config), collectives)
    loop, engine = loop_on_model(wl, topo, spec, config, dict(zip(collectives, schedules)))
    starts = [*loop.iteration_starts, engine.now_ns]
    its = [(b - a) / 1e3 for a, b in zip(starts, starts[1:])]
    return {
        "mean_us": engine.now_ns / spec.iterations / 1e3,
        "steady_us": its[-2] if len(its) > 1 else its[-1],
        "last_us": its[-1],
        "compute_us": loop.compute_ns / spec.iterations / 1e3,
        "layer0_wait_us": [
            (f[0] - s) / 1e3 for f, s in zip(loop.forward_starts[1:], loop.iteration_starts[1:])
        ],
        "collectives": loop.collectives_issued,
    }


def _cell(point) -> dict:
    """One (workload, ratio, policy): every scheduler."""
    name, path, scale, ratio, policy, intra, chunks, iterations = point
    topo = parse_topology(TOPOLOGY)
    row = {"workload": name, "ratio": ratio, "compute_scale": scale, "policy": policy, "intra": intra}
    for label, (scheduler, partition, active) in SCHEDULERS.items():
        spec = TrainingSpec(chunks, "float32", iterations, scale, partition_mib=partition)
        credit = int(CREDIT_MIB * 2**20)
        network = "fair" if active > 1 else "ideal"  # (stages at once on a dim share its links)
        config = RunConfig(
            intra=intra,
            active_per_dim=active,
            comm_scheduler=scheduler,
            credit_bytes=credit,
            network=network,
        )
        row[label] = run(path, topo, spec, config, policy)
    return row


def compute_scales(chunks: int) -> dict[str, tuple[float, float, float]]:
    """Per workload: each ratio's compute scale (from an iteration of baseline + fifo without compute)."""
    topo = parse_topology(TOPOLOGY)
    out = {}
    for name, path in WORKLOADS.items():
        config = RunConfig(intra="fifo")
        comm = run(path, topo, TrainingSpec(chunks, "float32", 1, 0.0), config, "baseline")["mean_us"]
        compute = run(path, topo, TrainingSpec(chunks, "float32", 1, 1.0), config, "baseline")["compute_us"]
        out[name] = tuple(comm / (r * compute) for r in RATIOS)
    return out


def loses(row: dict, scheduler: str = "p3", key: str = "steady_us") -> bool:
    """Whether a scheduler's iteration is slower than fifo's in a cell (by more than 0.05 %)."""
    return row[scheduler][key] > row["fifo"][key] * 1.0005


def why_p3_loses(row: dict, rows: list[dict]) -> str:
    """What the diagnostics of a cell where p3 is slower than fifo show."""
    fifo, sliced, p3 = row["fifo"], row["fifo+slices"], row["p3"]
    reasons = []
    cell = (row["workload"], row["ratio"])
    twin = next(r for r in rows if (r["workload"], r["ratio"]) == cell and r is not row)
    if loses(row, "fifo+slices"):
        cost = sliced["steady_us"] / fifo["steady_us"] - 1
        twin_cost = twin["fifo+slices"]["steady_us"] / twin["fifo"]["steady_us"] - 1
        if row["policy"] == "themis" and cost > twin_cost + 0.01:
            reasons.append(
                f"slicing alone costs {cost:+.1%} (baseline: {twin_cost:+.1%}): Themis balances the "
                "dims within a collective, and a partition of one or two chunks leaves it little to balance"
            )
        else:
            reasons.append(f"slicing alone costs {cost:+.1%} (more chunks, each paying the latency)")
    if loses(row, "p3", "last_us"):
        reasons.append(f"its last iteration is {p3['last_us'] / fifo['last_us'] - 1:+.1%}")
    if row["policy"] == "themis" and not loses(twin):
        reasons.append("under Themis only (p3 does not lose under baseline here)")
    return "; ".join(reasons) or "the order alone"


def markdown(rows: list[dict], chunks: int, iterations: int, elapsed: float) -> str:
    """The tables of the study."""
    md = [
        f"\n**Steady iteration speedup over fifo** ({TOPOLOGY}, {chunks} chunks per collective, "
        f"{iterations} iterations; the second-to-last iteration's time; fifo's in ms)\n",
        "| workload | comm/compute | policy | fifo ms | " + " | ".join(list(SCHEDULERS)[1:]) + " |",
        "|---" * (len(SCHEDULERS) + 3) + "|",
    ]
    for r in rows:
        base = r["fifo"]["steady_us"]
        base4 = r["fifo@4"]["steady_us"]
        cells = [
            f"{(base4 if s.endswith('@4') and s != 'fifo@4' else base) / r[s]['steady_us']:.3f}x"
            for s in list(SCHEDULERS)[1:]
        ]
        md.append(
            f"| {r['workload']} | {r['ratio']:g} | {r['policy']} | {base / 1e3:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    md += [
        "\n**Mean over all iterations, and when layer 0 of the next iteration starts** "
        "(mean speedup over fifo; us after the iteration began, fifo -> p3)\n",
        "| workload | comm/compute | policy | p3 mean | bytescheduler mean | tictac mean "
        "| layer 0 waits (fifo -> p3) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = r["fifo"]["mean_us"]
        wait = f"{r['fifo']['layer0_wait_us'][0]:.0f} -> {r['p3']['layer0_wait_us'][0]:.0f}"
        md.append(
            f"| {r['workload']} | {r['ratio']:g} | {r['policy']} | {base / r['p3']['mean_us']:.3f}x | "
            f"{base / r['bytescheduler']['mean_us']:.3f}x | {base / r['tictac']['mean_us']:.3f}x | {wait} |"
        )
    losers = [r for r in rows if loses(r) or loses(r, "p3", "last_us") or loses(r, "p3", "mean_us")]
    md.append(
        f"\n**Cells where p3 is slower than fifo** (the steady, the last or the mean iteration): "
        f"{len(losers)} of {len(rows)}\n"
    )
    if losers:
        md += [
            "| workload | comm/compute | policy | steady | last | mean | why (diagnostics) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in losers:
            sp = [r["fifo"][k] / r["p3"][k] for k in ("steady_us", "last_us", "mean_us")]
            why = why_p3_loses(r, rows)
            md.append(
                f"| {r['workload']} | {r['ratio']:g} | {r['policy']} | {sp[0]:.3f}x | {sp[1]:.3f}x | "
                f"{sp[2]:.3f}x | {why} |"
            )
    md.append(f"\n{len(rows) * len(SCHEDULERS)} training runs in {elapsed:.0f} s.\n")
    return "\n".join(md)


def plot(rows: list[dict], path: str) -> None:
    """Steady-iteration speedup over fifo of p3, bytescheduler and tictac, per workload and ratio."""
    labels = ("p3", "bytescheduler", "tictac")
    policies = [p for p, _ in POLICIES]
    fig, axes = plt.subplots(len(policies), 1, figsize=(12, 7.5), sharey=True)
    names = list(dict.fromkeys(r["workload"] for r in rows))
    ratios = sorted({r["ratio"] for r in rows})
    groups = [(n, q) for n in names for q in ratios]
    width = 0.8 / len(labels)
    for ax, policy in zip(axes, policies):
        for j, label in enumerate(labels):
            values = []
            for n, q in groups:
                r = next(r for r in rows if (r["workload"], r["ratio"], r["policy"]) == (n, q, policy))
                values.append(r["fifo"]["steady_us"] / r[label]["steady_us"])
            ax.bar([i + (j - 1) * width for i in range(len(groups))], values, width, label=label)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(range(len(groups)), [f"{n}\n{q:g}x" for n, q in groups], fontsize=8)
        ax.set_title(f"{policy}: steady iteration speedup over fifo (comm/compute below)", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylim(0.8, 1.4)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", default="results/scheduling", help="output folder (docs/scheduling is the shipped copy)"
    )
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--workers", default="1", help=WORKERS_HELP)
    ap.add_argument("--quick", action="store_true", help="ResNet-50 and VGG-19 at ratio 1 only")
    ap.add_argument("--write-vgg19", metavar="PATH", help="write the VGG-19 workload and stop")
    args = ap.parse_args(argv)
    if args.write_vgg19:
        write_text(args.write_vgg19, "\n".join(vgg19()) + "\n")
        print(f"wrote {args.write_vgg19}")
        return
    os.chdir(ROOT)
    started = time.perf_counter()
    scales = compute_scales(args.chunks)
    names = ["ResNet-50", "VGG-19"] if args.quick else list(WORKLOADS)
    ratios = [1.0] if args.quick else list(RATIOS)
    points = [
        (n, WORKLOADS[n], scales[n][RATIOS.index(r)], r, p, intra, args.chunks, args.iterations)
        for n in names
        for r in ratios
        for p, intra in POLICIES
    ]
    rows = []
    for i, row in enumerate(ordered_map(_cell, points, parse_workers(args.workers))):
        rows.append(row)
        sys.stderr.write(f"\r{i + 1}/{len(points)} cells, {time.perf_counter() - started:5.1f} s")
    sys.stderr.write("\n")
    text = markdown(rows, args.chunks, args.iterations, time.perf_counter() - started)
    write_study(args.out, "scheduling", text, rows)
    plot(rows, os.path.join(args.out, "speedup.png"))
    print(text)


if __name__ == "__main__":
    main()
