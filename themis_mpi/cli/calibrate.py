"""`themis-mpi calibrate`: fit an nccl-tests log and show the error per size.

By default the NCCL-like model (`nccl`: algorithms and protocols, all sizes, one or two levels
with ``--base``); ``--algorithm ring`` (or another per-dim algorithm) fits one dim's latency and
bandwidth instead. The fit, its checks and its defaults are `api.calibrate`'s; this prints it.
"""

from __future__ import annotations

import argparse
import inspect

from ..api import calibrate
from ..calibrate import NcclFit, NcclLog, format_fit, format_nccl_fit
from ..output import write_json
from .options import Meter, check_outputs

# The flags' dests: `api.calibrate`'s keyword parameters but its callbacks.
FLAGS = [n for n in inspect.signature(calibrate).parameters if n not in ("log", "progress", "on_log")]


def cmd_calibrate(args: argparse.Namespace) -> int:
    """`themis-mpi calibrate`: the fitted topology, and the model's error at every size of the log."""
    check_outputs(args.json, inputs=(args.log, args.base))
    given = {name: getattr(args, name) for name in FLAGS if getattr(args, name) is not None}
    read: list[NcclLog] = []
    with Meter(1, args.quiet) as meter:

        def header(log: NcclLog, lines: str) -> None:
            read.append(log)
            meter.write(lines)

        result = calibrate(args.log, **given, progress=meter.part(0), on_log=header)
    if isinstance(result, NcclFit):
        print(format_nccl_fit(read[0], result, header=False))
    else:
        print(format_fit(read[0], result, header=False))
    if args.json:
        write_json(args.json, result.to_dict())
    return 0
