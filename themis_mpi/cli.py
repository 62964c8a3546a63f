"""The `themis-mpi` command: run (under mpiexec), model, topologies, info.

Sizes follow nccl-tests: ``-b`` first size, ``-e`` last size, ``-f`` factor between sizes, with
binary suffixes K, M, G (64M = 64 * 2^20 bytes). Bandwidths are GB/s with 1 GB = 2^30 bytes.
A user mistake prints one line (from rank 0 under MPI) and exits with status 2 on every rank.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

import numpy as np

from . import __version__
from .collectives import DTYPES, OPS, REDOPS, Collective
from .engine import INTRA_POLICIES
from .errors import UsageError
from .launch import env_rank
from .policies import POLICIES
from .topology import ALGORITHMS, DESCRIPTIONS, PRESETS, parse_topology

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


def size_sweep(first: int, last: int | None, factor: float) -> list[int]:
    """Sizes from first to last, multiplied by factor (nccl-tests' -b/-e/-f)."""
    last = first if last is None else last
    if last < first:
        raise UsageError(f"last size ({last} B) is smaller than the first ({first} B)")
    if factor <= 1 and last > first:
        raise UsageError(f"size factor must be > 1 to sweep, got {factor}")
    sizes, size = [], first
    while size <= last:
        sizes.append(size)
        size = int(size * factor) if factor > 1 else last + 1
    return sizes


def _csv(kind):
    def parse(text):
        items = [x.strip() for x in text.split(",")]
        try:
            return [None if x in ("", "-") else kind(x) for x in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad list {text!r}") from None

    return parse


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-t", "--topology", default="2x2x2",
                   help="preset name (see `themis-mpi topologies`), inline "
                        "KIND(npus,GB/s,ns[,algorithm])_..., or ASTRA-sim network .yml (default 2x2x2)")
    p.add_argument("-o", "--op", default="all_reduce", choices=OPS, help="collective (default all_reduce)")
    p.add_argument("-b", "--minbytes", default="64M", help="first size per NPU (default 64M)")
    p.add_argument("-e", "--maxbytes", default=None, help="last size per NPU (default: the first)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0, help="size factor (default 2)")
    p.add_argument("-c", "--chunks", type=int, default=64, help="chunks per collective (default 64)")
    p.add_argument("-p", "--policy", default="both", choices=(*POLICIES, "both"),
                   help="inter-dim policy (default both)")
    p.add_argument("--intra", default="auto", choices=(*INTRA_POLICIES, "auto"),
                   help="intra-dim queue policy; auto = fifo for baseline, scf for themis")
    p.add_argument("--active-chunks-per-dim", type=int, default=1,
                   help="stages each dim runs at once (default 1)")
    p.add_argument("-d", "--dtype", default="float64", choices=DTYPES, help="element type")
    p.add_argument("--redop", default="sum", choices=REDOPS, help="reduction (default sum)")
    p.add_argument("--dims", type=_csv(int), default=None,
                   help="involved dims, comma-separated (default all)")
    _add_overrides(p)
    p.add_argument("--endpoint-delay-ns", type=float, default=0.0,
                   help="delay added to every algorithm step; ASTRA-sim uses 10 (default 0)")
    p.add_argument("--json", metavar="PATH", help="write the rows as a JSON list")
    p.add_argument("--trace", metavar="PATH.h5", help="write an HDF5 trace of every stage (last iteration)")


def _add_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algorithm", type=_csv(str), default=None,
                   help=f"per-dim algorithm override, comma-separated ({', '.join(ALGORITHMS)}, hd; "
                        "empty keeps the default)")
    p.add_argument("--bandwidth", type=_csv(float), default=None,
                   help="per-dim bandwidth override in GB/s, comma-separated")
    p.add_argument("--latency", type=_csv(float), default=None,
                   help="per-dim latency override in ns, comma-separated")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line in one line, from rank 0 only."""

    def error(self, message):
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

    run = sub.add_parser("run", help="emulate collectives on real data (under mpiexec)",
                         description=f"Run under mpiexec with one rank per NPU. Units: {UNITS}.")
    _add_common(run)
    run.add_argument("-n", "--iters", type=int, default=5, help="timed iterations (default 5)")
    run.add_argument("-w", "--warmup-iters", type=int, default=1, help="warm-up iterations")
    run.add_argument("--check", type=int, default=1, choices=(0, 1),
                     help="check results against the closed form (default 1)")
    run.add_argument("--clock", default="virtual", choices=("virtual", "wall"),
                     help="virtual: emulated time carried in messages; wall: delays really waited")
    run.add_argument("--time-scale", type=float, default=1.0,
                     help="wall seconds per emulated second (wall clock; default 1)")
    run.add_argument("--timeout-s", type=float, default=60.0,
                     help="abort the job when a rank sees no progress for this long (default 60)")

    model = sub.add_parser("model", help="model collectives in one process (any size, no data)",
                           description=f"Same flags and table as `run`, no MPI. Units: {UNITS}.")
    _add_common(model)

    analyze = sub.add_parser("analyze", help="per-dim timing analysis of one or more traces",
                             description=f"Analyze HDF5 traces. Units: {UNITS}.")
    analyze.add_argument("traces", nargs="+", metavar="TRACE.h5")
    analyze.add_argument("--rank", type=int, default=0, help="rank whose events give busy times (0)")
    analyze.add_argument("--json", metavar="PATH", help="write the analysis as JSON")
    analyze.add_argument("--plot", metavar="DIR", help="write PNG timelines, utilization and queue depth")
    analyze.add_argument("--timeline-ranks", default="rank", choices=("rank", "all"),
                         help="timeline of --rank only, or of every rank (up to 8)")

    export = sub.add_parser("export", help="convert a trace to Chrome/Perfetto trace-event JSON")
    export.add_argument("trace", metavar="TRACE.h5")
    export.add_argument("--perfetto", metavar="OUT.json", required=True, help="output file")
    export.add_argument("--ranks", type=_csv(int), default=None, help="ranks to keep, e.g. 0,1")
    export.add_argument("--window", type=_csv(float), default=None, help="time window start,end in us")
    export.add_argument("--collective", type=int, default=None, help="keep one collective")

    replay = sub.add_parser("replay", help="re-run a trace's exact schedule, optionally on a changed "
                                           "topology (model, or the emulator under mpiexec)",
                            description=f"Replay a trace. Units: {UNITS}.")
    replay.add_argument("trace", metavar="TRACE.h5", nargs="?", help="a trace to replay (or --workload)")
    replay.add_argument("-t", "--topology", default=None,
                        help="trace: another topology with the same dim sizes; workload: the topology "
                             "(default 2x2x2)")
    replay.add_argument("--workload", metavar="FILE", help="replay training iterations of an ASTRA-sim "
                                                            "1.0 text workload instead of a trace")
    replay.add_argument("-p", "--policy", default="both", choices=(*POLICIES, "both"),
                        help="workload: inter-dim policy (default both)")
    replay.add_argument("--intra", default="auto", choices=(*INTRA_POLICIES, "auto"),
                        help="workload: intra-dim policy; auto = fifo for baseline, scf for themis")
    replay.add_argument("-c", "--chunks", type=int, default=64, help="workload: chunks per collective")
    replay.add_argument("--iterations", type=int, default=2, help="workload: training iterations (2)")
    replay.add_argument("--compute-scale", type=float, default=1.0,
                        help="workload: factor on compute and update times (ns in the file)")
    replay.add_argument("--comm-scale", type=float, default=1.0,
                        help="workload: factor on every collective's size (bytes in the file)")
    replay.add_argument("-d", "--dtype", default="float32", choices=DTYPES, help="workload: element type")
    replay.add_argument("--active-chunks-per-dim", type=int, default=1, help="workload: stages per dim")
    replay.add_argument("--endpoint-delay-ns", type=float, default=0.0, help="workload: per-step delay")
    replay.add_argument("--timeout-s", type=float, default=60.0,
                        help="under mpiexec: abort when a rank sees no progress for this long (60)")
    _add_overrides(replay)
    replay.add_argument("--json", metavar="PATH", help="write the comparison rows as JSON")
    replay.add_argument("--trace", dest="out_trace", metavar="PATH.h5", help="write the replay's trace")

    sub.add_parser("topologies", help="list the topology presets")
    sub.add_parser("info", help="print versions of the package, numpy, mpi4py, h5py and MPI")
    return parser


def _topology(args, base=None):
    topo = base if base is not None else parse_topology(args.topology)
    return topo.with_overrides(args.bandwidth, args.latency, args.algorithm)


def _collectives(args, topo):
    n_dims = len(topo.dims)
    dims = tuple(range(n_dims)) if args.dims is None else tuple(args.dims)
    if not dims or any(d is None or not 0 <= d < n_dims for d in dims) or len(set(dims)) != len(dims):
        raise UsageError(f"--dims must list distinct dims between 0 and {n_dims - 1}")
    itemsize = np.dtype(args.dtype).itemsize  # chunks are checked by Collective
    out = []
    for size in size_sweep(parse_size(args.minbytes),
                           None if args.maxbytes is None else parse_size(args.maxbytes),
                           args.stepfactor):
        if size < itemsize:
            raise UsageError(f"size {size} B is smaller than one {args.dtype} element")
        out.append(Collective(args.op, size // itemsize, args.dtype, args.chunks,
                              tuple(sorted(dims)), args.redop))
    return out


def _policies(args):
    policies = POLICIES if args.policy == "both" else (args.policy,)
    return [(p, args.intra if args.intra != "auto" else ("fifo" if p == "baseline" else "scf"))
            for p in policies]


def _header(topo, command: str) -> str:
    lines = [f"# themis-mpi {command}: topology {topo.label()}, {topo.npus} NPUs"]
    for d, dim in enumerate(topo.dims):
        lines.append(f"#   dim {d}: {dim.kind:<14} npus {dim.npus:>4}  {dim.bandwidth_gbps:g} GB/s  "
                     f"{dim.latency_ns:g} ns/hop  {dim.algorithm}")
    return "\n".join(lines)


def _write_json(path: str, rows: list[dict]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(tmp, path)


def _check_positive(args):
    if getattr(args, "iters", 1) < 1 or getattr(args, "warmup_iters", 0) < 0:
        raise UsageError("iterations must be >= 1 and warm-up iterations >= 0")
    if not getattr(args, "timeout_s", 1.0) > 0:
        raise UsageError(f"--timeout-s must be > 0, got {args.timeout_s}")


def _recorder(args, topo, transport: str, **settings):
    if not getattr(args, "trace", None):
        return None
    from .trace import TraceRecorder

    return TraceRecorder(topo, transport, **settings)


def cmd_model(args) -> int:
    """`themis-mpi model`: the same rows from the model transport."""
    from .analysis import format_table
    from .model import model_collective

    topo = _topology(args)
    _check_positive(args)
    recorder = _recorder(args, topo, "model", clock="model", time_scale=1.0,
                         active_per_dim=args.active_chunks_per_dim, endpoint_delay_ns=args.endpoint_delay_ns)
    rows = []
    for coll in _collectives(args, topo):
        for policy, intra in _policies(args):
            row, engine = model_collective(topo, coll, policy, intra, args.active_chunks_per_dim,
                                           args.endpoint_delay_ns)
            row.update(topology=topo.label(), npus=topo.npus, iters=1)
            rows.append(row)
            if recorder:
                recorder.add_run(row, engine)
    print(_header(topo, "model"))
    print(format_table(rows, len(topo.dims), "model"))
    if args.json:
        _write_json(args.json, rows)
    if recorder:
        recorder.write(args.trace, np.concatenate(recorder.events))
    return 0


def cmd_run(args) -> int:
    """`themis-mpi run`: emulate on real data, one rank per NPU."""
    from mpi4py import MPI

    from .analysis import format_table
    from .emulator import CartGrid, run_collective

    comm = MPI.COMM_WORLD
    topo = _topology(args)
    _check_positive(args)
    colls = _collectives(args, topo)
    policies = _policies(args)
    recorder = _recorder(args, topo, "mpi", clock=args.clock, time_scale=args.time_scale,
                         active_per_dim=args.active_chunks_per_dim, endpoint_delay_ns=args.endpoint_delay_ns)
    rows = []
    with CartGrid(comm, topo) as grid:
        if grid.rank == 0:
            print(_header(topo, "run"), flush=True)
        for coll in colls:
            buffer = np.empty(coll.count, dtype=coll.dtype)
            for policy, intra in policies:
                walls = []
                for it in range(args.warmup_iters + args.iters):
                    last = it == args.warmup_iters + args.iters - 1
                    row, engine = run_collective(grid, coll, policy, intra, args.active_chunks_per_dim,
                                                 args.clock, args.time_scale, args.endpoint_delay_ns,
                                                 buffer, check=bool(args.check) and last,
                                                 timeout_s=args.timeout_s)
                    if it >= args.warmup_iters:
                        walls.append(row["wall_s"])
                row.update(wall_s=statistics.median(walls), iters=args.iters,
                           topology=topo.label(), npus=topo.npus, time_scale=args.time_scale)
                rows.append(row)
                if recorder:
                    recorder.add_run(row, engine, grid.rank)
        events = recorder.gather_events(grid.cart) if recorder else None
    if comm.Get_rank() == 0:
        print(format_table(rows, len(topo.dims), args.clock))
        if args.json:
            _write_json(args.json, rows)
        if recorder:
            recorder.write(args.trace, events)
    return 0


def cmd_analyze(args) -> int:
    """`themis-mpi analyze`: per-dim busy/idle time, bytes, queueing delay, bandwidths."""
    from .analysis import analyze_trace, format_analysis
    from .trace import Trace

    traces = [Trace(p) for p in args.traces]
    rows = []
    for trace in traces:
        ranks = set(trace.events["rank"].tolist())
        if ranks and args.rank not in ranks:
            raise UsageError(f"{trace.path}: no events of rank {args.rank} "
                             f"(ranks {min(ranks)}..{max(ranks)})")
        rows += analyze_trace(trace, args.rank)
    print(format_analysis(rows))
    if args.json:
        _write_json(args.json, rows)
    if args.plot:
        from . import plots

        os.makedirs(args.plot, exist_ok=True)
        written = [plots.utilization_bars(rows, os.path.join(args.plot, "utilization.png"))]
        for t, trace in enumerate(traces):
            stem = f"{t}-{os.path.splitext(os.path.basename(trace.path))[0]}"
            for c in trace.collectives["collective"].tolist():
                rank = None if args.timeline_ranks == "all" else args.rank
                written.append(plots.timeline(trace, c, os.path.join(args.plot, f"{stem}-c{c}-timeline.png"),
                                              rank))
                written.append(plots.queue_depth(trace, c, os.path.join(args.plot, f"{stem}-c{c}-queues.png"),
                                                 args.rank))
        print("# wrote " + " ".join(written))
    return 0


def cmd_export(args) -> int:
    """`themis-mpi export --perfetto`: trace-event JSON for Perfetto."""
    from .perfetto import to_perfetto, write_perfetto
    from .trace import Trace

    window = None
    if args.window is not None:
        if len(args.window) != 2 or None in args.window or args.window[0] >= args.window[1]:
            raise UsageError("--window needs start,end in us with start < end")
        window = tuple(args.window)
    doc = to_perfetto(Trace(args.trace), args.ranks, window,
                      None if args.collective is None else [args.collective])
    write_perfetto(doc, args.perfetto)
    print(f"# wrote {args.perfetto}: {sum(e['ph'] == 'X' for e in doc['traceEvents'])} stage slices; "
          "open it at ui.perfetto.dev")
    return 0


def cmd_replay(args) -> int:
    """`themis-mpi replay`: a trace's schedule again, or a workload's training iterations."""
    from .replay import replay, replay_workload

    if (args.trace is None) == (args.workload is None):
        raise UsageError("replay needs either a trace file or --workload FILE")
    return replay_workload(args) if args.workload else replay(args)


def cmd_topologies(args) -> int:
    """`themis-mpi topologies`: the presets with their inline form."""
    width = max(map(len, PRESETS))
    print(f"# {'preset':<{width}} {'npus':>5}  inline form (KIND(npus,GB/s,ns,algorithm)); "
          "GB/s with 1 GB = 2^30 B")
    for name in PRESETS:
        topo = parse_topology(name)
        print(f"  {name:<{width}} {topo.npus:>5}  {topo.spec()}\n  {'':<{width}} {'':>5}  "
              f"# {DESCRIPTIONS[name]}")
    return 0


def cmd_info(args) -> int:
    """`themis-mpi info`: versions, for bug reports and trace metadata."""
    from .trace import versions

    for key, value in versions().items():
        print(f"{key:>10}: {value}")
    return 0


COMMANDS = {"run": cmd_run, "model": cmd_model, "analyze": cmd_analyze, "export": cmd_export,
            "replay": cmd_replay, "topologies": cmd_topologies, "info": cmd_info}


def _rank() -> int:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi.COMM_WORLD.Get_rank() if mpi is not None else 0


def main(argv=None) -> int:
    """Entry point: user mistakes become one line and exit 2; bugs abort every rank."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as exc:
        if _rank() == 0:
            print(f"themis-mpi: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:
        if type(exc).__name__ != "Stalled":
            raise
        print(f"themis-mpi: error: {exc}; aborting the job", file=sys.stderr, flush=True)
        time.sleep(0.5)  # let the launcher forward the line before the abort tears it down
        sys.modules["mpi4py.MPI"].COMM_WORLD.Abort(3)
        return 3
    except BaseException:
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None and mpi.COMM_WORLD.Get_size() > 1:
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            mpi.COMM_WORLD.Abort(1)
        raise
