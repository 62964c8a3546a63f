"""`themis-mpi export`: a trace as Perfetto JSON, or a built-in algorithm as MSCCL-IR (`--msccl`)."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from ..msccl.build import builtin
from ..msccl.check import require
from ..msccl.execute import require_proof
from ..msccl.ir import summary, write_algorithm
from ..perfetto import to_perfetto, write_perfetto
from ..trace import Trace
from .options import check_outputs


def cmd_export(args: argparse.Namespace) -> int:
    """`themis-mpi export`: one of --perfetto (with a trace) or --msccl."""
    if (args.perfetto is None) == (args.msccl is None):
        raise UsageError("export takes one of --perfetto OUT.json (with TRACE.h5) or --msccl OUT.xml")
    return export_msccl(args) if args.msccl else export_perfetto(args)


def export_perfetto(args: argparse.Namespace) -> int:
    """Trace-event JSON for Perfetto, optionally cut to ranks and a window."""
    if args.trace_in is None:
        raise UsageError("export --perfetto needs the trace: themis-mpi export TRACE.h5 --perfetto OUT.json")
    check_outputs(args.perfetto, inputs=(args.trace_in,))
    window = None
    if args.window is not None:
        if len(args.window) != 2 or None in args.window or not args.window[0] < args.window[1]:
            raise UsageError("--window needs start,end in us with start < end")
        window = (args.window[0], args.window[1])
    doc = to_perfetto(
        Trace(args.trace_in), args.ranks, window, None if args.collective is None else [args.collective]
    )
    write_perfetto(doc, args.perfetto)
    print(
        f"# wrote {args.perfetto}: {sum(e['ph'] == 'X' for e in doc['traceEvents'])} stage slices; "
        "open it at ui.perfetto.dev"
    )
    return 0


def export_msccl(args: argparse.Namespace) -> int:
    """A built-in algorithm's stage as MSCCL-IR, checked and proved before it is written."""
    if args.trace_in is not None:
        raise UsageError("export --msccl writes a built-in algorithm and takes no trace")
    check_outputs(args.msccl)
    if args.both_ways and args.algorithm != "ring":
        raise UsageError(f"--both-ways is the ring's, not {args.algorithm}'s")
    algo = builtin(args.algorithm, args.op, args.npus, args.both_ways)
    require_proof(algo, require(algo, args.msccl), args.msccl)
    write_algorithm(args.msccl, algo)
    print(
        f"# wrote {args.msccl}: {summary(algo)}; checked, and proved to compute the {algo.coll} for any size"
    )
    return 0
