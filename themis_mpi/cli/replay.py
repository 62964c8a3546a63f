"""`themis-mpi replay`: a trace's schedule again, on the model or (under mpiexec) the emulator."""

from __future__ import annotations

import argparse

from ..config import RunConfig
from ..launch import under_mpiexec
from ..output import write_json
from ..replay import format_replay, replay_header, replay_trace
from ..run.backend import open_backend
from ..topology import parse_topology
from ..trace import Trace
from .options import Meter, check_outputs, one_topology


def cmd_replay(args: argparse.Namespace) -> int:
    """`themis-mpi replay`: exit 1 when an unchanged replay does not reproduce the trace."""
    RunConfig(timeout_s=args.timeout_s)  # validates the timeout before MPI starts
    trace = Trace(args.trace_in)
    topo = one_topology(args, parse_topology(args.topology) if args.topology else trace.topology())
    use_mpi = under_mpiexec()
    with open_backend(topo, use_mpi, args.timeout_s) as backend:
        if backend.rank == 0:
            check_outputs(args.json, args.trace, inputs=(args.trace_in,))
            print(replay_header(trace, topo, backend.name, args.network, args.mtu), flush=True)
        with Meter(1, args.quiet or backend.rank != 0) as meter:
            result = replay_trace(trace, topo, backend, args.timeout_s, args.network, args.mtu, meter.part(0))
        if backend.rank != 0:
            return 0
        print(format_replay(trace, result, topo, backend.name, header=False))
        if args.json:
            write_json(args.json, result.to_dict(trace))
        if args.trace and result.recorder is not None and result.events is not None:
            result.recorder.write(args.trace, result.events, backend.service)
            collectives = len(result.recorder.rows)
            print(f"# wrote {args.trace}: {len(result.events)} stage events of {collectives} collectives")
    return 0 if (not result.unchanged or result.reproduced) else 1
