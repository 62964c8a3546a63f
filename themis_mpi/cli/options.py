"""Options to domain objects: the parsed command line becomes topologies, sizes and `RunConfig`s.

Every command's flags go through here, so one flag means one thing everywhere; the library
below (`run.sweep`) checks what the names and numbers mean.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from ..config import DEFAULT_TIMEOUT_S, RunConfig
from ..cost import ASTRA_SIM_2, Endpoint, default_endpoint_delay_ns
from ..errors import UsageError
from ..launch import env_rank
from ..limits import MAX_CHUNKS, MAX_SIZE_BYTES, in_range
from ..output import STDOUT, check_output_path
from ..policies import default_partition_mib
from ..progress import Progress
from ..run.sweep import PolicyConfig, policy_configs
from ..timing.planner import SAY_ABOVE_S
from ..topology import FitFile, Topology, from_link_bandwidths, parse_topology, read_fit
from ..units import parse_size, size_sweep
from .parser import DefaultInt, DefaultList


def split_list(text: str) -> list[str]:
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


def read_topology(spec: str, args: argparse.Namespace) -> Topology:
    """A -t item; under --compat astra-sim-2 a YAML file's bandwidths are per link.

    A ``calibrate --json`` fit brings its chunk count where ``-c`` was not given (the first fit
    of a list sets it for all).
    """
    fit = read_fit(spec)
    if fit is not None:
        apply_fit(fit, args, spec)
    topo = parse_topology(spec)
    yaml_file = spec.endswith((".yml", ".yaml")) or (os.path.isfile(spec) and fit is None)
    return from_link_bandwidths(topo) if getattr(args, "compat", "") == ASTRA_SIM_2 and yaml_file else topo


def apply_fit(fit: FitFile, args: argparse.Namespace, path: str) -> None:
    """A fit's chunk count as ``-c`` when the command line gives none; its options, which must be none."""
    if fit.args:
        raise UsageError(
            f"{path} asks for the options {' '.join(fit.args)}: give them on the command line with -t"
        )
    chunks = getattr(args, "chunks", None)
    if isinstance(chunks, DefaultList):
        args.chunks = [fit.chunks]
    elif isinstance(chunks, DefaultInt):
        args.chunks = fit.chunks


def one_topology(args: argparse.Namespace, base: Topology | None = None) -> Topology:
    """The one topology of a command that takes one (train, replay)."""
    if args.algorithm is not None and len(args.algorithm) > 1:
        raise UsageError("this command takes one --algorithm list")
    topo = base if base is not None else read_topology(args.topology, args)
    return topo.with_overrides(args.bandwidth, args.latency, args.algorithm[0] if args.algorithm else None)


def all_topologies(args: argparse.Namespace) -> list[Topology]:
    """Every topology of a sweep: each -t item under each --algorithm override."""
    out = []
    for spec in split_list(args.topology):
        base = read_topology(spec, args)
        for algorithms in args.algorithm or [None]:
            out.append(base.with_overrides(args.bandwidth, args.latency, algorithms))
    return out


def size_list(args: argparse.Namespace) -> list[int]:
    """The sizes of ``-b``/``-e``/``-f``, in bytes."""
    last = None if args.maxbytes is None else parse_size(args.maxbytes)
    return size_sweep(parse_size(args.minbytes), last, args.stepfactor)


def chunk_counts(args: argparse.Namespace) -> list[int]:
    """The chunk counts of ``-c``."""
    if not args.chunks or any(c is None for c in args.chunks):
        raise UsageError("-c needs chunk counts, e.g. 64 or 4,16,64")
    for c in args.chunks:
        in_range("chunks", c, 1, MAX_CHUNKS)
    return list(args.chunks)


def one_chunk_count(args: argparse.Namespace) -> int:
    """The chunk count of a command that takes one (train)."""
    counts = chunk_counts(args)
    if len(counts) > 1:
        raise UsageError("train takes one chunk count (sweep with the Python API or a shell loop)")
    return counts[0]


def base_config(args: argparse.Namespace) -> RunConfig:
    """The settings every run of the command shares (the intra-dim policy aside)."""
    return RunConfig(
        active_per_dim=args.active_chunks_per_dim,
        endpoint_delay_ns=(
            default_endpoint_delay_ns(args.compat)
            if args.endpoint_delay_ns is None
            else float(args.endpoint_delay_ns)
        ),
        clock=getattr(args, "clock", "virtual"),
        time_scale=getattr(args, "time_scale", 1.0),
        timeout_s=getattr(args, "timeout_s", DEFAULT_TIMEOUT_S),
        compat=args.compat,
        endpoint=Endpoint(args.hbm_gbps, args.compute_share, args.ace),
        network=args.network or "",
        mtu_bytes=args.mtu,
        compat_concurrent=args.compat_concurrent,
        compat_fifo=args.compat_scheduling == "FIFO",
        npu_delay_ns=npu_delays_ns(getattr(args, "npu_delay_us", None)),
        link_scale=link_scales(getattr(args, "link_scale", None)),
        comm_scheduler=getattr(args, "comm_scheduler", ""),
        credit_bytes=credit_bytes(args),
    )


def rank_values(text: str | None, flag: str, unit: str) -> tuple[tuple[int, float], ...]:
    """``RANK=VALUE[,...]`` as ``(rank, value)`` pairs (the settings check the ranges)."""
    pairs = []
    for item in split_list(text) if text else []:
        rank, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            pairs.append((int(rank), float(value)))
        except ValueError:
            raise UsageError(f"{flag} takes RANK={unit}[,RANK={unit}...], not {item!r}") from None
    return tuple(pairs)


def credit_bytes(args: argparse.Namespace) -> int:
    """``--credit-mib`` in bytes (0: the scheduler's default); only bytescheduler takes it."""
    credit_mib = getattr(args, "credit_mib", None)
    if credit_mib is None:
        return 0
    in_range("--credit-mib", credit_mib, 2.0**-20, MAX_SIZE_BYTES / 2**20, "MiB")
    return max(1, int(credit_mib * 2**20))


def partition_mib(args: argparse.Namespace) -> float:
    """``--partition-mib``, or the scheduler's default (`policies.default_partition_mib`)."""
    return default_partition_mib(getattr(args, "comm_scheduler", ""), args.partition_mib)


def npu_delays_ns(text: str | None) -> tuple[tuple[int, float], ...]:
    """``--npu-delay-us RANK=US[,...]`` as ``(rank, ns)`` pairs."""
    return tuple((rank, us * 1e3) for rank, us in rank_values(text, "--npu-delay-us", "US"))


def compute_jitter(text: str | None) -> float:
    """``--compute-jitter lognormal:SIGMA`` as its sigma (0 without)."""
    if not text:
        return 0.0
    kind, sep, value = text.partition(":")
    try:
        if kind != "lognormal" or not sep:
            raise ValueError
        return float(value)
    except ValueError:
        raise UsageError(f"--compute-jitter takes lognormal:SIGMA, not {text!r}") from None


def policy_settings(args: argparse.Namespace, topology: Topology) -> list[PolicyConfig]:
    """(policy, settings) per ``-p`` and ``--intra`` policy (`run.sweep.policy_configs`), on a topology.

    The settings are `RunConfig.on` the topology: the default rule is ideal on nccl dims, and a
    named rule that the topology cannot take is refused here.
    """
    policies = args.policy if args.policy in ("all", "both") else split_list(args.policy)
    return policy_configs(policies, split_list(args.intra), base_config(args).on(topology))


def check_outputs(*paths: str | None, inputs: Sequence[str | None] = ()) -> None:
    """Refuse bad output paths before any work (on rank 0: a refusal there aborts the job with 2).

    An output may be no input of the command (through symlinks too) and no other output of it.
    """
    named = [p for p in inputs if p]
    seen: dict[str, str] = {}
    for path in paths:
        if not path:
            continue
        check_output_path(path, named)
        if path == STDOUT:
            continue
        real = os.path.realpath(path)
        if real in seen:
            raise UsageError(
                f"cannot write {path}: {seen[real]} is the same file; give each output its own path"
            )
        seen[real] = path


def wrong_exit(wrong: int) -> int:
    """The exit status after the report: 1 when data came out wrong (a failed check), else 0."""
    if wrong:
        if env_rank() == 0:
            print(f"themis-mpi: error: {wrong} element(s) differ from the closed form", file=sys.stderr)
        return 1
    return 0


def input_files(*values: str | None) -> list[str]:
    """The values that name existing files (a topology given as a YAML path, a workload, ...)."""
    return [v for v in values if v and v != STDOUT and os.path.isfile(v)]


class Lines:
    """Where rows go as they finish: lines on stdout, and progress on stderr.

    The lines go to stderr instead when stdout carries data (`--json -`). Progress is a bar on a
    terminal, else a line a minute; it says the cells done, the cells left and the time left.
    """

    NOTE_S = 60.0  # off a terminal (a cluster job's log): a progress line this often

    def __init__(self, total: int, quiet: bool, done: int = 0, data_on_stdout: bool = False):
        self.bar = None
        self.quiet = quiet
        self.stream = sys.stderr if data_on_stdout else sys.stdout  # `--json -`: stdout holds data only
        self.total, self.done, self.first = total, done, done
        self.t0_s = self.last_s = time.perf_counter()
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm  # type: ignore[import-untyped]  # only on a terminal

            self.bar = tqdm(
                total=total,
                initial=done,
                unit="cell",
                file=sys.stderr,
                leave=False,
                postfix=str(total - done),
                bar_format="{n_fmt}/{total_fmt} cells done{postfix} left, ETA {remaining} |{bar}|",
            )

    def write(self, line: str) -> None:
        """Print a line above the bar."""
        if self.bar is not None:
            self.bar.clear()
        print(line, file=self.stream, flush=True)
        if self.bar is not None:
            self.bar.refresh()

    def progress(self) -> str:
        """E.g. ``12/40 cells done, 28 left, ETA 35 s``."""
        ran, left = self.done - self.first, self.total - self.done
        eta = f"{(time.perf_counter() - self.t0_s) / ran * left:.0f} s" if ran else "?"
        return f"{self.done}/{self.total} cells done, {left} left, ETA {eta}"

    def update(self) -> None:
        """One more run done."""
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(str(self.total - self.done), refresh=False)
            self.bar.update()
        elif not self.quiet and time.perf_counter() - self.last_s >= self.NOTE_S:
            self.last_s = time.perf_counter()
            print(f"themis-mpi: {self.progress()}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Remove the bar."""
        if self.bar is not None:
            self.bar.close()


def link_scales(text: str | None) -> tuple[tuple[int, int, float], ...]:
    """``DIM:RANK=F[,...]`` as ``(dim, rank, factor)`` triples (`RunConfig.link_scale` checks the ranges)."""
    triples = []
    for item in split_list(text) if text else []:
        link, sep, value = item.partition("=")
        dim, colon, rank = link.partition(":")
        try:
            if not sep or not colon:
                raise ValueError
            triples.append((int(dim), int(rank), float(value)))
        except ValueError:
            raise UsageError(f"--link-scale takes DIM:RANK=F[,DIM:RANK=F...], not {item!r}") from None
    return tuple(triples)


def expect_line(seconds: float, reason: str) -> str | None:
    """``# expect ~4 min: <reason>`` when a run is expected to take over `timing.planner.SAY_ABOVE_S`.

    ``THEMIS_MPI_EXPECT_S`` in the environment moves that threshold (the tests lower it).
    """
    if seconds <= float(os.environ.get("THEMIS_MPI_EXPECT_S", SAY_ABOVE_S)):
        return None
    n, unit = (
        (seconds, "s") if seconds < 90 else (seconds / 60, "min") if seconds < 5400 else (seconds / 3600, "h")
    )
    return f"# expect ~{n:.2g} {unit}: {reason}" if n < 10 else f"# expect ~{n:.0f} {unit}: {reason}"


class Meter:
    """Progress of one long command on stderr, from the library's `progress.Progress` calls.

    The work is `parts` runs done one after the other (a policy each, say); `part(i)` is run i's
    callback, which the library calls in its own units (layer steps, graph nodes, rows). Shown as
    a bar with the ETA on a terminal, else as a line every `NOTE_S` seconds (a job's log), nothing
    when `quiet` (``-q``, or an MPI rank other than 0). Standard output is never touched.
    """

    NOTE_S = float(os.environ.get("THEMIS_MPI_PROGRESS_S", "5"))  # off a terminal: a line this often

    def __init__(self, parts: int, quiet: bool):
        self.parts, self.quiet = max(1, parts), quiet
        self.fraction, self.label = 0.0, ""
        self.t0_s = self.last_s = time.perf_counter()
        self.bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm  # only on a terminal

            self.bar = tqdm(
                total=100,
                file=sys.stderr,
                leave=False,
                bar_format="{desc} {percentage:3.0f}% |{bar}| {elapsed} elapsed, ETA {remaining}",
            )

    def part(self, i: int, label: str = "") -> Progress:
        """The callback of run `i` (0-based) of the parts; `label` names it (a policy)."""
        best = [0.0]

        def tell(done: int, total: int) -> None:
            share = done / total if total else 1.0
            if share > best[0]:  # (every NPU of a run may report: the furthest counts)
                best[0] = share
                self._show((i + min(share, 1.0)) / self.parts, label)

        return tell

    def _show(self, fraction: float, label: str) -> None:
        self.fraction, self.label = max(self.fraction, fraction), label
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.set_description_str(label, refresh=False)
            self.bar.update(100 * self.fraction - self.bar.n)
        elif time.perf_counter() - self.last_s >= self.NOTE_S:
            self.last_s = time.perf_counter()
            print(f"themis-mpi: {self.line()}", file=sys.stderr, flush=True)

    def write(self, line: str) -> None:
        """A line on standard output (above the bar, which tqdm clears and redraws)."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def line(self) -> str:
        """E.g. ``baseline: 40% done in 12 s, ETA 18 s``."""
        spent_s = time.perf_counter() - self.t0_s
        eta = f"{spent_s / self.fraction * (1 - self.fraction):.0f} s" if self.fraction else "?"
        head = f"{self.label}: " if self.label else ""
        return f"{head}{100 * self.fraction:.0f}% done in {spent_s:.0f} s, ETA {eta}"

    def close(self) -> None:
        """Remove the bar."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
