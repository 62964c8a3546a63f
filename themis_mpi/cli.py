"""The `themis-mpi` command: options in, domain objects out, library calls, tables printed.

Subcommands: run (under mpiexec), model, train, convert, replay, analyze, export, calibrate, topologies,
policies, info. Sizes
follow nccl-tests: ``-b`` first size, ``-e`` last size, ``-f`` factor between sizes, with binary
suffixes K, M, G (64M = 64 * 2^20 bytes). Bandwidths are GB/s with 1 GB = 2^30 bytes.

Errors end every rank: a user mistake found before MPI starts prints one line (rank 0) and every
rank exits 2; a mistake found on some ranks only, once MPI runs, aborts the job with 2; a rank
that waits in vain (`Stalled`) aborts it with 3; any other exception prints its traceback once
and aborts with 1.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import textwrap
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import __version__
from .analysis import format_size, median
from .collectives import DTYPES, OPS, REDOPS, Collective
from .cost import ASTRA_ENDPOINT_DELAY_NS, ASTRA_SIM_1_0, Endpoint
from .driver import DEFAULT_TIMEOUT_S, RunConfig
from .errors import UsageError
from .launch import env_rank, under_mpiexec
from .limits import MAX_CHUNKS, MAX_FACTOR, MAX_ITERS, MAX_SIZE_BYTES, check_memory, in_range
from .output import RowFiles, atomic_path, check_output_path, write_json
from .policies import InterPolicy, inter_class, inter_names, intra_class, intra_names, make_inter, origin
from .topology import ALGORITHMS, DESCRIPTIONS, PRESETS, SOURCES, Topology, parse_topology

if TYPE_CHECKING:
    from .trace import TraceRecorder

UNITS = "sizes in bytes (suffixes K/M/G are binary); bandwidth in GB/s with 1 GB = 2^30 B; times in us"
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)B?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``64M`` -> 67108864; plain numbers are bytes."""
    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"bad size {text!r}: use a byte count with an optional K, M or G suffix")
    digits = match.group(1)
    if len(digits) > 20:
        raise UsageError(f"size {text[:24]}... is out of range (at most {MAX_SIZE_BYTES} B per NPU)")
    value = int(digits) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2).upper()]
    if value <= 0:
        raise UsageError(f"size must be positive, got {text!r}")
    if value > MAX_SIZE_BYTES:
        raise UsageError(f"size {text!r} is out of range (at most {MAX_SIZE_BYTES} B = 1 PiB per NPU)")
    return value


MAX_SIZES = 4096


def size_sweep(first: int, last: int | None, factor: float) -> list[int]:
    """Sizes from first to last, multiplied by factor (nccl-tests' -b/-e/-f), each larger than the last."""
    last = first if last is None else last
    if last < first:
        raise UsageError(f"last size ({last} B) is smaller than the first ({first} B)")
    if not math.isfinite(factor) or factor > MAX_FACTOR or (factor <= 1 and last > first):
        raise UsageError(f"size factor must be > 1 and at most {MAX_FACTOR:g} to sweep, got {factor}")
    sizes, size = [], first
    while size <= last:
        sizes.append(size)
        if len(sizes) > MAX_SIZES:
            raise UsageError(
                f"the sweep from {first} to {last} B by {factor:g} has more than {MAX_SIZES} sizes"
            )
        size = max(size + 1, int(size * factor)) if factor > 1 else last + 1
    return sizes


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list]:
    def parse(text: str) -> list:
        items = [x.strip() for x in text.split(",")]
        try:
            return [None if x in ("", "-") else kind(x) for x in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad list {text!r}") from None

    return parse


# --- options -----------------------------------------------------------------------------------


def _add_topology(p: argparse.ArgumentParser, default: str | None = "2x2x2") -> None:
    p.add_argument(
        "-t",
        "--topology",
        default=default,
        help="preset name (see `themis-mpi topologies`), inline KIND(npus,GB/s,ns[,algorithm])_..., "
        f"or ASTRA-sim network .yml (default {default or 'the recorded one'}); run and model take a "
        "comma-separated list to sweep",
    )
    p.add_argument(
        "--algorithm",
        type=_csv(str),
        action="append",
        default=None,
        help=f"per-dim algorithm override, comma-separated ({', '.join(ALGORITHMS)}, hd; "
        "empty keeps the default); run and model take it more than once to sweep",
    )
    p.add_argument(
        "--bandwidth",
        type=_csv(float),
        default=None,
        help="per-dim bandwidth override in GB/s, comma-separated",
    )
    p.add_argument(
        "--latency", type=_csv(float), default=None, help="per-dim latency override in ns, comma-separated"
    )


def _add_schedule(p: argparse.ArgumentParser, dtype: str) -> None:
    p.add_argument(
        "-c", "--chunks", type=_csv(int), default=[64], help="chunks per collective, a comma list sweeps (64)"
    )
    p.add_argument(
        "-p",
        "--policy",
        default="both",
        help="inter-dim policies, comma-separated (see `themis-mpi policies`); both = baseline,themis; "
        "all = every one (default both)",
    )
    p.add_argument(
        "--intra",
        default="auto",
        help="intra-dim queue policies, comma-separated (fifo, scf, rg, lrpf or a plugin); auto = each "
        "inter-dim policy's own (fifo for baseline and roundRobin, scf otherwise)",
    )
    p.add_argument("--active-chunks-per-dim", type=int, default=1, help="stages each dim runs at once (1)")
    p.add_argument(
        "--endpoint-delay-ns",
        type=float,
        default=None,
        help="delay added to every algorithm step (default 0; 10, ASTRA-sim's, with --compat astra-sim-1.0)",
    )
    p.add_argument(
        "--compat",
        default="",
        choices=("", ASTRA_SIM_1_0),
        help="astra-sim-1.0: ASTRA-sim 1.0's exact semantics where they are modelling choices (whole-ns "
        "messages, endpoint delay per message, local reduction time, event order, LIFO between collectives)",
    )
    p.add_argument("-d", "--dtype", default=dtype, choices=DTYPES, help=f"element type (default {dtype})")
    p.add_argument(
        "--hbm-gbps",
        type=float,
        default=0.0,
        help="endpoint model: NPU memory bandwidth in GB/s; every step also pays its reduce/copy memory "
        "traffic, overlapped with the transfer (default 0: off)",
    )
    p.add_argument(
        "--compute-share",
        type=float,
        default=0.0,
        help="endpoint model: share of the memory bandwidth compute keeps while it runs beside a "
        "collective in training replay (default 0)",
    )
    p.add_argument(
        "--ace",
        action="store_true",
        help="endpoint model: an Accelerator Collectives Engine reduces and copies; a chunk costs the NPU's "
        "memory one read and one write",
    )


def _add_mpi(p: argparse.ArgumentParser, clock: bool = True) -> None:
    if clock:
        p.add_argument(
            "--clock",
            default="virtual",
            choices=("virtual", "wall"),
            help="virtual: emulated time carried in messages; wall: delays really waited",
        )
        p.add_argument(
            "--time-scale",
            type=float,
            default=1.0,
            help="wall seconds per emulated second (wall clock; default 1)",
        )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"under mpiexec: abort the job when a rank sees no progress this long ({DEFAULT_TIMEOUT_S:g})",
    )


def _add_collective(p: argparse.ArgumentParser) -> None:
    _add_topology(p)
    p.add_argument("-o", "--op", default="all_reduce", choices=OPS, help="collective (default all_reduce)")
    p.add_argument("-b", "--minbytes", default="64M", help="first size per NPU (default 64M)")
    p.add_argument("-e", "--maxbytes", default=None, help="last size per NPU (default: the first)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0, help="size factor (default 2)")
    _add_schedule(p, "float64")
    p.add_argument("--redop", default="sum", choices=REDOPS, help="reduction (default sum)")
    p.add_argument(
        "--dims", type=_csv(int), default=None, help="involved dims, comma-separated (default all)"
    )
    p.add_argument(
        "--json", metavar="PATH", help="write the rows as a JSON list, updated as each row finishes"
    )
    p.add_argument("--csv", metavar="PATH", help="write the rows as CSV, updated as each row finishes")
    p.add_argument("--trace", metavar="PATH.h5", help="write an HDF5 trace of every stage (last iteration)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--format",
        default="themis",
        choices=("themis", "nccl"),
        help="table format: this package's (default) or nccl-tests' (GB/s of 1e9 B, one block per policy)",
    )


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line in one line, from rank 0 only."""

    def error(self, message: str):
        if env_rank() == 0:
            self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
        self.exit(2)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with its subcommands."""
    parser = _Parser(
        prog="themis-mpi",
        description="Emulate multi-dimensional accelerator networks with MPI and schedule "
        f"collectives with Themis. Units: {UNITS}.",
    )
    parser.add_argument("--version", action="version", version=f"themis-mpi {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser(
        "run",
        help="emulate collectives on real data (under mpiexec)",
        description=f"Run under mpiexec with one rank per NPU. Units: {UNITS}.",
    )
    _add_collective(run)
    run.add_argument("-n", "--iters", type=int, default=5, help="timed iterations (default 5)")
    run.add_argument("-w", "--warmup-iters", type=int, default=1, help="warm-up iterations (default 1)")
    run.add_argument(
        "--check",
        type=int,
        default=1,
        choices=(0, 1),
        help="check results against the closed form (default 1)",
    )
    _add_mpi(run)

    model = sub.add_parser(
        "model",
        help="model collectives in one process (any size, no data)",
        description=f"Same flags and table as `run`, no MPI. Units: {UNITS}.",
    )
    _add_collective(model)

    train = sub.add_parser(
        "train",
        help="training iterations of a workload (model, or the emulator under mpiexec)",
        description="Replay training iterations of an ASTRA-sim 1.0 text workload, or a Chakra execution "
        f"trace (.et file, or the prefix of prefix.<rank>.et files). Units: {UNITS}.",
    )
    train.add_argument(
        "workload",
        metavar="WORKLOAD",
        help="ASTRA-sim 1.0 text workload, Chakra .et file (every rank runs it) "
        "or the prefix of prefix.<rank>.et files",
    )
    _add_topology(train)
    _add_schedule(train, "float32")
    train.add_argument("-n", "--iters", type=int, default=2, help="training iterations (default 2)")
    train.add_argument(
        "--compute-scale",
        type=float,
        default=1.0,
        help="what-if accelerator speed: factor on compute and update times (ns in the file); "
        "0.25 = an accelerator 4x faster (default 1)",
    )
    train.add_argument(
        "--comm-scale",
        type=float,
        default=1.0,
        help="what-if model width or dtype: factor on every collective's size (bytes in the file); "
        "2 = fp32 instead of 2-byte gradients and activations (default 1)",
    )
    train.add_argument(
        "--bucket-mib",
        type=float,
        default=0.0,
        help="fuse weight-gradient collectives into gradient buckets of this many MiB, DDP's way "
        "(PyTorch DDP: 25, Horovod: 64); 0 = one collective per layer, as the file says (default 0)",
    )
    train.add_argument(
        "--first-bucket-mib",
        type=float,
        default=None,
        help="cap of the first bucket (the last layers' gradients; DDP: 1; default: --bucket-mib)",
    )
    train.add_argument(
        "--comm-group",
        metavar="JSON",
        default=None,
        help='Chakra traces: communicator groups {"id": [npu, ...]} for pg_name (ASTRA-sim\'s '
        "--comm-group-configuration)",
    )
    _add_mpi(train)
    train.add_argument("--json", metavar="PATH", help="write the rows as a JSON list")

    convert = sub.add_parser(
        "convert",
        help="convert a text workload to a Chakra ET file and back",
        description="IN.txt -> OUT.et (or OUT.et.gz): the text loop as an execution graph for a topology "
        "(it decides each collective's involved_dim). IN.et -> OUT.txt: the text workload an ET converted "
        "here came from.",
    )
    convert.add_argument("input", metavar="IN", help="text workload or .et file")
    convert.add_argument("output", metavar="OUT", help="output: .et / .et.gz, or a text file")
    convert.add_argument("-t", "--topology", default="2x2x2", help="topology for text -> ET (default 2x2x2)")
    convert.add_argument(
        "-n", "--iters", type=int, default=1, help="training iterations to unroll (default 1)"
    )

    replay = sub.add_parser(
        "replay",
        help="re-run a trace's exact schedule, optionally on a changed "
        "topology (model, or the emulator under mpiexec)",
        description=f"Replay a trace. Units: {UNITS}.",
    )
    replay.add_argument("trace_in", metavar="TRACE.h5", help="the trace to replay")
    _add_topology(replay, default=None)
    _add_mpi(replay, clock=False)
    replay.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    replay.add_argument("--trace", metavar="PATH.h5", help="write the replay's own trace")

    analyze = sub.add_parser(
        "analyze",
        help="per-dim timing analysis of one or more traces",
        description=f"Analyze HDF5 traces. Units: {UNITS}.",
    )
    analyze.add_argument("traces", nargs="+", metavar="TRACE.h5")
    analyze.add_argument(
        "--ranks",
        type=_csv(int),
        default=[0],
        help="ranks whose events give busy times and timelines, comma-separated (default 0)",
    )
    analyze.add_argument("--json", metavar="PATH", help="write the analysis as JSON")
    analyze.add_argument("--plot", metavar="DIR", help="write PNG timelines, utilization and queue depth")

    export = sub.add_parser("export", help="convert a trace to Chrome/Perfetto trace-event JSON")
    export.add_argument("trace_in", metavar="TRACE.h5")
    export.add_argument("--perfetto", metavar="OUT.json", required=True, help="output file")
    export.add_argument("--ranks", type=_csv(int), default=None, help="ranks to keep, e.g. 0,1 (default all)")
    export.add_argument("--window", type=_csv(float), default=None, help="time window start,end in us")
    export.add_argument("--collective", type=int, default=None, help="keep one collective")

    calibrate = sub.add_parser(
        "calibrate",
        help="fit a dim's latency and bandwidth to an nccl-tests log",
        description="Read an all_reduce_perf / all_gather_perf / reduce_scatter_perf table and fit the "
        "latency and bandwidth of one dim of the log's NPU count, by least squares on time vs size; "
        f"print the fitted topology and the error per size. Units: {UNITS}; nccl-tests' GB/s are 1e9 B/s.",
    )
    calibrate.add_argument("log", metavar="LOG", help="nccl-tests output (text)")
    calibrate.add_argument(
        "-o",
        "--op",
        default=None,
        choices=("all_reduce", "all_gather", "reduce_scatter"),
        help="the collective (default: from the log)",
    )
    calibrate.add_argument(
        "--npus", type=int, default=None, help="NPUs measured (default: the log's Rank lines)"
    )
    calibrate.add_argument("--kind", default="SW", help="kind of the fitted dim: SW, Ring or FC (default SW)")
    calibrate.add_argument(
        "--algorithm",
        default="nccl",
        help="nccl (default: the NCCL-like model, all sizes) or a per-dim algorithm (ring...: one-dim fit)",
    )
    calibrate.add_argument("-c", "--chunks", type=int, default=1, help="chunks the fit assumes (default 1)")
    calibrate.add_argument("--min-size", default="1M", help="smallest size of the per-dim fit (default 1M)")
    calibrate.add_argument(
        "--table", type=int, default=None, help="which table of a log with several (1, 2...)"
    )
    calibrate.add_argument(
        "--nccl-algo", default=None, help="the algorithms the run allowed (NCCL_ALGO), e.g. Ring or Ring,Tree"
    )
    calibrate.add_argument(
        "--base",
        default=None,
        help="a single-node fit (its topology or --json file): fit dim 1 of a multi-node log",
    )
    calibrate.add_argument(
        "--link-gbps",
        type=float,
        default=450e9 / 2**30,
        help="dim 0's nominal link rate, GB/s (default NVLink 4)",
    )
    calibrate.add_argument("--json", metavar="PATH", help='write {"topology", "chunks", "args", "rows", ...}')

    sub.add_parser("topologies", help="list the topology presets")
    sub.add_parser("policies", help="list the inter-dim and intra-dim scheduling policies (and plugins)")
    sub.add_parser("info", help="print versions of the package, numpy, mpi4py, h5py and MPI")
    return parser


# --- options to domain objects -----------------------------------------------------------------


def _split_list(text: str) -> list[str]:
    """Comma-separated items, commas inside parentheses kept (inline topologies have them)."""
    items, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += ch
    items.append(current.strip())
    if not all(items):
        raise UsageError(f"empty item in the list {text!r}")
    return items


def _topology(args: argparse.Namespace, base: Topology | None = None) -> Topology:
    """The one topology of a command that takes one (train, replay)."""
    if args.algorithm is not None and len(args.algorithm) > 1:
        raise UsageError("this command takes one --algorithm list")
    topo = base if base is not None else parse_topology(args.topology)
    return topo.with_overrides(args.bandwidth, args.latency, args.algorithm[0] if args.algorithm else None)


def _topologies(args: argparse.Namespace) -> list[Topology]:
    """Every topology of a sweep: each -t item under each --algorithm override."""
    out = []
    for spec in _split_list(args.topology):
        base = parse_topology(spec)
        for algorithms in args.algorithm or [None]:
            out.append(base.with_overrides(args.bandwidth, args.latency, algorithms))
    return out


def _collectives(args: argparse.Namespace, topo: Topology) -> list[Collective]:
    from .check import check_range

    n_dims = len(topo.dims)
    dims = tuple(range(n_dims)) if args.dims is None else tuple(args.dims)
    if not dims or any(d is None or not 0 <= d < n_dims for d in dims) or len(set(dims)) != len(dims):
        raise UsageError(f"--dims must list distinct dims between 0 and {n_dims - 1}")
    itemsize = np.dtype(args.dtype).itemsize  # chunks are checked by Collective
    check_range(args.dtype, topo.group_npus(dims))
    out = []
    for size in size_sweep(
        parse_size(args.minbytes),
        None if args.maxbytes is None else parse_size(args.maxbytes),
        args.stepfactor,
    ):
        if size < itemsize:
            raise UsageError(f"size {size} B is smaller than one {args.dtype} element")
        for chunks in _chunk_counts(args):
            coll = Collective(args.op, size // itemsize, args.dtype, chunks, tuple(sorted(dims)), args.redop)
            if coll.n_chunks < coll.chunks and env_rank() == 0:
                print(
                    f"themis-mpi: warning: {format_size(size)} holds only {coll.count} {args.dtype} "
                    f"element(s): {coll.n_chunks} chunk(s) of one element instead of {coll.chunks}",
                    file=sys.stderr,
                )
            out.append(coll)
    return out


def _one_chunk_count(args: argparse.Namespace) -> int:
    """The chunk count of a command that takes one (train)."""
    counts = _chunk_counts(args)
    if len(counts) > 1:
        raise UsageError("train takes one chunk count (sweep with the Python API or a shell loop)")
    return counts[0]


def _chunk_counts(args: argparse.Namespace) -> list[int]:
    if not args.chunks or any(c is None for c in args.chunks):
        raise UsageError("-c needs chunk counts, e.g. 64 or 4,16,64")
    for c in args.chunks:
        in_range("chunks", c, 1, MAX_CHUNKS)
    return list(args.chunks)


def _endpoint_delay_ns(args: argparse.Namespace) -> float:
    """The flag's value, else ASTRA-sim's 10 ns under its compat mode, else 0."""
    if args.endpoint_delay_ns is not None:
        return float(args.endpoint_delay_ns)
    return ASTRA_ENDPOINT_DELAY_NS if args.compat == ASTRA_SIM_1_0 else 0.0


def _policy_names(text: str) -> list[str]:
    """The names of `--policy`: a comma-separated list, ``both`` (baseline,themis) or ``all``."""
    if text == "all":
        return inter_names()
    names = ["baseline", "themis"] if text == "both" else _split_list(text)
    for name in names:
        inter_class(name)
    return names


def _configs(args: argparse.Namespace) -> list[tuple[InterPolicy, RunConfig]]:
    """(policy, RunConfig) per policy and intra-dim policy; intra `auto` is the policy's own default.

    Each policy is one instance for the whole command, so state it keeps between collectives
    (roundRobin's counter) carries on.
    """
    intras = _split_list(args.intra)
    for name in intras:
        if name != "auto":
            intra_class(name)
    out = []
    for name in _policy_names(args.policy):
        policy = make_inter(name)
        for intra in dict.fromkeys(policy.default_intra if i == "auto" else i for i in intras):
            out.append(
                (
                    policy,
                    RunConfig(
                        intra=intra,
                        active_per_dim=args.active_chunks_per_dim,
                        endpoint_delay_ns=_endpoint_delay_ns(args),
                        clock=getattr(args, "clock", "virtual"),
                        time_scale=getattr(args, "time_scale", 1.0),
                        timeout_s=getattr(args, "timeout_s", DEFAULT_TIMEOUT_S),
                        compat=args.compat,
                        endpoint=Endpoint(args.hbm_gbps, args.compute_share, args.ace),
                    ),
                )
            )
    return out


def _check_outputs(*paths: str | None, inputs: tuple[str, ...] = ()) -> None:
    """Refuse bad output paths before any work (on rank 0: a refusal there aborts the job with 2)."""
    for path in paths:
        if path:
            check_output_path(path, inputs)


def _header(topo: Topology, command: str, config: RunConfig) -> str:
    lines = [f"# themis-mpi {command}: topology {topo.label()}, {topo.npus} NPUs"]
    for d, dim in enumerate(topo.dims):
        lines.append(
            f"#   dim {d}: {dim.kind:<14} npus {dim.npus:>4}  {dim.bandwidth_gbps:g} GB/s  "
            f"{dim.latency_ns:g} ns/hop  {dim.algorithm}"
        )
    if config.endpoint_delay_ns or config.compat:
        lines.append(
            f"#   endpoint delay {config.endpoint_delay_ns:g} ns"
            + (f", compat {config.compat}" if config.compat else "")
        )
    if config.endpoint.on:
        e = config.endpoint
        lines.append(
            f"#   endpoint model: HBM {e.hbm_gbps:g} GB/s, compute share {e.compute_share:g}, "
            + ("ACE (one read and one write per chunk)" if e.ace else "reductions and copies on the NPU")
        )
    return "\n".join(lines)


# --- subcommands -------------------------------------------------------------------------------


def _collective_sweep(args: argparse.Namespace, use_mpi: bool, command: str) -> int:
    """`run` and `model`: topologies x sizes x chunks x policies, each row shown and saved as it ends."""
    from .analysis import flat_row, table_header, table_row
    from .driver import open_backend, run_collective

    if use_mpi:
        in_range("--iters", args.iters, 1, MAX_ITERS)
        in_range("--warmup-iters", args.warmup_iters, 0, MAX_ITERS)
    topologies = _topologies(args)
    if args.trace and len(topologies) > 1:
        raise UsageError("--trace records one topology; sweep topologies without it")
    sweep = [(topo, _collectives(args, topo)) for topo in topologies]
    configs = _configs(args)
    iters, warmup = (args.iters, args.warmup_iters) if use_mpi else (1, 0)
    if use_mpi:
        if not under_mpiexec():
            npus = topologies[0].npus
            raise UsageError(
                f"run needs one MPI rank per NPU: mpiexec -n {npus} themis-mpi run ... (or use model)"
            )
        largest = max(c.size_bytes for _, colls in sweep for c in colls)
        check_memory(3 * largest, "the buffer and scratch of the largest size")
    clock = configs[0][1].clock if use_mpi else "model"
    files = RowFiles(args.json, args.csv, flat_row)
    progress = _Lines(sum(len(c) for _, c in sweep) * len(configs), args.quiet or env_rank() != 0)
    for topo, colls in sweep:
        recorder = _trace_recorder(topo, use_mpi, clock, configs[0][1]) if args.trace else None
        with open_backend(topo, use_mpi, configs[0][1].timeout_s) as backend:
            if backend.rank == 0:
                _check_outputs(args.json, args.csv, args.trace)
                progress.write(_header(topo, command, configs[0][1]))
                if args.format != "nccl":
                    progress.write(table_header(len(topo.dims), clock))
            rows = []
            for coll in colls:
                for policy, config in configs:
                    transport = backend.transport(config)
                    walls = []
                    for it in range(warmup + iters):
                        last = it == warmup + iters - 1
                        check = bool(getattr(args, "check", 1)) and last
                        result, engine = run_collective(transport, coll, policy, check=check)
                        if it >= warmup:
                            walls.append(result.wall_s)
                    result.wall_s, result.iters = median(walls), iters
                    if recorder:
                        recorder.add_run(result, engine, backend.rank)
                    if backend.rank == 0:
                        if args.format != "nccl":
                            progress.write(table_row(result))
                        files.add(result.to_dict())
                    rows.append(result)
                    progress.update()
            if backend.rank == 0 and args.format == "nccl":  # nccl-tests' blocks, at the end of a topology
                from .calibrate import format_nccl

                progress.write(format_nccl(rows, topo.group_npus(colls[0].dims)))
            events = backend.gather(recorder.my_events()) if recorder else None
            if backend.rank == 0 and recorder and events is not None:
                recorder.write(args.trace, events, backend.service)  # the other ranks wait, patiently
                progress.write(
                    f"# wrote {args.trace}: {len(events)} stage events of {len(recorder.rows)} collectives"
                )
    progress.close()
    if backend.rank == 0:
        files.close()
    return 0


def _trace_recorder(topo: Topology, use_mpi: bool, clock: str, settings: RunConfig) -> TraceRecorder:
    """The `--trace` recorder of one topology (every rank records its own stage events)."""
    from .trace import TraceRecorder  # only --trace records: a plain run never loads the trace code

    return TraceRecorder(
        topo, "mpi" if use_mpi else "model", clock=clock, time_scale=settings.time_scale,
        active_per_dim=settings.active_per_dim, endpoint_delay_ns=settings.endpoint_delay_ns,
        compat=settings.compat,
    )  # fmt: skip


class _Lines:
    """Where rows go as they finish: lines on stdout, a tqdm bar on stderr when it is a terminal."""

    def __init__(self, total: int, quiet: bool):
        self.bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm  # type: ignore[import-untyped]

            self.bar = tqdm(total=total, unit="run", file=sys.stderr, leave=False)

    def write(self, line: str) -> None:
        """Print a line above the bar."""
        if self.bar is not None:
            self.bar.clear()
        print(line, flush=True)
        if self.bar is not None:
            self.bar.refresh()

    def update(self) -> None:
        """One more run done."""
        if self.bar is not None:
            self.bar.update()

    def close(self) -> None:
        """Remove the bar."""
        if self.bar is not None:
            self.bar.close()


def cmd_run(args: argparse.Namespace) -> int:
    """`themis-mpi run`: emulate on real data, one rank per NPU."""
    return _collective_sweep(args, True, "run")


def cmd_model(args: argparse.Namespace) -> int:
    """`themis-mpi model`: the same rows from the model transport."""
    return _collective_sweep(args, False, "model")


def _train_graph(args: argparse.Namespace) -> int:
    """`themis-mpi train` on a Chakra trace: the graph under each policy."""
    from .driver import open_backend, run_graph
    from .graph import graph_collectives, load_graph, plan_graph
    from .training import TrainingSpec
    from .workload import Workload

    if args.bucket_mib or args.first_bucket_mib is not None:
        raise UsageError("--bucket-mib and --first-bucket-mib apply to text workloads only")
    graph = load_graph(args.workload, args.comm_group)
    given = _topology(args)
    topo = Workload("", "HYBRID_TRANSFORMER", [], graph.model_parallel_group).fit_topology(given)
    spec = TrainingSpec(_one_chunk_count(args), args.dtype, 1, args.compute_scale, args.comm_scale)
    configs = _configs(args)
    use_mpi = under_mpiexec()
    if not graph.symmetric and len(graph.traces) != topo.npus:
        raise UsageError(f"{args.workload}: {len(graph.traces)} per-rank traces but {topo.npus} NPUs")
    ranks = range(topo.npus) if use_mpi else [0]
    collectives = graph_collectives(graph, topo, spec, ranks)  # refused on every rank before MPI starts
    plan = plan_graph(graph.trace(0), topo, 0, spec, graph.groups)
    if use_mpi and collectives:
        check_memory(3 * max(c.size_bytes for c in collectives), "the buffers of the largest collectives")
    with open_backend(topo, use_mpi, configs[0][1].timeout_s) as backend:
        if backend.rank == 0:
            _check_outputs(args.json)
        rows = [
            run_graph(backend.transport(config), graph, policy, spec, ranks) for policy, config in configs
        ]
        if backend.rank == 0:
            _report_graph(args, graph, plan, collectives, given, topo, spec, rows, use_mpi)
    return 0


def _report_graph(args, graph, plan, collectives, given: Topology, topo: Topology, spec, rows, use_mpi):
    """The `train` table of a Chakra trace and its JSON."""
    trace = graph.trace(0)
    kinds = ", ".join(f"{n} {kind}" for kind, n in trace.counts().items())
    files = "1 file for every rank" if graph.symmetric else f"{len(graph.traces)} per-rank files"
    print(
        f"# Chakra trace {args.workload}: {files}; "
        f"rank 0: {len(trace.nodes)} nodes ({kinds}); {plan.collectives} collectives on the network "
        f"({len(collectives)} distinct), {plan.messages} point-to-point messages; "
        f"{plan.missing_deps} deps on absent nodes ignored, {plan.dropped_ctrl_deps} cyclic ctrl deps dropped"
    )
    print(
        f"# topology {topo.label()}, {topo.npus} NPUs; {graph.iterations} iteration(s) in the graph, "
        f"{spec.chunks} chunks per collective, {'emulator' if use_mpi else 'model'}"
    )
    if topo != given:
        print(
            f"# model-parallel group {graph.model_parallel_group} splits a dim: "
            f"{given.spec()} runs as {topo.spec()}"
        )
    _print_training_rows(rows, topo)
    if args.json:
        write_json(args.json, [r.to_dict() for r in rows])


def _print_training_rows(rows: list, topo: Topology) -> None:
    """The rows of `train`, with the speedup over the baseline."""
    base = next((r for r in rows if r.policy == "baseline"), None)
    for r in rows:
        r.speedup = base.iteration_us / r.iteration_us if base and r.iteration_us else None
    dim_cols = "".join(f" {'dim' + str(d) + '%':>6}" for d in range(len(topo.dims)))
    print(
        f"#{'policy':>9} {'intra':>5} {'iteration_us':>13} {'compute_us':>11} {'exposed_us':>11} "
        f"{'colls':>6} {'#wrong':>7}{dim_cols} {'speedup':>8}"
    )
    for r in rows:
        wrong = "N/A" if r.wrong is None else r.wrong
        speed = f"{r.speedup:.3f}x" if r.speedup else "-"
        print(
            f" {r.policy:>9} {r.intra:>5} {r.iteration_us:>13.2f} {r.compute_us:>11.2f} "
            f"{r.exposed_comm_us:>11.2f} {r.collectives:>6} {wrong:>7}"
            + "".join(f" {100 * d.utilization:>6.1f}" for d in r.dims)
            + f" {speed:>8}"
        )


def cmd_convert(args: argparse.Namespace) -> int:
    """`themis-mpi convert`: text workload -> Chakra ET, or ET -> text workload."""
    from . import chakra
    from .graph import is_et_source
    from .workload import parse_workload

    in_range("--iters", args.iters, 1, MAX_ITERS)
    check_output_path(args.output, inputs=(args.input,))
    if is_et_source(args.input):
        text = chakra.et_to_workload_text(chakra.read_et(args.input))
        with atomic_path(args.output) as tmp, open(tmp, "w") as f:
            f.write(text)
        print(f"# wrote {args.output}: the text workload of {args.input}")
        return 0
    if not args.output.endswith((".et", ".et.gz")):
        raise UsageError(f"{args.output}: a text workload converts to a .et or .et.gz file")
    wl = parse_workload(args.input)
    topo = parse_topology(args.topology)
    trace = chakra.workload_to_et(wl, topo, args.iters, args.output)
    chakra.write_et(args.output, trace)
    counts = ", ".join(f"{n} {kind}" for kind, n in trace.counts().items())
    print(
        f"# wrote {args.output}: {len(trace.nodes)} nodes ({counts}), {args.iters} iteration(s) of "
        f"{args.input} ({wl.parallelism}, {len(wl.layers)} layers) on {wl.fit_topology(topo).label()}"
    )
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """`themis-mpi train`: training iterations of a workload under each policy, with the speedup."""
    from .driver import open_backend, run_training
    from .graph import is_et_source
    from .training import TrainingSpec, distinct_collectives
    from .workload import parse_workload

    if is_et_source(args.workload):
        return _train_graph(args)
    if args.comm_group:
        raise UsageError("--comm-group applies to Chakra traces only")
    wl = parse_workload(args.workload)
    given = _topology(args)
    topo = wl.fit_topology(given)
    spec = TrainingSpec(
        _one_chunk_count(args),
        args.dtype,
        args.iters,
        args.compute_scale,
        args.comm_scale,
        args.bucket_mib,
        args.first_bucket_mib,
    )
    configs = _configs(args)
    collectives = distinct_collectives(wl, topo, spec)  # a workload that does not fit is refused here
    use_mpi = under_mpiexec()
    if use_mpi and collectives:
        check_memory(3 * max(c.size_bytes for c in collectives), "the buffers of the largest collectives")
    with open_backend(topo, use_mpi, configs[0][1].timeout_s) as backend:
        if backend.rank == 0:
            _check_outputs(args.json)
        rows = [run_training(backend.transport(config), wl, policy, spec) for policy, config in configs]
        if backend.rank == 0:
            _report_training(args, wl, given, topo, spec, rows, use_mpi)
    return 0


def _report_training(args, wl, given: Topology, topo: Topology, spec, rows: list, use_mpi: bool) -> None:
    """The `train` table of a text workload and its JSON."""
    print(
        f"# workload {args.workload}: {wl.parallelism}, {len(wl.layers)} layers; topology {topo.label()}, "
        f"{topo.npus} NPUs; {spec.iterations} iterations, {spec.chunks} chunks per collective, "
        f"{'emulator' if use_mpi else 'model'}"
    )
    if topo != given:
        group = wl.model_parallel_group
        print(f"# model-parallel group {group} splits a dim: {given.spec()} runs as {topo.spec()}")
    if spec.bucket_mib:
        from .training import bucket_plan

        buckets = bucket_plan(wl, topo, spec)
        sizes = [b.collective.size_bytes / 2**20 for b in buckets] or [0.0]
        first = f", first {spec.first_bucket_mib:g} MiB" if spec.first_bucket_mib is not None else ""
        print(
            f"# gradient buckets of {spec.bucket_mib:g} MiB{first}: {len(buckets)} per iteration for "
            f"{sum(len(b.layers) for b in buckets)} layers, {min(sizes):.2f} to {max(sizes):.2f} MiB, "
            f"{sum(sizes):.2f} MiB in all"
        )
    _print_training_rows(rows, topo)
    if args.json:
        write_json(args.json, [r.to_dict() for r in rows])


def cmd_replay(args: argparse.Namespace) -> int:
    """`themis-mpi replay`: a trace's schedule again, on the model or (under mpiexec) the emulator."""
    from .driver import RunConfig, open_backend
    from .replay import format_replay, replay_trace
    from .trace import Trace

    RunConfig(timeout_s=args.timeout_s)  # validates the timeout before MPI starts
    trace = Trace(args.trace_in)
    topo = _topology(args, parse_topology(args.topology) if args.topology else trace.topology())
    use_mpi = under_mpiexec()
    with open_backend(topo, use_mpi, args.timeout_s) as backend:
        if backend.rank == 0:
            _check_outputs(args.json, args.trace, inputs=(args.trace_in,))
        result = replay_trace(trace, topo, backend, args.timeout_s)
        if backend.rank != 0:
            return 0
        print(format_replay(trace, result, topo, backend.name))
        if args.json:
            write_json(args.json, result.to_dict(trace))
        if args.trace and result.recorder is not None and result.events is not None:
            result.recorder.write(args.trace, result.events, backend.service)
    return 0 if (not result.unchanged or result.reproduced) else 1


def cmd_analyze(args: argparse.Namespace) -> int:
    """`themis-mpi analyze`: per-dim busy/idle time, bytes, queueing delay, bandwidths."""
    from .analysis import analyze_trace, format_analysis
    from .trace import Trace

    ranks = args.ranks
    if not ranks or any(r is None or r < 0 for r in ranks):
        raise UsageError("--ranks must list ranks >= 0, e.g. 0 or 0,3")
    _check_outputs(args.json, inputs=tuple(args.traces))
    if args.plot and os.path.exists(args.plot) and not os.path.isdir(args.plot):
        raise UsageError(f"--plot {args.plot}: not a directory")
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
        from . import plots

        os.makedirs(args.plot, exist_ok=True)
        written = [plots.utilization_bars(rows, os.path.join(args.plot, "utilization.png"))]
        for t, trace in enumerate(traces):
            stem = f"{t}-{os.path.splitext(os.path.basename(trace.path))[0]}"
            for c in trace.collectives["collective"].tolist():
                written.append(
                    plots.timeline(trace, c, os.path.join(args.plot, f"{stem}-c{c}-timeline.png"), ranks)
                )
                written.append(
                    plots.queue_depth(trace, c, os.path.join(args.plot, f"{stem}-c{c}-queues.png"), ranks[0])
                )
        print("# wrote " + " ".join(written))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """`themis-mpi export --perfetto`: trace-event JSON for Perfetto."""
    from .perfetto import to_perfetto, write_perfetto
    from .trace import Trace

    _check_outputs(args.perfetto, inputs=(args.trace_in,))
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


def cmd_calibrate(args: argparse.Namespace) -> int:
    """`themis-mpi calibrate`: fit a dim to an nccl-tests log and show the error per size."""
    from .calibrate import fit, format_fit, read_nccl_log
    from .limits import MAX_CHUNKS
    from .topology import KIND_ALIASES

    _check_outputs(args.json, inputs=(args.log,))
    in_range("--chunks", args.chunks, 1, MAX_CHUNKS)
    if args.npus is not None:
        in_range("--npus", args.npus, 2, 2**20)
    kind = KIND_ALIASES.get(args.kind.lower())
    if kind is None:
        raise UsageError(f"unknown dim kind {args.kind!r}; use SW, Ring or FC")
    if args.algorithm.lower() == "nccl":
        from .calibrate import run_calibrate

        return run_calibrate(args, kind)
    log = read_nccl_log(args.log, args.op, args.npus, args.table)
    result = fit(log, kind, args.algorithm.lower(), args.chunks, parse_size(args.min_size))
    print(format_fit(log, result))
    if args.json:
        write_json(args.json, result.to_dict())
    return 0


def cmd_topologies(args: argparse.Namespace) -> int:
    """`themis-mpi topologies`: the presets with their inline form."""
    width = max(map(len, PRESETS))
    print(
        f"# {'preset':<{width}} {'npus':>5}  inline form (KIND(npus,GB/s,ns,algorithm)); "
        "GB/s with 1 GB = 2^30 B"
    )
    for name in PRESETS:
        topo = parse_topology(name)
        print(
            f"  {name:<{width}} {topo.npus:>5}  {topo.spec()}\n  {'':<{width}} {'':>5}  "
            f"# {DESCRIPTIONS[name]}"
        )
        if name in SOURCES:
            for line in textwrap.wrap(SOURCES[name], 96):
                print(f"  {'':<{width}} {'':>5}  #   {line}")
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    """`themis-mpi policies`: every inter-dim and intra-dim policy, with where it comes from."""
    inter, intra = inter_names(), intra_names()
    width = max(map(len, inter + intra))
    print(f"# inter-dim policies (--policy); {len(inter)}")
    for name in inter:
        cls = inter_class(name)
        tags = f"auto intra {cls.default_intra}" + (", sizes chunks" if cls.sizes_chunks else "")
        print(f"  {name:<{width}}  {cls.description}  [{tags}; {origin(name)}]")
    print(f"# intra-dim policies (--intra); {len(intra)}")
    for name in intra:
        print(f"  {name:<{width}}  {intra_class(name).description}  [{origin(name)}]")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """`themis-mpi info`: versions, for bug reports and trace metadata."""
    from .trace import versions

    for key, value in versions().items():
        print(f"{key:>10}: {value}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "model": cmd_model,
    "train": cmd_train,
    "convert": cmd_convert,
    "replay": cmd_replay,
    "analyze": cmd_analyze,
    "export": cmd_export,
    "calibrate": cmd_calibrate,
    "topologies": cmd_topologies,
    "policies": cmd_policies,
    "info": cmd_info,
}


# --- errors end every rank ---------------------------------------------------------------------

FORWARD_S = 0.3  # lets the launcher forward a last line before an abort tears the job down
RANK0_GRACE_S = 1.0  # a rank other than 0 waits this long for rank 0 to report the same error


def _world() -> Any:
    """COMM_WORLD when MPI is running with more than one rank, else None."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized() or mpi.COMM_WORLD.Get_size() < 2:
        return None
    return mpi.COMM_WORLD


def _abort(world: Any, message: str, code: int) -> int:
    """Print `message` once for the job and abort every rank with `code`.

    Rank 0 prints and aborts at once. Another rank first gives rank 0 a moment: when rank 0 met
    the same error it aborts the job (and this rank) with one line; when only this rank did, it
    prints its own line and aborts.
    """
    if world.Get_rank() != 0:
        time.sleep(RANK0_GRACE_S)
    print(message, file=sys.stderr, end="" if message.endswith("\n") else "\n", flush=True)
    time.sleep(FORWARD_S)
    world.Abort(code)
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point: one line and exit 2 for a user mistake; a bug or a lost rank aborts every rank."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as exc:
        world = _world()
        if world is None:  # found before MPI started: every rank found it
            if env_rank() == 0:
                print(f"themis-mpi: error: {exc}", file=sys.stderr, flush=True)
            return 2
        return _abort(world, f"themis-mpi: error: {exc}", 2)
    except KeyboardInterrupt:  # Ctrl-C reaches every rank: one line, and the job ends
        world = _world()
        if env_rank() == 0:
            print("themis-mpi: interrupted", file=sys.stderr, flush=True)
        if world is not None:
            world.Abort(130)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as a Unix filter does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        world = _world()
        if type(exc).__name__ == "Stalled" and world is not None:
            print(f"themis-mpi: error: {exc}; aborting the job", file=sys.stderr, flush=True)
            time.sleep(FORWARD_S)
            world.Abort(3)
            return 3
        if world is None:
            raise
        return _abort(world, traceback.format_exc(), 1)
