"""The one run driver: a collective, or training iterations, on any transport.

The same code runs on the model (one process, `model.ModelTransport`) and on the emulator (one
MPI rank per NPU, `mpi.transport.MpiTransport`): rank 0 asks the inter-dim policy for every
collective's schedule (chunk bounds, orders, queue policy) and broadcasts it (`share_schedules`),
every rank issues the same collectives on its engine, and the results are reduced so that every
rank returns the same result. `run`, `model`, `replay` and `train` all come through here.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .analysis import CollectiveResult, TrainingResult, dim_results, summarize
from .collectives import Collective
from .cost import ASTRA_CYCLE_NS, ASTRA_SIM_1_0, NO_ENDPOINT, Endpoint, check_compat
from .engine import CollectiveRun, Engine, Transport
from .errors import UsageError
from .launch import env_rank, env_size
from .limits import MAX_TIME_NS, MAX_TIME_SCALE, MAX_TIMEOUT_S, in_range
from .policies import (
    InterPolicy,
    PolicyContext,
    PolicyError,
    Schedule,
    intra_names,
    is_inter,
    is_intra,
    make_inter,
    origin,
)
from .topology import Topology

if TYPE_CHECKING:  # training and graph replay import their modules when they run (not on `run`)
    from .graph import Graph
    from .training import TrainingSpec
    from .workload import Workload

DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RunConfig:
    """How a run is carried out, whatever it runs.

    Attributes:
        intra: intra-dim queue policy, a name of the registry (fifo, scf, rg, lrpf or a plugin).
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
        if not is_intra(self.intra):
            raise UsageError(
                f"unknown intra-dim policy {self.intra!r}; use one of {', '.join(intra_names())} "
                "(themis-mpi policies)"
            )
        in_range("active chunks per dim", self.active_per_dim, 1, 1024)
        in_range("endpoint delay", self.endpoint_delay_ns, 0, MAX_TIME_NS, "ns")
        if self.clock not in ("virtual", "wall"):
            raise UsageError(f"unknown clock {self.clock!r}; use virtual or wall")
        in_range("time scale", self.time_scale, 1e-9, MAX_TIME_SCALE, "wall s per emulated s")
        in_range("timeout", self.timeout_s, 0.1, MAX_TIMEOUT_S, "s")


PolicyLike = str | InterPolicy


def as_policy(policy: PolicyLike) -> InterPolicy:
    """A policy instance: the given one, or a fresh one of that name."""
    return make_inter(policy) if isinstance(policy, str) else policy


def policy_name(policy: PolicyLike) -> str:
    """The registry name of a policy given by name or as an instance."""
    return policy if isinstance(policy, str) else policy.name


def model_oracle(topology: Topology, config: RunConfig):
    """The model as an oracle for policies: one collective's time in us under a schedule."""
    from .model import ModelTransport

    def evaluate_collective(collective: Collective, schedule: Schedule) -> float:
        engine = Engine(
            topology, ModelTransport(topology, config), config.intra, config.active_per_dim, config.compat
        )
        run = issue(engine, collective, schedule)
        engine.run()
        return (run.end_ns - run.issued_ns) / 1e3

    return evaluate_collective


def issue(engine: Engine, collective: Collective, schedule: Schedule, check: bool = True) -> CollectiveRun:
    """Issue a collective on an engine with its schedule."""
    return engine.issue(
        collective, schedule.orders, check, schedule.fuse_last, schedule.bounds, schedule.intra
    )


def validate_schedule(schedule: Schedule, collective: Collective, n_dims: int) -> Schedule:
    """The schedule with numpy types checked; `PolicyError` when it cannot run the collective."""
    if not isinstance(schedule, Schedule):
        raise PolicyError(f"returned {type(schedule).__name__}, not a Schedule")
    bounds = np.asarray(schedule.bounds)
    orders = np.asarray(schedule.orders)
    chunks = len(bounds) - 1
    if bounds.ndim != 1 or chunks < 1 or orders.shape != (chunks, n_dims):
        raise PolicyError(
            f"returned bounds of shape {bounds.shape} and orders of shape {orders.shape}; "
            f"they must be (chunks + 1,) and (chunks, {n_dims})"
        )
    if bounds[0] != 0 or bounds[-1] != collective.count or np.any(np.diff(bounds) < 1):
        raise PolicyError(
            f"returned chunk bounds that do not cut [0, {collective.count}) into non-empty chunks"
        )
    if np.any(np.sort(orders, axis=1) != np.arange(n_dims)):
        k = int(np.argmax(np.any(np.sort(orders, axis=1) != np.arange(n_dims), axis=1)))
        raise PolicyError(
            f"returned order {orders[k].tolist()} for chunk {k}; it must be a permutation of the dims"
        )
    if schedule.intra and not is_intra(schedule.intra):
        raise PolicyError(f"asked for the unknown intra-dim policy {schedule.intra!r}")
    return replace(schedule, bounds=bounds.astype(np.int64), orders=orders.astype(np.int32))


def share_schedules(
    transport: Transport,
    policy: PolicyLike,
    collectives: Sequence[Collective],
    given: Sequence[Schedule] | None = None,
    evaluate=None,
) -> tuple[list[Schedule], float]:
    """Every collective's schedule, chosen on rank 0 and broadcast; and rank 0's decision time in s.

    Rank 0 asks the policy (or takes `given`, a replay's) and checks the result; a policy that
    raises or returns an invalid schedule becomes one `PolicyError` line naming it, which every
    rank raises together. Four uppercase broadcasts: a header of known shape (status, text length,
    decision time, then chunks and fused flag per collective), the text (the error, or each
    collective's queue policy and label), and one int64 table of every chunk's bounds and order.

    Args:
        transport: the run's transport.
        policy: a policy instance (its state carries over between calls) or a name.
        collectives: every collective the run issues (distinct ones for training).
        given: schedules to broadcast instead of asking the policy.
        evaluate: the whole run's oracle for `PolicyContext.evaluate` (training); a single
            collective gets the model of that collective.
    """
    topo = transport.topology
    n_dims, n_coll = len(topo.dims), len(collectives)
    header = np.zeros(3 + 2 * n_coll, dtype=np.int64)
    text = ""
    schedules: list[Schedule] = []
    if transport.rank == 0:
        t0 = time.perf_counter()
        try:
            schedules = (
                list(given) if given is not None else _decide(transport, policy, collectives, evaluate)
            )
            if len(schedules) != n_coll:
                raise PolicyError(f"returned {len(schedules)} schedules for {n_coll} collectives")
            schedules = [validate_schedule(s, c, n_dims) for s, c in zip(schedules, collectives)]
            text = "\n".join(f"{s.intra}\t{s.label}" for s in schedules)
            header[3::2] = [s.n_chunks for s in schedules]
            header[4::2] = [s.fuse_last for s in schedules]
        except Exception as exc:
            name = policy_name(policy)
            where = origin(name) if given is None and is_inter(name) else "given"
            why = str(exc) if isinstance(exc, PolicyError) else f"raised {type(exc).__name__}: {exc}"
            header[0], text = 1, f"policy {name!r} ({where}) {why}".replace("\n", " ")
        header[2] = int((time.perf_counter() - t0) * 1e9)
        header[1] = len(text.encode())
    transport.bcast(header, "the broadcast of the schedule header")
    if header[1]:
        raw = (
            np.frombuffer(text.encode(), np.uint8).copy()
            if transport.rank == 0
            else np.empty(header[1], np.uint8)
        )
        transport.bcast(raw, "the broadcast of the schedule text")
        text = raw.tobytes().decode()
    if header[0]:
        raise PolicyError(text)
    counts = header[3::2].tolist()
    table = np.zeros((sum(counts), 2 + n_dims), dtype=np.int64)
    if transport.rank == 0 and len(table):
        table[:] = np.concatenate(
            [np.column_stack([s.bounds[:-1], s.bounds[1:], s.orders]) for s in schedules]
        )
    if len(table):
        transport.bcast(table, "the broadcast of the chunk bounds and orders")
    lines = text.split("\n") if n_coll else []
    out, row = [], 0
    for i, c in enumerate(counts):
        part = table[row : row + c]
        row += c
        intra, label = lines[i].split("\t", 1)
        bounds = np.append(part[:, 0], part[-1, 1]).astype(np.int64)
        out.append(Schedule(bounds, part[:, 2:].astype(np.int32), bool(header[4 + 2 * i]), intra, label))
    return out, float(header[2]) / 1e9


def _decide(
    transport: Transport, policy: PolicyLike, collectives: Sequence[Collective], evaluate
) -> list[Schedule]:
    """Rank 0: the policy's schedules, with the model as its oracle."""
    config = transport.config
    one = model_oracle(transport.topology, config)
    if evaluate is None and len(collectives) == 1:
        (only,) = collectives

        def evaluate(schedules: Sequence[Schedule]) -> float:
            return one(only, schedules[0])

    context = PolicyContext(transport.topology, config, transport.cost, one, evaluate)
    return as_policy(policy).schedule_all(context, collectives)


def share_orders(
    transport: Transport, policy: PolicyLike, collectives: Sequence[Collective]
) -> list[Schedule]:
    """The schedules alone (`share_schedules` without the decision time)."""
    return share_schedules(transport, policy, collectives)[0]


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
    policy: PolicyLike,
    schedule: Schedule | None = None,
    check: bool = True,
) -> tuple[CollectiveResult, Engine]:
    """Run one collective; every rank returns the same result.

    Args:
        transport: the model or the MPI transport, with its `RunConfig`.
        collective: what to run.
        policy: the inter-dim policy (an instance keeps its state between calls, or a name).
        schedule: replay this schedule instead of asking the policy.
        check: check the reduced data against the closed form (emulator only).

    Returns:
        The result (``wrong`` summed over ranks, ``wall_s`` of the slowest rank) and this rank's
        engine, which holds the stage records. Under the wall clock ``time_us`` is the measured
        wall time divided by the time scale.
    """
    config = transport.config
    name = policy_name(policy)
    (schedule,), decision_s = share_schedules(
        transport, policy, [collective], None if schedule is None else [schedule]
    )
    engine = Engine(transport.topology, transport, config.intra, config.active_per_dim, config.compat)
    t0 = _start(transport, engine, "the collective")
    run = issue(engine, collective, schedule, check)
    engine.run()
    wall_s = float(transport.reduce([time.perf_counter() - t0 - transport.check_s], "max")[0])
    wall = transport.clock.name == "wall"
    result = summarize(
        run, transport.topology, transport.cost, wall_s / config.time_scale * 1e6 if wall else None
    )
    result.virtual_us = (run.end_ns - run.issued_ns) / 1e3 if wall else None
    result.policy, result.intra = name, schedule.intra or config.intra
    result.schedule, result.decision_s = schedule.label, decision_s
    result.clock = "model" if transport.name == "model" else transport.clock.name
    result.wrong, result.wall_s = _wrong(transport, [run]), wall_s
    result.topology, result.npus = transport.topology.label(), transport.topology.npus
    result.time_scale = config.time_scale
    return result, engine


def training_oracle(topology: Topology, config: RunConfig, workload: Workload, spec: TrainingSpec):
    """The model as an oracle for a training run: mean iteration time in us under given schedules."""
    from .model import ModelTransport
    from .training import TrainingLoop, distinct_collectives

    collectives = distinct_collectives(workload, topology, spec)

    def evaluate(schedules: Sequence[Schedule]) -> float:
        transport = ModelTransport(topology, config)
        engine = Engine(topology, transport, config.intra, config.active_per_dim, config.compat)
        tick_ns = ASTRA_CYCLE_NS if config.compat == ASTRA_SIM_1_0 else 0.0
        loop = TrainingLoop(workload, topology, spec, dict(zip(collectives, schedules)), tick_ns)
        engine.process(loop.process(engine))
        engine.run()
        return engine.now_ns / spec.iterations / 1e3

    return evaluate


def run_training(
    transport: Transport, workload: Workload, policy: PolicyLike, spec: TrainingSpec
) -> TrainingResult:
    """Training iterations of a workload; every collective on real data (and checked) in MPI.

    The transport's topology must fit the workload (see `workload.Workload.fit_topology`).
    """
    from .training import TrainingLoop, distinct_collectives

    topo, config = transport.topology, transport.config
    collectives = distinct_collectives(workload, topo, spec)
    oracle = training_oracle(topo, config, workload, spec) if transport.rank == 0 else None
    schedules, decision_s = share_schedules(transport, policy, collectives, evaluate=oracle)
    engine = Engine(topo, transport, config.intra, config.active_per_dim, config.compat)
    tick_ns = ASTRA_CYCLE_NS if config.compat == ASTRA_SIM_1_0 else 0.0
    loop = TrainingLoop(workload, topo, spec, dict(zip(collectives, schedules)), tick_ns)
    t0 = _start(transport, engine, "training")
    engine.process(loop.process(engine))
    engine.run()
    wall_s = float(transport.reduce([time.perf_counter() - t0 - transport.check_s], "max")[0])
    total_ns = engine.now_ns
    starts = [*loop.iteration_starts, total_ns]
    compute_ns = loop.compute_ns / spec.iterations
    mean_ns = total_ns / spec.iterations
    return TrainingResult(
        policy=policy_name(policy),
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
        decision_s=decision_s,
    )


def run_graph(
    transport: Transport,
    graph: Graph,
    policy: PolicyLike,
    spec: TrainingSpec,
    ranks: Sequence[int] | None = None,
) -> TrainingResult:
    """A Chakra execution graph (`graph`) once; every collective and message on real data in MPI.

    `ranks` whose graphs give the distinct collectives: all of them by default under MPI, rank
    0 on the model. ``iterations`` and the per-iteration times come from the graph's
    ``themis_iterations`` metadata (1 unless it was converted from a text workload).
    """
    from .graph import GraphReplay, graph_collectives, plan_graph

    topo, config = transport.topology, transport.config
    if ranks is None:
        ranks = range(topo.npus) if transport.name == "mpi" else [0]
    plan = plan_graph(graph.trace(transport.rank), topo, transport.rank, spec, graph.groups)
    if plan.messages and config.compat:
        raise UsageError("point-to-point messages are not supported with --compat")
    collectives = graph_collectives(graph, topo, spec, ranks)
    schedules = dict(zip(collectives, share_orders(transport, policy, collectives)))
    engine = Engine(topo, transport, config.intra, config.active_per_dim, config.compat)
    replay = GraphReplay(plan, schedules)
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
        policy=policy_name(policy),
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


# The start-up guard, a POSIX shell script (argv: timeout in s, the rank's pid, rank 0's line or
# ""; stdin: a pipe the rank holds open until MPI is up). End of input (MPI started, or the rank
# is gone) stops the sleeper; a sleeper that runs out ends the rank. The guard leaves last.
_GUARD_SH = """
exec 3>&2 2>/dev/null 4<&0
sleep "$1" & s=$!
(cat <&4 >/dev/null; kill "$s") &
if wait "$s"; then
    if [ -n "$3" ]; then printf '%s\\n' "$3" >&3; else sleep 1; fi
    kill -9 "$2"
fi
wait
"""


@contextmanager
def _start_up_deadline(timeout_s: float) -> Iterator[None]:
    """End this rank with one line if MPI_Init does not return within the timeout.

    MPI_Init waits for every rank; one that died or stopped before reaching it would keep the
    others there for ever (spinning, with the GIL held), out of reach of the watchdog, which
    needs MPI itself. A guard process ends this one unless MPI starts in time: a small shell
    script, spawned (no copy of this process: a forked copy, sharing every page copy-on-write
    while MPI_Init wrote them, cost each rank of a 128-rank job on 2 cores about 20-40 ms of CPU).
    """
    shell = "/bin/sh"
    if not hasattr(os, "posix_spawn") or not os.path.exists(shell):  # not POSIX (Windows): no guard
        yield
        return
    line = ""
    if env_rank() == 0:
        line = (
            f"themis-mpi: error: MPI did not start within {timeout_s:g} s (--timeout-s): a rank died or "
            "stopped before MPI_Init, or start-up is slower than that on this machine; aborting"
        )
    argv = [shell, "-c", _GUARD_SH, "themis-mpi-guard", str(math.ceil(timeout_s)), str(os.getpid()), line]
    read_fd, write_fd = os.pipe()  # (not inherited: Python's descriptors close on exec)
    try:
        stdio = [(os.POSIX_SPAWN_DUP2, read_fd, 0), (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
        guard = os.posix_spawn(shell, argv, os.environ, file_actions=stdio)
    finally:
        os.close(read_fd)
    try:
        yield
    finally:
        os.close(write_fd)  # the guard sees its input end and leaves
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
