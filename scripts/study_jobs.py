"""Two jobs sharing a NIC or a dim: issued together vs interleaved, under baseline and Themis.

Usage::

    python scripts/study_jobs.py [--out docs/jobs] [--quick] [--chunks 8] [--iterations 4] [--workers N|mpi]

Topology: the HGX-H100-SW_SW_SW preset (dims 1 and 2 leave each GPU through one NIC), under
``--network fair``. Two data-parallel jobs, both on every NPU, in three placements:

- ``nic``: A on dim 1, B on dim 2: their dims share only the NIC;
- ``dim0+nic``: A on dims 0,1, B on dims 0,2: they share NVLink (dim 0) and the NIC;
- ``all``: both on every dim: they share everything.

Each pair runs VGG-19 twice (A and B alike) and, outside ``--quick``, GNMT twice and ASTRA-sim's
ResNet-50 beside VGG-19 (ResNet-50's many small all-reduces are latency-bound on this machine's
1.7 us scale-out hops, so the NIC's bandwidth matters little to it).
Each job's compute is scaled (its placement's ``compute_scale``) so that its communication alone
on its dims (an iteration without compute, baseline) is RATIO times its compute. "Together" starts both jobs
at 0; "interleaved" starts B half of its solo iteration late, so that one job's communication
falls in the other's compute. "One period" first scales B's compute so that its solo iteration
equals A's (a secant search), so that the offset cannot drift, and then runs together and
interleaved (B half of A's solo iteration late). A job's iteration time runs from its own start;
the slowdown is over the job alone on the network (same policy). Writes jobs.json and jobs.md
into --out (atomic writes) and prints the table.
"""

import argparse
import os
import sys
import time

from themis_mpi.config import RunConfig
from themis_mpi.model import ModelTransport
from themis_mpi.output import write_study
from themis_mpi.run.jobs import Job, Placement, check_jobs, run_jobs
from themis_mpi.run.pool import WORKERS_HELP, ordered_map, parse_workers
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPOLOGY = "HGX-H100-SW_SW_SW"
RESNET = "tests/data/astra-sim-1.0-text/Resnet50_DataParallel.txt"
GNMT = "traces/gnmt.txt"
VGG = "traces/vgg19.txt"
PAIRS = {"VGG-19 + VGG-19": (VGG, VGG), "GNMT + GNMT": (GNMT, GNMT), "ResNet-50 + VGG-19": (RESNET, VGG)}
PLACEMENTS = {"nic": ((1,), (2,)), "dim0+nic": ((0, 1), (0, 2)), "all": (None, None)}
POLICIES = (("baseline", "fifo"), ("themis", "scf"))
RATIOS = (0.5, 1.0, 2.0)  # each job's communication / compute


def jobs_of(paths, dims, scales=(1.0, 1.0), delay_ns: float = 0.0) -> list[Job]:
    """The pair as jobs, each with its compute scale, B started `delay_ns` late."""
    (a, b), (da, db), (sa, sb) = paths, dims, scales
    return [
        Job(parse_workload(os.path.join(ROOT, a)), Placement(da, compute_scale=sa), "A"),
        Job(parse_workload(os.path.join(ROOT, b)), Placement(db, delay_ns=delay_ns, compute_scale=sb), "B"),
    ]


def iterations_us(jobs, spec, policy: str, intra: str) -> list[float]:
    """Each job's iteration time on the model under fair sharing."""
    topo = parse_topology(TOPOLOGY)
    check_jobs(jobs, topo, spec)
    result = run_jobs(ModelTransport(topo, RunConfig(intra=intra, network="fair")), jobs, policy, spec)
    return [r.iteration_us for r in result.jobs]


def compute_scale(path: str, dims, ratio: float, chunks: int) -> float:
    """The compute scale at which a job's communication alone is `ratio` times its compute."""
    (job,) = jobs_of((path, path), (dims, dims))[:1]
    no_compute = TrainingSpec(chunks, iterations=1, compute_scale=0.0)
    comm_us = iterations_us([job], no_compute, "baseline", "fifo")[0]
    topo = parse_topology(TOPOLOGY)
    spec = TrainingSpec(chunks, iterations=1)
    row = run_jobs(ModelTransport(topo, RunConfig(network="fair")), [job], "baseline", spec).jobs[0]
    return comm_us / (ratio * row.compute_us)


def cell(
    pair: str, placement: str, ratio: float, policy: str, intra: str, chunks: int, iterations: int
) -> dict:
    """One (pair, placement, ratio, policy): solo, together and interleaved iteration times."""
    paths, dims = PAIRS[pair], PLACEMENTS[placement]
    scales = tuple(compute_scale(p, d, ratio, chunks) for p, d in zip(paths, dims))
    spec = TrainingSpec(chunks, iterations=iterations)
    pair_jobs = jobs_of(paths, dims, scales)
    solo = [iterations_us([job], spec, policy, intra)[0] for job in pair_jobs]
    together = iterations_us(pair_jobs, spec, policy, intra)
    delay_ns = solo[1] / 2 * 1e3
    interleaved = iterations_us(jobs_of(paths, dims, scales, delay_ns), spec, policy, intra)
    matched = matched_scale(paths, dims, scales, solo, spec, policy, intra)
    same = {}
    if matched is not None:
        both = (scales[0], matched)
        half_ns = solo[0] / 2 * 1e3
        same = {
            "matched_scale": matched,
            "matched_solo_us": iterations_us(jobs_of(paths, dims, both)[1:], spec, policy, intra)[0],
            "matched_together_us": iterations_us(jobs_of(paths, dims, both), spec, policy, intra),
            "matched_interleaved_us": iterations_us(jobs_of(paths, dims, both, half_ns), spec, policy, intra),
        }
        solos = (solo[0], same["matched_solo_us"])
        for mode in ("together", "interleaved"):
            same[f"matched_{mode}_slowdown"] = [t / s for t, s in zip(same[f"matched_{mode}_us"], solos)]
    return {
        "pair": pair,
        "placement": placement,
        "ratio": ratio,
        "compute_scale": list(scales),
        "policy": policy,
        "intra": intra,
        "solo_us": solo,
        "together_us": together,
        "interleaved_us": interleaved,
        "delay_us": delay_ns / 1e3,
        "together_slowdown": [t / s for t, s in zip(together, solo)],
        "interleaved_slowdown": [t / s for t, s in zip(interleaved, solo)],
        **same,
    }


def matched_scale(paths, dims, scales, solo, spec, policy: str, intra: str, rel: float = 1e-3):
    """B's compute scale at which its solo iteration equals A's (secant), or None if none can.

    With one period, an offset of half an iteration stays half an iteration (CASSINI's
    condition); B's communication is unchanged, only its compute stretches or shrinks.
    """

    def gap(scale_b: float) -> float:
        job = jobs_of(paths, dims, (scales[0], scale_b))[1]
        return iterations_us([job], spec, policy, intra)[0] - solo[0]

    x0, f0 = scales[1], solo[1] - solo[0]
    if abs(f0) <= rel * solo[0]:
        return x0
    if gap(0.0) > 0:  # B's communication alone is longer than A's iteration
        return None
    x1 = x0 * solo[0] / solo[1]
    f1 = gap(x1)
    for _ in range(12):
        if abs(f1) <= rel * solo[0] or f1 == f0:
            break
        x0, x1, f0 = x1, max(0.0, x1 - f1 * (x1 - x0) / (f1 - f0)), f1
        f1 = gap(x1)
    return x1 if abs(f1) <= rel * solo[0] else None


def table(rows: list[dict]) -> str:
    """The study as a Markdown table: slowdowns over solo, A / B, together and interleaved."""
    lines = [
        "| pair | placement | comm/compute | policy | A solo (ms) | B solo (ms) | together A / B | "
        "interleaved A / B | one period: together A / B | one period: interleaved A / B |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def pair_of(r: dict, key: str) -> str:
        return " / ".join(f"{s:.3f}x" for s in r[key]) if key in r else "-"

    for r in rows:
        lines.append(
            f"| {r['pair']} | {r['placement']} | {r['ratio']:g} | {r['policy']} "
            f"| {r['solo_us'][0] / 1e3:.3f} | {r['solo_us'][1] / 1e3:.3f} "
            f"| {pair_of(r, 'together_slowdown')} | {pair_of(r, 'interleaved_slowdown')} "
            f"| {pair_of(r, 'matched_together_slowdown')} | {pair_of(r, 'matched_interleaved_slowdown')} |"
        )
    return "\n".join(lines)


def themis_vs_baseline(rows: list[dict]) -> str:
    """Themis's speedup over baseline per cell and mode (mean of the two jobs' iteration times)."""
    lines = [
        "| pair | placement | comm/compute | solo | together | interleaved |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for base in (r for r in rows if r["policy"] == "baseline"):
        key = (base["pair"], base["placement"], base["ratio"])
        them = next(
            r for r in rows if r["policy"] == "themis" and (r["pair"], r["placement"], r["ratio"]) == key
        )
        cols = [sum(base[k]) / sum(them[k]) for k in ("solo_us", "together_us", "interleaved_us")]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]:g} | " + " | ".join(f"{c:.3f}x" for c in cols) + " |")
    return "\n".join(lines)


def _cell(args: tuple) -> dict:
    """One cell of the grid (a module-level function, as a process pool needs)."""
    return cell(*args)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument(
        "--out", default=os.path.join(ROOT, "docs", "jobs"), help="folder of jobs.json and jobs.md"
    )
    p.add_argument("--quick", action="store_true", help="one pair and one ratio (a smoke run)")
    p.add_argument("--chunks", type=int, default=8, help="chunks per collective (default 8)")
    p.add_argument("--iterations", type=int, default=4, help="training iterations (default 4)")
    p.add_argument("--workers", default="1", help=WORKERS_HELP)
    args = p.parse_args(argv)
    pairs = list(PAIRS)[:1] if args.quick else list(PAIRS)
    ratios = (1.0,) if args.quick else RATIOS
    t0 = time.perf_counter()
    grid = [
        (pair, placement, ratio, policy, intra, args.chunks, args.iterations)
        for pair in pairs
        for placement in PLACEMENTS
        for ratio in ratios
        for policy, intra in POLICIES
    ]
    rows = list(ordered_map(_cell, grid, parse_workers(args.workers)))
    elapsed = time.perf_counter() - t0
    text = (
        f"**Slowdown over solo, two jobs on {TOPOLOGY} under --network fair** ({args.chunks} chunks per "
        f"collective, {args.iterations} iterations; A / B; interleaved: B starts half its solo iteration "
        "late; one period: B's compute scaled so that its solo iteration is A's, then B half of it "
        "late)\n\n"
        + table(rows)
        + "\n\n**Themis over baseline** (sum of the two jobs' iteration times)\n\n"
        + themis_vs_baseline(rows)
        + f"\n\n{len(rows)} cells in {elapsed:.0f} s.\n"
    )
    write_study(args.out, "jobs", text, rows)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
