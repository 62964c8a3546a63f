"""Straggler sensitivity: one slow NPU, one degraded link and one late NPU, under baseline and Themis.

Usage::

    python scripts/study_stragglers.py [--out docs/stragglers] [--workers N|mpi] [--quick]

Answers issue 30's question: does Themis's load balancing absorb a slow link or amplify it? Three
parts, all on the per-NPU model (`--network ideal`, one stage per dim at once):

- training: ASTRA-sim's ResNet-50 and traces/resnet152.txt, 2 iterations, 16 chunks, baseline
  (FIFO) and Themis (SCF); NPU 3 at 1.1x, 1.5x and 2x compute time (``--npu-compute-scale``),
  every NPU at that factor (``--compute-scale``), and NPU 3's links in one dim at 0.5x;
- collectives: all-reduce of 1 MiB to 1 GiB, 64 chunks, baseline, Themis and themisFlex; NPU 5's
  links in each dim at 0.5x and 0.25x (``--link-scale DIM:5=F``), against the healthy run and
  against the whole dim at that bandwidth (which the policies see and balance for);
- late NPU: NPU 5 starts 50 us late (``--npu-delay-us 5=50``) on an 8-NPU ring all-reduce, whose
  time is then the healthy time plus 50 us (closed form), and on 4x2.

``--quick`` runs the 8-NPU subset (2x2x2 training of ResNet-50, 4x2 collectives, the late NPU):
its rows equal the matching rows of the full run (tests/test_study_stragglers.py). Writes
study.json (every row) and study.md (the tables) into --out and prints the tables.
"""

import argparse
import os
import sys
import time

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.output import write_study
from themis_mpi.report import measured_on
from themis_mpi.run.collective import model_collective
from themis_mpi.run.pool import WORKERS_HELP, ordered_map, parse_workers
from themis_mpi.run.training import model_training
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the paper's 3D-SW_SW_SW_hetero (200/100/50 GB/s, 700/700/1700 ns) at 64 NPUs, and an 8-NPU pair
TOPOLOGIES = {
    "2x2x2": "2x2x2",
    "4x2": "4x2",
    "8": "8",
    "4x4x4-hetero": "SW(4,200,700,hd)_SW(4,100,700,hd)_SW(4,50,1700,hd)",
}
WORKLOADS = {
    "ResNet-50": "tests/data/astra-sim-1.0-text/Resnet50_DataParallel.txt",
    "ResNet-152": "traces/resnet152.txt",
    "GNMT": "traces/gnmt.txt",
}
TRAIN_POLICIES = (("baseline", "fifo"), ("themis", "scf"))
COLL_POLICIES = (("baseline", "fifo"), ("themis", "scf"), ("themisFlex", "scf"))
COMPUTE_FACTORS = (1.1, 1.5, 2.0)
LINK_FACTORS = (0.5, 0.25)
TRAIN_LINK_FACTOR = 0.5
SLOW_NPU, SLOW_LINK_NPU, LATE_NPU = 3, 5, 5
LATE_US = 50.0
COLL_CHUNKS, ITERATIONS = 64, 2
SIZES = {"1M": 2**20, "16M": 2**24, "256M": 2**28, "1G": 2**30}
TRAINING = [  # workload, topology, chunks per collective
    ("ResNet-50", "2x2x2", 4),
    ("ResNet-152", "4x4x4-hetero", 16),
    ("GNMT", "4x4x4-hetero", 16),
]
COLL_TOPOLOGIES = ("4x2", "4x4x4-hetero")
LATE_TOPOLOGIES = ("8", "4x2")
LATE_SIZES = ("1M", "256M")


def quick_point(point) -> bool:
    """Whether a point of the full grid is in the --quick subset (8 NPUs, fewer factors and sizes)."""
    kind, args = point
    if kind == "training":
        workload, topo, _, _, _, case, factor = args
        return topo == "2x2x2" and (case in ("healthy", "link dim2") or factor == 2.0)
    if kind == "collective":
        return args[0] == "4x2" and args[1] in ("1M", "256M")
    return args[1] == "1M"


WALL_KEYS = ("wall_s",)


def _topology(label: str):
    return parse_topology(TOPOLOGIES[label])


def _train(point) -> dict:
    """One training run: iteration, rank 0's compute, the wait for the slowest NPU, exposed communication."""
    workload, topo_label, chunks, policy, intra, case, factor = point
    wl = parse_workload(os.path.join(ROOT, WORKLOADS[workload]))
    topo = _topology(topo_label)
    spec = TrainingSpec(chunks=chunks, iterations=ITERATIONS)
    config = RunConfig(intra=intra)
    if case == "one NPU":
        spec = TrainingSpec(chunks, iterations=ITERATIONS, npu_compute_scale=((SLOW_NPU, factor),))
    elif case == "every NPU":
        spec = TrainingSpec(chunks, iterations=ITERATIONS, compute_scale=factor)
    elif case.startswith("link dim"):
        config = RunConfig(intra=intra, link_scale=((int(case[len("link dim") :]), SLOW_NPU, factor),))
    t0 = time.perf_counter()
    res = model_training(wl, topo, policy, spec, config)
    return {
        "part": "training",
        "workload": workload,
        "topology": topo_label,
        "npus": topo.npus,
        "chunks": chunks,
        "policy": policy,
        "intra": intra,
        "case": case,
        "factor": factor,
        "iteration_us": res.iteration_us,
        "compute_us": res.compute_us,
        "exposed_us": res.exposed_comm_us,
        "wait_us": res.wait_us,
        "wall_s": time.perf_counter() - t0,
    }


def _collective(point) -> dict:
    """One all-reduce: time (us) and the per-dim bytes and busy time of NPU `SLOW_LINK_NPU`'s schedule."""
    topo_label, size, policy, intra, case, dim, factor = point
    topo = _topology(topo_label)
    config = RunConfig(intra=intra)
    if case == "one link":
        config = RunConfig(intra=intra, link_scale=((dim, SLOW_LINK_NPU, factor),))
    elif case == "whole dim":
        bw = [d.bandwidth_gbps * (factor if i == dim else 1.0) for i, d in enumerate(topo.dims)]
        topo = topo.with_overrides(bandwidth_gbps=bw)
    coll = Collective("all_reduce", SIZES[size] // 4, "float32", COLL_CHUNKS, tuple(range(len(topo.dims))))
    t0 = time.perf_counter()
    res, _ = model_collective(topo, coll, policy, config)
    return {
        "part": "collective",
        "topology": topo_label,
        "npus": topo.npus,
        "size": size,
        "policy": policy,
        "intra": intra,
        "case": case,
        "dim": dim,
        "factor": factor,
        "time_us": res.time_us,
        "dim_bytes": [d.bytes for d in res.dims],
        "dim_busy_us": [d.busy_us for d in res.dims],
        "wall_s": time.perf_counter() - t0,
    }


def _late(point) -> dict:
    """An all-reduce with NPU `LATE_NPU` starting `LATE_US` late, and without."""
    topo_label, size, policy, intra = point
    topo = _topology(topo_label)
    coll = Collective("all_reduce", SIZES[size] // 4, "float32", COLL_CHUNKS, tuple(range(len(topo.dims))))
    t0 = time.perf_counter()
    healthy, _ = model_collective(topo, coll, policy, RunConfig(intra=intra))
    late, _ = model_collective(
        topo, coll, policy, RunConfig(intra=intra, npu_delay_ns=((LATE_NPU, LATE_US * 1e3),))
    )
    ring = len(topo.dims) == 1 and topo.dims[0].algorithm == "ring"
    return {
        "part": "late",
        "topology": topo_label,
        "npus": topo.npus,
        "size": size,
        "policy": policy,
        "intra": intra,
        "delay_us": LATE_US,
        "healthy_us": healthy.time_us,
        "late_us": late.time_us,
        "closed_form_us": healthy.time_us + LATE_US if ring else None,
        "wall_s": time.perf_counter() - t0,
    }


def _point(point) -> dict:
    kind, args = point
    return {"training": _train, "collective": _collective, "late": _late}[kind](args)


def points(quick: bool) -> list:
    """The grid: training, collective and late-NPU runs (--quick: the `quick_point` subset)."""
    out = []
    for workload, topo_label, chunks in TRAINING:
        ndims = len(_topology(topo_label).dims)
        cases = [("healthy", 1.0)]
        cases += [(c, f) for f in COMPUTE_FACTORS for c in ("one NPU", "every NPU")]
        cases += [(f"link dim{d}", TRAIN_LINK_FACTOR) for d in range(ndims)]
        for policy, intra in TRAIN_POLICIES:
            out += [("training", (workload, topo_label, chunks, policy, intra, c, f)) for c, f in cases]
    for topo_label in COLL_TOPOLOGIES:
        ndims = len(_topology(topo_label).dims)
        cases = [("healthy", -1, 1.0)]
        cases += [(c, d, f) for d in range(ndims) for f in LINK_FACTORS for c in ("one link", "whole dim")]
        for size in SIZES:
            for policy, intra in COLL_POLICIES:
                out += [("collective", (topo_label, size, policy, intra, c, d, f)) for c, d, f in cases]
    for topo_label in LATE_TOPOLOGIES:
        for size in LATE_SIZES:
            out += [("late", (topo_label, size, policy, intra)) for policy, intra in TRAIN_POLICIES]
    return [p for p in out if quick_point(p)] if quick else out


def derive(rows: list[dict]) -> None:
    """Add slowdowns (vs healthy, vs every NPU at the factor) and Themis's speedup over baseline."""
    train = {
        (r["workload"], r["topology"], r["policy"], r["case"], r["factor"]): r
        for r in rows
        if r["part"] == "training"
    }
    for (w, t, p, case, f), r in train.items():
        r["slowdown"] = r["iteration_us"] / train[(w, t, p, "healthy", 1.0)]["iteration_us"]
        if case == "one NPU":
            r["vs_every_npu"] = r["iteration_us"] / train[(w, t, p, "every NPU", f)]["iteration_us"]
        r["themis_speedup"] = None
        if p == "themis":
            r["themis_speedup"] = train[(w, t, "baseline", case, f)]["iteration_us"] / r["iteration_us"]
    coll = {
        (r["topology"], r["size"], r["policy"], r["case"], r["dim"], r["factor"]): r
        for r in rows
        if r["part"] == "collective"
    }
    for (t, s, p, case, d, f), r in coll.items():
        r["slowdown"] = r["time_us"] / coll[(t, s, p, "healthy", -1, 1.0)]["time_us"]
        r["vs_whole_dim"] = None
        if case == "one link":
            r["vs_whole_dim"] = r["time_us"] / coll[(t, s, p, "whole dim", d, f)]["time_us"]
        r["speedup_over_baseline"] = coll[(t, s, "baseline", case, d, f)]["time_us"] / r["time_us"]


def _find(rows: list[dict], **keys) -> dict:
    """The one row with these values."""
    return next(r for r in rows if all(r[k] == v for k, v in keys.items()))


def _fmt(x, spec=".3f", suffix="x") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def tables(rows: list[dict]) -> str:
    """The study's markdown tables."""
    md = []
    train = [r for r in rows if r["part"] == "training"]
    for w, t in dict.fromkeys((r["workload"], r["topology"]) for r in train):
        sel = [r for r in train if r["workload"] == w and r["topology"] == t]
        npus = sel[0]["npus"]
        md.append(
            f"\n**Training, {w} on {t} ({npus} NPUs), {ITERATIONS} iterations, {sel[0]['chunks']} chunks**: "
            "iteration time (us), slowdown vs healthy, one NPU vs every NPU at that factor, Themis's "
            "speedup over baseline\n"
        )
        md.append(
            "| case | factor | baseline us | slowdown | vs every NPU | Themis us | slowdown | vs every NPU "
            "| Themis speedup |"
        )
        md.append("|---" * 9 + "|")
        for r in (r for r in sel if r["policy"] == "baseline"):
            th = _find(sel, policy="themis", case=r["case"], factor=r["factor"])
            md.append(
                f"| {r['case']} | {r['factor']:g} | {r['iteration_us']:.1f} | {_fmt(r['slowdown'])} "
                f"| {_fmt(r.get('vs_every_npu'))} | {th['iteration_us']:.1f} | {_fmt(th['slowdown'])} "
                f"| {_fmt(th.get('vs_every_npu'))} | {_fmt(th['themis_speedup'])} |"
            )
    coll = [r for r in rows if r["part"] == "collective"]
    policies = [p for p, _ in COLL_POLICIES]
    for t in dict.fromkeys(r["topology"] for r in coll):
        sel = [r for r in coll if r["topology"] == t]
        md.append(
            f"\n**All-reduce on {t} ({sel[0]['npus']} NPUs, {TOPOLOGIES[t]}), {COLL_CHUNKS} chunks**: "
            f"slowdown vs healthy with NPU {SLOW_LINK_NPU}'s links in one dim at F (healthy: time in us), "
            "in brackets one link over the whole dim at F; then speedup over baseline\n"
        )
        md.append(
            "| size | links | "
            + " | ".join(policies)
            + " | "
            + " | ".join(f"{p} speedup" for p in policies[1:])
            + " |"
        )
        md.append("|---" * (2 + 2 * len(policies) - 1) + "|")
        for s in dict.fromkeys(r["size"] for r in sel):
            base = [r for r in sel if r["size"] == s and r["policy"] == "baseline"]
            for r0 in (r for r in base if r["case"] != "whole dim"):
                case = f"dim{r0['dim']}:{SLOW_LINK_NPU}={r0['factor']:g}"
                case = "healthy" if r0["case"] == "healthy" else case
                cells, speed = [], []
                for p in policies:
                    r = _find(sel, size=s, policy=p, case=r0["case"], dim=r0["dim"], factor=r0["factor"])
                    if r["case"] == "healthy":
                        cells.append(f"{r['time_us']:.1f} us")
                    else:
                        cells.append(f"{r['slowdown']:.3f}x ({r['vs_whole_dim']:.3f})")
                    if p != "baseline":
                        speed.append(f"{r['speedup_over_baseline']:.3f}x")
                md.append(f"| {s} | {case} | " + " | ".join(cells + speed) + " |")
        big = list(dict.fromkeys(r["size"] for r in sel))[-1]
        healthy = [r for r in sel if r["size"] == big and r["case"] == "healthy"]
        ndims = len(healthy[0]["dim_bytes"])
        md.append(
            f"\n**Per-dim load on {t}, healthy {big} all-reduce** (one NPU's bytes sent per dim in MiB, "
            "and its busy time per dim as % of the run): where each policy leaves slack\n"
        )
        heads = " | ".join(f"dim{d} MiB | dim{d} busy" for d in range(ndims))
        md.append(f"| policy | time us | {heads} |")
        md.append("|---" * (2 + 2 * ndims) + "|")
        for r in healthy:
            loads = zip(r["dim_bytes"], r["dim_busy_us"])
            cells = [f"{b / 2**20:.1f} | {100 * u / r['time_us']:.1f}%" for b, u in loads]
            md.append(f"| {r['policy']} | {r['time_us']:.1f} | " + " | ".join(cells) + " |")
    late = [r for r in rows if r["part"] == "late"]
    md.append(
        f"\n**Late NPU**: NPU {LATE_NPU} starts {LATE_US:g} us late; all-reduce, {COLL_CHUNKS} chunks "
        "(closed form on a ring: healthy + delay)\n"
    )
    md.append("| topology | size | policy | healthy us | late us | late - healthy us | closed form us |")
    md.append("|---" * 7 + "|")
    for r in late:
        md.append(
            f"| {r['topology']} | {r['size']} | {r['policy']} | {r['healthy_us']:.2f} | {r['late_us']:.2f} "
            f"| {r['late_us'] - r['healthy_us']:.2f} | {_fmt(r['closed_form_us'], '.2f', '')} |"
        )
    return "\n".join(md) + "\n"


def main(argv=None) -> list[dict]:
    """Run the grid, write study.md and study.json into --out, print the tables; the rows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", default="results/stragglers", help="output folder (docs/stragglers is the shipped copy)"
    )
    ap.add_argument("--quick", action="store_true", help="the 8-NPU subset (under a minute)")
    ap.add_argument("--workers", default="1", help=WORKERS_HELP)
    args = ap.parse_args(argv)
    workers = parse_workers(args.workers)
    grid = points(args.quick)
    rows, started = [], time.perf_counter()
    for i, row in enumerate(ordered_map(_point, grid, workers)):
        rows.append(row)
        sys.stderr.write(f"\r{i + 1}/{len(grid)} runs, {time.perf_counter() - started:5.1f} s")
    sys.stderr.write("\n")
    derive(rows)
    text = tables(rows)
    elapsed = time.perf_counter() - started
    text += f"\n{len(grid)} runs on the per-NPU model in {elapsed:.1f} s ({measured_on()}).\n"
    write_study(args.out, "study", text, rows)
    print(text)
    return rows


if __name__ == "__main__":
    main()
