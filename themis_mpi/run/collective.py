"""One collective from start to end on any transport: the run driver's core.

The same code runs on the model (one process, `model.ModelTransport`) and on the emulator (one
MPI rank per NPU, `mpi.transport.MpiTransport`): the schedule comes from rank 0
(`coordinator.share_schedules`), every rank issues the collective on its engine (`execute`: a
run's start and end, written once for every kind of run), and the result is reduced so that
every rank returns the same, whole result.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from ..collectives import Collective
from ..config import RunConfig
from ..engine import CollectiveRun, Engine, StageRun, Transport
from ..errors import UsageError
from ..model import ModelTransport
from ..msccl.custom import choose
from ..policies import Schedule, origin
from ..results import CollectiveResult, summarize
from ..timing.planner import CUSTOM, Run, plan, run_on
from ..topology import Topology
from .coordinator import PolicyLike, policy_name, share_schedules
from .custom import custom_collective, dim_stages

T = TypeVar("T")


def execute(transport: Transport, engine: Engine, what: str, begin: Callable[[], T]) -> tuple[T, float]:
    """A run from start to end: the ranks line up, the clocks start, `begin` issues, the engine runs.

    Returns what `begin` returned and the slowest rank's wall seconds (checking time excluded).
    """
    transport.barrier(f"the barrier before {what}")
    transport.check_s = 0.0
    transport.clock.start()
    engine.t0_wall_s = t0 = time.perf_counter()
    started = begin()
    engine.run()
    wall_s = float(transport.reduce([time.perf_counter() - t0 - transport.check_s], "max")[0])
    return started, wall_s


def wrong_elements(transport: Transport, engine: Engine) -> int | None:
    """Wrong elements of the checked collectives and messages, summed over ranks; None if unchecked."""
    wrongs = [r.wrong for r in engine.collectives] + [m.wrong for m in engine.messages]
    checked = [w for w in wrongs if w is not None]
    if not transport.checks_data or (engine.collectives and not checked):
        return None
    return int(transport.reduce(np.array([sum(checked)], np.int64), "sum")[0])


def run_collective(
    transport: Transport,
    collective: Collective,
    policy: PolicyLike,
    schedule: Schedule | None = None,
    check: bool = True,
    start_order: list | None = None,
) -> tuple[CollectiveResult, Engine]:
    """Run one collective; every rank returns the same result.

    What times it is the planner's choice (`timing.planner.plan`); this runs the collective on
    every NPU that choice runs (`collective_on`).

    Args:
        transport: the model or the MPI transport, with its `RunConfig`.
        collective: what to run.
        policy: the inter-dim policy (an instance keeps its state between calls, or a name).
        schedule: replay this schedule instead of asking the policy.
        check: check the reduced data against the closed form (emulator only).
        start_order: with stragglers, the order in which each dim starts its stages, when the
            caller has it; else that of a run with NPUs alike.

    Returns:
        The result (``wrong`` summed over ranks, ``wall_s`` of the slowest rank) and this rank's
        engine, which holds the stage records. Under the wall clock ``time_us`` is the measured
        wall time divided by the time scale.
    """
    topology, config = transport.topology, transport.config
    check_ranks(topology, config)
    with dim_stages(topology, config, collective, prove=not transport.checks_data):  # (a dim's msccl:FILE)
        return _run_collective(transport, collective, policy, schedule, check, start_order)


def _run_collective(
    transport: Transport,
    collective: Collective,
    policy: PolicyLike,
    schedule: Schedule | None,
    check: bool,
    start_order: list | None,
) -> tuple[CollectiveResult, Engine]:
    """`run_collective` while a dim's custom stages are held: the policy's estimates see them too."""
    topology, config = transport.topology, transport.config
    (schedule,), decision_s = share_schedules(
        transport, policy, [collective], None if schedule is None else [schedule]
    )
    custom = choose(topology, collective, prove=not transport.checks_data)
    timing = plan(Run(topology, config, custom=custom is not None))
    if timing.simulator == CUSTOM and custom is not None:  # the custom algorithm's own run
        return custom_collective(transport, collective, custom, policy_name(policy), decision_s)
    if timing.agreed and start_order is None:  # each dim starts its stages as with NPUs alike
        start_order = symmetric_run(topology, config, collective, schedule)[0].start_order()

    program = getattr(transport, "run_program", None)  # (the emulator's: `mpi.program`)
    if program is not None and timing.programmed and origin(schedule.intra or config.intra) == "builtin":
        return program_result(program, transport, collective, schedule, policy, decision_s, check)

    def body(npu: Transport) -> tuple[CollectiveRun, Engine, float]:
        return collective_on(npu, collective, schedule, check, start_order, timing.every_npu)

    run, engine, wall_s = run_on(timing, transport, body, kinds={})  # (every NPU runs one program)
    return result_of(transport, run, engine, wall_s, schedule, policy, decision_s), engine


def result_of(
    transport: Transport,
    run: CollectiveRun,
    engine: Engine,
    wall_s: float,
    schedule: Schedule,
    policy: PolicyLike,
    decision_s: float,
) -> CollectiveResult:
    """The whole result of a collective that ran on this transport's engine (the same on every rank)."""
    config = transport.config
    return summarize(
        run,
        transport.topology,
        transport.cost,
        policy=policy_name(policy),
        intra=schedule.intra or config.intra,
        schedule=schedule.label,
        decision_s=decision_s,
        clock="model" if transport.name == "model" else transport.clock.name,
        wrong=wrong_elements(transport, engine),
        wall_s=wall_s,
        time_scale=config.time_scale,
        wall_time_us=wall_s / config.time_scale * 1e6 if transport.clock.name == "wall" else None,
        network=config.network,
    )


_RECORDED: dict[tuple, tuple[CollectiveRun, list[StageRun], list[int]]] = {}  # `recorded_run`
RECORDED_MAX = 64  # symmetric runs kept before the memo starts over


def recorded_run(
    topology: Topology, config: RunConfig, collective: Collective, schedule: Schedule
) -> tuple[tuple, CollectiveRun, list[StageRun], list[int]]:
    """The model's run of a symmetric collective, memoised: its key, run, stages in start order, finish order.

    The run is a function of its inputs (NPUs alike, built-in policies), so every call with the
    same ones (a training step's collective, a benchmark's repeats) reuses the first. The finish
    order gives, for each record of the engine in completion order, its place in the start order.
    """
    key = (
        topology,
        config,
        collective,
        schedule.bounds.tobytes(),
        schedule.orders.tobytes(),
        schedule.orders.shape,
        schedule.fuse_last,
        schedule.intra,
    )
    memo = _RECORDED.get(key)
    if memo is None:
        engine, run = symmetric_run(topology, config, collective, schedule)
        order = sorted(engine.records, key=lambda r: r.start_seq)
        at = {id(r): i for i, r in enumerate(order)}
        memo = (run, order, [at[id(r)] for r in engine.records])
        if len(_RECORDED) >= RECORDED_MAX:
            _RECORDED.clear()
        _RECORDED[key] = memo
    return (key, *memo)


def program_result(
    program: Callable[[CollectiveRun, list[StageRun], tuple], np.ndarray],
    transport: Transport,
    collective: Collective,
    schedule: Schedule,
    policy: PolicyLike,
    decision_s: float,
    check: bool,
) -> tuple[CollectiveResult, Engine]:
    """A symmetric collective on the emulator: the model's memoised run, its data moved as a program.

    Every rank moves its data in the model's stage order (`program`, `mpi.program`); the times
    and stage records are the model's, each record with this rank's wall start and end.
    """
    topology, config = transport.topology, transport.config
    key, model_run, order, finish = recorded_run(topology, config, collective, schedule)
    engine = Engine(topology, transport, config)
    run = dataclasses.replace(model_run, check=check, wrong=None, runs=[])

    def begin() -> np.ndarray:
        transport.open(run)
        walls = program(run, order, key)
        transport.close(run)
        return walls

    walls, wall_s = execute(transport, engine, "the collective", begin)
    runs = [
        StageRun(r.stage, r.queued_ns, r.start_ns, r.end_ns, r.slot, r.dim_seq, r.start_seq, w0, w1)
        for r, (w0, w1) in zip(order, walls.tolist())
    ]
    engine.recorded(run, [runs[i] for i in finish])
    return result_of(transport, run, engine, wall_s, schedule, policy, decision_s), engine


def collective_on(
    npu: Transport,
    collective: Collective,
    schedule: Schedule,
    check: bool,
    start_order: list | None,
    spans: bool,
) -> tuple[CollectiveRun, Engine, float]:
    """The collective on one NPU's engine (or every NPU's, vectorised): its run, engine and wall seconds.

    With `spans` the collective spans every NPU: its first issue and its last end.
    """
    engine = Engine(npu.topology, npu, npu.config)
    if start_order is not None:
        engine.agree(start_order)

    def begin() -> CollectiveRun:
        engine.now_ns = npu.issue_ns  # a late NPU starts its work then
        return engine.issue(collective, schedule, check)

    run, wall_s = execute(npu, engine, "the collective", begin)
    if spans:
        run.issued_ns, run.end_ns = npu.span_ns(engine)
    return run, engine, wall_s


def check_ranks(topology: Topology, config: RunConfig, compute_ranks: Sequence[int] = ()) -> None:
    """Every straggler names an NPU of the topology (known only once a workload has fitted it).

    nccl dims time one NCCL call at a time on every link: they take no straggler and one active chunk.
    """
    if topology.flat and config.active_per_dim > 1:
        raise UsageError(
            f"--active-chunks-per-dim {config.active_per_dim}: nccl dims time one NCCL call at a time "
            "(concurrent calls would share its links, which the NCCL-like model does not time); use 1"
        )
    named = [r for r, _ in config.npu_delay_ns] + [r for _, r, _ in config.link_scale] + list(compute_ranks)
    if named and topology.flat:
        raise UsageError("stragglers run on per-dim algorithms, not on nccl dims")
    if named and max(named) >= topology.npus:
        raise UsageError(
            f"a straggler names rank {max(named)}, but {topology.label()} has {topology.npus} NPUs"
        )


def symmetric_run(
    topology: Topology, config: RunConfig, collective: Collective, schedule: Schedule
) -> tuple[Engine, CollectiveRun]:
    """The collective on the one-NPU model with all NPUs alike: its start order is the agreed one."""
    model = ModelTransport(topology, config.alike())
    engine = Engine(topology, model, model.config)
    run = engine.issue(collective, schedule, False)
    engine.run()
    return engine, run


def model_collective(
    topology: Topology,
    collective: Collective,
    policy: PolicyLike,
    config: RunConfig | None = None,
    schedule: Schedule | None = None,
) -> tuple[CollectiveResult, Engine]:
    """One collective on the model: `run_collective` on a fresh model transport."""
    return run_collective(ModelTransport(topology, config or RunConfig()), collective, policy, schedule)
