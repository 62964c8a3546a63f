"""`themis-mpi calibrate`: fit an nccl-tests log and show the error per size.

By default the NCCL-like model (`nccl`: algorithms and protocols, all sizes, one or two levels
with ``--base``); ``--algorithm ring`` (or another per-dim algorithm) fits one dim's latency and
bandwidth instead.
"""

from __future__ import annotations

import argparse

from ..calibrate import (
    fit,
    fit_header,
    fit_nccl,
    format_fit,
    format_nccl_fit,
    nccl_fit_header,
    parse_algos,
    read_base,
    read_nccl_log,
)
from ..errors import UsageError
from ..limits import MAX_BANDWIDTH_GBPS, MAX_CHUNKS, MIN_BANDWIDTH_GBPS, in_range
from ..output import write_json
from ..topology import KIND_ALIASES
from ..units import parse_size
from .options import Meter, check_outputs


def cmd_calibrate(args: argparse.Namespace) -> int:
    """`themis-mpi calibrate`: the fitted topology, and the model's error at every size of the log."""
    check_outputs(args.json, inputs=(args.log, args.base))
    in_range("--chunks", args.chunks, 1, MAX_CHUNKS)
    if args.npus is not None:
        in_range("--npus", args.npus, 2, 2**20)
    kind = KIND_ALIASES.get(args.kind.lower())
    if kind is None:
        raise UsageError(f"unknown dim kind {args.kind!r}; use SW, Ring or FC")
    log = read_nccl_log(args.log, args.op, args.npus, args.table)
    if args.algorithm.lower() == "nccl":
        base = read_base(args.base) if args.base else None
        for flag, value in (("--link-gbps", args.link_gbps), ("--nic-gbps", args.nic_gbps)):
            if value is not None:
                in_range(flag, value, MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS)
        if args.gpus_per_node is not None:
            in_range("--gpus-per-node", args.gpus_per_node, 1, 2**20)
        print(nccl_fit_header(log), flush=True)
        with Meter(1, args.quiet) as meter:
            flat = fit_nccl(
                log,
                base,
                parse_algos(args.nccl_algo),
                link_gbps=args.link_gbps,
                nic_gbps=args.nic_gbps,
                gpus_per_node=args.gpus_per_node,
                progress=meter.part(0),
            )
        print(format_nccl_fit(log, flat, header=False))
        doc = flat.to_dict()
    else:
        print(fit_header(log), flush=True)
        one_dim = fit(log, kind, args.algorithm.lower(), args.chunks, parse_size(args.min_size))
        print(format_fit(log, one_dim, header=False))
        doc = one_dim.to_dict()
    if args.json:
        write_json(args.json, doc)
    return 0
