"""Where an emulator rank's memory goes: peak RSS after each phase of one job.

Usage::

    mpiexec -n 8 python -m mpi4py scripts/memory_phases.py [-t TOPOLOGY] [--size-mib 16] [-c 8] [--out DIR]

Phases, in order, in one process per rank: the idle process (``mpi4py`` and ``numpy`` imported,
one barrier), the data buffer, this package's imports, the Cartesian grid (its communicators),
then an all-reduce with the baseline and one with Themis (checked). The transports allocate the
collective's buffer themselves, so the data buffer is freed before the first run and each run's
transport is dropped before the next: one buffer at a time, as when the runs shared it. Prints
the mean over ranks of the peak resident set (ru_maxrss, MiB) after each phase and what the
phase added, and the resident set's private (anonymous) and shared-memory pages at that moment
(RssAnon and RssShmem of /proc/self/status: MPI's intra-node segments are the shared part);
writes memory_phases.json into --out (default results/).
"""

import argparse
import os
import resource

import numpy as np
from mpi4py import MPI


def sample() -> tuple[float, float, float]:
    """Peak RSS, and the anonymous and shared-memory parts of the RSS now (MiB; 0 without /proc)."""
    parts = {"RssAnon": 0.0, "RssShmem": 0.0}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key = line.split(":")[0]
                if key in parts:
                    parts[key] = int(line.split()[1]) / 1024.0
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return peak, parts["RssAnon"], parts["RssShmem"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--topology", default="Ring(2,100,20)_FC(2,100,700)_SW(2,100,700)")
    ap.add_argument("--size-mib", type=int, default=16)
    ap.add_argument("-c", "--chunks", type=int, default=8)
    ap.add_argument("--out", default="results", help="output folder (default results)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    comm.Barrier()
    marks = [("idle process", sample())]
    buf = np.ones(args.size_mib * 2**20 // 8)
    marks.append(("data buffer", sample()))
    from themis_mpi.collectives import Collective
    from themis_mpi.config import RunConfig
    from themis_mpi.mpi.grid import CartGrid
    from themis_mpi.mpi.transport import MpiTransport
    from themis_mpi.output import write_json
    from themis_mpi.run.collective import run_collective
    from themis_mpi.timing.planner import emulator_timer
    from themis_mpi.topology import parse_topology

    marks.append(("package imports", sample()))
    topo = parse_topology(args.topology)
    wrong = 0
    with CartGrid(comm, topo) as grid:
        marks.append(("Cartesian grid", sample()))
        coll = Collective("all_reduce", buf.size, "float64", args.chunks, tuple(range(len(topo.dims))))
        nbytes = buf.nbytes
        del buf  # the transport allocates the collective's buffer
        for policy, intra in (("baseline", "fifo"), ("themis", "scf")):
            config = RunConfig(intra=intra).on(topo)  # the default rule, timed as the planner gives it
            result = run_collective(MpiTransport(grid, config, emulator_timer(topo, config)), coll, policy)[0]
            wrong += result.wrong
            marks.append((f"{policy} all-reduce", sample()))
    per_rank = comm.gather([m for _, m in marks], root=0)
    if comm.Get_rank() == 0:
        mean = np.mean(np.array(per_rank), axis=0).tolist()
        print(
            f"# {comm.Get_size()} ranks, {topo.label()}, {nbytes} B float64 all-reduce, "
            f"{args.chunks} chunks; peak RSS per rank (MiB), mean over ranks; #wrong {wrong}"
        )
        print(f"# {'phase':<22} {'peak_mib':>9} {'added_mib':>10} {'anon_mib':>9} {'shmem_mib':>10}")
        rows = []
        for i, (name, _) in enumerate(marks):
            peak, anon, shmem = mean[i]
            added = peak - mean[i - 1][0] if i else 0.0
            rows.append(
                {"phase": name, "peak_mib": peak, "added_mib": added, "anon_mib": anon, "shmem_mib": shmem}
            )
            print(f"  {name:<22} {peak:>9.2f} {added:>10.2f} {anon:>9.2f} {shmem:>10.2f}")
        os.makedirs(args.out, exist_ok=True)
        write_json(
            os.path.join(args.out, "memory_phases.json"),
            {
                "ranks": comm.Get_size(),
                "topology": args.topology,
                "bytes": nbytes,
                "chunks": args.chunks,
                "wrong": wrong,
                "phases": rows,
            },
        )


if __name__ == "__main__":
    main()
