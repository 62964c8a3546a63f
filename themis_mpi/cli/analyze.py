"""`themis-mpi analyze`: per-dim busy/idle time, bytes, queueing delay and bandwidths of traces."""

from __future__ import annotations

import argparse
import os

from ..analysis import analyze_trace, format_analysis
from ..errors import UsageError
from ..output import write_json
from ..plots import (  # (matplotlib loads when a picture is drawn)
    queue_depth,
    timeline,
    utilization_bars,
)
from ..trace import Trace
from .options import check_outputs


def check_plot_dir(path: str) -> None:
    """Refuse, before any work, a --plot directory that is no directory or cannot be made or written."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--plot {path}: not a directory")
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK | os.X_OK):  # (a read-only file system too)
        raise UsageError(f"cannot write --plot {path}: {existing} is not writable (read-only, or not yours)")


def cmd_analyze(args: argparse.Namespace) -> int:
    """`themis-mpi analyze`: the table, and with ``--plot`` timelines, utilization and queue depth."""
    ranks = args.ranks
    if not ranks or any(r is None or r < 0 for r in ranks):
        raise UsageError("--ranks must list ranks >= 0, e.g. 0 or 0,3")
    check_outputs(args.json, inputs=tuple(args.traces))
    if args.plot:
        check_plot_dir(args.plot)
    traces = [Trace(p) for p in args.traces]
    rows = []
    for trace in traces:
        present = set(trace.events["rank"].tolist())
        missing = [r for r in ranks if present and r not in present]
        if missing:
            raise UsageError(
                f"{trace.path}: no events of rank {missing[0]} (ranks {min(present)}..{max(present)})"
            )
        for rank in ranks:
            rows += analyze_trace(trace, rank)
    print(format_analysis(rows))
    if args.json:
        write_json(args.json, rows)
    if args.plot:
        try:
            os.makedirs(args.plot, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot write --plot {args.plot}: {exc.strerror or exc}") from None
        written = [utilization_bars(rows, os.path.join(args.plot, "utilization.png"))]
        for t, trace in enumerate(traces):
            stem = f"{t}-{os.path.splitext(os.path.basename(trace.path))[0]}"
            for c in trace.collectives["collective"].tolist():
                written.append(
                    timeline(trace, c, os.path.join(args.plot, f"{stem}-c{c}-timeline.png"), ranks)
                )
                written.append(
                    queue_depth(trace, c, os.path.join(args.plot, f"{stem}-c{c}-queues.png"), ranks[0])
                )
        print("# wrote " + " ".join(written))
    return 0
