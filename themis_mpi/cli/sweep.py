"""`themis-mpi run` and `themis-mpi model`: one collective sweep, on the emulator or the model.

The cells come from `run.sweep.sweep_cells` (as for `api.sweep`): topologies x sizes x chunks x
policies x intra-dim policies. One loop shows and saves each row as it ends, whoever runs the
cells: `model` on a pool (`--workers`, `run.pool`), resuming a killed sweep from its files
(`--resume`); `run` (each cell an MPI job) and ``--trace`` in this process, in order (`_serial`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import groupby

from ..errors import UsageError
from ..launch import env_rank, under_mpiexec
from ..limits import MAX_ITERS, check_memory, in_range
from ..msccl.custom import choose
from ..report import format_nccl, run_header, table_header, table_row
from ..results import CollectiveResult, median
from ..run.backend import open_backend
from ..run.collective import run_collective
from ..run.pool import fingerprint, parse_workers, run_cells
from ..run.sweep import sweep_cells
from ..timing.packet import recorded_mtu
from ..topology import Topology
from ..units import format_size
from .options import (
    Lines,
    all_topologies,
    base_config,
    check_outputs,
    check_resume,
    chunk_counts,
    data_on_stdout,
    input_files,
    size_list,
    split_list,
    sweep_files,
    wrong_exit,
)


def cmd_run(args: argparse.Namespace) -> int:
    """`themis-mpi run`: emulate on real data, one rank per NPU."""
    return collective_sweep(args, True, "run")


def cmd_model(args: argparse.Namespace) -> int:
    """`themis-mpi model`: the same rows from the model transport."""
    return collective_sweep(args, False, "model")


def collective_sweep(args: argparse.Namespace, use_mpi: bool, command: str) -> int:
    """`run` and `model`: every cell of the sweep, each row shown and saved as it ends."""
    workers = parse_workers(args.workers)
    if use_mpi:
        in_range("--iters", args.iters, 1, MAX_ITERS)
        in_range("--warmup-iters", args.warmup_iters, 0, MAX_ITERS)
        if workers != 1 or args.resume:
            raise UsageError("run is serial (each cell is an MPI job): --workers and --resume are for model")
    topologies = all_topologies(args)
    if args.trace and len(topologies) > 1:
        raise UsageError("--trace records one topology; sweep topologies without it")
    check_resume(args)
    if args.trace and (workers != 1 or args.resume):
        raise UsageError("--trace records every cell in this process: drop --workers and --resume")
    cells = sweep_cells(
        topologies,
        size_list(args),
        chunk_counts(args),
        args.policy if args.policy in ("all", "both") else split_list(args.policy),
        split_list(args.intra),
        base_config(args),
        op=args.op,
        dtype=args.dtype,
        dims=args.dims,
        redop=args.redop,
    )
    _warn_small(cells)
    for cell in cells:  # a custom algorithm's file is checked (and proved on the model) before MPI runs
        if choose(cell.topology, cell.collective, prove=not use_mpi) and args.trace:
            raise UsageError("--trace records engine stages; a custom algorithm's steps are not traced yet")
    config = cells[0].config
    iters, warmup = (args.iters, args.warmup_iters) if use_mpi else (1, 0)
    if use_mpi:
        if not under_mpiexec():
            raise UsageError(
                f"run needs one MPI rank per NPU: mpiexec -n {topologies[0].npus} themis-mpi run ... "
                "(or use model)"
            )
        check_memory(
            3 * max(c.collective.size_bytes for c in cells), "the buffer and scratch of the largest size"
        )
    clock = config.clock if use_mpi else "model"
    serial = use_mpi or bool(args.trace)  # the emulator and --trace: every cell in this process, in order
    speaks = env_rank() == 0  # (plain mpiexec of model: every rank models, rank 0 speaks and writes)
    if speaks and not use_mpi:
        check_outputs(
            args.json, args.csv, args.jsonl, args.trace, inputs=input_files(*split_list(args.topology))
        )
    files, todo = sweep_files(args, fingerprint(cells, command, iters), len(cells), speaks)
    progress = Lines(
        len(cells), args.quiet or not speaks, done=len(cells) - len(todo), data_on_stdout=data_on_stdout(args)
    )
    if files.done and speaks:
        progress.write(f"# resumed: {len(files.done)} of {len(cells)} cells in the files, {len(todo)} left")
    last = {id(cells[i].topology): i for i in todo}  # each topology's last cell
    shown: list[Topology] = []  # the topologies whose header is out (the last one's table is open)
    rows: list[CollectiveResult] = []  # the open table's rows (for --format nccl)
    wrong = 0  # elements that differ from the closed form, over every row

    def head(i: int) -> None:
        """Cell i's topology's header, once a policy has decided (a failing policy's line comes first)."""
        topo = cells[i].topology
        if shown and shown[-1] is topo:
            return
        shown.append(topo)
        rows.clear()
        if speaks:
            progress.write(run_header(topo, command, cells[i].config))
            if args.format != "nccl":
                progress.write(table_header(len(topo.dims), clock))

    results = (
        _serial(args, cells, use_mpi, iters, warmup, progress, head)
        if serial
        else run_cells(cells, todo, workers)
    )
    for i, result in results:
        topo = cells[i].topology
        wrong += result.wrong or 0
        head(i)
        rows.append(result)
        if speaks:
            if args.format != "nccl":
                progress.write(table_row(result))
            files.add(i, result.to_dict())
            if args.format == "nccl" and last[id(topo)] == i:  # nccl-tests' blocks, at the end of a topology
                progress.write(format_nccl(rows, topo.group_npus(rows[0].involved)))
        progress.update()
    progress.close()
    if speaks:
        files.close()
    return wrong_exit(wrong)


def _serial(
    args: argparse.Namespace,
    cells: list,
    use_mpi: bool,
    iters: int,
    warmup: int,
    progress: Lines,
    head: Callable[[int], None],
) -> Iterator[tuple[int, CollectiveResult]]:
    """(cell, result) of every cell, in order, in this process: the emulator's and --trace's runs.

    A backend per topology; each cell timed over its iterations (the emulator's), `head` told
    after its first (the header comes out once the job runs, not after a long cell); with --trace,
    each topology's stage events written at its end.
    """
    config = cells[0].config
    clock = config.clock if use_mpi else "model"
    index = {id(cell): i for i, cell in enumerate(cells)}
    for _, same_topology in groupby(cells, key=lambda c: id(c.topology)):
        group = list(same_topology)
        topo = group[0].topology
        recorder = _trace_recorder(topo, use_mpi, clock, config) if args.trace else None
        with open_backend(topo, use_mpi, config.timeout_s) as backend:
            if backend.rank == 0 and use_mpi:  # (MPI has started: a refusal here ends the job)
                check_outputs(
                    args.json,
                    args.csv,
                    args.jsonl,
                    args.trace,
                    inputs=input_files(*split_list(args.topology)),
                )
            for cell in group:
                transport = backend.transport(cell.config)
                walls = []
                for it in range(warmup + iters):
                    check = bool(getattr(args, "check", 1)) and it == warmup + iters - 1
                    result, engine = run_collective(transport, cell.collective, cell.policy, check=check)
                    if it == 0:
                        head(index[id(cell)])
                    if it >= warmup:
                        walls.append(result.wall_s)
                result = replace(result, wall_s=median(walls), iters=iters)
                if recorder:
                    recorder.add_run(result, engine, backend.rank)
                yield index[id(cell)], result
            events = backend.gather(recorder.my_events()) if recorder else None
            if backend.rank == 0 and recorder and events is not None:
                recorder.write(args.trace, events, backend.service)  # the other ranks wait, patiently
                progress.write(
                    f"# wrote {args.trace}: {len(events)} stage events of {len(recorder.rows)} collectives"
                )


def _warn_small(cells) -> None:
    """Say so (rank 0) when a size holds fewer elements than the chunks asked for."""
    if env_rank() != 0:
        return
    for coll in dict.fromkeys(c.collective for c in cells):
        if coll.n_chunks < coll.chunks:
            print(
                f"themis-mpi: warning: {format_size(coll.size_bytes)} holds only {coll.count} {coll.dtype} "
                f"element(s): {coll.n_chunks} chunk(s) of one element instead of {coll.chunks}",
                file=sys.stderr,
            )


def _trace_recorder(topo, use_mpi: bool, clock: str, config):
    """The `--trace` recorder of one topology (every rank records its own stage events)."""
    from ..trace import TraceRecorder  # only --trace records: a plain run never loads the trace code

    return TraceRecorder(
        topo, "mpi" if use_mpi else "model", clock=clock, time_scale=config.time_scale,
        active_per_dim=config.active_per_dim, endpoint_delay_ns=config.endpoint_delay_ns,
        compat=config.compat, network=config.network,
        mtu_bytes=recorded_mtu(topo, config.network, config.mtu_bytes),
    )  # fmt: skip
