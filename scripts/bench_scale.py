"""Scaling: startup, memory and a 16 MiB all-reduce at 8 to 128 ranks; the model at 1024 and 16384 NPUs.

Usage::

    python scripts/bench_scale.py [--ranks 8,16,32,64,128] [--json bench_scale.json]

For each rank count it launches three jobs with the same launcher:
- a reference job: ``import mpi4py.MPI, numpy``, then one barrier;
- a native job: the same 16 MiB float64 buffer all-reduced by ``COMM_WORLD.Allreduce``;
- the emulator job: a 16 MiB float64 all-reduce (8 chunks, baseline and Themis) on a 3-dim
  topology of that many NPUs.

It reports:
- the wall time of each job (startup = the reference job, since both pay it);
- the peak resident memory (ru_maxrss) per rank and in total;
- the emulator's extra memory per rank over the reference, against the 16 MiB buffer.

Then it times the model on the four 1024-NPU paper topologies and on a 16384-NPU topology
(1 GiB, 64 chunks, Themis+SCF). Prints tables and writes JSON.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

SHAPES = {8: (2, 2, 2), 16: (4, 2, 2), 32: (4, 4, 2), 64: (4, 4, 4), 128: (8, 4, 4)}
HERE = os.path.dirname(os.path.abspath(__file__))


def topology_for(n: int) -> str:
    a, b, c = SHAPES[n]
    return f"Ring({a},100,20)_FC({b},100,700)_SW({c},100,700)"


def worker(kind: str, topology: str, size_mib: int, chunks: int) -> None:
    """Run inside mpiexec: the reference or the emulator job; rank 0 prints one JSON line."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out = {}
    if kind == "emulator":
        from themis_mpi.collectives import Collective
        from themis_mpi.emulator import CartGrid, run_collective
        from themis_mpi.topology import parse_topology

        topo = parse_topology(topology)
        with CartGrid(comm, topo) as grid:
            coll = Collective("all_reduce", size_mib * 2**20 // 8, "float64", chunks, (0, 1, 2))
            buf = np.empty(coll.count)
            for policy, intra in (("baseline", "fifo"), ("themis", "scf")):
                row, _ = run_collective(grid, coll, policy, intra, buffer=buf)
                out[policy] = {"wall_s": row["wall_s"], "time_us": row["time_us"], "wrong": row["wrong"]}
    elif kind == "native":
        buf = np.ones(size_mib * 2**20 // 8)
        comm.Barrier()
        t0 = MPI.Wtime()
        comm.Allreduce(MPI.IN_PLACE, buf)
        out["wall_s"] = comm.allreduce(MPI.Wtime() - t0, op=MPI.MAX)
    else:
        comm.Barrier()
    rss = np.array([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])  # MiB
    all_rss = np.zeros(comm.Get_size())
    comm.Gather(rss, all_rss, root=0)
    if comm.Get_rank() == 0:
        out.update(rss_mib_mean=float(all_rss.mean()), rss_mib_max=float(all_rss.max()),
                   rss_mib_total=float(all_rss.sum()))
        print("RESULT " + json.dumps(out), flush=True)


def launch(n: int, kind: str, args) -> dict:
    here = os.path.dirname(sys.executable)
    mpiexec = os.path.join(here, "mpiexec") if os.path.exists(os.path.join(here, "mpiexec")) else "mpiexec"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = [mpiexec, "-n", str(n), sys.executable, "-m", "mpi4py", os.path.abspath(__file__), "--worker", kind,
           "--topology", topology_for(n), "--size-mib", str(args.size_mib), "--chunks", str(args.chunks)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{kind} job on {n} ranks failed:\n{proc.stderr[-2000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return {"job_s": wall, **json.loads(line[len("RESULT "):])}


def model_times() -> list[dict]:
    from themis_mpi.collectives import Collective
    from themis_mpi.model import model_collective
    from themis_mpi.topology import parse_topology

    names = ["3D-SW_SW_SW_hetero", "3D-FC_Ring_SW", "4D-Ring_SW_SW_SW", "4D-Ring_FC_Ring_SW",
             "SW(16,200,700)_SW(16,100,700)_SW(8,50,1700)_SW(8,25,1700)"]
    rows = []
    for name in names:
        topo = parse_topology(name)
        coll = Collective("all_reduce", 2**30 // 4, "float32", 64, tuple(range(len(topo.dims))))
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            model_collective(topo, coll, "themis", "scf")
            samples.append(time.perf_counter() - t0)
        rows.append({"topology": name, "npus": topo.npus, "model_s": sorted(samples)[2]})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=("reference", "native", "emulator"))
    ap.add_argument("--topology")
    ap.add_argument("--ranks", default="8,16,32,64,128")
    ap.add_argument("--size-mib", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--json", default="bench_scale.json")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.topology, args.size_mib, args.chunks)
        return
    rows = []
    for n in [int(x) for x in args.ranks.split(",")]:
        ref = launch(n, "reference", args)
        native = launch(n, "native", args)
        emu = launch(n, "emulator", args)
        rows.append({"ranks": n, "topology": topology_for(n), "reference": ref, "native": native,
                     "emulator": emu,
                     "extra_rss_mib_per_rank": emu["rss_mib_mean"] - ref["rss_mib_mean"]})
        print(f"ranks {n}: done", file=sys.stderr, flush=True)
    models = model_times()
    print(f"# {args.size_mib} MiB float64 all-reduce, {args.chunks} chunks, on {os.cpu_count()} cores; "
          "job_s = whole mpiexec job; RSS = peak resident set per rank (MiB)")
    print(f"#{'ranks':>6} {'ref_job_s':>10} {'emu_job_s':>10} {'native_s':>9} {'base_wall_s':>12} "
          f"{'themis_s':>9} {'ref_rss':>8} {'native_rss':>11} {'emu_rss':>8} {'emu-ref':>8} "
          f"{'emu_total':>10} {'#wrong':>7}")
    for r in rows:
        e, nat = r["emulator"], r["native"]
        print(f" {r['ranks']:>6} {r['reference']['job_s']:>10.2f} {e['job_s']:>10.2f} {nat['wall_s']:>9.3f} "
              f"{e['baseline']['wall_s']:>12.3f} {e['themis']['wall_s']:>9.3f} "
              f"{r['reference']['rss_mib_mean']:>8.1f} {nat['rss_mib_mean']:>11.1f} "
              f"{e['rss_mib_mean']:>8.1f} "
              f"{r['extra_rss_mib_per_rank']:>8.1f} {e['rss_mib_total']:>10.0f} "
              f"{e['baseline']['wrong'] + e['themis']['wrong']:>7}")
    print("\n# model: 1 GiB all-reduce, 64 chunks, Themis+SCF, median of 5")
    for m in models:
        print(f"  {m['topology']:>58} {m['npus']:>6} NPUs {1e3 * m['model_s']:>8.1f} ms")
    with open(args.json, "w") as f:
        json.dump({"emulator": rows, "model": models}, f, indent=1)


if __name__ == "__main__":
    main()
