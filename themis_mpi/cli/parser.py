"""The `themis-mpi` argument parser: subcommands, their options, and one spelling per flag.

Sizes follow nccl-tests: ``-b`` first size, ``-e`` last size, ``-f`` factor between sizes, with
binary suffixes K, M, G (64M = 64 * 2^20 bytes). Bandwidths are GB/s with 1 GB = 2^30 bytes.
The option groups (`_add_topology`, `_add_schedule`, `_add_late_links`, `_add_slow_compute`,
`_add_mpi`, `_add_collective`) are shared, so a flag is spelled and documented once for every
command that takes it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..collectives import DEFAULT_DTYPE, DTYPES, OPS, REDOPS
from ..config import DEFAULT_TIMEOUT_S
from ..cost import ASTRA_SIM_1_0, ASTRA_SIM_2
from ..launch import env_rank
from ..timing.rules import rule_names
from ..topology import ALGORITHMS
from ..units import UNITS
from ..version import __version__


class DefaultList(list):
    """A list default that argparse keeps as it is: a value the command line did not give."""


class DefaultInt(int):
    """An int default that argparse keeps as it is: a value the command line did not give."""


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list]:
    def parse(text: str) -> list:
        items = [x.strip() for x in text.split(",")]
        try:
            return [None if x in ("", "-") else kind(x) for x in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad list {text!r}") from None

    return parse


def _path(text: str) -> str:
    """An output path: an empty one names no file (it was ignored, and nothing was written)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no file; give a file name")
    return text


class _Joined(argparse.Action):
    """A ``RANK=VALUE[,...]`` flag given more than once: its items add up (the last no longer wins)."""

    def __call__(self, parser, namespace, values, option_string=None):
        old = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, f"{old},{values}" if old else values)


# Flags whose values may start with '-' (``--bandwidth -,-,200``, ``--npu-delay-us -1=5``): argparse
# takes such a value for an option and says "expected one argument"; `_join_dash_values` joins them.
DASH_VALUES = (
    "--bandwidth",
    "--latency",
    "--algorithm",
    "--npu-delay-us",
    "--link-scale",
    "--npu-compute-scale",
    "--dims",
    "--ranks",
    "--window",
)
_DASH_VALUE = re.compile(r"-($|[^-A-Za-z])")  # '-', '-,-', '-1=5'; not '-q' or '--json'


def _join_dash_values(argv: Sequence[str]) -> list[str]:
    """``--bandwidth -,-,200`` as ``--bandwidth=-,-,200``, so that argparse reads the value as one."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in DASH_VALUES and _DASH_VALUE.match(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def _add_topology(p: argparse.ArgumentParser, default: str | None = "2x2x2") -> None:
    p.add_argument(
        "-t",
        "--topology",
        default=default,
        help="preset name (see `themis-mpi topologies`), inline KIND(npus,GB/s,ns[,algorithm])_..., "
        f"or ASTRA-sim network .yml (default {default or 'the recorded one'}); run, model, train and "
        "workload gpt --run take a comma-separated list to sweep",
    )
    p.add_argument(
        "--algorithm",
        type=_csv(str),
        action="append",
        default=None,
        help=f"per-dim algorithm override, comma-separated ({', '.join(ALGORITHMS)}, hd; "
        "empty keeps the default; msccl:FILE.xml, once, runs the collective by a custom MSCCL-IR "
        "algorithm, checked and proved first, msccl-auto:DIR by the file of DIR whose size window holds "
        "the size; msccl:RS.xml+AG.xml on a dim runs its stages by files of its size: "
        "docs/custom-algorithms.md); run and model take it more than once to sweep",
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


def _add_schedule(p: argparse.ArgumentParser, sweeps_rules: bool = False) -> None:
    p.add_argument(
        "-c",
        "--chunks",
        type=_csv(int),
        default=DefaultList([64]),
        help="chunks per collective, a comma list sweeps (64, or a calibrate fit's given as -t FIT.json)",
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
        choices=("", ASTRA_SIM_1_0, ASTRA_SIM_2),
        help="astra-sim-1.0: ASTRA-sim 1.0's exact semantics where they are modelling choices (whole-ns "
        "messages, endpoint delay per message, local reduction time, event order, LIFO between collectives); "
        "astra-sim-2: ASTRA-sim 2.x's (YAML bandwidths per link, --network store-forward its "
        "congestion-aware backend and the default, ideal its congestion-unaware one; one collective "
        "in flight per NPU)",
    )
    p.add_argument(
        "--compat-concurrent",
        action="store_true",
        help="with --compat astra-sim-2: collectives in flight together (its hwres_multi_comm build)",
    )
    p.add_argument(
        "--compat-scheduling",
        default="LIFO",
        choices=("LIFO", "FIFO"),
        help="with --compat astra-sim-2: its scheduling-policy between collectives (default LIFO)",
    )
    _add_network(
        p,
        "packet; ideal on nccl dims, with --hbm-gbps or --clock wall and with --compat astra-sim-1.0; "
        "store-forward with --compat astra-sim-2",
        sweeps=sweeps_rules,
    )
    _add_late_links(p)
    p.add_argument(
        "-d", "--dtype", default=DEFAULT_DTYPE, choices=DTYPES, help=f"element type (default {DEFAULT_DTYPE})"
    )
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


def _add_late_links(p: argparse.ArgumentParser) -> None:
    """Stragglers on the network: late NPUs and degraded links (every command that schedules)."""
    p.add_argument(
        "--npu-delay-us",
        metavar="RANK=US[,RANK=US...]",
        action=_Joined,
        default=None,
        help="late NPUs: each starts its work this many us late (a straggler); the model then runs "
        "every NPU, and each dim starts its stages in the order a run without them agrees on",
    )
    p.add_argument(
        "--link-scale",
        metavar="DIM:RANK=F[,DIM:RANK=F...]",
        action=_Joined,
        default=None,
        help="that NPU's links in that dim run at F times the dim's bandwidth, both ways (a degraded "
        "link); a message runs at the smaller factor of its two ends",
    )


def _add_slow_compute(p: argparse.ArgumentParser) -> None:
    """Stragglers in compute: slow NPUs and jitter (`train` and `workload ... --run`)."""
    p.add_argument(
        "--npu-compute-scale",
        metavar="RANK=F[,RANK=F...]",
        action=_Joined,
        default=None,
        help="stragglers: that NPU's compute and update times times F (1.5 = half as fast again)",
    )
    p.add_argument(
        "--compute-jitter",
        metavar="lognormal:SIGMA",
        default=None,
        help="every compute phase of every NPU times a lognormal factor of mean 1 (seeded by --seed)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --compute-jitter (default 0)")


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


def _add_rows(p: argparse.ArgumentParser, command: str) -> None:
    """Where a sweep's rows go, and how its cells run (`run`, `model`, `train`)."""
    p.add_argument(
        "--json",
        metavar="PATH",
        type=_path,
        help="write the rows as a JSON list, updated as each row finishes",
    )
    p.add_argument(
        "--csv", metavar="PATH", type=_path, help="write the rows as CSV, updated as each row finishes"
    )
    p.add_argument(
        "--jsonl", metavar="PATH", type=_path, help="write the rows as JSON Lines, appended as each finishes"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="the model: keep the rows already in the --json/--csv/--jsonl files (same sweep), run the rest",
    )
    p.add_argument(
        "--workers",
        default="1",
        help="the model: run the cells on N local processes, or mpi (an mpi4py.futures pool: mpiexec -n K "
        f"python -m mpi4py.futures -m themis_mpi {command} ...); the rows are the same, in order (default 1)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr (bar or lines)")


def _add_collective(p: argparse.ArgumentParser) -> None:
    _add_topology(p)
    p.add_argument("-o", "--op", default="all_reduce", choices=OPS, help="collective (default all_reduce)")
    p.add_argument("-b", "--minbytes", default="64M", help="first size per NPU (default 64M)")
    p.add_argument("-e", "--maxbytes", default=None, help="last size per NPU (default: the first)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0, help="size factor (default 2)")
    _add_schedule(p)
    p.add_argument("--redop", default="sum", choices=REDOPS, help="reduction (default sum)")
    p.add_argument(
        "--dims", type=_csv(int), default=None, help="involved dims, comma-separated (default all)"
    )
    _add_rows(p, "model")
    p.add_argument(
        "--trace", metavar="PATH.h5", type=_path, help="write an HDF5 trace of every stage (last iteration)"
    )
    p.add_argument(
        "--format",
        default="themis",
        choices=("themis", "nccl"),
        help="table format: this package's (default) or nccl-tests' (GB/s of 1e9 B, one block per policy)",
    )


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line in one line, from rank 0 only."""

    def parse_known_args(self, args=None, namespace=None):
        return super().parse_known_args(_join_dash_values(sys.argv[1:] if args is None else args), namespace)

    def error(self, message: str):
        if env_rank() == 0:
            self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
        self.exit(2)


def _run_parser(sub: Any) -> None:
    """`themis-mpi run`."""
    p = sub.add_parser(
        "run",
        help="emulate collectives on real data (under mpiexec)",
        description=f"Run under mpiexec with one rank per NPU. Units: {UNITS}.",
    )
    _add_collective(p)
    p.add_argument("-n", "--iters", type=int, default=5, help="timed iterations (default 5)")
    p.add_argument("-w", "--warmup-iters", type=int, default=1, help="warm-up iterations (default 1)")
    p.add_argument(
        "--check",
        type=int,
        default=1,
        choices=(0, 1),
        help="check results against the closed form (default 1)",
    )
    _add_mpi(p)


def _model_parser(sub: Any) -> None:
    """`themis-mpi model`."""
    p = sub.add_parser(
        "model",
        help="model collectives in one process (any size, no data)",
        description=f"Same flags and table as `run`, no MPI. Units: {UNITS}.",
    )
    _add_collective(p)
    p.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"a plugin policy's decision may take this long before the command ends ({DEFAULT_TIMEOUT_S:g})",
    )


def _train_parser(sub: Any) -> None:
    """`themis-mpi train`."""
    p = sub.add_parser(
        "train",
        help="training iterations of a workload (model, or the emulator under mpiexec)",
        description="Replay training iterations of an ASTRA-sim 1.0 text workload, or a Chakra execution "
        f"trace (.et file, or the prefix of prefix.<rank>.et files). Units: {UNITS}.",
    )
    p.add_argument(
        "workload",
        metavar="WORKLOAD",
        nargs="?",
        help="ASTRA-sim 1.0 text workload, Chakra .et file (every rank runs it) "
        "or the prefix of prefix.<rank>.et files (or give --job)",
    )
    p.add_argument(
        "--job",
        metavar="PATH@PLACEMENT",
        action="append",
        default=None,
        help="a text workload as one of several jobs on the network (repeat it); PLACEMENT is "
        "dims=D,D.. (the dims its collectives use; default all), at=D/I (only the NPUs whose "
        "coordinate on dim D is I), delay_us=US (a late start) and compute_scale=F (this job's compute "
        "times F), joined by ':', e.g. "
        "A.txt@dims=0,1:at=2/0; see docs/jobs.md",
    )
    _add_topology(p)
    _add_schedule(p, sweeps_rules=True)
    p.add_argument("-n", "--iters", type=int, default=2, help="training iterations (default 2)")
    p.add_argument(
        "--compute-scale",
        type=float,
        default=1.0,
        help="what-if accelerator speed: factor on compute and update times (ns in the file); "
        "0.25 = an accelerator 4x faster (default 1)",
    )
    _add_slow_compute(p)
    p.add_argument(
        "--comm-scale",
        type=float,
        default=1.0,
        help="what-if model width or dtype: factor on every collective's size (bytes in the file); "
        "2 = fp32 instead of 2-byte gradients and activations (default 1)",
    )
    p.add_argument(
        "--bucket-mib",
        type=float,
        default=0.0,
        help="fuse weight-gradient collectives into gradient buckets of this many MiB, DDP's way "
        "(PyTorch DDP: 25, Horovod: 64); 0 = one collective per layer, as the file says (default 0)",
    )
    p.add_argument(
        "--first-bucket-mib",
        type=float,
        default=None,
        help="cap of the first bucket (the last layers' gradients; DDP: 1; default: --bucket-mib)",
    )
    p.add_argument(
        "--comm-scheduler",
        metavar="NAME",
        default="",
        help="communication scheduler between collectives: fifo, lifo, p3, bytescheduler, tictac or a "
        "plugin (themis-mpi policies; docs/scheduling.md), a comma list sweeps; default fifo, lifo under "
        "--compat",
    )
    p.add_argument(
        "--partition-mib",
        type=float,
        default=None,
        help="slice every collective into partitions of this many MiB; 0 = whole tensors "
        "(default 4 under p3 and bytescheduler, else 0)",
    )
    p.add_argument(
        "--credit-mib",
        type=float,
        default=None,
        help="bytescheduler: MiB of stages running at once per dim (default 16)",
    )
    p.add_argument(
        "--comm-group",
        metavar="JSON",
        default=None,
        help='Chakra traces: communicator groups {"id": [npu, ...]} for pg_name (ASTRA-sim\'s '
        "--comm-group-configuration)",
    )
    _add_mpi(p)
    _add_rows(p, "train")


def _convert_parser(sub: Any) -> None:
    """`themis-mpi convert`."""
    p = sub.add_parser(
        "convert",
        help="convert a text workload to a Chakra ET file and back",
        description="IN.txt -> OUT.et (or OUT.et.gz): the text loop as an execution graph for a topology "
        "(it decides each collective's involved_dim). IN.et -> OUT.txt: the text workload an ET converted "
        "here came from.",
    )
    p.add_argument("input", metavar="IN", help="text workload or .et file")
    p.add_argument("output", metavar="OUT", type=_path, help="output: .et / .et.gz, or a text file")
    p.add_argument("-t", "--topology", default="2x2x2", help="topology for text -> ET (default 2x2x2)")
    p.add_argument("-n", "--iters", type=int, default=1, help="training iterations to unroll (default 1)")


def _choice_list(choices: Sequence[str]) -> Callable[[str], str]:
    """A comma list of `choices` (each checked), kept as its text."""

    def parse(text: str) -> str:
        bad = [x for x in text.split(",") if x.strip() not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"invalid choice: {bad[0]!r} (choose from {', '.join(choices)})")
        return text

    return parse


def _add_network(
    p: argparse.ArgumentParser,
    default: str,
    mtu: str = "4096, or the topology's MTU(...)",
    sweeps: bool = False,
) -> None:
    p.add_argument(
        "--network",
        default=None,
        type=_choice_list(rule_names()) if sweeps else str,
        metavar="RULE[,RULE...]" if sweeps else None,
        choices=None if sweeps else rule_names(),
        help=("a comma list sweeps; " if sweeps else "")
        + "how stages that run at once share the links: packet (max-min per message, whole packets, "
        "round robin at the sender, per-packet store-and-forward: what a packet network does), fair "
        "(max-min fair per stage, cut-through: the fluid bound), store-forward (whole messages in "
        "arrival order: ASTRA-sim 2.x's view) or ideal (they share nothing: ASTRA-sim 1.0's rule) "
        f"(default {default})",
    )
    p.add_argument(
        "--mtu",
        type=int,
        default=None,
        metavar="BYTES",
        help="the packet rule's packet: what a sender interleaves and a switch stores before forwarding "
        f"(default {mtu})",
    )


def _replay_parser(sub: Any) -> None:
    """`themis-mpi replay`."""
    p = sub.add_parser(
        "replay",
        help="re-run a trace's exact schedule, optionally on a changed "
        "topology (model, or the emulator under mpiexec)",
        description=f"Replay a trace. Units: {UNITS}.",
    )
    p.add_argument("trace_in", metavar="TRACE.h5", help="the trace to replay")
    _add_topology(p, default=None)
    _add_network(p, "the recorded one", "the recorded one")
    _add_mpi(p, clock=False)
    p.add_argument("--json", metavar="PATH", type=_path, help="write the comparison as JSON")
    p.add_argument("--trace", metavar="PATH.h5", type=_path, help="write the replay's own trace")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr (bar or lines)")


def _analyze_parser(sub: Any) -> None:
    """`themis-mpi analyze`."""
    p = sub.add_parser(
        "analyze",
        help="per-dim timing analysis of one or more traces",
        description=f"Analyze HDF5 traces. Units: {UNITS}.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE.h5")
    p.add_argument(
        "--ranks",
        type=_csv(int),
        default=[0],
        help="ranks whose events give busy times and timelines, comma-separated (default 0)",
    )
    p.add_argument("--json", metavar="PATH", type=_path, help="write the analysis as JSON")
    p.add_argument(
        "--plot", metavar="DIR", type=_path, help="write PNG timelines, utilization and queue depth"
    )


def _export_parser(sub: Any) -> None:
    """`themis-mpi export`."""
    p = sub.add_parser(
        "export",
        help="convert a trace to Chrome/Perfetto trace-event JSON, or write a built-in algorithm as MSCCL-IR",
        description="TRACE.h5 --perfetto OUT.json: the trace as trace-event JSON. --msccl OUT.xml: a "
        "built-in algorithm's stage (--algorithm, -o, --npus, --both-ways) as MSCCL-IR XML, checked and "
        "proved before it is written.",
    )
    p.add_argument("trace_in", metavar="TRACE.h5", nargs="?", help="the trace (with --perfetto)")
    p.add_argument("--perfetto", metavar="OUT.json", type=_path, help="write the trace as trace-event JSON")
    p.add_argument("--ranks", type=_csv(int), default=None, help="ranks to keep, e.g. 0,1 (default all)")
    p.add_argument("--window", type=_csv(float), default=None, help="time window start,end in us")
    p.add_argument("--collective", type=int, default=None, help="keep one collective")
    p.add_argument(
        "--msccl", metavar="OUT.xml", type=_path, help="write a built-in algorithm as MSCCL-IR XML"
    )
    p.add_argument(
        "--algorithm", default="ring", help="with --msccl: ring, direct or halving_doubling (ring)"
    )
    p.add_argument(
        "-o",
        "--op",
        default="all_reduce",
        choices=("all_reduce", "reduce_scatter", "all_gather"),
        help="with --msccl: the collective (default all_reduce)",
    )
    p.add_argument("--npus", type=int, default=8, help="with --msccl: NPUs of the algorithm (default 8)")
    p.add_argument(
        "--both-ways",
        action="store_true",
        help="with --msccl and the ring: both ways round on two channels, as the ring runs on Ring "
        "and FullyConnected dims (default one way, as on a Switch)",
    )


def _synthesize_parser(sub: Any) -> None:
    """`themis-mpi synthesize`."""
    p = sub.add_parser(
        "synthesize",
        help="synthesize an all-gather (reduce-scatter, all-reduce) for a topology as MSCCL-IR",
        description="Greedy link-chunk matching over time on the topology's links, in the spirit of TACOS; "
        "reduce_scatter is the all-gather reversed, all_reduce the two in turn. The file is checked and "
        "proved before it is written, then timed (alpha-beta per message, links one message at a time). "
        f"Units: {UNITS}.",
    )
    p.add_argument("op", choices=("all_gather", "reduce_scatter", "all_reduce"), help="the collective")
    _add_topology(p)
    p.add_argument(
        "-b",
        "--size",
        default="64M",
        help="nccl-tests' size: the all-gather's output, the others' input (64M)",
    )
    p.add_argument("--chunks-per-npu", type=int, default=1, help="chunks each NPU's block is cut into (1)")
    p.add_argument("--out", metavar="FILE.xml", type=_path, required=True, help="the MSCCL-IR file to write")


def _calibrate_parser(sub: Any) -> None:
    """`themis-mpi calibrate`."""
    p = sub.add_parser(
        "calibrate",
        help="fit the NCCL-like model (or one dim) to an nccl-tests or rccl-tests log",
        description="Read an nccl-tests or rccl-tests log as posted (all_reduce, all_gather, reduce_scatter, "
        "alltoall; every table of it), take the machine from it and from the GPU table, and fit NCCL's or "
        "RCCL's algorithms and protocols within physical bounds (or, with --algorithm ring..., one dim's "
        "latency and bandwidth); print the fitted topology, the command that predicts each run and the "
        f"error per size. Units: {UNITS}; nccl-tests' GB/s are 1e9 B/s.",
    )
    p.add_argument("log", metavar="LOG", help="nccl-tests output (text)")
    p.add_argument(
        "-o",
        "--op",
        default=None,
        choices=("all_reduce", "all_gather", "reduce_scatter"),
        help="the collective (default: from the log)",
    )
    p.add_argument("--npus", type=int, default=None, help="NPUs measured (default: the log's Rank lines)")
    # (the defaults these helps state are `api.calibrate`'s, which the command calls with the flags given)
    p.add_argument("--kind", help="kind of the fitted dim: SW, Ring or FC (default SW)")
    p.add_argument(
        "--algorithm",
        help="nccl (default: the NCCL-like model, all sizes) or a per-dim algorithm (ring...: one-dim fit)",
    )
    p.add_argument("-c", "--chunks", type=int, help="chunks the fit assumes (default 1)")
    p.add_argument("--min-size", help="smallest size of the per-dim fit (default 1M)")
    p.add_argument("--table", type=int, default=None, help="which table of a log with several (1, 2...)")
    p.add_argument(
        "--nccl-algo", default=None, help="the algorithms the run allowed (NCCL_ALGO), e.g. Ring or Ring,Tree"
    )
    p.add_argument(
        "--base",
        default=None,
        help="a single-node fit (its topology or --json file): fit dim 1 of a multi-node log",
    )
    p.add_argument(
        "--link-gbps",
        type=float,
        default=None,
        help="GPU-to-GPU rate each way, GB/s of 1e9 B (default: the GPU table's row for the log's GPU)",
    )
    p.add_argument(
        "--nic-gbps",
        type=float,
        default=None,
        help="the NIC per GPU, GB/s of 1e9 B (default: the GPU's reference platform, e.g. 50 for 400 Gb/s)",
    )
    p.add_argument(
        "--gpus-per-node", type=int, default=None, help="GPUs per node (default: from the log's host names)"
    )
    p.add_argument(
        "--json", metavar="PATH", type=_path, help='write {"topology", "chunks", "args", "rows", ...}'
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr (bar or lines)")


PLOT_SCALES = ("auto", "log", "linear")  # plots.SCALES (not imported here: the parser stays light)


def _plot_parser(sub: Any) -> None:
    """`themis-mpi plot`."""
    p = sub.add_parser(
        "plot",
        help="plot a sweep's rows (--csv, --json or --jsonl of run, model or train)",
        description="--y against --x, one line per run of the grid: colour by --hue, line style and marker "
        "by the other grid columns that vary; bars when --x is not a number (e.g. policy). Axes not given "
        "are chosen from the file (a train file: iteration time against what varies). Short names: size, "
        "time, ideal, busbw, algbw, util, chunks, iteration; any other column by its name.",
    )
    p.add_argument("rows", metavar="ROWS", help="a --csv, --json or --jsonl file of run, model or train")
    p.add_argument(
        "--x",
        default=None,
        help="the x axis (default: size where sizes vary, else the grid column that varies)",
    )
    p.add_argument("--y", default=None, help="the y axis (default: busbw, or iteration for a train file)")
    p.add_argument(
        "--hue", default=None, help="a colour per value of this column (default: the first other that varies)"
    )
    p.add_argument(
        "--col", metavar="COLUMN", default=None, help="one axes per value of this column, side by side"
    )
    p.add_argument("--row", metavar="COLUMN", default=None, help="one axes per value of this column, stacked")
    p.add_argument(
        "--where",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="keep the rows with this value (repeatable: every key must match; a key twice: either value)",
    )
    for axis in ("x", "y"):
        p.add_argument(
            f"--log{axis}",
            choices=PLOT_SCALES,
            default="auto",
            help=f"the {axis} axis scale (default auto: log for sizes, chunk counts and times that span 10x "
            "or more, linear for the rest or when a value is <= 0)",
        )
    p.add_argument("--title", default=None, help="the figure's title (default: none)")
    p.add_argument(
        "--out", metavar="PNG", type=_path, default=None, help="the picture (default: ROWS with .png)"
    )


LLM_PRESETS = ("gpt3-175b", "llama2-70b", "mixtral-8x7b")  # workloads.llm.PRESETS (not imported here)
# `workload gpt`'s shape flags, each with its own help (the preset's value when not given).
SHAPE_HELP = {
    "layers": "transformer layers (decoder blocks)",
    "hidden": "hidden size h (the model width)",
    "heads": "attention heads (must divide --hidden)",
    "seq": "sequence length s in tokens",
    "vocab": "vocabulary size V (the embedding and LM head)",
    "ffn": "MLP inner size (default 4 * --hidden)",
    "experts": "experts per MoE layer (default 0: a dense MLP)",
    "topk": "experts each token is routed to (default 1)",
}
PARALLEL_HELP = {
    "tp": "tensor-parallel degree: GPUs that split each layer",
    "pp": "pipeline-parallel degree: stages of consecutive layers",
    "dp": "data-parallel degree: replicas that reduce gradients",
    "ep": "expert-parallel degree: GPUs the experts are spread over (divides DP)",
}


def _workload_parser(sub: Any) -> None:
    """`themis-mpi workload gpt`."""
    p = sub.add_parser(
        "workload",
        help="generate an LLM's training iteration (TP/PP/DP/EP) as per-rank Chakra ET files",
        description="A GPT/Llama-like decoder (optionally MoE) from its shape: compute from FLOPs over the "
        "stated throughput, collective and message sizes by Megatron-LM's accounting, the pipeline schedule "
        "written into the graphs. Ranks: TP fastest, then DP, then PP (--order); TP on the first dims.",
    )
    p.add_argument(
        "kind", choices=["gpt", "simai"], help="gpt: a decoder from its shape; simai: a SimAI file"
    )
    p.add_argument("file", nargs="?", help="simai: the SimAI/AICB workload file")
    p.add_argument("--nvlink-gbps", type=float, default=360.0, help="simai: NVLink GB/s per GPU (360)")
    p.add_argument("--nic-gbps", type=float, default=48.5, help="simai: NIC GB/s per GPU (48.5)")
    p.add_argument("--preset", choices=LLM_PRESETS, help="a model's shape; flags given override it")
    for name, text in SHAPE_HELP.items():
        p.add_argument(f"--{name}", type=int, help=text)
    p.add_argument("--micro-batch", type=int, help="micro-batch size b (default 1)")
    p.add_argument("--global-batch", type=int, help="global batch B in sequences (default b*DP)")
    for name, text in PARALLEL_HELP.items():
        p.add_argument(f"--{name}", type=int, default=1, help=f"{text} (default 1)")
    p.add_argument(
        "--order",
        default="tp-dp-pp",
        help="the groups inner to outer: which takes the first dims (default tp-dp-pp, Megatron's; "
        "any order of tp, dp, pp, e.g. tp-pp-dp spreads DP over the outer dims)",
    )
    p.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3 (default 0)")
    p.add_argument("--schedule", default="1f1b", help="gpipe, 1f1b or interleaved:V (default 1f1b)")
    p.add_argument("--recompute", action="store_true", help="full activation recomputation")
    p.add_argument(
        "--overlap-dp",
        action="store_true",
        help="reduce gradients layer by layer behind the last backward (Megatron's --overlap-grad-reduce)",
    )
    p.add_argument("--peak-tflops", type=float, default=989.0, help="peak TFLOP/s (default 989)")
    p.add_argument("--efficiency", type=float, default=0.5, help="share of the peak reached (default 0.5)")
    p.add_argument("--bytes-per-element", type=int, default=2, help="e: bytes per element (default 2)")
    _add_topology(p, "2x2x2")
    p.add_argument("--out", metavar="PREFIX", type=_path, help="write PREFIX.<rank>.et, one file per rank")
    p.add_argument("--run", action="store_true", help="price one iteration on the model, per parallelism")
    _add_network(p, "packet; ideal on nccl dims", sweeps=True)
    _add_late_links(p)
    _add_slow_compute(p)
    p.add_argument(
        "-c",
        "--chunks",
        type=_csv(int),
        default=DefaultList([4]),
        help="chunks per collective for --run, a comma list sweeps (default 4, or a calibrate fit's given "
        "as -t FIT.json; one for simai)",
    )
    p.add_argument(
        "-p",
        "--policy",
        default="both",
        help="gpt --run: inter-dim policies, comma-separated, each with its own intra-dim policy; both = "
        "baseline,themis; all = every one (default both)",
    )
    _add_rows(p, "workload gpt")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with its subcommands."""
    parser = _Parser(
        prog="themis-mpi",
        description="Emulate multi-dimensional accelerator networks with MPI and schedule "
        f"collectives with Themis. Units: {UNITS}.",
    )
    parser.add_argument("--version", action="version", version=f"themis-mpi {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (
        _run_parser,
        _model_parser,
        _train_parser,
        _convert_parser,
        _replay_parser,
        _analyze_parser,
        _export_parser,
        _synthesize_parser,
        _calibrate_parser,
        _plot_parser,
        _workload_parser,
    ):
        add(sub)
    sub.add_parser("topologies", help="list the topology presets")
    sub.add_parser("policies", help="list the inter-dim and intra-dim scheduling policies (and plugins)")
    sub.add_parser("info", help="print versions of the package, numpy, mpi4py, h5py and MPI")
    return parser
