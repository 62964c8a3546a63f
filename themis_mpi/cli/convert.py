"""`themis-mpi convert`: a text workload to a Chakra ET file, or such an ET file back to text."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from ..limits import MAX_ITERS, in_range
from ..output import check_output_path, write_text
from ..topology import parse_topology
from ..workloads.chakra import is_et_source
from ..workloads.convert import et_to_workload_text, workload_to_et
from ..workloads.et import MAX_ET_NODES, read_et, write_et
from ..workloads.text import parse_workload


def cmd_convert(args: argparse.Namespace) -> int:
    """`themis-mpi convert`: text workload -> Chakra ET, or ET -> text workload."""
    in_range("--iters", args.iters, 1, MAX_ITERS)
    check_output_path(args.output, inputs=(args.input,))
    if is_et_source(args.input):
        text = et_to_workload_text(read_et(args.input))
        write_text(args.output, text)
        print(f"# wrote {args.output}: the text workload of {args.input}")
        return 0
    if not args.output.endswith((".et", ".et.gz")):
        raise UsageError(f"{args.output}: a text workload converts to a .et or .et.gz file")
    wl = parse_workload(args.input)
    topo = parse_topology(args.topology)
    per_iteration = len(workload_to_et(wl, topo, 1).nodes)
    if per_iteration * args.iters > MAX_ET_NODES:
        raise UsageError(
            f"{args.iters} iterations of {args.input} make {per_iteration * args.iters} nodes; an ET file "
            f"holds at most {MAX_ET_NODES} (at most {MAX_ET_NODES // max(per_iteration, 1)} iterations here)"
        )
    trace = workload_to_et(wl, topo, args.iters, args.output)
    write_et(args.output, trace)
    counts = ", ".join(f"{n} {kind}" for kind, n in trace.counts().items())
    print(
        f"# wrote {args.output}: {len(trace.nodes)} nodes ({counts}), {args.iters} iteration(s) of "
        f"{args.input} ({wl.parallelism}, {len(wl.layers)} layers) on {wl.fit_topology(topo).label()}"
    )
    return 0
