"""Run a list of emulator cases under mpiexec and write, from rank 0, what the tests compare.

Usage: mpiexec -n K python tests/mpi_cases.py SPEC.json OUT.json

For every case the output row holds the emulator's summary, the model's summary for the same
configuration, the cost model's sum of the stage costs each dim served on every rank, and the
spread of collective times across ranks.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

from themis_mpi.collectives import Collective
from themis_mpi.cost import CostModel
from themis_mpi.emulator import CartGrid, run_collective
from themis_mpi.model import model_collective
from themis_mpi.topology import parse_topology


def stage_cost_sums_us(engine, topo, cost):
    """Per dim, the cost model's time of every stage this rank served (us)."""
    sums = np.zeros(len(topo.dims))
    for r in engine.records:
        s = r.stage
        sums[s.dim] += cost.stage_end_ns(s.dim, s.op, s.full_elems, 0.0) / 1e3
    return sums


def main(spec_path, out_path):
    spec = json.load(open(spec_path))
    topo = parse_topology(spec["topology"])
    rows = []
    with CartGrid(MPI.COMM_WORLD, topo) as grid:
        for case in spec["cases"]:
            coll = Collective(case["op"], case["count"], case["dtype"], case["chunks"],
                              tuple(case.get("dims", range(len(topo.dims)))), case.get("redop", "sum"))
            kw = dict(intra=case["intra"], active_per_dim=case.get("active", 1),
                      endpoint_delay_ns=case.get("endpoint_delay_ns", 0.0))
            row, engine = run_collective(grid, coll, case["policy"], clock=case.get("clock", "virtual"),
                                         time_scale=case.get("time_scale", 1.0), **kw)
            model, _ = model_collective(topo, coll, case["policy"], **kw)
            cost = CostModel(topo, coll.itemsize, kw["endpoint_delay_ns"])
            sums = stage_cost_sums_us(engine, topo, cost)
            busy = np.array([d["busy_us"] for d in row["dims"]])
            lo, hi = np.array([row["time_us"]]), np.array([row["time_us"]])
            grid.cart.Allreduce(MPI.IN_PLACE, lo, op=MPI.MIN)
            grid.cart.Allreduce(MPI.IN_PLACE, hi, op=MPI.MAX)
            worst = np.array([np.max(np.abs(busy - sums))])
            grid.cart.Allreduce(MPI.IN_PLACE, worst, op=MPI.MAX)
            rows.append({"case": case, "emu": row, "model": model, "time_min_us": float(lo[0]),
                         "time_max_us": float(hi[0]), "busy_minus_cost_us": float(worst[0]),
                         "cost_sums_us": sums.tolist(), "stages": len(engine.records)})
    if MPI.COMM_WORLD.Get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
