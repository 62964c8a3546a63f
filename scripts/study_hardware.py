"""Model studies of the hardware: ACE, in-network aggregation, and real nccl-tests logs calibrated.

Usage::

    python scripts/study_hardware.py [--out docs/hardware] [--quick] [--workers N|mpi]
    python scripts/study_hardware.py --nccl [--logs tests/data/nccl-tests] [--out docs/hardware]

``--nccl`` (issues 29, 47) fits the NCCL-like model (`themis_mpi.nccl`) to every shipped
nccl-tests log, read as posted: the issue's figures per run, the fitted parameters, each size's
error, algorithm and protocol, more nodes predicted from one node at the NICs' nominal rate, and
measured vs model busbw per log (OUT/nccl_busbw.png). Results go to OUT/nccl.md and OUT/nccl.json.
Themis on the fitted machines: scripts/study_calibrated.py.

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
import glob
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from themis_mpi.calibrate.ncclfit import PARAM_DOC  # noqa: E402
from themis_mpi.collectives import Collective  # noqa: E402
from themis_mpi.config import RunConfig  # noqa: E402
from themis_mpi.cost import Endpoint  # noqa: E402
from themis_mpi.output import atomic_path, write_study  # noqa: E402
from themis_mpi.run.collective import model_collective  # noqa: E402
from themis_mpi.run.pool import WORKERS_HELP, ordered_map, parse_workers  # noqa: E402
from themis_mpi.run.training import model_training  # noqa: E402
from themis_mpi.topology import parse_topology  # noqa: E402
from themis_mpi.workloads.text import parse_workload  # noqa: E402
from themis_mpi.workloads.training import TrainingSpec  # noqa: E402

PAPER = ["3D-SW_SW_SW_hetero", "3D-FC_Ring_SW", "4D-Ring_SW_SW_SW", "4D-Ring_FC_Ring_SW"]
WORKLOADS = {
    "ResNet-50": os.path.join(ROOT, "tests/data/astra-sim-1.0-text/Resnet50_DataParallel.txt"),
    "GNMT": os.path.join(ROOT, "traces/gnmt.txt"),
    "DLRM": os.path.join(ROOT, "traces/dlrm.txt"),
}
MULTIPLES = [1, 1.5, 2, 3, 4, 6, 8]
GIB = 1 << 30

NETWORK = "ideal"  # the endpoint model is ideal's (not modelled under a sharing rule): like with like


def network_gbps(topo) -> float:
    """Summed per-NPU bandwidth of the dims with more than one NPU."""
    return sum(d.bandwidth_gbps for d in topo.dims if d.npus > 1)


def utilization(topo, size, policy, endpoint, chunks=64) -> float:
    """Ideal / time of one float32 all-reduce on the model."""
    coll = Collective("all_reduce", size // 4, "float32", chunks, tuple(range(len(topo.dims))))
    intra = "fifo" if policy == "baseline" else "scf"
    result, _ = model_collective(
        topo, coll, policy, RunConfig(intra=intra, endpoint=endpoint, network=NETWORK)
    )
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
        net = model_training(wl, topo, "themis", spec, RunConfig(intra="scf", network=NETWORK)).iteration_us
        cells = []
        for m in multiples:
            best = min(
                (
                    model_training(
                        wl,
                        topo,
                        "themis",
                        spec,
                        RunConfig(intra="scf", endpoint=Endpoint(m * b, s), network=NETWORK),
                    ).iteration_us,
                    s,
                )
                for s in shares
            )
            ace = model_training(
                wl,
                topo,
                "themis",
                spec,
                RunConfig(intra="scf", endpoint=Endpoint(m * b, 0, True), network=NETWORK),
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
                    result, _ = model_collective(tp, coll, policy, RunConfig(intra=intra, network=NETWORK))
                    t[policy + label] = result.time_us
            gain = min(t["baseline"], t["themis"]) / min(t["baseline+ina"], t["themis+ina"])
            rows.append({"study": "ina", "topology": name, "size": size, **t})
            lines.append(
                f"| {name} | {size >> 20} MiB | {t['baseline']:.1f} | {t['baseline+ina']:.1f} | "
                f"{t['themis']:.1f} | {t['themis+ina']:.1f} | {gain:.2f}x |"
            )
    return lines


NCCL_LOGS_GLOB = "*.txt"  # every shipped log of --logs, read as posted (no flag), in name order
NCCL_PREDICTIONS = [  # one-node log -> more nodes (table of the log; None: its only table)
    ("mi300x8_1node_rccl.txt", "mi300x16_2node_roce_rccl.txt", None),
    ("h100x8_nvls_dgxc.txt", "h100x16_2node_ib_issue309_qoofyk.txt", None),
    ("h100x8_nvls_dgxc.txt", "h100x16_2node_ib_ring_issue309_gjaion.txt", None),
    ("mi325x_1to8node_ring_PARTIAL.txt", "mi325x_1to8node_ring_PARTIAL.txt", 2),
    ("mi325x_1to8node_ring_PARTIAL.txt", "mi325x_1to8node_ring_PARTIAL.txt", 3),
    ("mi325x_1to8node_ring_PARTIAL.txt", "mi325x_1to8node_ring_PARTIAL.txt", 4),
]


def _fmt_size(n: int) -> str:
    from themis_mpi.units import format_size

    return format_size(n)


def _us(v) -> str:
    return "" if v is None else f"{v:.2f}"


def _pct(v: float) -> str:
    import math

    return f"{v:.1f}" if math.isfinite(v) else "n/a"


def nccl_study(rows: list, logs_dir: str, out: str) -> list[str]:
    """Fit every log, tabulate the issue's figures and each size, predict more nodes, plot busbw."""
    from themis_mpi.calibrate import fit_nccl, read_nccl_log

    lines = [
        "## Real nccl-tests logs and the NCCL-like model (issues 29, 47)",
        "",
        "Every shipped log read as posted (`themis-mpi calibrate LOG`, no flag), fitted on the even-indexed "
        "sizes of each run (all sizes of a run of fewer than six; each size's time the faster of its "
        "out-of-place and in-place runs), judged on the odd ones against the out-of-place time. "
        "|time error| %: median, 90th percentile and worst of the held-out sizes from 64 KiB, worst from "
        "64 MiB (issue 47's bounds: 3, 10, 15 and 5 %); partial runs: worst of all sizes (bound 5 %).",
        "",
        "| log | run | machine (from the log) | median | p90 | worst from 64 KiB | worst from 64 MiB "
        "| on a bound |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fits, details = [], []
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(logs_dir, NCCL_LOGS_GLOB)))
    for name in names:
        log = read_nccl_log(os.path.join(logs_dir, name))
        result = fit_nccl(log)
        fits.append((name, log, result))
        machine = result.machine[0].split(":")[0]
        for run in result.runs:
            s = run["summary"]
            partial = not s["held_out"]
            rows.append({"study": "nccl_fit", "log": name, "run": run["label"], "summary": s})
            figures = (
                f"all sizes: worst {_pct(s['worst_all_pct'])} | | | |"
                if partial
                else f"{_pct(s['median_pct'])} | {_pct(s['p90_pct'])} | {_pct(s['worst_from_64KiB_pct'])} | "
                f"{_pct(s['worst_from_64MiB_pct'])} |"
            )
            bounds = ", ".join(result.on_bounds) or "none"
            lines.append(f"| {name} | {run['label']} | {machine} | {figures} {bounds} |")
        rows.append(
            {"study": "nccl_params", "log": name, "topology": result.topology, "fitted": result.fitted}
        )
        details += [f"### {name}", "", *(f"- {m}" for m in result.machine), ""]
        details += ["| parameter | value | what |", "|---|---|---|"]
        details += [f"| {k} | {v:g} | {PARAM_DOC[k]} |" for k, v in result.fitted.items()]
        details += ["", f"topology: `{result.topology}`", ""]
        for run in result.runs:
            details += [
                f"{run['label']}:",
                "",
                "| size | fitted | measured us | in place us | model us | error % | algorithm | protocol |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for r in run["rows"]:
                details.append(
                    f"| {_fmt_size(r['size_bytes'])} | {'*' if r['fitted'] else ''} | "
                    f"{r['measured_us']:.2f} | {_us(r['in_place_us'])} | "
                    f"{r['model_us']:.2f} | {r['time_error_pct']:+.1f} | {r['algorithm']} | {r['protocol']} |"
                )
            details.append("")
    lines += ["", *nccl_predictions(rows, logs_dir, fits), *nccl_plot(fits, out), *details]
    return lines


def nccl_predictions(rows: list, logs_dir: str, fits) -> list[str]:
    """More nodes predicted from a one-node fit and the NICs' nominal rate: the error at every size."""
    from themis_mpi.calibrate import fit_nccl, predict, read_nccl_log
    from themis_mpi.topology import parse_topology

    by_name = {name: result for name, _, result in fits}
    lines = [
        "### More nodes predicted from one node (issue 47, item 7)",
        "",
        "The one-node fit, the other log's node count and its GPUs' nominal NIC rate, NCCL's network step "
        "(14 us), nothing fitted on the multi-node log: time error % at every size.",
        "",
    ]
    for one, more, table in NCCL_PREDICTIONS:
        base = by_name[one] if one != more else fit_nccl(read_nccl_log(os.path.join(logs_dir, one), table=1))
        target = read_nccl_log(os.path.join(logs_dir, more), table=table)
        p = predict(parse_topology(base.topology), target)
        rows.append({"study": "nccl_prediction", "one": one, "more": more, "table": table, **p})
        big = [abs(r["time_error_pct"]) for r in p["rows"] if r["size_bytes"] >= 256 << 20]
        lines += [
            f"**{one} -> {more}" + (f" (table {table})" if table else "") + f"**: `{p['topology']}`; "
            f"worst from 256 MiB {max(big):.1f} %",
            "",
            "| size | " + " | ".join(_fmt_size(r["size_bytes"]) for r in p["rows"]) + " |",
            "|---|" + "---|" * len(p["rows"]),
            "| error % | " + " | ".join(f"{r['time_error_pct']:+.1f}" for r in p["rows"]) + " |",
            "",
        ]
    return lines


def nccl_plot(fits, out: str) -> list[str]:
    """Measured vs model busbw per log and run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 3, figsize=(15, 12))
    for ax, (name, _, result) in zip(axes.flat, fits):
        for run in result.runs:
            x = [r["size_bytes"] for r in run["rows"]]
            ax.plot(x, [r["measured_busbw"] for r in run["rows"]], "o", ms=4, color="black")
            ax.plot(x, [r["model_busbw"] for r in run["rows"]], "-", color="tab:blue")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size per NPU (bytes)")
        ax.set_ylabel("busbw (GB/s, 1e9 B/s)")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle("nccl-tests busbw: measured (dots) vs the calibrated NCCL-like model (line)")
    fig.tight_layout()
    path = os.path.join(out, "nccl_busbw.png")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)
    return ["### Measured vs model busbw", "", "![measured vs model busbw per log](nccl_busbw.png)", ""]


SECTIONS = ("ace_utilization", "ace_needed", "ace_training", "ina_study")  # in the page's order


def _section(part) -> tuple[list[dict], list[str]]:
    """One section of the page: its rows and its lines (the sections run on the pool)."""
    name, quick = part
    rows: list[dict] = []
    lines = globals()[name](rows, quick)
    return rows, lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/hardware", help="output directory")
    ap.add_argument("--quick", action="store_true", help="fewer topologies and points (for a smoke test)")
    ap.add_argument("--nccl", action="store_true", help="the nccl-tests logs study only (issue 29)")
    ap.add_argument("--logs", default=os.path.join(ROOT, "tests/data/nccl-tests"), help="nccl-tests logs")
    ap.add_argument("--workers", default="1", help=f"{WORKERS_HELP}; the four sections run in parallel")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.nccl:
        os.makedirs(args.out, exist_ok=True)
        nccl_rows: list[dict] = []
        text = "\n".join(nccl_study(nccl_rows, args.logs, args.out)) + "\n"
        print(text)
        print(f"# {time.perf_counter() - t0:.1f} s")
        write_study(args.out, "nccl", text, nccl_rows)
        return
    rows: list[dict] = []
    sections = []
    parts = [(name, args.quick) for name in SECTIONS]
    for part_rows, lines in ordered_map(_section, parts, parse_workers(args.workers)):
        rows += part_rows
        sections.append(lines)
    text = "\n\n".join("\n".join(s) for s in sections) + "\n"
    print(text)
    print(f"# {time.perf_counter() - t0:.1f} s")
    write_study(args.out, "hardware", text, rows)


if __name__ == "__main__":
    main()
