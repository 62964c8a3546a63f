"""`themis-mpi export --perfetto`: a trace as Chrome/Perfetto trace-event JSON."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from ..perfetto import to_perfetto, write_perfetto
from ..trace import Trace
from .options import check_outputs


def cmd_export(args: argparse.Namespace) -> int:
    """`themis-mpi export --perfetto`: trace-event JSON for Perfetto, optionally cut to ranks and a window."""
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
