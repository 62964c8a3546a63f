"""Model studies of the hardware in issue 16: ACE against NPU memory bandwidth, and in-network aggregation.

Usage::

    python scripts/study_hardware.py [--out docs/hardware] [--quick]

ACE (Rashidi et al., ISCA 2020), on the model:
1. network utilization (ideal / time) of a 1 GiB all-reduce, 64 chunks, on the paper's four
   1024-NPU topologies, with and without ACE, as the HBM bandwidth H goes from 1x to 8x the
   topology's summed network bandwidth;
2. the memory bandwidth each needs to reach 95 % of the utilization the network alone allows;
3. training iterations of ResNet-50, GNMT and DLRM on 3D-SW_SW_SW_hetero (Themis+SCF), the
   baseline NPU at its best compute share (0, 0.25, 0.5, 0.75) against ACE.

INA: baseline and Themis, with and without ``ina`` on every Switch dim, on the paper's four
topologies and the HGX-H100 preset, at 64 MiB and 1 GiB.

Assumptions (docs/hardware.md#the-endpoint-model-and-ace states the formulas): every reduced byte costs
the NPU 5 bytes of memory traffic and every copied byte 2, ACE 2 per chunk byte in all; the
memory bandwidth is split between dims by network bandwidth; compute is memory-bound and keeps
at least its share. Results go to OUT/hardware.md and OUT/hardware.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from themis_mpi.collectives import Collective  # noqa: E402
from themis_mpi.cost import Endpoint  # noqa: E402
from themis_mpi.driver import RunConfig  # noqa: E402
from themis_mpi.model import model_collective, model_training  # noqa: E402
from themis_mpi.output import atomic_path, write_json  # noqa: E402
from themis_mpi.topology import parse_topology  # noqa: E402
from themis_mpi.training import TrainingSpec  # noqa: E402
from themis_mpi.workload import parse_workload  # noqa: E402

PAPER = ["3D-SW_SW_SW_hetero", "3D-FC_Ring_SW", "4D-Ring_SW_SW_SW", "4D-Ring_FC_Ring_SW"]
WORKLOADS = {
    "ResNet-50": os.path.join(ROOT, "tests/data/astra-sim-1.0-text/Resnet50_DataParallel.txt"),
    "GNMT": os.path.join(ROOT, "traces/gnmt.txt"),
    "DLRM": os.path.join(ROOT, "traces/dlrm.txt"),
}
MULTIPLES = [1, 1.5, 2, 3, 4, 6, 8]
GIB = 1 << 30


def network_gbps(topo) -> float:
    """Summed per-NPU bandwidth of the dims with more than one NPU."""
    return sum(d.bandwidth_gbps for d in topo.dims if d.npus > 1)


def utilization(topo, size, policy, endpoint, chunks=64) -> float:
    """Ideal / time of one float32 all-reduce on the model."""
    coll = Collective("all_reduce", size // 4, "float32", chunks, tuple(range(len(topo.dims))))
    intra = "fifo" if policy == "baseline" else "scf"
    result, _ = model_collective(topo, coll, policy, RunConfig(intra=intra, endpoint=endpoint))
    return result.utilization


def ace_utilization(rows: list, quick: bool) -> list[str]:
    lines = [
        "### ACE: network utilization (%) of a 1 GiB all-reduce, 64 chunks, Themis+SCF, vs HBM bandwidth",
        "",
        "H is given as a multiple of the topology's summed network bandwidth (sum B). 'net' is the "
        "utilization without the endpoint model (the network alone).",
        "",
        "| topology | sum B (GB/s) | net | " + " | ".join(f"H={m:g}x: NPU / ACE" for m in MULTIPLES) + " |",
        "|---|---|---|" + "---|" * len(MULTIPLES),
    ]
    ratios: dict[float, list[float]] = {m: [] for m in MULTIPLES}
    for name in PAPER[:2] if quick else PAPER:
        topo = parse_topology(name)
        b = network_gbps(topo)
        net = utilization(topo, GIB, "themis", Endpoint())
        cells = []
        for m in MULTIPLES:
            npu = utilization(topo, GIB, "themis", Endpoint(m * b))
            ace = utilization(topo, GIB, "themis", Endpoint(m * b, 0, True))
            ratios[m].append(ace / npu)
            rows.append(
                {"study": "ace_util", "topology": name, "multiple": m, "npu": npu, "ace": ace, "net": net}
            )
            cells.append(f"{100 * npu:.1f} / {100 * ace:.1f}")
        lines.append(f"| {name} | {b:g} | {100 * net:.1f} | " + " | ".join(cells) + " |")
    lines.append(
        "| **ACE / NPU, mean** | | | "
        + " | ".join(f"**{sum(r) / len(r):.2f}x**" for r in ratios.values())
        + " |"
    )
    return lines


def needed_multiple(topo, ace: bool, target: float) -> float:
    """Smallest H / sum B (bisection, 1 % steps) at which utilization reaches `target`."""
    b = network_gbps(topo)
    lo, hi = 0.05, 16.0
    while hi / lo > 1.01:
        mid = (lo * hi) ** 0.5
        if utilization(topo, GIB, "themis", Endpoint(mid * b, 0, ace)) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def ace_needed(rows: list, quick: bool) -> list[str]:
    lines = [
        "### Memory bandwidth needed to reach 95 % of the network-alone utilization (H / sum B)",
        "",
        "| topology | NPU reduces | ACE | NPU / ACE |",
        "|---|---|---|---|",
    ]
    ratios = []
    for name in PAPER[:2] if quick else PAPER:
        topo = parse_topology(name)
        target = 0.95 * utilization(topo, GIB, "themis", Endpoint())
        npu, ace = needed_multiple(topo, False, target), needed_multiple(topo, True, target)
        ratios.append(npu / ace)
        rows.append({"study": "ace_needed", "topology": name, "npu": npu, "ace": ace})
        lines.append(f"| {name} | {npu:.2f} | {ace:.2f} | {npu / ace:.2f}x |")
    lines.append(f"| **mean** | | | **{sum(ratios) / len(ratios):.2f}x** |")
    return lines


def ace_training(rows: list, quick: bool) -> list[str]:
    topo_name = "3D-SW_SW_SW_hetero"
    topo = parse_topology(topo_name)
    b = network_gbps(topo)
    multiples = [1, 2, 4] if quick else [1, 2, 3, 4, 8]
    shares = [0.0, 0.5] if quick else [0.0, 0.25, 0.5, 0.75]
    spec = TrainingSpec(chunks=16, iterations=1)
    lines = [
        f"### ACE: iteration time (us) on {topo_name}, Themis+SCF, 16 chunks, vs HBM bandwidth",
        "",
        "Baseline NPU: the best of compute shares " + ", ".join(f"{s:g}" for s in shares) + " (in brackets). "
        "ACE at compute share 0. 'net' has no endpoint model.",
        "",
        "| workload | net | "
        + " | ".join(f"H={m:g}x: NPU [share] / ACE / speedup" for m in multiples)
        + " |",
        "|---|---|" + "---|" * len(multiples),
    ]
    for wl_name, path in WORKLOADS.items():
        wl = parse_workload(path)
        net = model_training(wl, topo, "themis", spec, RunConfig(intra="scf")).iteration_us
        cells = []
        for m in multiples:
            best = min(
                (
                    model_training(
                        wl, topo, "themis", spec, RunConfig(intra="scf", endpoint=Endpoint(m * b, s))
                    ).iteration_us,
                    s,
                )
                for s in shares
            )
            ace = model_training(
                wl, topo, "themis", spec, RunConfig(intra="scf", endpoint=Endpoint(m * b, 0, True))
            ).iteration_us
            rows.append(
                {
                    "study": "ace_train",
                    "workload": wl_name,
                    "multiple": m,
                    "npu": best[0],
                    "share": best[1],
                    "ace": ace,
                    "net": net,
                }
            )
            cells.append(f"{best[0]:.0f} [{best[1]:g}] / {ace:.0f} / {best[0] / ace:.2f}x")
        lines.append(f"| {wl_name} | {net:.0f} | " + " | ".join(cells) + " |")
    return lines


def ina_study(rows: list, quick: bool) -> list[str]:
    lines = [
        "### INA: all-reduce time (us) with and without ina on every Switch dim, 64 chunks",
        "",
        "| topology | size | baseline | baseline+ina | Themis | Themis+ina | best ina / best without |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in (PAPER + ["HGX-H100-SW_SW_SW"])[: 2 if quick else None]:
        topo = parse_topology(name)
        ina = topo.with_overrides(algorithms=["ina" if d.kind == "Switch" else None for d in topo.dims])
        for size in (64 << 20, GIB):
            coll = Collective("all_reduce", size // 4, "float32", 64, tuple(range(len(topo.dims))))
            t = {}
            for label, tp in (("", topo), ("+ina", ina)):
                for policy, intra in (("baseline", "fifo"), ("themis", "scf")):
                    result, _ = model_collective(tp, coll, policy, RunConfig(intra=intra))
                    t[policy + label] = result.time_us
            gain = min(t["baseline"], t["themis"]) / min(t["baseline+ina"], t["themis+ina"])
            rows.append({"study": "ina", "topology": name, "size": size, **t})
            lines.append(
                f"| {name} | {size >> 20} MiB | {t['baseline']:.1f} | {t['baseline+ina']:.1f} | "
                f"{t['themis']:.1f} | {t['themis+ina']:.1f} | {gain:.2f}x |"
            )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/hardware", help="output directory")
    ap.add_argument("--quick", action="store_true", help="fewer topologies and points (for a smoke test)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows: list[dict] = []
    sections = [
        ace_utilization(rows, args.quick),
        ace_needed(rows, args.quick),
        ace_training(rows, args.quick),
        ina_study(rows, args.quick),
    ]
    text = "\n\n".join("\n".join(s) for s in sections) + "\n"
    print(text)
    print(f"# {time.perf_counter() - t0:.1f} s")
    os.makedirs(args.out, exist_ok=True)
    with atomic_path(os.path.join(args.out, "hardware.md")) as tmp, open(tmp, "w") as f:
        f.write(text)
    write_json(os.path.join(args.out, "hardware.json"), rows)


if __name__ == "__main__":
    main()
