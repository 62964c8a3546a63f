"""The `themis-mpi` command: options in, domain objects out, library calls, tables printed.

Subcommands: run (under mpiexec), model, train, replay, analyze, export, topologies, policies,
info. Sizes
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
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from . import __version__
from .collectives import DTYPES, OPS, REDOPS, Collective
from .cost import ASTRA_ENDPOINT_DELAY_NS, ASTRA_SIM_1_0
from .driver import DEFAULT_TIMEOUT_S, RunConfig
from .errors import UsageError
from .launch import env_rank, under_mpiexec
from .output import write_json
from .policies import InterPolicy, inter_class, inter_names, intra_class, intra_names, make_inter, origin
from .topology import ALGORITHMS, DESCRIPTIONS, PRESETS, Topology, parse_topology

UNITS = "sizes in bytes (suffixes K/M/G are binary); bandwidth in GB/s with 1 GB = 2^30 B; times in us"
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)B?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``64M`` -> 67108864; plain numbers are bytes."""
    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"bad size {text!r}: use a byte count with an optional K, M or G suffix")
    value = int(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2).upper()]
    if value <= 0:
        raise UsageError(f"size must be positive, got {text!r}")
    return value


MAX_SIZES = 4096


def size_sweep(first: int, last: int | None, factor: float) -> list[int]:
    """Sizes from first to last, multiplied by factor (nccl-tests' -b/-e/-f), each larger than the last."""
    last = first if last is None else last
    if last < first:
        raise UsageError(f"last size ({last} B) is smaller than the first ({first} B)")
    if not math.isfinite(factor) or (factor <= 1 and last > first):
        raise UsageError(f"size factor must be a finite number > 1 to sweep, got {factor}")
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
        f"or ASTRA-sim network .yml (default {default or 'the recorded one'})",
    )
    p.add_argument(
        "--algorithm",
        type=_csv(str),
        default=None,
        help=f"per-dim algorithm override, comma-separated ({', '.join(ALGORITHMS)}, hd; "
        "empty keeps the default)",
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
    p.add_argument("-c", "--chunks", type=int, default=64, help="chunks per collective (default 64)")
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
        help="intra-dim queue policy (fifo, scf, rg, lrpf or a plugin); auto = each inter-dim policy's "
        "own (fifo for baseline and roundRobin, scf otherwise)",
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
    p.add_argument("--json", metavar="PATH", help="write the rows as a JSON list")
    p.add_argument("--trace", metavar="PATH.h5", help="write an HDF5 trace of every stage (last iteration)")


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
        description=f"Replay training iterations of an ASTRA-sim 1.0 text workload. Units: {UNITS}.",
    )
    train.add_argument("workload", metavar="WORKLOAD", help="ASTRA-sim 1.0 text workload file")
    _add_topology(train)
    _add_schedule(train, "float32")
    train.add_argument("-n", "--iters", type=int, default=2, help="training iterations (default 2)")
    train.add_argument(
        "--compute-scale",
        type=float,
        default=1.0,
        help="factor on compute and update times (ns in the file; default 1)",
    )
    train.add_argument(
        "--comm-scale",
        type=float,
        default=1.0,
        help="factor on every collective's size (bytes in the file; default 1)",
    )
    _add_mpi(train)
    train.add_argument("--json", metavar="PATH", help="write the rows as a JSON list")

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

    sub.add_parser("topologies", help="list the topology presets")
    sub.add_parser("policies", help="list the inter-dim and intra-dim scheduling policies (and plugins)")
    sub.add_parser("info", help="print versions of the package, numpy, mpi4py, h5py and MPI")
    return parser


# --- options to domain objects -----------------------------------------------------------------


def _topology(args: argparse.Namespace, base: Topology | None = None) -> Topology:
    topo = base if base is not None else parse_topology(args.topology)
    return topo.with_overrides(args.bandwidth, args.latency, args.algorithm)


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
        out.append(
            Collective(args.op, size // itemsize, args.dtype, args.chunks, tuple(sorted(dims)), args.redop)
        )
    return out


def _endpoint_delay_ns(args: argparse.Namespace) -> float:
    """The flag's value, else ASTRA-sim's 10 ns under its compat mode, else 0."""
    if args.endpoint_delay_ns is not None:
        return float(args.endpoint_delay_ns)
    return ASTRA_ENDPOINT_DELAY_NS if args.compat == ASTRA_SIM_1_0 else 0.0


def _policy_names(text: str) -> list[str]:
    """The names of `--policy`: a comma-separated list, ``both`` (baseline,themis) or ``all``."""
    if text == "all":
        return inter_names()
    names = ["baseline", "themis"] if text == "both" else [n.strip() for n in text.split(",")]
    for name in names:
        inter_class(name)
    return names


def _configs(args: argparse.Namespace) -> list[tuple[InterPolicy, RunConfig]]:
    """(policy, RunConfig) per policy to run; intra `auto` is the policy's own default.

    Each policy is one instance for the whole command, so state it keeps between collectives
    (roundRobin's counter) carries on.
    """
    if args.intra != "auto":
        intra_class(args.intra)
    out = []
    for name in _policy_names(args.policy):
        policy = make_inter(name)
        intra = args.intra if args.intra != "auto" else policy.default_intra
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
                ),
            )
        )
    return out


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
    return "\n".join(lines)


# --- subcommands -------------------------------------------------------------------------------


def _collective_sweep(args: argparse.Namespace, use_mpi: bool, command: str) -> int:
    """`run` and `model`: every size under every policy, through the one driver."""
    from .analysis import format_table
    from .driver import open_backend, run_collective
    from .trace import TraceRecorder

    if use_mpi and (args.iters < 1 or args.warmup_iters < 0):
        raise UsageError("--iters must be >= 1 and --warmup-iters >= 0")
    topo = _topology(args)
    colls = _collectives(args, topo)
    configs = _configs(args)
    iters, warmup = (args.iters, args.warmup_iters) if use_mpi else (1, 0)
    clock = configs[0][1].clock if use_mpi else "model"
    recorder = None
    if args.trace:
        recorder = TraceRecorder(
            topo,
            "mpi" if use_mpi else "model",
            clock=clock,
            time_scale=configs[0][1].time_scale,
            active_per_dim=args.active_chunks_per_dim,
            endpoint_delay_ns=configs[0][1].endpoint_delay_ns,
            compat=args.compat,
        )
    rows = []
    with open_backend(topo, use_mpi, configs[0][1].timeout_s) as backend:
        if backend.rank == 0:
            print(_header(topo, command, configs[0][1]), flush=True)
        for coll in colls:
            for policy, config in configs:
                transport = backend.transport(config)
                walls = []
                for it in range(warmup + iters):
                    last = it == warmup + iters - 1
                    result, engine = run_collective(
                        transport, coll, policy, check=bool(getattr(args, "check", 1)) and last
                    )
                    if it >= warmup:
                        walls.append(result.wall_s)
                result.wall_s, result.iters = statistics.median(walls), iters
                rows.append(result)
                if recorder:
                    recorder.add_run(result, engine, backend.rank)
        events = backend.gather(recorder.my_events()) if recorder else None
    if backend.rank == 0:
        print(format_table(rows, len(topo.dims), clock))
        if args.json:
            write_json(args.json, [r.to_dict() for r in rows])
        if recorder and events is not None:
            recorder.write(args.trace, events)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """`themis-mpi run`: emulate on real data, one rank per NPU."""
    return _collective_sweep(args, True, "run")


def cmd_model(args: argparse.Namespace) -> int:
    """`themis-mpi model`: the same rows from the model transport."""
    return _collective_sweep(args, False, "model")


def cmd_train(args: argparse.Namespace) -> int:
    """`themis-mpi train`: training iterations of a workload under each policy, with the speedup."""
    from .driver import open_backend, run_training
    from .training import TrainingSpec, distinct_collectives
    from .workload import parse_workload

    wl = parse_workload(args.workload)
    given = _topology(args)
    topo = wl.fit_topology(given)
    spec = TrainingSpec(args.chunks, args.dtype, args.iters, args.compute_scale, args.comm_scale)
    configs = _configs(args)
    distinct_collectives(wl, topo, spec)  # a workload that does not fit is refused before MPI starts
    use_mpi = under_mpiexec()
    with open_backend(topo, use_mpi, configs[0][1].timeout_s) as backend:
        rows = [run_training(backend.transport(config), wl, policy, spec) for policy, config in configs]
    if backend.rank != 0:
        return 0
    base = next((r for r in rows if r.policy == "baseline"), None)
    for r in rows:
        r.speedup = base.iteration_us / r.iteration_us if base and r.iteration_us else None
    print(
        f"# workload {args.workload}: {wl.parallelism}, {len(wl.layers)} layers; topology {topo.label()}, "
        f"{topo.npus} NPUs; {spec.iterations} iterations, {spec.chunks} chunks per collective, "
        f"{'emulator' if use_mpi else 'model'}"
    )
    if topo != given:
        group = wl.model_parallel_group
        print(f"# model-parallel group {group} splits a dim: {given.spec()} runs as {topo.spec()}")
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
    if args.json:
        write_json(args.json, [r.to_dict() for r in rows])
    return 0


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
        result = replay_trace(trace, topo, backend, args.timeout_s)
    if backend.rank != 0:
        return 0
    print(format_replay(trace, result, topo, backend.name))
    if args.json:
        write_json(args.json, result.to_dict(trace))
    if args.trace and result.recorder is not None and result.events is not None:
        result.recorder.write(args.trace, result.events)
    return 0 if (not result.unchanged or result.reproduced) else 1


def cmd_analyze(args: argparse.Namespace) -> int:
    """`themis-mpi analyze`: per-dim busy/idle time, bytes, queueing delay, bandwidths."""
    from .analysis import analyze_trace, format_analysis
    from .trace import Trace

    ranks = args.ranks
    if not ranks or any(r is None or r < 0 for r in ranks):
        raise UsageError("--ranks must list ranks >= 0, e.g. 0 or 0,3")
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
    "replay": cmd_replay,
    "analyze": cmd_analyze,
    "export": cmd_export,
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
