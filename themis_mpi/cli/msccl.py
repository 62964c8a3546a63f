"""`themis-mpi msccl FILE.xml`: read, check and prove an MSCCL-IR algorithm, and time it on a topology."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from ..msccl.check import require
from ..msccl.execute import prove
from ..msccl.ir import read_algorithm, summary
from ..msccl.timing import AlphaBeta, time_programs
from ..topology import parse_topology
from ..units import format_size, parse_size


def cmd_msccl(args: argparse.Namespace) -> int:
    """Check and prove the file (exit 2 if it could not run, 1 if it computes a wrong result); time it."""
    topo = parse_topology(args.topology) if args.topology else None
    size = parse_size(args.size)
    algo = read_algorithm(args.file)
    if topo is not None and topo.npus != algo.ngpus:
        raise UsageError(f"{args.file} runs on {algo.ngpus} GPUs but {topo.label()} has {topo.npus} NPUs")
    progs = require(algo, args.file)
    print(f"# {args.file}: {summary(algo)}")
    print("# checked: sends match receives, buffers, dependencies, no deadlock, no race")
    proof = prove(algo, progs)
    if not proof.ok:
        print(f"# wrong result: {proof.first()}")
        return 1
    data = ", ".join(f"{d.wrong} of {d.elements} elements wrong" for d in proof.data)
    print(
        f"# proved: it computes the {algo.coll}: every output chunk, for any size "
        f"({' and '.join(proof.placements)}); on numpy data {data}"
    )
    if topo is not None:
        chunk = size / algo.nchunksperloop
        timing = time_programs(progs, chunk, AlphaBeta(topo))
        print(
            f"# time on {topo.label()}: {timing.end_ns / 1e3:.2f} us for {format_size(size)} "
            f"({format_size(int(chunk))} chunks); alpha-beta per message, links one message at a time"
        )
    return 0
