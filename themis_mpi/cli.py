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

from . import __version__
from .collectives import DTYPES, OPS, REDOPS, Collective
from .engine import INTRA_POLICIES
from .errors import UsageError
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
    p.add_argument("--algorithm", type=_csv(str), default=None,
                   help=f"per-dim algorithm override, comma-separated ({', '.join(ALGORITHMS)}, hd; "
                        "empty keeps the default)")
    p.add_argument("--bandwidth", type=_csv(float), default=None,
                   help="per-dim bandwidth override in GB/s, comma-separated")
    p.add_argument("--latency", type=_csv(float), default=None,
                   help="per-dim latency override in ns, comma-separated")
    p.add_argument("--endpoint-delay-ns", type=float, default=0.0,
                   help="delay added to every algorithm step; ASTRA-sim uses 10 (default 0)")
    p.add_argument("--json", metavar="PATH", help="write the rows as a JSON list")


def env_rank() -> int:
    """This process's MPI rank from the launcher's environment, before MPI is initialised."""
    for key in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


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

    model = sub.add_parser("model", help="model collectives in one process (any size, no data)",
                           description=f"Same flags and table as `run`, no MPI. Units: {UNITS}.")
    _add_common(model)

    sub.add_parser("topologies", help="list the topology presets")
    sub.add_parser("info", help="print versions of the package, numpy, mpi4py, h5py and MPI")
    return parser


def _topology(args):
    topo = parse_topology(args.topology)
    return topo.with_overrides(args.bandwidth, args.latency, args.algorithm)


def _collectives(args, topo):
    n_dims = len(topo.dims)
    dims = tuple(range(n_dims)) if args.dims is None else tuple(args.dims)
    if not dims or any(d is None or not 0 <= d < n_dims for d in dims) or len(set(dims)) != len(dims):
        raise UsageError(f"--dims must list distinct dims between 0 and {n_dims - 1}")
    itemsize = {"float32": 4, "float64": 8, "int32": 4, "int64": 8}[args.dtype]
    if args.chunks < 1:
        raise UsageError(f"chunks must be >= 1, got {args.chunks}")
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
    if args.active_chunks_per_dim < 1:
        raise UsageError(f"active chunks per dim must be >= 1, got {args.active_chunks_per_dim}")
    if getattr(args, "iters", 1) < 1 or getattr(args, "warmup_iters", 0) < 0:
        raise UsageError("iterations must be >= 1 and warm-up iterations >= 0")


def cmd_model(args) -> int:
    """`themis-mpi model`: the same rows from the model transport."""
    from .analysis import format_table
    from .model import model_collective

    topo = _topology(args)
    _check_positive(args)
    rows = []
    for coll in _collectives(args, topo):
        for policy, intra in _policies(args):
            row, _ = model_collective(topo, coll, policy, intra, args.active_chunks_per_dim,
                                      args.endpoint_delay_ns)
            row.update(topology=topo.label(), npus=topo.npus, iters=1)
            rows.append(row)
    print(_header(topo, "model"))
    print(format_table(rows, len(topo.dims), "model"))
    if args.json:
        _write_json(args.json, rows)
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
    rows = []
    with CartGrid(comm, topo) as grid:
        if grid.rank == 0:
            print(_header(topo, "run"), flush=True)
        import numpy as np

        for coll in colls:
            buffer = np.empty(coll.count, dtype=coll.dtype)
            for policy, intra in policies:
                walls = []
                for it in range(args.warmup_iters + args.iters):
                    last = it == args.warmup_iters + args.iters - 1
                    row, _ = run_collective(grid, coll, policy, intra, args.active_chunks_per_dim,
                                            args.clock, args.time_scale, args.endpoint_delay_ns,
                                            buffer, check=bool(args.check) and last)
                    if it >= args.warmup_iters:
                        walls.append(row["wall_s"])
                row.update(wall_s=statistics.median(walls), iters=args.iters,
                           topology=topo.label(), npus=topo.npus, time_scale=args.time_scale)
                rows.append(row)
    if comm.Get_rank() == 0:
        print(format_table(rows, len(topo.dims), args.clock))
        if args.json:
            _write_json(args.json, rows)
    return 0


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


COMMANDS = {"run": cmd_run, "model": cmd_model, "topologies": cmd_topologies, "info": cmd_info}


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
    except BaseException:
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None and mpi.COMM_WORLD.Get_size() > 1:
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            mpi.COMM_WORLD.Abort(1)
        raise
