"""Scaling: startup, memory and a 16 MiB all-reduce at 8 to 128 ranks; the model at 1024 and 16384 NPUs.

Usage::

    python scripts/bench_scale.py [--ranks 8,16,32,64,128] [--out results]

For each rank count it launches four jobs with the same launcher:
- a reference job: ``import mpi4py.MPI, numpy``, then one barrier (the idle process);
- a native job: the same 16 MiB float64 buffer all-reduced by ``COMM_WORLD.Allreduce``;
- a grid job, plain mpi4py without this package: the 16 MiB buffer, the Cartesian communicator
  and one sub-communicator per dim, the control collectives the emulator uses (nonblocking
  broadcast, barrier, reduction) and one 8-byte exchange per dim. This is what MPI charges any
  program built as DESIGN.md asks, before a chunk moves;
- the emulator job: a 16 MiB float64 all-reduce (8 chunks, baseline and Themis) on a 3-dim
  topology of that many NPUs.

It reports:
- the wall time of each job (startup = the reference job, since all pay it);
- the peak resident memory (ru_maxrss) per rank and in total;
- each job's peak memory against the target's yardstick, the idle process plus the 16 MiB
  buffer (``/idle+buf``).

Then it times the model on the four 1024-NPU paper topologies and on a 16384-NPU topology
(1 GiB, 64 chunks, Themis+SCF). Prints tables and writes bench_scale.json into --out.
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
        from themis_mpi.driver import RunConfig, run_collective
        from themis_mpi.mpi.grid import CartGrid
        from themis_mpi.mpi.transport import MpiTransport
        from themis_mpi.topology import parse_topology

        topo = parse_topology(topology)
        with CartGrid(comm, topo) as grid:
            coll = Collective("all_reduce", size_mib * 2**20 // 8, "float64", chunks, (0, 1, 2))
            for policy, intra in (("baseline", "fifo"), ("themis", "scf")):
                # the engine is not kept, so each transport (and its buffer) goes before the next
                result = run_collective(MpiTransport(grid, RunConfig(intra=intra)), coll, policy)[0]
                out[policy] = {"wall_s": result.wall_s, "time_us": result.time_us, "wrong": result.wrong}
    elif kind == "grid":
        buf = np.ones(size_mib * 2**20 // 8)
        shape = [int(x) for x in topology.split(",")]
        cart = comm.Create_cart(shape, periods=[True] * len(shape), reorder=False)
        subs = [cart.Sub([i == d for i in range(len(shape))]) for d in range(len(shape))]
        cart.Ibcast(np.zeros(len(shape), np.int32)).Wait()
        cart.Ibarrier().Wait()
        cart.Iallreduce(np.ones(1), np.empty(1), op=MPI.MAX).Wait()
        for sub in subs:
            peer = (sub.Get_rank() + 1) % sub.Get_size()
            sub.Sendrecv(buf[:1].copy(), peer, 0, np.empty(1), MPI.ANY_SOURCE, 0)
        for c in subs + [cart]:
            c.Free()
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
        out.update(
            rss_mib_mean=float(all_rss.mean()),
            rss_mib_max=float(all_rss.max()),
            rss_mib_total=float(all_rss.sum()),
        )
        print("RESULT " + json.dumps(out), flush=True)


def launch(n: int, kind: str, args) -> dict:
    from themis_mpi.launch import job_env, mpiexec_path  # not at the top: the workers stay lean

    topology = ",".join(map(str, SHAPES[n])) if kind == "grid" else topology_for(n)
    cmd = [
        mpiexec_path(),
        "-n",
        str(n),
        sys.executable,
        "-m",
        "mpi4py",
        os.path.abspath(__file__),
        "--worker",
        kind,
        "--topology",
        topology,
        "--size-mib",
        str(args.size_mib),
        "--chunks",
        str(args.chunks),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=job_env())
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{kind} job on {n} ranks failed:\n{proc.stderr[-2000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return {"job_s": wall, **json.loads(line[len("RESULT ") :])}


def model_times() -> list[dict]:
    from themis_mpi.collectives import Collective
    from themis_mpi.driver import RunConfig
    from themis_mpi.model import model_collective
    from themis_mpi.topology import parse_topology

    names = [
        "3D-SW_SW_SW_hetero",
        "3D-FC_Ring_SW",
        "4D-Ring_SW_SW_SW",
        "4D-Ring_FC_Ring_SW",
        "SW(16,200,700)_SW(16,100,700)_SW(8,50,1700)_SW(8,25,1700)",
    ]
    rows, config = [], RunConfig(intra="scf")
    for name in names:
        topo = parse_topology(name)
        coll = Collective("all_reduce", 2**30 // 4, "float32", 64, tuple(range(len(topo.dims))))
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            model_collective(topo, coll, "themis", config)
            samples.append(time.perf_counter() - t0)
        rows.append({"topology": name, "npus": topo.npus, "model_s": sorted(samples)[2]})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=("reference", "native", "grid", "emulator"))
    ap.add_argument("--topology")
    ap.add_argument("--ranks", default="8,16,32,64,128")
    ap.add_argument("--size-mib", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--out", default="results", help="output folder (default results)")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.topology, args.size_mib, args.chunks)
        return
    rows = []
    for n in [int(x) for x in args.ranks.split(",")]:
        ref = launch(n, "reference", args)
        native = launch(n, "native", args)
        grid = launch(n, "grid", args)
        emu = launch(n, "emulator", args)
        yardstick = ref["rss_mib_mean"] + args.size_mib
        rows.append(
            {
                "ranks": n,
                "topology": topology_for(n),
                "reference": ref,
                "native": native,
                "grid": grid,
                "emulator": emu,
                "idle_plus_buffer_mib": yardstick,
                "extra_rss_mib_per_rank": emu["rss_mib_mean"] - ref["rss_mib_mean"],
                "native_over_yardstick": native["rss_mib_mean"] / yardstick,
                "grid_over_yardstick": grid["rss_mib_mean"] / yardstick,
                "emulator_over_yardstick": emu["rss_mib_mean"] / yardstick,
            }
        )
        print(f"ranks {n}: done", file=sys.stderr, flush=True)
    models = model_times()
    print(
        f"# {args.size_mib} MiB float64 all-reduce, {args.chunks} chunks, on {os.cpu_count()} cores; "
        "job_s = whole mpiexec job; wall times of the collective in s"
    )
    print(
        f"#{'ranks':>6} {'ref_job_s':>10} {'emu_job_s':>10} {'native_s':>9} {'base_wall_s':>12} "
        f"{'themis_s':>9} {'#wrong':>7}"
    )
    for r in rows:
        e, nat = r["emulator"], r["native"]
        print(
            f" {r['ranks']:>6} {r['reference']['job_s']:>10.2f} {e['job_s']:>10.2f} {nat['wall_s']:>9.3f} "
            f"{e['baseline']['wall_s']:>12.3f} {e['themis']['wall_s']:>9.3f} "
            f"{e['baseline']['wrong'] + e['themis']['wrong']:>7}"
        )
    print(
        f"\n# peak RSS per rank (MiB); /idle+buf = against the idle process plus the "
        f"{args.size_mib} MiB buffer"
    )
    print(
        f"#{'ranks':>6} {'idle':>6} {'idle+buf':>9} {'native':>7} {'/idle+buf':>10} {'grid':>6} "
        f"{'/idle+buf':>10} {'emulator':>9} {'/idle+buf':>10} {'emu_total':>10}"
    )
    for r in rows:
        print(
            f" {r['ranks']:>6} {r['reference']['rss_mib_mean']:>6.1f} {r['idle_plus_buffer_mib']:>9.1f} "
            f"{r['native']['rss_mib_mean']:>7.1f} {r['native_over_yardstick']:>10.3f} "
            f"{r['grid']['rss_mib_mean']:>6.1f} {r['grid_over_yardstick']:>10.3f} "
            f"{r['emulator']['rss_mib_mean']:>9.1f} {r['emulator_over_yardstick']:>10.3f} "
            f"{r['emulator']['rss_mib_total']:>10.0f}"
        )
    print("\n# model: 1 GiB all-reduce, 64 chunks, Themis+SCF, median of 5")
    for m in models:
        print(f"  {m['topology']:>58} {m['npus']:>6} NPUs {1e3 * m['model_s']:>8.1f} ms")
    from themis_mpi.output import write_json

    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "bench_scale.json"), {"emulator": rows, "model": models})


if __name__ == "__main__":
    main()
