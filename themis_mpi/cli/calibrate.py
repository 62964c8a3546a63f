"""`themis-mpi calibrate`: fit a dim to an nccl-tests log and show the error per size."""

from __future__ import annotations

import argparse

from ..calibrate import fit, format_fit, read_nccl_log
from ..errors import UsageError
from ..limits import MAX_CHUNKS, in_range
from ..output import write_json
from ..topology import KIND_ALIASES
from ..units import parse_size
from .options import check_outputs


def cmd_calibrate(args: argparse.Namespace) -> int:
    """`themis-mpi calibrate`: the fitted topology, and the model's error at every size of the log."""
    check_outputs(args.json, inputs=(args.log,))
    in_range("--chunks", args.chunks, 1, MAX_CHUNKS)
    if args.npus is not None:
        in_range("--npus", args.npus, 2, 2**20)
    kind = KIND_ALIASES.get(args.kind.lower())
    if kind is None:
        raise UsageError(f"unknown dim kind {args.kind!r}; use SW, Ring or FC")
    log = read_nccl_log(args.log, args.op, args.npus)
    result = fit(log, kind, args.algorithm.lower(), args.chunks, parse_size(args.min_size))
    print(format_fit(log, result))
    if args.json:
        write_json(args.json, result.to_dict())
    return 0
