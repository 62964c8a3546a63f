"""Emulator vs model: the same configurations, the same times (within 0.1 %), exact results.

Usage::

    mpiexec -n 64 python -m mpi4py scripts/agreement.py [--spec SPEC.json] [--json OUT.json]

Without --spec it sweeps topologies of exactly as many NPUs as there are ranks (every dim kind
and algorithm, one to three dims), two sizes (one that nothing divides), chunk counts 1, 7 and 64,
every built-in inter-dim policy with FIFO and SCF, and themis with RG and LRPF. A spec is
``{"topology": ..., "cases": [{op, count, dtype, chunks, policy, intra[, active, redop,
endpoint_delay_ns, compat, network, clock, time_scale, hbm_gbps, ace]}]}``; the tests use it. Rank 0
prints a table and writes JSON; the exit status is 1 on any disagreement.
"""

import argparse
import itertools
import json
import os
import sys
from dataclasses import replace

import numpy as np
from mpi4py import MPI

from themis_mpi.collectives import PRICED_ITEMSIZE, Collective
from themis_mpi.config import RunConfig
from themis_mpi.cost import CostModel, Endpoint
from themis_mpi.mpi.grid import CartGrid
from themis_mpi.mpi.transport import MpiTransport
from themis_mpi.output import write_json
from themis_mpi.run.collective import model_collective, run_collective
from themis_mpi.timing.planner import emulator_timer
from themis_mpi.topology import parse_topology

REL_TOL = 1e-3
KINDS = [("Ring", 200, 20), ("FC", 100, 700), ("SW", 50, 1700)]


def default_topologies(n: int) -> list[str]:
    """Topologies of exactly n NPUs: one dim of each kind, then 2 and 3 dims of mixed kinds."""
    shapes = [[n]]
    factors = [f for f in range(2, n) if n % f == 0]
    if factors:
        shapes.append([factors[0], n // factors[0]])
        rest = n // factors[0]
        sub = [f for f in range(2, rest) if rest % f == 0]
        if sub:
            shapes.append([factors[0], sub[0], rest // sub[0]])
    specs = []
    for shape in shapes:
        rotations = range(len(KINDS)) if len(shape) == 1 else [0, 1]
        for r in rotations:
            dims = [KINDS[(r + i) % 3] for i in range(len(shape))]
            specs.append("_".join(f"{k}({p},{bw},{lat})" for p, (k, bw, lat) in zip(shape, dims)))
    return specs


def default_cases() -> list[dict]:
    """Two sizes x three chunk counts x every built-in policy pair (see the module doc)."""
    return [
        {
            "op": "all_reduce",
            "count": count,
            "dtype": "float32",
            "chunks": chunks,
            "policy": policy,
            "intra": intra,
        }
        for (count, chunks), (policy, intra) in itertools.product(
            [(100003, 7), (100003, 64), (1 << 20, 1), (1 << 20, 64)],
            [
                *itertools.product(
                    ["baseline", "themis", "themisFlex", "roundRobin", "themis-lat", "predictive"],
                    ["fifo", "scf"],
                ),
                ("themis", "rg"),
                ("themis", "lrpf"),
            ],
        )
    ]


def stage_cost_sums_us(engine, topo, cost):
    """Per dim, the cost model's time of every stage this rank served (us)."""
    sums = np.zeros(len(topo.dims))
    for r in engine.records:
        sums[r.stage.dim] += sum(cost.run_steps_ns(r)) / 1e3
    return sums


def run_spec(topology: str, cases: list[dict]) -> list[dict]:
    """Run every case on the emulator and the model; return one comparison row per case."""
    topo = parse_topology(topology)
    rows = []
    with CartGrid(MPI.COMM_WORLD, topo) as grid:
        for case in cases:
            coll = Collective(
                case["op"],
                case["count"],
                case["dtype"],
                case["chunks"],
                tuple(case.get("dims", range(len(topo.dims)))),
                case.get("redop", "sum"),
            )
            config = RunConfig(
                intra=case["intra"],
                active_per_dim=case.get("active", 1),
                endpoint_delay_ns=case.get("endpoint_delay_ns", 0.0),
                compat=case.get("compat", ""),
                network=case.get("network", "ideal"),
                endpoint=Endpoint(case.get("hbm_gbps", 0.0), 0.0, case.get("ace", False)),
            )
            clock = replace(
                config, clock=case.get("clock", "virtual"), time_scale=case.get("time_scale", 1.0)
            )
            emu, engine = run_collective(
                MpiTransport(grid, clock, emulator_timer(topo, clock)), coll, case["policy"]
            )
            model, _ = model_collective(topo, coll, case["policy"], config)
            cost = CostModel(topo, PRICED_ITEMSIZE, config.endpoint_delay_ns, endpoint=config.endpoint)
            sums = stage_cost_sums_us(engine, topo, cost)
            busy = np.array([d.busy_us for d in emu.dims])
            lo = grid.watchdog.allreduce([emu.time_us], MPI.MIN)
            hi = grid.watchdog.allreduce([emu.time_us], MPI.MAX)
            worst = grid.watchdog.allreduce([np.max(np.abs(busy - sums))], MPI.MAX)
            rel = [abs(emu.time_us - model.time_us) / max(model.time_us, 1e-12)]
            rel += [abs(a.busy_us - b.busy_us) / max(b.busy_us, 1e-12) for a, b in zip(emu.dims, model.dims)]
            rows.append(
                {
                    "topology": topology,
                    "case": case,
                    "emu": emu.to_dict(),
                    "model": model.to_dict(),
                    "time_min_us": float(lo[0]),
                    "time_max_us": float(hi[0]),
                    "busy_minus_cost_us": float(worst[0]),
                    "cost_sums_us": sums.tolist(),
                    "max_rel_diff": max(rel),
                    "stages": len(engine.records),
                }
            )
    return rows


def agrees(row) -> bool:
    """Exact data, emulator = model within REL_TOL, all ranks agree."""
    return (
        row["emu"]["wrong"] == 0
        and row["max_rel_diff"] <= REL_TOL
        and row["time_min_us"] == row["time_max_us"]
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", help="JSON spec (default: the built-in sweep)")
    ap.add_argument("--json", default="results/agreement.json", help="output rows (JSON)")
    ap.add_argument("--quiet", action="store_true", help="no table")
    args = ap.parse_args()
    if args.spec:
        spec = json.load(open(args.spec))
        specs = [(spec["topology"], spec["cases"])]
    else:
        specs = [(t, default_cases()) for t in default_topologies(MPI.COMM_WORLD.Get_size())]
    rows = []
    for topology, cases in specs:
        rows += run_spec(topology, cases)
    bad = [r for r in rows if not agrees(r)]
    if MPI.COMM_WORLD.Get_rank() == 0:
        if not args.quiet:
            print(f"# emulator (virtual clock) vs model, {MPI.COMM_WORLD.Get_size()} ranks; times in us")
            print(
                f"#{'topology':>44} {'policy':>8} {'intra':>5} {'count':>8} {'chunks':>6} "
                f"{'emu_us':>10} {'model_us':>10} {'max_rel':>8} {'#wrong':>6}"
            )
            for r in rows:
                c = r["case"]
                print(
                    f" {r['topology']:>44} {c['policy']:>8} {c['intra']:>5} {c['count']:>8} "
                    f"{c['chunks']:>6} {r['emu']['time_us']:>10.3f} {r['model']['time_us']:>10.3f} "
                    f"{r['max_rel_diff']:>8.1e} {r['emu']['wrong']:>6}"
                )
            print(f"# {len(rows)} cases, {len(bad)} disagree (tolerance {REL_TOL:.0e}, wrong = 0)")
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        write_json(args.json, rows)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
