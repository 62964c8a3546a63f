"""One collective from start to end on any transport: the run driver's core.

The same code runs on the model (one process, `model.ModelTransport`) and on the emulator (one
MPI rank per NPU, `mpi.transport.MpiTransport`): the schedule comes from rank 0
(`coordinator.share_schedules`), every rank issues the collective on its engine (`execute`: a
run's start and end, written once for every kind of run), and the result is reduced so that
every rank returns the same, whole result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

import numpy as np

from ..collectives import Collective
from ..config import RunConfig
from ..engine import CollectiveRun, Engine, Transport
from ..errors import UsageError
from ..model import ModelTransport
from ..npunet import Astra2World, SharedWorld, World, WorldTransport, every_npu, shared_every_npu
from ..npus import NpuVectors
from ..policies import Schedule
from ..results import CollectiveResult, summarize
from ..topology import Topology
from .coordinator import PolicyLike, policy_name, share_schedules

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

    Args:
        transport: the model or the MPI transport, with its `RunConfig`.
        collective: what to run.
        policy: the inter-dim policy (an instance keeps its state between calls, or a name).
        schedule: replay this schedule instead of asking the policy.
        check: check the reduced data against the closed form (emulator only).
        start_order: with stragglers, the order in which each dim starts its stages, when the
            caller has it (the NPUs of a world share one); else that of a run with NPUs alike.

    Returns:
        The result (``wrong`` summed over ranks, ``wall_s`` of the slowest rank) and this rank's
        engine, which holds the stage records. Under the wall clock ``time_us`` is the measured
        wall time divided by the time scale.
    """
    config = transport.config
    late = dict(config.npu_delay_ns)
    check_ranks(transport.topology, config)
    (schedule,), decision_s = share_schedules(
        transport, policy, [collective], None if schedule is None else [schedule]
    )
    if config.asymmetric and start_order is None:  # each dim starts its stages as with NPUs alike
        start_order = symmetric_run(transport.topology, config, collective, schedule)[0].start_order()
    uneven = every_npu(transport.topology, config) or shared_every_npu(config, False, False)
    if uneven and not isinstance(transport, WorldTransport):
        done = _on_every_npu(transport, collective, policy, schedule, start_order)
        if done is not None:
            result, engine = done
            return replace(result, decision_s=decision_s, clock="model"), engine
    if config.asymmetric and isinstance(transport, ModelTransport):  # no symmetry: every NPU at once
        transport = NpuVectors(transport.topology, config)
    engine = Engine(transport.topology, transport, config)
    if start_order is not None:
        engine.agree(start_order)

    issue_ns = transport.issue_ns if isinstance(transport, NpuVectors) else late.get(transport.rank, 0.0)

    def begin():
        engine.now_ns = issue_ns  # a late NPU starts its work then
        return engine.issue(collective, schedule, check)

    run, wall_s = execute(transport, engine, "the collective", begin)
    if isinstance(transport, NpuVectors):  # the collective spans every NPU
        first_ns = float(np.min(run.issued_ns))
        run.end_ns = transport.npu0(engine)
        run.issued_ns = first_ns
    elif config.asymmetric or uneven:  # (a collective of every NPU: the first issue, the last end)
        run.issued_ns = float(transport.reduce([run.issued_ns], "min", "the collective's first issue")[0])
        run.end_ns = float(transport.reduce([run.end_ns], "max", "the collective's last end")[0])
    wall = transport.clock.name == "wall"
    result = summarize(
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
        wall_time_us=wall_s / config.time_scale * 1e6 if wall else None,
        network=config.network,
    )
    return result, engine


def _on_every_npu(
    transport: Transport,
    collective: Collective,
    policy: PolicyLike,
    schedule: Schedule,
    start_order: list | None,
) -> tuple[CollectiveResult, Engine] | None:
    """The collective on every NPU (`npunet`, `on_world`): 2.x's congestion-aware links, or every NPU's links.

    2.x's links where a dim is uneven; every NPU's links under fair or store-forward where
    stragglers put the NPUs out of step. On the model: NPU 0's result and engine.
    """
    topology, config = transport.topology, transport.config
    replayable = not isinstance(transport, ModelTransport)  # (the emulator's ranks replay it)
    if every_npu(topology, config):
        world: Astra2World | SharedWorld = Astra2World(topology, config)
    else:
        world = SharedWorld(topology, config, replayable)
    return on_world(
        transport, world, lambda npu: run_collective(npu, collective, policy, schedule, False, start_order)
    )


def on_world(transport: Transport, world: World, body: Callable[[WorldTransport], T]) -> T | None:
    """`body` on every NPU of a `npunet` world, in one process: on the model, NPU 0's return.

    Under MPI every rank runs the same deterministic simulation and its transport then takes its
    own rank's stage and message ends from it (`npunet.Replay`) while the data still moves rank
    to rank: the rank's engine takes the decisions its NPU took there, so emulator == model
    exactly. Then None: the caller runs it.
    """
    results = world.run(body)
    if isinstance(transport, ModelTransport):
        return results[0]
    transport.network = world.replay(transport.rank)  # type: ignore[attr-defined]
    return None


def check_ranks(topology: Topology, config: RunConfig, compute_ranks: Sequence[int] = ()) -> None:
    """Every straggler names an NPU of the topology (known only once a workload has fitted it)."""
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
