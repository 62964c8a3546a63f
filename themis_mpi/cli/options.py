"""Options to domain objects: the parsed command line becomes topologies, sizes and `RunConfig`s.

Every command's flags go through here, so one flag means one thing everywhere; the library
below (`run.sweep`) checks what the names and numbers mean.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from itertools import groupby
from typing import TYPE_CHECKING, Any

from ..config import DEFAULT_TIMEOUT_S, RunConfig
from ..cost import ASTRA_SIM_2, Endpoint, default_endpoint_delay_ns
from ..errors import UsageError
from ..launch import env_rank
from ..limits import MAX_CHUNKS, MAX_SIZE_BYTES, in_range
from ..output import STDOUT, SweepFiles, check_output_path
from ..policies import default_partition_mib
from ..progress import Progress
from ..report import training_table
from ..results import TrainingResult, flat_row
from ..run.backend import open_backend
from ..run.coordinator import policy_name
from ..run.pool import chain_tasks, run_training_cells, training_fingerprint
from ..run.sweep import PolicyConfig, TrainingCell, baseline_cells, check_row, policy_configs
from ..timing.planner import SAY_ABOVE_S, Plan, check_fits, estimate, expected_bytes
from ..topology import FitFile, Topology, from_link_bandwidths, parse_topology, read_fit
from ..units import parse_size, size_sweep
from .parser import DefaultInt, DefaultList

if TYPE_CHECKING:  # (`run` loads no training code on its ranks: tests/test_imports.py)
    from ..workloads.training import TrainingSpec


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


def one_chunk_count(args: argparse.Namespace, command: str = "train --job") -> int:
    """The chunk count of a command that takes one (train --job)."""
    counts = chunk_counts(args)
    if len(counts) > 1:
        raise UsageError(f"{command} takes one chunk count, not a list")
    return counts[0]


def names(text: str | None) -> list[str]:
    """A flag's comma list of names; none given is the one default, ``""``."""
    return split_list(text) if text else [""]


def rule_bases(args: argparse.Namespace) -> list[RunConfig]:
    """The shared settings of every ``--network`` x ``--comm-scheduler`` asked (a comma list sweeps each)."""
    return [
        base_config(argparse.Namespace(**{**vars(args), "network": rule, "comm_scheduler": scheduler}))
        for rule in names(args.network)
        for scheduler in names(getattr(args, "comm_scheduler", ""))
    ]


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
        **late_links(args),
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


def late_links(args: argparse.Namespace) -> dict:
    """``--npu-delay-us`` and ``--link-scale`` as the `RunConfig` fields they set (none: no stragglers)."""
    return {
        "npu_delay_ns": npu_delays_ns(getattr(args, "npu_delay_us", None)),
        "link_scale": link_scales(getattr(args, "link_scale", None)),
    }


def slow_compute(args: argparse.Namespace) -> dict:
    """``--npu-compute-scale``, ``--compute-jitter`` and ``--seed`` as the `TrainingSpec` fields they set."""
    return {
        "npu_compute_scale": rank_values(args.npu_compute_scale, "--npu-compute-scale", "F"),
        "compute_jitter": compute_jitter(args.compute_jitter),
        "seed": args.seed,
    }


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


def check_resume(args: argparse.Namespace) -> None:
    """``--resume`` needs a file to read the rows back from."""
    if args.resume and not any(p and p != STDOUT for p in (args.json, args.csv, args.jsonl)):
        raise UsageError("--resume reads the rows already written: give --json, --csv or --jsonl")


def say_dropped(dropped: dict[str, tuple[int, dict[str, int]]]) -> None:
    """One line: the rows --resume dropped from each file (and why), which it rewrote without them."""
    parts = []
    for path, (read, why) in dropped.items():
        reasons = ", ".join(f"{reason}: {n}" for reason, n in why.items())
        parts.append(f"{sum(why.values())} of {read} rows of {path} ({reasons})")
    print(
        f"themis-mpi: warning: --resume dropped {'; '.join(parts)}, and rewrote the files without them; "
        "their cells run again",
        file=sys.stderr,
        flush=True,
    )


def sweep_files(
    args: argparse.Namespace, fingerprint: str, cells: int, speaks: bool
) -> tuple[SweepFiles, list[int]]:
    """A sweep's ``--json``/``--csv``/``--jsonl`` files, and the cells left to run.

    Under ``--resume`` the rank that speaks reads the rows back; those dropped are said in one line.
    """
    files = SweepFiles(
        fingerprint,
        args.json,
        args.csv,
        args.jsonl,
        flat_row,
        args.resume and speaks,
        cells=cells,
        check=check_row,
    )
    if files.dropped:
        say_dropped(files.dropped)
    return files, [i for i in range(cells) if i not in files.done]


def data_on_stdout(args: argparse.Namespace) -> bool:
    """Whether an output is `-` (standard output): then the table goes to stderr."""
    return STDOUT in (args.json, args.csv, args.jsonl)


@contextlib.contextmanager
def table_to_stderr(args: argparse.Namespace) -> Iterator[None]:
    """With ``--json -`` (or --csv/--jsonl): the rows alone on standard output, the rest on stderr.

    The real standard output is kept as ``args.rows_stream`` (`training_sweep` writes the rows there).
    """
    if not data_on_stdout(args):
        yield
        return
    args.rows_stream = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        yield


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


def expect_line(seconds: float, reason: str, memory_bytes: float = 0.0) -> str | None:
    """``# expect ~4 min: <reason>`` when a run is expected to take over `timing.planner.SAY_ABOVE_S`.

    With `memory_bytes` the peak memory too: ``# expect ~4 min, ~2.5 GB: <reason>``.
    ``THEMIS_MPI_EXPECT_S`` in the environment moves that threshold (the tests lower it).
    """
    if seconds <= float(os.environ.get("THEMIS_MPI_EXPECT_S", SAY_ABOVE_S)):
        return None
    n, unit = (
        (seconds, "s") if seconds < 90 else (seconds / 60, "min") if seconds < 5400 else (seconds / 3600, "h")
    )
    memory = f", ~{_rounded(memory_bytes / 1e9)} GB" if memory_bytes else ""
    return f"# expect ~{_rounded(n)} {unit}{memory}: {reason}"


def _rounded(x: float) -> str:
    """A figure as the estimate line says it: two significant digits below 10, whole above."""
    return f"{x:.2g}" if x < 10 else f"{x:.0f}"


def expect_lines(
    timing: Plan, steps: list[int], spec: TrainingSpec, nodes_per_npu: int = 0, graph_nodes: int = 0
) -> list[str]:
    """The one line a topology's runs print first when `estimate` expects them to be long.

    `steps`: each run's chunk steps on one NPU; `spec` names the slow NPUs; `nodes_per_npu` and
    `graph_nodes`: a graph's (`timing.planner.expected_bytes`). Where every NPU runs the line
    gives the expected peak memory too, and a run expected to need more memory than the machine
    has is refused here, before it starts (`timing.planner.check_fits`).
    """
    slow = [r for r, f in spec.npu_compute_scale if f != 1]
    seconds = sum(estimate(timing, n, slow)[0] for n in steps)
    reason = estimate(timing, max(steps, default=0), slow)[1]
    memory = expected_bytes(timing, nodes_per_npu, graph_nodes, slow) if timing.every_npu else 0.0
    check_fits(memory, reason)
    line = expect_line(seconds, reason, memory)
    return [line] if line else []


class Meter:
    """Progress of one long command on stderr, from the library's `progress.Progress` calls.

    The work is `parts` runs done one after the other (a policy each, say); `part(i)` is run i's
    callback, which the library calls in its own units (layer steps, graph nodes, rows). Shown as
    a bar with the ETA on a terminal, else as a line every `NOTE_S` seconds (a job's log), nothing
    when `quiet` (``-q``, or an MPI rank other than 0). Standard output is never touched.
    """

    NOTE_S = float(os.environ.get("THEMIS_MPI_PROGRESS_S", "5"))  # off a terminal: a line this often
    ETA_FROM = 0.01  # the fraction of the work from which `line` extrapolates an ETA

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
        """E.g. ``baseline: 40% done in 12 s, ETA 18 s``.

        No ETA ("?") before `ETA_FROM` of the work: the first per cent holds the reading and
        planning, so extrapolating it gave days for a run of a minute.
        """
        spent_s = time.perf_counter() - self.t0_s
        known = self.fraction >= self.ETA_FROM
        eta = f"{spent_s / self.fraction * (1 - self.fraction):.0f} s" if known else "?"
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


RunCell = Callable[[Any, Any, Any, Progress | None], TrainingResult]  # (transport, policy, spec, progress)


def training_sweep(
    args: argparse.Namespace,
    cells: list[TrainingCell],
    run: RunCell,
    head: Callable[[list[TrainingCell]], list[str]],
    use_mpi: bool,
    workers: int | str,
    inputs: Sequence[str],
    extra: tuple = (),
    render: Callable[[Sequence[TrainingResult], int], str] = training_table,
) -> int:
    """The cells of `train` (and `workload --run`): each row printed and saved as it ends.

    One loop for the emulator (under mpiexec: the cells one after the other, a backend per
    topology) and the model (in this process, or on a pool: `run.pool.run_training_cells`).
    Rows go to ``--json``/``--csv``/``--jsonl`` in grid order (`output.SweepFiles`); ``--resume``
    keeps the rows already there. `head` gives a topology's header lines (printed before its
    table); each row's speedup is over the first baseline row of its topology, chunks, rule and
    scheduler. `extra` goes into the sweep's fingerprint (the workload, say); `render` gives a
    title (no rows) or a row and the lines under it (`report.training_table`'s shape).
    """
    check_resume(args)
    if use_mpi and args.resume:
        raise UsageError("train under mpiexec is the emulator: --resume is for the model")
    speaks = env_rank() == 0
    if speaks and not use_mpi:
        check_outputs(args.json, args.csv, args.jsonl, inputs=inputs)
    files, todo = sweep_files(args, training_fingerprint(cells, *extra), len(cells), speaks)
    table = _TrainingTable(args, cells, files, head, speaks, render)
    if files.done and speaks:
        table.write(f"# resumed: {len(files.done)} of {len(cells)} cells in the files, {len(todo)} left")
    runs = sorted(run for task in chain_tasks([c.policy for c in cells], todo) for run in task)
    if todo and not use_mpi:
        table.head(todo[0])  # before the progress bar
    with Meter(len(runs) if workers == 1 else len(todo), args.quiet or not speaks) as meter:
        table.meter = meter
        if workers != 1:
            for k, (i, result) in enumerate(run_training_cells(run, cells, todo, workers)):
                meter.part(k, policy_name(cells[i].policy))(1, 1)
                table.add(i, result)
        else:
            for _, same in groupby(enumerate(runs), key=lambda kr: id(cells[kr[1][0]].topology)):
                group = list(same)
                first = cells[group[0][1][0]]
                with open_backend(first.topology, use_mpi, first.config.timeout_s) as backend:
                    if (
                        backend.rank == 0 and use_mpi and not table.headed
                    ):  # (MPI runs: a refusal ends the job)
                        check_outputs(args.json, args.csv, args.jsonl, inputs=inputs)
                    table.head(group[0][1][0])
                    for k, (i, keep) in group:
                        cell = cells[i]
                        part = meter.part(k, policy_name(cell.policy))
                        result = run(backend.transport(cell.config), cell.policy, cell.spec, part)
                        if keep:
                            table.add(i, result)
    if speaks:
        with table.rows_out():
            files.close()
    return wrong_exit(table.wrong)


class _TrainingTable:
    """`training_sweep`'s rows on the way out: in grid order, with their speedups, printed and saved."""

    VARIED: dict[str, Callable[[TrainingCell], Any]] = {  # what a row names when the sweep varies it
        "chunks": lambda c: c.spec.chunks,
        "network": lambda c: c.config.network,
        "scheduler": lambda c: c.config.comm_scheduler,
    }

    def __init__(
        self,
        args: argparse.Namespace,
        cells: list[TrainingCell],
        files: SweepFiles,
        head: Callable[[list[TrainingCell]], list[str]],
        speaks: bool,
        render: Callable[[Sequence[TrainingResult], int], str] = training_table,
    ):
        self.args, self.cells, self.files, self.heading, self.speaks = args, cells, files, head, speaks
        self.render = render
        self.meter: Meter | None = None
        self.todo = [i for i in range(len(cells)) if i not in files.done]
        self.next = 0  # the place in `todo` of the next row to show
        self.fresh: dict[int, TrainingResult] = {}
        self.headed: set[int] = set()
        self.titled: set[int] = set()
        self.wrong = 0
        self.groups = [0] * len(cells)  # each cell's topology (as given), numbered in grid order
        for i in range(1, len(cells)):
            self.groups[i] = self.groups[i - 1] + (cells[i].given is not cells[i - 1].given)
        self.base = baseline_cells(cells)
        self.varies = [name for name, value in self.VARIED.items() if len({value(c) for c in cells}) > 1]

    def write(self, line: str) -> None:
        if self.meter is not None:
            self.meter.write(line)
        else:
            print(line, flush=True)

    def head(self, i: int) -> None:
        """A topology's header and table header, once, before its first run or row (rank 0)."""
        g = self.groups[i]
        if g in self.headed:
            return
        self.headed.add(g)
        if not self.speaks:
            return
        todo = set(self.todo)
        group = [c for j, c in enumerate(self.cells) if self.groups[j] == g and j in todo]
        for line in self.heading(group):
            self.write(line)

    def _base_us(self, i: int) -> float | None | bool:
        """The iteration of cell i's baseline row, None without one, False while it is not known."""
        j = self.base[i]
        if j is None:
            return None
        if j in self.fresh:
            return self.fresh[j].iteration_us
        for rows in self.files.kept.values():
            if j in rows:
                return float(rows[j]["iteration_us"])
        return False

    def add(self, i: int, result: TrainingResult) -> None:
        """A cell's result; the rows now in order are shown and saved."""
        self.fresh[i] = result
        self.wrong += result.wrong or 0
        while self.next < len(self.todo) and self.todo[self.next] in self.fresh:
            j = self.todo[self.next]
            base_us = self._base_us(j)
            if base_us is False:
                return
            row = self.fresh[j]
            if row.iteration_us and base_us is not None:
                row = replace(row, speedup=base_us / row.iteration_us)
                self.fresh[j] = row
            self.next += 1
            if self.speaks:
                self._show(j, row)

    def _show(self, i: int, row: TrainingResult) -> None:
        self.head(i)
        if self.groups[i] not in self.titled:  # the table's title with its first row
            self.titled.add(self.groups[i])
            title = self.render([], len(row.dims))
            self.write(title + ("  " + " ".join(self.varies) if self.varies else ""))
        line, *why = self.render([row], len(row.dims)).split("\n")[1:]  # the row, and its waits line
        cell = self.cells[i]
        values = [str(self.VARIED[v](cell) or "-") for v in self.varies]
        self.write(line + ("  " + " ".join(values) if values else ""))
        for text in why:
            self.write(text)
        with self.rows_out():
            self.files.add(i, row.to_dict())

    @contextlib.contextmanager
    def rows_out(self) -> Iterator[None]:
        """Rows for standard output go to the real one (`train` sends its table to stderr then)."""
        stream = getattr(self.args, "rows_stream", None)
        with contextlib.redirect_stdout(stream) if stream is not None else contextlib.nullcontext():
            yield
