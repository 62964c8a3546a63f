"""`themis-mpi train`: training iterations of a workload under each policy, with the speedup.

A text workload runs its layer loop (`workloads.training`); a Chakra trace (a .et file, or the
prefix of prefix.<rank>.et files) runs as a graph (`workloads.chakra`). Comma lists of -t, -c,
-p, --intra, --network and --comm-scheduler sweep, in `run.sweep.training_cells`' order; the
cells run one after the other, or on a pool (``--workers``, the model only), each row printed and
saved as it ends (`cli.options.training_sweep`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from functools import partial

from ..config import RunConfig
from ..errors import UsageError
from ..launch import under_mpiexec
from ..limits import check_memory
from ..output import STDOUT, write_json
from ..policies import default_scheduler, make_scheduler
from ..report import stragglers_line
from ..run.backend import open_backend
from ..run.coordinator import policy_name
from ..run.jobs import Job, check_jobs, jobs_table, parse_placement, run_jobs, solo_times_us
from ..run.pool import MPI, parse_workers, train_graph, train_text
from ..run.sweep import TrainingCell, training_cells
from ..run.training import graph_run
from ..timing.planner import JOBS, TRAINING, WORLD, Run, chunk_steps
from ..timing.planner import plan as plan_of
from ..topology import Topology
from ..workloads.chakra import Graph, Plan, graph_collectives, is_et_source, load_graph, plan_graph
from ..workloads.text import Workload, parse_workload
from ..workloads.training import TrainingSpec, bucket_plan, distinct_collectives, listed_collectives
from .options import (
    Meter,
    all_topologies,
    check_outputs,
    chunk_counts,
    expect_lines,
    input_files,
    one_chunk_count,
    one_topology,
    partition_mib,
    policy_settings,
    rule_bases,
    slow_compute,
    split_list,
    table_to_stderr,
    training_sweep,
    wrong_exit,
)


def cmd_train(args: argparse.Namespace) -> int:
    """`themis-mpi train`: a text workload's iterations, or a Chakra graph, under each policy.

    With ``--json -`` the rows alone go to standard output, as `model`'s do; what the command
    prints besides (its header and table) goes to standard error.
    """
    with table_to_stderr(args):
        return _train(args)


def _rows_out(args: argparse.Namespace, doc: list) -> None:
    """``--json``: the rows to their file, or to the real standard output for ``-``."""
    if args.json == STDOUT:
        with contextlib.redirect_stdout(args.rows_stream):
            write_json(STDOUT, doc)
    elif args.json:
        write_json(args.json, doc)


def _train(args: argparse.Namespace) -> int:
    if args.job:
        if args.workload is not None:
            raise UsageError("give either WORKLOAD or --job (one or more), not both")
        return _train_jobs(args)
    if args.workload is None:
        raise UsageError("give a WORKLOAD, or --job PATH@PLACEMENT one or more times")
    if is_et_source(args.workload):
        return _train_graph(args)
    if args.comm_group:
        raise UsageError("--comm-group applies to Chakra traces only")
    wl = parse_workload(args.workload)
    cells = _cells(args, wl, _text_spec(args, 64, 0.0))
    use_mpi, workers = _where(args)
    sizes = [0]
    for topo, spec in dict.fromkeys((c.topology, c.spec) for c in cells):  # refused here when it does not fit
        sizes += [c.size_bytes for c in distinct_collectives(wl, topo, spec)]
    if use_mpi:
        check_memory(3 * max(sizes), "the buffers of the largest collectives")

    def head(group: list[TrainingCell]) -> list[str]:
        cell = group[0] if group else cells[0]
        topo, spec, config = cell.topology, cell.spec, cell.config
        lines = [
            f"# workload {args.workload}: {wl.parallelism}, {len(wl.layers)} layers; topology "
            f"{topo.label()}, {topo.npus} NPUs; {spec.iterations} iterations, {_chunks(group)} chunks per "
            f"collective, {'emulator' if use_mpi else 'model'}"
        ]
        if topo != cell.given:
            lines.append(
                f"# model-parallel group {wl.model_parallel_group} splits a dim: "
                f"{cell.given.spec()} runs as {topo.spec()}"
            )
        if spec.bucket_mib:
            lines.append(_buckets_line(wl, topo, spec))
        lines += _scheduler_lines(group)
        if config.asymmetric or spec.heterogeneous:
            lines.append(stragglers_line(config, spec))
        timing = plan_of(Run(topo, config, TRAINING, slow_compute=spec.heterogeneous))
        steps = [c.spec.iterations * chunk_steps(topo, listed_collectives(wl, topo, c.spec)) for c in group]
        return lines + expect_lines(timing, steps, spec)

    inputs = input_files(args.workload, *split_list(args.topology), args.comm_group)
    return training_sweep(
        args, cells, partial(train_text, wl), head, use_mpi, workers, inputs, ("train", args.workload)
    )


def _cells(args: argparse.Namespace, wl: Workload, spec: TrainingSpec) -> list[TrainingCell]:
    """Every cell of `train`'s sweep: -t x -c x -p x --intra x --network x --comm-scheduler."""
    if args.algorithm is not None and len(args.algorithm) > 1:
        raise UsageError("train takes one --algorithm list (sweep topologies with -t A,B)")
    pairs = [(given, wl.fit_topology(given)) for given in all_topologies(args)]
    policies = args.policy if args.policy in ("all", "both") else split_list(args.policy)
    return training_cells(
        pairs,
        chunk_counts(args),
        policies,
        split_list(args.intra),
        rule_bases(args),
        spec,
        args.partition_mib,
    )


def _chunks(group: list[TrainingCell]) -> str:
    """The chunk counts of a topology's cells, e.g. ``4,16``."""
    return ",".join(str(c) for c in dict.fromkeys(cell.spec.chunks for cell in group)) or "no"


def _text_spec(args: argparse.Namespace, chunks: int, parts_mib: float) -> TrainingSpec:
    """How a text workload (or every job) runs, from the flags (the sweep sets chunks and partitions)."""
    return TrainingSpec(
        chunks,
        args.dtype,
        args.iters,
        args.compute_scale,
        args.comm_scale,
        args.bucket_mib,
        args.first_bucket_mib,
        parts_mib,
        **slow_compute(args),
    )


def _train_jobs(args: argparse.Namespace) -> int:
    """`themis-mpi train --job ...`: several text workloads at once on one network, under each policy."""
    if args.comm_group:
        raise UsageError("--comm-group applies to Chakra traces only")
    jobs = []
    for text in args.job:
        path, at, placement = text.rpartition("@") if "@" in text else ("", "", "")
        path = path if at else text
        if is_et_source(path):
            raise UsageError(f"--job {text}: jobs are text workloads; Chakra traces run alone")
        name = os.path.basename(path) + (f"@{placement}" if placement else "")
        jobs.append(Job(parse_workload(path), parse_placement(placement), name))
    if args.csv or args.jsonl or args.resume:
        raise UsageError(
            "--job runs one topology's jobs: it writes --json only (no --csv, --jsonl, --resume)"
        )
    topo = one_topology(args)
    spec = _text_spec(args, one_chunk_count(args), partition_mib(args))
    settings = policy_settings(args, topo)
    check_jobs(jobs, topo, spec)  # refused on every rank before MPI starts
    plan_of(Run(topo, settings[0].config, JOBS, slow_compute=spec.heterogeneous))  # (stragglers are refused)
    use_mpi, workers = _where(args)
    if workers != 1:
        raise UsageError("--job runs one policy at a time: --workers is not taken")
    if use_mpi:
        sizes = [
            c.size_bytes
            for job in jobs
            for c in distinct_collectives(job.workload, job.sub_topology(topo), spec)
        ]
        check_memory(3 * max(sizes, default=0) * len(jobs), "the buffers of the jobs' largest collectives")
    with open_backend(topo, use_mpi, settings[0].config.timeout_s) as backend:
        if backend.rank == 0:
            check_outputs(args.json, inputs=input_files(*[j.workload.path for j in jobs], args.topology))
            print(
                f"# {len(jobs)} jobs on topology {topo.label()}, {topo.npus} NPUs; {spec.iterations} "
                f"iterations, {spec.chunks} chunks per collective, --network {settings[0].config.network}, "
                f"{'emulator' if use_mpi else 'model'}; solo_us: each job alone on the model",
                flush=True,
            )
        results = []
        with Meter(len(settings), args.quiet or backend.rank != 0) as meter:
            for i, (policy, config) in enumerate(settings):
                results.append(run_jobs(backend.transport(config), jobs, policy, spec))
                meter.part(i, policy_name(policy))(1, 1)
        if backend.rank == 0:
            solo = [solo_times_us(topo, config, jobs, policy, spec) for policy, config in settings]
            print(jobs_table(results, solo))
            _rows_out(args, [r.to_dict() for r in results])
    return wrong_exit(sum(row.wrong or 0 for r in results for row in r.jobs))


def _scheduler_line(config: RunConfig, spec: TrainingSpec) -> str:
    """Which communication scheduler runs, with its partitions and credit."""
    name = default_scheduler(config)
    parts = f"partitions of {spec.partition_mib:g} MiB" if spec.partition_mib else "whole tensors"
    scheduler = make_scheduler(name)
    scheduler.setup(config)
    credit_bytes = getattr(scheduler, "credit_bytes", None) if scheduler.gated else None
    credit = f", credit {credit_bytes / 2**20:g} MiB per dim" if credit_bytes else ""
    return f"# communication scheduler {name}: {parts}{credit}"


def _scheduler_lines(group: list[TrainingCell]) -> list[str]:
    """Which communication scheduler each of a topology's cells runs, once per scheduler."""
    runs = {(c.config.comm_scheduler, c.spec.partition_mib): c for c in group}
    return [
        _scheduler_line(c.config, c.spec)
        for c in runs.values()
        if c.config.comm_scheduler or c.spec.partition_mib
    ]


def _where(args: argparse.Namespace) -> tuple[bool, int | str]:
    """The emulator (under mpiexec) or the model, and ``--workers``.

    Under mpiexec with ``--workers mpi`` (mpi4py.futures) the runs are the model's, on the pool;
    otherwise mpiexec means the emulator, whose runs are MPI jobs themselves and stay serial.
    """
    workers = parse_workers(args.workers)
    use_mpi = under_mpiexec() and workers != MPI
    if use_mpi and workers != 1:
        raise UsageError("train under mpiexec is the emulator, one run at a time: --workers is for the model")
    return use_mpi, workers


def _buckets_line(wl: Workload, topo: Topology, spec: TrainingSpec) -> str:
    """What the gradient buckets of a text workload are."""
    buckets = bucket_plan(wl, topo, spec)
    sizes = [b.collective.size_bytes / 2**20 for b in buckets] or [0.0]
    first = f", first {spec.first_bucket_mib:g} MiB" if spec.first_bucket_mib is not None else ""
    return (
        f"# gradient buckets of {spec.bucket_mib:g} MiB{first}: {len(buckets)} per iteration for "
        f"{sum(len(b.layers) for b in buckets)} layers, {min(sizes):.2f} to {max(sizes):.2f} MiB, "
        f"{sum(sizes):.2f} MiB in all"
    )


def _train_graph(args: argparse.Namespace) -> int:
    """`themis-mpi train` on a Chakra trace: the graph under each policy (a sweep as for text workloads)."""
    if args.bucket_mib or args.first_bucket_mib is not None:
        raise UsageError("--bucket-mib and --first-bucket-mib apply to text workloads only")
    graph = load_graph(args.workload, args.comm_group)
    spec = TrainingSpec(
        64,
        args.dtype,
        1,
        args.compute_scale,
        args.comm_scale,
        **slow_compute(args),
    )
    cells = _cells(args, Workload("", "HYBRID_TRANSFORMER", [], graph.model_parallel_group), spec)
    use_mpi, workers = _where(args)
    ranks = None
    sizes = [0]
    for topo, run_spec in dict.fromkeys((c.topology, c.spec) for c in cells):
        if not graph.symmetric and len(graph.traces) != topo.npus:
            raise UsageError(f"{args.workload}: {len(graph.traces)} per-rank traces but {topo.npus} NPUs")
        ranks = list(range(topo.npus)) if use_mpi else [0]
        sizes += [c.size_bytes for c in graph_collectives(graph, topo, run_spec, ranks)]  # refused here
    if use_mpi:
        check_memory(3 * max(sizes), "the buffers of the largest collectives")

    def head(group: list[TrainingCell]) -> list[str]:
        cell = group[0] if group else cells[0]
        topo, config, cell_spec = cell.topology, cell.config, cell.spec
        plan = plan_graph(graph.trace(0), topo, 0, cell_spec, graph.groups)
        distinct = len(graph_collectives(graph, topo, cell_spec, range(topo.npus) if use_mpi else [0]))
        lines = [
            _graph_lines(
                args.workload, graph, plan, distinct, topo, cell_spec, use_mpi, config, _chunks(group)
            )
        ]
        lines += _scheduler_lines(group)
        if topo != cell.given:
            lines.append(
                f"# model-parallel group {graph.model_parallel_group} splits a dim: "
                f"{cell.given.spec()} runs as {topo.spec()}"
            )
        timing = plan_of(graph_run(topo, config, graph, plan, cell_spec))
        steps = []
        for c in group:
            issued = plan_graph(graph.trace(0), topo, 0, c.spec, graph.groups).ops
            steps.append(chunk_steps(topo, [op.collective for op in issued if op.collective is not None]))
        held = sum(len(trace.nodes) for trace in graph.traces)  # (read from files: every rank's)
        return lines + expect_lines(timing, steps, cell_spec, len(plan.ops), held)

    inputs = [t.path for t in graph.traces] + input_files(*split_list(args.topology), args.comm_group)
    return training_sweep(
        args,
        cells,
        partial(train_graph, graph, ranks),
        head,
        use_mpi,
        workers,
        inputs,
        ("train", args.workload),
    )


def _graph_lines(
    source: str,
    graph: Graph,
    plan: Plan,
    distinct: int,
    topo: Topology,
    spec: TrainingSpec,
    use_mpi: bool,
    config: RunConfig | None = None,
    chunks: str = "",
) -> str:
    """What a Chakra trace holds and how it runs (on every NPU's links, where `config` says so)."""
    run = None if config is None else graph_run(topo, config, graph, plan, spec)
    timing = None if run is None else plan_of(run)
    trace = graph.trace(0)
    kinds = ", ".join(f"{n} {kind}" for kind, n in trace.counts().items())
    files = "1 file for every rank" if graph.symmetric else f"{len(graph.traces)} per-rank files"
    return (
        f"# Chakra trace {source}: {files}; "
        f"rank 0: {len(trace.nodes)} nodes ({kinds}); {plan.collectives} collectives on the network "
        f"({distinct} distinct), {plan.messages} point-to-point messages; "
        f"{plan.missing_deps} deps on absent nodes ignored, {plan.dropped_ctrl_deps} cyclic ctrl deps "
        "dropped\n"
        f"# topology {topo.label()}, {topo.npus} NPUs; {graph.iterations} iteration(s) in the graph, "
        f"{chunks or spec.chunks} chunks per collective, {'emulator' if use_mpi else 'model'}"
        + (f"; {timing.describe()}" if timing is not None and timing.simulator == WORLD else "")
    )
