"""The one run driver: a collective, or training iterations, on any transport.

The same code runs on the model (one process, `model.ModelTransport`) and on the emulator (one
MPI rank per NPU, `mpi.transport.MpiTransport`): rank 0 chooses the chunk orders and broadcasts
them, every rank issues the same collectives on its engine, and the results are reduced so that
every rank returns the same result. `run`, `model`, `replay` and `train` all come through here.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .analysis import CollectiveResult, TrainingResult, dim_results, summarize
from .collectives import Collective
from .cost import ASTRA_CYCLE_NS, ASTRA_SIM_1_0, NO_ENDPOINT, Endpoint, check_compat
from .engine import INTRA_POLICIES, CollectiveRun, Engine, Transport
from .errors import UsageError
from .graph import Graph, GraphReplay, graph_collectives, plan_graph
from .launch import env_rank, env_size
from .limits import MAX_TIME_NS, MAX_TIME_SCALE, MAX_TIMEOUT_S, in_range
from .policies import chunk_orders, fuses_last_dim
from .topology import Topology
from .training import TrainingLoop, TrainingSpec, distinct_collectives
from .workload import Workload

DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RunConfig:
    """How a run is carried out, whatever it runs.

    Attributes:
        intra: intra-dim queue policy, fifo or scf.
        active_per_dim: stages each dim runs at once.
        endpoint_delay_ns: delay added to every algorithm step (ASTRA-sim uses 10).
        clock: virtual (emulated time travels with the messages) or wall (delays really waited).
        time_scale: wall seconds per emulated second (wall clock only).
        timeout_s: seconds a rank waits without progress before it ends the job (MPI only).
        compat: "" for this project's model, or "astra-sim-1.0" for ASTRA-sim 1.0's exact
            semantics where they are modelling choices (see `cost` and `engine`).
        endpoint: the NPU's memory bandwidth, compute share and ACE (`cost.Endpoint`; off).
    """

    intra: str = "fifo"
    active_per_dim: int = 1
    endpoint_delay_ns: float = 0.0
    clock: str = "virtual"
    time_scale: float = 1.0
    timeout_s: float = DEFAULT_TIMEOUT_S
    compat: str = ""
    endpoint: Endpoint = NO_ENDPOINT

    def __post_init__(self) -> None:
        check_compat(self.compat)
        if self.compat and self.endpoint.on:
            raise UsageError("the endpoint model (--hbm-gbps) is not part of --compat astra-sim-1.0")
        if self.intra not in INTRA_POLICIES:
            raise UsageError(f"unknown intra-dim policy {self.intra!r}; use fifo or scf")
        in_range("active chunks per dim", self.active_per_dim, 1, 1024)
        in_range("endpoint delay", self.endpoint_delay_ns, 0, MAX_TIME_NS, "ns")
        if self.clock not in ("virtual", "wall"):
            raise UsageError(f"unknown clock {self.clock!r}; use virtual or wall")
        in_range("time scale", self.time_scale, 1e-9, MAX_TIME_SCALE, "wall s per emulated s")
        in_range("timeout", self.timeout_s, 0.1, MAX_TIMEOUT_S, "s")


def share_orders(
    transport: Transport,
    policy: str,
    collectives: Sequence[Collective],
    given: Sequence[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Every collective's chunk orders: chosen on rank 0, broadcast as one int32 array.

    `given` orders (a replay's) replace the policy's choice. Every rank knows the collectives,
    so every rank knows the array's shape.
    """
    n_dims = len(transport.topology.dims)
    counts = [c.n_chunks for c in collectives]
    flat = np.empty((sum(counts), n_dims), dtype=np.int32)
    if transport.rank == 0 and len(flat):
        chosen = (
            given
            if given is not None
            else [
                chunk_orders(policy, transport.topology, c.op, c.size_bytes, c.n_chunks, c.dims)
                for c in collectives
            ]
        )
        flat[:] = np.concatenate([np.asarray(o, dtype=np.int32) for o in chosen])
    transport.bcast(flat, "the broadcast of the chunk orders")
    return np.split(flat, np.cumsum(counts)[:-1]) if counts else []


def _start(transport: Transport, engine: Engine, what: str) -> float:
    """Line the ranks up and start the clocks; returns the wall start."""
    transport.barrier(f"the barrier before {what}")
    transport.check_s = 0.0
    transport.clock.start()
    engine.t0_wall_s = time.perf_counter()
    return engine.t0_wall_s


def _wrong(transport: Transport, runs: Sequence[CollectiveRun]) -> int | None:
    """Wrong elements of the checked runs, summed over ranks; None when nothing was checked."""
    checked = [r.wrong for r in runs if r.wrong is not None]
    if not transport.checks_data or (runs and not checked):
        return None
    return int(transport.reduce(np.array([sum(checked)], np.int64), "sum")[0])


def run_collective(
    transport: Transport,
    collective: Collective,
    policy: str,
    orders: np.ndarray | None = None,
    check: bool = True,
) -> tuple[CollectiveResult, Engine]:
    """Run one collective; every rank returns the same result.

    Args:
        transport: the model or the MPI transport, with its `RunConfig`.
        collective: what to run.
        policy: the inter-dim policy that chooses the chunk orders.
        orders: replay these chunk orders instead of asking the policy.
        check: check the reduced data against the closed form (emulator only).

    Returns:
        The result (``wrong`` summed over ranks, ``wall_s`` of the slowest rank) and this rank's
        engine, which holds the stage records. Under the wall clock ``time_us`` is the measured
        wall time divided by the time scale.
    """
    config = transport.config
    (orders,) = share_orders(transport, policy, [collective], None if orders is None else [orders])
    engine = Engine(transport.topology, transport, config.intra, config.active_per_dim, config.compat)
    t0 = _start(transport, engine, "the collective")
    run = engine.issue(collective, orders, check, fuses_last_dim(policy))
    engine.run()
    wall_s = float(transport.reduce([time.perf_counter() - t0 - transport.check_s], "max")[0])
    wall = transport.clock.name == "wall"
    result = summarize(
        run, transport.topology, transport.cost, wall_s / config.time_scale * 1e6 if wall else None
    )
    result.virtual_us = (run.end_ns - run.issued_ns) / 1e3 if wall else None
    result.policy, result.intra = policy, config.intra
    result.clock = "model" if transport.name == "model" else transport.clock.name
    result.wrong, result.wall_s = _wrong(transport, [run]), wall_s
    result.topology, result.npus = transport.topology.label(), transport.topology.npus
    result.time_scale = config.time_scale
    return result, engine


def run_training(transport: Transport, workload: Workload, policy: str, spec: TrainingSpec) -> TrainingResult:
    """Training iterations of a workload; every collective on real data (and checked) in MPI.

    The transport's topology must fit the workload (see `workload.Workload.fit_topology`).
    """
    topo, config = transport.topology, transport.config
    collectives = distinct_collectives(workload, topo, spec)
    orders = dict(zip(collectives, share_orders(transport, policy, collectives)))
    engine = Engine(topo, transport, config.intra, config.active_per_dim, config.compat)
    tick_ns = ASTRA_CYCLE_NS if config.compat == ASTRA_SIM_1_0 else 0.0
    loop = TrainingLoop(workload, topo, spec, orders, fuses_last_dim(policy), tick_ns)
    t0 = _start(transport, engine, "training")
    engine.process(loop.process(engine))
    engine.run()
    wall_s = float(transport.reduce([time.perf_counter() - t0 - transport.check_s], "max")[0])
    total_ns = engine.now_ns
    starts = [*loop.iteration_starts, total_ns]
    compute_ns = loop.compute_ns / spec.iterations
    mean_ns = total_ns / spec.iterations
    return TrainingResult(
        policy=policy,
        intra=config.intra,
        chunks=spec.chunks,
        transport=transport.name,
        iterations=spec.iterations,
        total_us=total_ns / 1e3,
        iteration_us=mean_ns / 1e3,
        last_iteration_us=(starts[-1] - starts[-2]) / 1e3,
        compute_us=compute_ns / 1e3,
        exposed_comm_us=max(0.0, mean_ns - compute_ns) / 1e3,
        collectives=loop.collectives_issued,
        dims=dim_results(engine.records, topo, transport.cost, total_ns / 1e3, (0.0, total_ns)),
        wrong=_wrong(transport, engine.collectives),
        wall_s=wall_s,
        workload=workload.path,
        topology=topo.label(),
        npus=topo.npus,
    )


def run_graph(
    transport: Transport, graph: Graph, policy: str, spec: TrainingSpec, ranks: Sequence[int] | None = None
) -> TrainingResult:
    """A Chakra execution graph (`graph`) once; every collective and message on real data in MPI.

    `ranks` whose graphs give the distinct collectives: all of them by default under MPI, rank
    0 on the model. ``iterations`` and the per-iteration times come from the graph's
    ``themis_iterations`` metadata (1 unless it was converted from a text workload).
    """
    topo, config = transport.topology, transport.config
    if ranks is None:
        ranks = range(topo.npus) if transport.name == "mpi" else [0]
    plan = plan_graph(graph.trace(transport.rank), topo, transport.rank, spec, graph.groups)
    if plan.messages and config.compat:
        raise UsageError("point-to-point messages are not supported with --compat")
    collectives = graph_collectives(graph, topo, spec, ranks)
    orders = dict(zip(collectives, share_orders(transport, policy, collectives)))
    engine = Engine(topo, transport, config.intra, config.active_per_dim, config.compat)
    replay = GraphReplay(plan, orders, fuses_last_dim(policy))
    t0 = _start(transport, engine, "the graph replay")
    engine.process(replay.process(engine))
    engine.run()
    wall_s = float(transport.reduce([time.perf_counter() - t0 - transport.check_s], "max")[0])
    total_ns, iterations = engine.now_ns, graph.iterations
    mean_ns, compute_ns = total_ns / iterations, plan.compute_ns / iterations
    wrong = None
    if transport.checks_data:
        mine = sum(r.wrong or 0 for r in engine.collectives) + sum(m.wrong or 0 for m in engine.messages)
        wrong = int(transport.reduce(np.array([mine], np.int64), "sum")[0])
    return TrainingResult(
        policy=policy,
        intra=config.intra,
        chunks=spec.chunks,
        transport=transport.name,
        iterations=iterations,
        total_us=total_ns / 1e3,
        iteration_us=mean_ns / 1e3,
        last_iteration_us=mean_ns / 1e3,
        compute_us=compute_ns / 1e3,
        exposed_comm_us=max(0.0, mean_ns - compute_ns) / 1e3,
        collectives=replay.collectives_issued,
        dims=dim_results(engine.records, topo, transport.cost, total_ns / 1e3, (0.0, total_ns)),
        wrong=wrong,
        wall_s=wall_s,
        workload=graph.source,
        topology=topo.label(),
        npus=topo.npus,
    )


class Backend(Protocol):
    """Where runs happen: the model (this process) or MPI (one rank per NPU on a grid)."""

    @property
    def name(self) -> str:
        """Model or mpi."""
        ...

    @property
    def rank(self) -> int:
        """This process's rank (0 in the model)."""
        ...

    def transport(self, config: RunConfig) -> Transport:
        """A transport with these settings."""
        ...

    def gather(self, events: np.ndarray) -> np.ndarray | None:
        """Every rank's trace events on rank 0 (None on the others)."""
        ...

    def service(self) -> None:
        """Answer liveness pings while this rank is busy on its own (writing outputs)."""

    def close(self, barrier: bool = True) -> None:
        """Wait for every rank (unless `barrier` is False), then free what the backend holds."""


@contextmanager
def _start_up_deadline(timeout_s: float) -> Iterator[None]:
    """End this rank with one line if MPI_Init does not return within the timeout.

    MPI_Init waits for every rank; one that died or stopped before reaching it would keep the
    others there for ever (spinning, with the GIL held), out of reach of the watchdog, which
    needs MPI itself. A forked guard process ends this one unless MPI starts in time.
    """
    if not hasattr(os, "fork"):
        yield
        return
    read_fd, write_fd = os.pipe()
    parent, guard = os.getpid(), os.fork()
    if guard == 0:  # the guard: wait for the pipe to close, or give up
        try:
            os.close(write_fd)
            ready, _, _ = select.select([read_fd], [], [], timeout_s)
            if not ready:
                if env_rank() == 0:
                    line = f"MPI did not start within {timeout_s:g} s: a rank died or stopped before MPI_Init"
                    os.write(2, f"themis-mpi: error: {line}; aborting\n".encode())
                else:
                    time.sleep(1.0)  # rank 0 says it once, before the launcher tears the job down
                os.kill(parent, signal.SIGKILL)
        finally:
            os._exit(0)
    os.close(read_fd)
    try:
        yield
    finally:
        os.close(write_fd)  # the guard sees the pipe close and leaves
        os.waitpid(guard, 0)


@contextmanager
def open_backend(
    topology: Topology, use_mpi: bool, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Iterator[Backend]:
    """The MPI backend on COMM_WORLD (under mpiexec) or the model; closed on exit.

    mpi4py is imported only here, and only for the MPI backend.
    """
    backend: Backend
    if use_mpi:
        ranks = env_size()
        if ranks is not None and ranks != topology.npus:  # refused on every rank before MPI starts
            raise UsageError(
                f"topology {topology.label()} has {topology.npus} NPUs "
                f"({'x'.join(map(str, topology.shape))}) but {ranks} MPI ranks were started"
            )
        with _start_up_deadline(timeout_s):
            from mpi4py import MPI  # MPI_Init waits for every rank of the job

        from .mpi.transport import MpiBackend

        backend = MpiBackend(MPI.COMM_WORLD, topology, timeout_s)
    else:
        from .model import ModelBackend

        backend = ModelBackend(topology)
    try:
        yield backend
    except BaseException:
        backend.close(barrier=False)  # the other ranks may be anywhere: the caller ends the job
        raise
    backend.close()
