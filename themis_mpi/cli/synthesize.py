"""`themis-mpi synthesize OP -t TOPOLOGY -b SIZE --out FILE.xml`: a TACOS-like algorithm as MSCCL-IR."""

from __future__ import annotations

import argparse

from ..msccl.check import require
from ..msccl.execute import prove
from ..msccl.ir import write_algorithm
from ..msccl.synthesis import synthesize_all_gather, to_algorithm
from ..msccl.timing import AlphaBeta, time_programs
from ..results import ideal_time_us
from ..units import format_size, parse_size
from .options import check_outputs, one_topology


def cmd_synthesize(args: argparse.Namespace) -> int:
    """Synthesize, write, check, prove and time the algorithm; print its time against the bound."""
    check_outputs(args.out)
    topo = one_topology(args)
    size = parse_size(args.size)
    synth = synthesize_all_gather(topo, size, args.chunks_per_npu)
    algo = to_algorithm(synth, args.op)
    progs = require(algo, args.out)
    proof = prove(algo, progs)
    if not proof.ok:  # a bug of the synthesizer, not of the user
        raise AssertionError(f"the synthesized {args.op} is wrong: {proof.first()}")
    write_algorithm(args.out, algo)
    timing = time_programs(progs, synth.chunk_bytes, AlphaBeta(topo))
    bound = ideal_time_us(args.op, size, topo, range(len(topo.dims)))
    print(
        f"# synthesize {args.op} on {topo.label()} ({topo.npus} NPUs), {format_size(size)}, "
        f"{args.chunks_per_npu} chunk(s) per NPU of {format_size(int(synth.chunk_bytes))}: "
        f"{len(synth.transfers)} transfers per all-gather"
    )
    print(
        f"# wrote {args.out}: {algo.ngpus} GPUs, {sum(len(g.threadblocks) for g in algo.gpus)} threadblocks, "
        f"{algo.n_steps()} steps; checked, and proved to compute the {algo.coll} for any size"
    )
    print("#  time_us  bound_us   util%   (alpha-beta per message, links one message at a time)")
    t_us = timing.end_ns / 1e3
    print(f"  {t_us:8.2f}  {bound:8.2f}  {100 * bound / t_us:6.2f}")
    return 0
