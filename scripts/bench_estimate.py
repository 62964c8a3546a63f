"""The per-unit costs behind `timing.planner.estimate`: CPU per chunk step of each simulator.

Usage::

    python scripts/bench_estimate.py [--cases one,vectors,greenlets,world] [--chunks 16]

Runs GNMT (traces/gnmt.txt, 2 iterations, one all-reduce per layer) on the model, in this
process, on what the planner picks for each case: NPUs alike (one NPU's view, 1024 NPUs), NPU 5
at 1.5x compute on ideal links (every NPU vectorised), the same under a gated scheduler
(bytescheduler: every NPU in event order) and under ``--network fair`` (every NPU's links). For
each: the chunk steps (`timing.planner.chunk_steps` of the listed collectives, as ``train``
counts them), CPU seconds (``time.process_time``, which a loaded machine does not inflate as it
does wall time), CPU per step (one NPU's view) or per NPU and step (every NPU), and what
`estimate` predicts with the constants it has. Constants in `timing.planner.STEP_US` come from
this table; ``hgx`` repeats the every-NPU-links rows on cuts of the HGX-H100 preset (64 to 256
NPUs), whose NIC the two outer dims share (docs/performance.md, "What a run will cost").
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from themis_mpi.config import RunConfig  # noqa: E402
from themis_mpi.model import ModelTransport  # noqa: E402
from themis_mpi.run.training import run_training  # noqa: E402
from themis_mpi.timing.planner import TRAINING, Run, chunk_steps, estimate, plan  # noqa: E402
from themis_mpi.topology import parse_topology  # noqa: E402
from themis_mpi.workloads.text import parse_workload  # noqa: E402
from themis_mpi.workloads.training import TrainingSpec, listed_collectives  # noqa: E402

GNMT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "traces", "gnmt.txt")
SLOW = ((5, 1.5),)
HGX = "HGX-H100-SW_SW_SW"


def hgx_cut(nodes: int, pods: int) -> str:
    """The HGX-H100 preset's dims (8 GPUs on NVLink, two NIC-shared switch dims) at fewer NPUs."""
    return f"SW(8,419.1,700,hd)_SW({nodes},46.57,1700,hd)_SW({pods},46.57,1700,hd)_NIC(1+2,46.57)"


CASES = {  # name: [(topology, rule, comm scheduler, slow NPUs)]
    "one": [(HGX, "ideal", "", ()), (HGX, "fair", "", ())],
    "vectors": [(s, "ideal", "", SLOW) for s in ("4x4x4", "8x8x8", HGX)],
    "greenlets": [(s, "ideal", "bytescheduler", SLOW) for s in ("4x4x4", "8x4x4")],
    "world": [(s, "fair", "", SLOW) for s in ("4x4x4", "8x4x4", "8x8x4", "8x8x8")],
    "hgx": [(hgx_cut(b, c), "fair", "", SLOW) for b, c in ((4, 2), (8, 2), (8, 4))],
}
HGX_CUTS = {hgx_cut(b, c): f"HGX cut ({b}, {c})" for b, c in ((4, 2), (8, 2), (8, 4))}  # short names


def row(spec_text: str, rule: str, scheduler: str, slow: tuple, chunks: int) -> dict:
    """One measured case."""
    wl = parse_workload(GNMT)
    topo = wl.fit_topology(parse_topology(spec_text))
    config = RunConfig(network=rule, comm_scheduler=scheduler)
    spec = TrainingSpec(chunks=chunks, iterations=2, npu_compute_scale=slow)
    timing = plan(Run(topo, config, TRAINING, slow_compute=bool(slow)))
    steps = spec.iterations * chunk_steps(topo, listed_collectives(wl, topo, spec))
    predicted_s, reason = estimate(timing, steps, [r for r, _ in slow])
    cpu0 = time.process_time()
    run_training(ModelTransport(topo, config), wl, "baseline", spec)
    cpu_s = time.process_time() - cpu0
    units = steps * (topo.npus if timing.every_npu else 1)
    return {
        "topology": HGX_CUTS.get(spec_text, spec_text),
        "npus": topo.npus,
        "simulator": timing.simulator,
        "rule": rule + (f"+{scheduler}" if scheduler else ""),
        "steps": steps,
        "cpu_s": cpu_s,
        "us_per_unit": cpu_s / units * 1e6,
        "estimate_s": predicted_s,
        "reason": reason,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help="which simulators (one,vectors,greenlets,world)")
    ap.add_argument("--chunks", type=int, default=16, help="chunks per collective (16)")
    args = ap.parse_args()
    print(
        f"{'topology':>18} {'npus':>5} {'simulator':>22} {'rule':>19} {'steps':>6} {'cpu_s':>7} "
        f"{'us/unit':>8} {'estimate_s':>10}"
    )
    for case in args.cases.split(","):
        for spec_text, rule, scheduler, slow in CASES[case]:
            r = row(spec_text, rule, scheduler, slow, args.chunks)
            print(
                f"{r['topology']:>18} {r['npus']:>5} {r['simulator']:>22} {r['rule']:>19} {r['steps']:>6} "
                f"{r['cpu_s']:>7.2f} {r['us_per_unit']:>8.2f} {r['estimate_s']:>10.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
