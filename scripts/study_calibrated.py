"""Themis on calibrated machines: every shipped nccl-tests log fitted, then baseline vs Themis on it.

Usage::

    python scripts/study_calibrated.py [--logs tests/data/nccl-tests] [--out docs/hardware] [--quick]

For each log of --logs (a log of several runs gives the machine of its largest run) calibrate fits
the NCCL-like model (`themis_mpi.calibrate`), and the study asks the fitted machine:

1. one all-reduce of 64 MiB and 1 GiB per NPU: the fitted (flat) machine, baseline and Themis, at
   one chunk (one NCCL call); the per-dim view of the fit at that size (`calibrate.per_dim`: one
   dim per level, the fit's rates and latencies, scaled so that its one-chunk baseline takes the
   flat time), baseline (FIFO) and Themis (SCF) at 1, 4, 16 and 64 chunks;
2. a training iteration of ResNet-152, GNMT and DLRM (the paper's workloads that fit 8 to 64
   NPUs; Transformer-1T needs a model-parallel group of 128) on the per-dim view at 64 MiB, 4 and
   16 chunks;
3. the case issue 47 reports (the earlier 2-node fit's per-dim ring stages, 1 GiB in 4 chunks:
   Themis+SCF 10.3 ms against the baseline's 4.6 ms): every chunk's order, each dim's bytes.

Runs use ``network="ideal"`` (per-dim stages one at a time per dim, one message per ring step:
the sharing rules agree there). ``--quick``: two logs, one workload, part 3; its rows are those of
the full study (a test compares them). Writes OUT/themis.md and OUT/themis.json.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from themis_mpi.calibrate import fit_nccl, per_dim, read_nccl_log  # noqa: E402
from themis_mpi.collectives import Collective  # noqa: E402
from themis_mpi.config import RunConfig  # noqa: E402
from themis_mpi.output import write_study  # noqa: E402
from themis_mpi.run.collective import model_collective  # noqa: E402
from themis_mpi.run.training import model_training  # noqa: E402
from themis_mpi.topology import parse_topology  # noqa: E402
from themis_mpi.units import format_size  # noqa: E402
from themis_mpi.workloads.text import parse_workload  # noqa: E402
from themis_mpi.workloads.training import TrainingSpec  # noqa: E402

QUICK_LOGS = ["h100x16_2node_ib_issue309_qoofyk.txt", "h100x8_nvls_dgxc.txt"]  # the quick test's subset
SIZES = (64 << 20, 1 << 30)
CHUNKS = (1, 4, 16, 64)
WORKLOADS = ("resnet152", "gnmt", "dlrm")
QUICK_WORKLOADS = ("dlrm",)
TRAIN_CHUNKS = (4, 16)
TRAIN_SIZE = 64 << 20
POLICIES = (("baseline", "fifo"), ("themis", "scf"))
ISSUE_CASE = "SW(8,419.095,600,ring)_SW(2,35.778,2047.4,ring)"  # docs/hardware/nccl.md before issue 47


def config(intra: str) -> RunConfig:
    """The study's settings: the policy's own intra-dim queue, links shared by nothing."""
    return RunConfig(intra=intra, network="ideal")


def all_reduce_us(topo, size: int, chunks: int, policy: str, intra: str) -> float:
    """One float32 all-reduce over every dim, on the model."""
    coll = Collective("all_reduce", size // 4, "float32", chunks, tuple(range(len(topo.dims))))
    return model_collective(topo, coll, policy, config(intra))[0].time_us


def machine_rows(name: str, logs_dir: str, workloads) -> tuple[list[dict], list[str]]:
    """Parts 1 and 2 for one log."""
    log = read_nccl_log(os.path.join(logs_dir, name))
    fit = fit_nccl(log)
    flat = parse_topology(fit.topology)
    rows, lines = [], [f"### {name}: `{fit.topology}`", ""]
    lines += [
        "| size | flat, 1 chunk: baseline / Themis (us) | per-dim view | "
        + " | ".join(f"{c} chunk(s): baseline / Themis (us)" for c in CHUNKS)
        + " |",
        "|---|---|---|" + "---|" * len(CHUNKS),
    ]
    for size in SIZES:
        t_flat = {p: all_reduce_us(flat, size, 1, p, i) for p, i in POLICIES}
        view = per_dim(flat, size)
        cells = []
        for chunks in CHUNKS:
            t = {p: all_reduce_us(view, size, chunks, p, i) for p, i in POLICIES}
            rows.append({"part": "all_reduce", "log": name, "size": size, "chunks": chunks, **t})
            cells.append(f"{t['baseline']:.1f} / {t['themis']:.1f}")
        rows.append({"part": "flat", "log": name, "size": size, "chunks": 1, "view": view.spec(), **t_flat})
        lines.append(
            f"| {format_size(size)} | {t_flat['baseline']:.1f} / {t_flat['themis']:.1f} | `{view.spec()}` | "
            + " | ".join(cells)
            + " |"
        )
    if len(flat.dims) > 1 and workloads:
        view = per_dim(flat, TRAIN_SIZE)
        lines += [
            "",
            "| workload | "
            + " | ".join(f"{c} chunks: baseline / Themis iteration (us), speedup" for c in TRAIN_CHUNKS)
            + " |",
            "|---|" + "---|" * len(TRAIN_CHUNKS),
        ]
        for wl_name in workloads:
            wl = parse_workload(os.path.join(ROOT, "traces", f"{wl_name}.txt"))
            cells = []
            for chunks in TRAIN_CHUNKS:
                spec = TrainingSpec(chunks=chunks, iterations=1)
                t = {p: model_training(wl, view, p, spec, config(i)).iteration_us for p, i in POLICIES}
                rows.append({"part": "training", "log": name, "workload": wl_name, "chunks": chunks, **t})
                cells.append(f"{t['baseline']:.0f} / {t['themis']:.0f}, {t['baseline'] / t['themis']:.3f}x")
            lines.append(f"| {wl_name} | " + " | ".join(cells) + " |")
    return rows, lines + [""]


def issue_case() -> tuple[list[dict], list[str]]:
    """Part 3: the earlier per-dim case, chunk orders and bytes per dim."""
    topo = parse_topology(ISSUE_CASE)
    rows, lines = [], [f"### The case of issue 47: `{ISSUE_CASE}`, 1 GiB", ""]
    lines += [
        "| chunks | baseline (us) | Themis (us) | Themis's chunk orders | dim-1 MiB: baseline / Themis |"
    ]
    lines += ["|---|---|---|---|---|"]
    for chunks in CHUNKS:
        coll = Collective("all_reduce", (1 << 30) // 4, "float32", chunks, (0, 1))
        out, engines = {}, {}
        for policy, intra in POLICIES:
            out[policy], engines[policy] = model_collective(topo, coll, policy, config(intra))
        orders = [[int(d) for d in row] for row in engines["themis"].collectives[0].orders.tolist()]
        dim1 = {p: r.dims[1].bytes / 2**20 for p, r in out.items()}
        rows.append(
            {
                "part": "issue_case",
                "chunks": chunks,
                "baseline": out["baseline"].time_us,
                "themis": out["themis"].time_us,
                "themis_orders": orders,
                "dim1_mib": dim1,
            }
        )
        shown = " ".join("".join(map(str, o)) for o in orders[:8]) + (" ..." if len(orders) > 8 else "")
        lines.append(
            f"| {chunks} | {out['baseline'].time_us:.1f} | {out['themis'].time_us:.1f} | {shown} | "
            f"{dim1['baseline']:.0f} / {dim1['themis']:.0f} |"
        )
    return rows, lines + [""]


def main(argv: list[str] | None = None) -> int:
    """Fit every log, ask each fitted machine, print the page, write OUT/themis.md and .json."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", default=os.path.join(ROOT, "tests", "data", "nccl-tests"), help="the logs")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "hardware"), help="output directory")
    ap.add_argument("--quick", action="store_true", help="two logs, one workload (a test's subset)")
    args = ap.parse_args(argv)
    t0 = time.process_time()
    rows, lines = [], ["## Themis on calibrated machines (issue 47)", ""]
    logs = sorted(os.path.basename(p) for p in glob.glob(os.path.join(args.logs, "*.txt")))
    for name in QUICK_LOGS if args.quick else logs:
        more, text = machine_rows(name, args.logs, QUICK_WORKLOADS if args.quick else WORKLOADS)
        rows += more
        lines += text
    more, text = issue_case()
    rows += more
    lines += text
    page = "\n".join(lines) + "\n"
    write_study(args.out, "themis", page, rows)
    print(page)
    print(f"# {time.process_time() - t0:.0f} s of CPU; wrote {os.path.join(args.out, 'themis.md')} and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
