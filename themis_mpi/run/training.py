"""Training iterations of a text workload, or a Chakra graph, from start to end on any transport.

Every collective of the run is known before the first one is issued, so rank 0 chooses all their
schedules at once (`coordinator.share_schedules`, with the model of the whole run as its oracle,
`training_oracle`); every rank then runs the workload as an engine process (`collective.execute`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..collectives import Collective
from ..config import RunConfig
from ..cost import loop_tick_ns
from ..engine import Engine, Transport
from ..errors import UsageError
from ..model import ModelTransport
from ..network import IDEAL
from ..npunet import Replay, SharedWorld, WorldTransport, shared_every_npu
from ..npus import NpuVectors, NpuWorld, Stalled, npu0_ns, vectorisable
from ..policies import Schedule, default_scheduler
from ..results import TrainingResult, dim_results, link_results
from ..topology import Topology
from ..workloads.chakra import Graph, GraphReplay, graph_collectives, plan_graph
from ..workloads.text import Workload
from ..workloads.training import TrainingLoop, TrainingSpec, distinct_collectives
from .collective import check_ranks, execute, on_world, wrong_elements
from .coordinator import PolicyLike, policy_name, share_orders, share_schedules
from .linked import linked_ranks, run_linked


def loop_on_model(
    workload: Workload,
    topology: Topology,
    spec: TrainingSpec,
    config: RunConfig,
    schedules: dict[Collective, Schedule],
) -> tuple[TrainingLoop, Engine]:
    """The training loop on the one-NPU model under these schedules: the loop and its engine, run."""
    engine = Engine(topology, ModelTransport(topology, config), config)
    loop = TrainingLoop(workload, topology, spec, schedules, loop_tick_ns(config.compat))
    engine.process(loop.process(engine))
    engine.run()
    return loop, engine


def training_oracle(topology: Topology, config: RunConfig, workload: Workload, spec: TrainingSpec):
    """The model as an oracle for a training run: mean iteration time in us under given schedules."""
    collectives = distinct_collectives(workload, topology, spec)

    def evaluate(schedules: Sequence[Schedule]) -> float:
        _, engine = loop_on_model(workload, topology, spec, config, dict(zip(collectives, schedules)))
        return engine.now_ns / spec.iterations / 1e3

    return evaluate


def _training_result(
    transport: Transport,
    engine: Engine,
    policy: PolicyLike,
    spec: TrainingSpec,
    wall_s: float,
    *,
    iterations: int,
    last_iteration_ns: float,
    compute_ns: float,
    collectives: int,
    workload: str,
    decision_s: float = 0.0,
    total_ns: float | None = None,
) -> TrainingResult:
    """The row of a training run or a graph replay, from its engine (`total_ns`: the last rank's end)."""
    topo, network = transport.topology, transport.config.network
    total_ns = engine.now_ns if total_ns is None else total_ns
    carried = getattr(transport, "link_bytes", None)  # what every NPU's links carried, where run
    if carried is None and isinstance(getattr(transport, "network", None), Replay):
        carried = transport.network.link_bytes  # type: ignore[attr-defined]
    span_us = total_ns / 1e3
    links = link_results(engine.records, topo, transport.cost, span_us, carried) if network != IDEAL else []
    return TrainingResult.timed(
        total_ns=total_ns,
        iterations=iterations,
        last_iteration_ns=last_iteration_ns,
        compute_ns=compute_ns,
        policy=policy_name(policy),
        intra=transport.config.intra,
        chunks=spec.chunks,
        transport=transport.name,
        collectives=collectives,
        dims=dim_results(engine.records, topo, transport.cost, total_ns / 1e3, (0.0, total_ns), links),
        wrong=wrong_elements(transport, engine),
        wall_s=wall_s,
        workload=workload,
        topology=topo.label(),
        npus=topo.npus,
        decision_s=decision_s,
        network=network,
        links=links,
        scheduler=default_scheduler(transport.config),
        partition_mib=spec.partition_mib,
    )


def run_training(
    transport: Transport,
    workload: Workload,
    policy: PolicyLike,
    spec: TrainingSpec,
    shared: tuple[dict[Collective, Schedule], list | None, float] | None = None,
) -> TrainingResult:
    """Training iterations of a workload; every collective on real data (and checked) in MPI.

    The transport's topology must fit the workload (see `workloads.text.Workload.fit_topology`).
    `shared`: the schedules, the agreed start order (stragglers) and the decision seconds, when
    decided once for the NPUs of a world.
    """
    topo, config = transport.topology, transport.config
    uneven = config.asymmetric or spec.heterogeneous  # stragglers
    if uneven:
        check_ranks(topo, config, [r for r, _ in spec.npu_compute_scale])
    on_links = shared_every_npu(config, False, False, spec.heterogeneous)  # every NPU's shared links
    if uneven and not on_links and isinstance(transport, ModelTransport):  # no symmetry: every NPU
        if not vectorisable(config):
            return NpuWorld(topo, config).run(lambda npu: run_training(npu, workload, policy, spec))[0]
        transport = NpuVectors(topo, config)
    if shared is None:
        collectives = distinct_collectives(workload, topo, spec)
        oracle = training_oracle(topo, config, workload, spec) if transport.rank == 0 else None
        schedules, decision_s = share_schedules(transport, policy, collectives, evaluate=oracle)
        by_collective = dict(zip(collectives, schedules))
        order = _start_order(workload, topo, spec, config, by_collective) if uneven else None
    else:
        by_collective, order, decision_s = shared
    if on_links and not isinstance(transport, WorldTransport):
        world = SharedWorld(topo, config, replayable=not isinstance(transport, ModelTransport))
        shared = (by_collective, order, decision_s)
        row = on_world(transport, world, lambda npu: run_training(npu, workload, policy, spec, shared))
        if row is not None:
            return replace(row, transport="model")
    engine = Engine(topo, transport, config)
    tick_ns = loop_tick_ns(config.compat)
    ranks = np.arange(topo.npus) if isinstance(transport, NpuVectors) else transport.rank  # (all at once)
    loop = TrainingLoop(workload, topo, spec, by_collective, tick_ns, rank=ranks)
    if order is not None:
        engine.agree(order)

    late = dict(config.npu_delay_ns)
    issue_ns = transport.issue_ns if isinstance(transport, NpuVectors) else late.get(transport.rank, 0.0)

    def begin():
        engine.now_ns = issue_ns  # a late NPU starts then
        return engine.process(loop.process(engine))

    _, wall_s = execute(transport, engine, "training", begin)
    total_ns = engine.now_ns
    if isinstance(transport, NpuVectors):  # the run ends with the last NPU; the rest is NPU 0's
        total_ns = transport.npu0(engine)
        loop.iteration_starts[-1] = npu0_ns(loop.iteration_starts[-1])
        loop.compute_ns = npu0_ns(loop.compute_ns)
    elif uneven:  # the run ends with the last NPU (under an agreed order, its latest event)
        total_ns = max([total_ns, engine.last_timer_ns] + [r.end_ns for r in engine.records])
        total_ns = float(transport.reduce([total_ns], "max", "the training's last end")[0])
    return _training_result(
        transport,
        engine,
        policy,
        spec,
        wall_s,
        iterations=spec.iterations,
        total_ns=total_ns,
        last_iteration_ns=total_ns - loop.iteration_starts[-1],
        compute_ns=loop.compute_ns,
        collectives=loop.collectives_issued,
        workload=workload.path,
        decision_s=decision_s,
    )


def _start_order(
    workload: Workload,
    topo: Topology,
    spec: TrainingSpec,
    config: RunConfig,
    schedules: dict[Collective, Schedule],
) -> list:
    """With stragglers, the order in which each dim starts its stages: a run's at the fastest NPUs' pace.

    Every NPU slowed alike is then exactly the compute-scale what-if.
    """
    factors = [f for _, f in spec.npu_compute_scale]
    fastest = min(factors + [1.0] * (len(factors) < topo.npus))
    even_spec = replace(
        spec, compute_scale=spec.compute_scale * fastest, npu_compute_scale=(), compute_jitter=0.0
    )
    _, model = loop_on_model(workload, topo, even_spec, config.alike(), schedules)
    return model.start_order()


def run_graph(
    transport: Transport,
    graph: Graph,
    policy: PolicyLike,
    spec: TrainingSpec,
    ranks: Sequence[int] | None = None,
    schedules: dict[Collective, Schedule] | None = None,
) -> TrainingResult:
    """A Chakra execution graph once; every collective and message on real data in MPI.

    `schedules`: every distinct collective's, decided already (the NPUs of a world share them).

    `ranks` whose graphs give the distinct collectives: all of them by default under MPI, rank
    0 on the model. ``iterations`` and the per-iteration times come from the graph's
    ``themis_iterations`` metadata (1 unless it was converted from a text workload).
    """
    topo, config = transport.topology, transport.config
    if config.asymmetric or spec.heterogeneous:
        raise UsageError("stragglers run text workloads in train; Chakra graphs do not take them yet")
    in_world = isinstance(transport, WorldTransport)
    if ranks is None or in_world:
        ranks = range(topo.npus) if transport.name in ("mpi", "npus") else [0]
    plan = plan_graph(graph.trace(transport.rank), topo, transport.rank, spec, graph.groups)
    if plan.messages and config.compat:
        raise UsageError("point-to-point messages are not supported with --compat")
    if not graph.symmetric and config.network != IDEAL and config.compat:
        raise UsageError(
            f"per-rank Chakra traces under --compat {config.compat} --network {config.network} "
            "are not supported; use --network ideal"
        )
    if shared_every_npu(config, bool(plan.messages), not graph.symmetric) and not in_world:
        done, schedules = _graph_on_every_npu(transport, graph, policy, spec)
        if done is not None:
            return done
    linked = None
    if transport.name == "model" and not graph.symmetric and plan.messages and spec.partition_mib:
        raise UsageError(
            "--partition-mib is not supported for per-rank Chakra traces with messages on the model"
        )
    if transport.name == "model" and not graph.symmetric and plan.messages:
        plans = {0: plan}
        ranks = linked_ranks(plans, lambda r: plan_graph(graph.trace(r), topo, r, spec, graph.groups))
    if schedules is None:
        collectives = graph_collectives(graph, topo, spec, ranks)
        schedules = dict(zip(collectives, share_orders(transport, policy, collectives)))
    if transport.name == "model" and not graph.symmetric and plan.messages:
        t0 = time.perf_counter()
        linked = run_linked(topo, config, plans, schedules)
        engine, wall_s = linked[0], time.perf_counter() - t0
        replay = GraphReplay(plan, schedules)
        replay.collectives_issued = len(engine.collectives)
        total_ns = max(e.now_ns for e in linked.values())
    else:
        engine = Engine(topo, transport, config)
        replay = GraphReplay(plan, schedules, spec, topo)
        _, wall_s = execute(
            transport, engine, "the graph replay", lambda: engine.process(replay.process(engine))
        )
        total_ns = engine.now_ns
        if not graph.symmetric:  # the iteration ends with the last rank
            total_ns = float(transport.reduce([engine.now_ns], "max")[0])
    return _training_result(
        transport,
        engine,
        policy,
        spec,
        wall_s,
        iterations=graph.iterations,
        last_iteration_ns=total_ns / graph.iterations,
        compute_ns=plan.compute_ns,
        collectives=replay.collectives_issued,
        workload=graph.source,
        total_ns=total_ns,
    )


def _graph_on_every_npu(
    transport: Transport, graph: Graph, policy: PolicyLike, spec: TrainingSpec
) -> tuple[TrainingResult | None, dict[Collective, Schedule]]:
    """Messages or per-rank graphs under fair or store-forward: the graph on every NPU's links.

    On the model that run is the result (rank 0's row); under MPI None: run it (`on_world`).
    With the row go the schedules, decided once for every NPU. The world keeps what it needs
    to say why a graph deadlocks (its stage starts), on the model too.
    """
    topo, config = transport.topology, transport.config
    collectives = graph_collectives(graph, topo, spec, range(topo.npus))
    schedules = dict(zip(collectives, share_orders(transport, policy, collectives)))
    world = SharedWorld(topo, config)
    t0 = time.perf_counter()
    try:
        row = on_world(transport, world, lambda npu: run_graph(npu, graph, policy, spec, schedules=schedules))
    except Stalled as exc:  # (a receive nobody sends, or a group whose NPUs issue different stages)
        raise UsageError(f"the graph deadlocks on every NPU's links: {exc}") from None
    if row is not None:
        return replace(row, transport="model", wall_s=time.perf_counter() - t0), schedules
    return None, schedules


def model_training(
    workload: Workload,
    topology: Topology,
    policy: PolicyLike,
    spec: TrainingSpec,
    config: RunConfig | None = None,
) -> TrainingResult:
    """Training iterations on the model: `run_training` on a fresh model transport.

    The topology is first fitted to the workload (a transformer's group may split a dim).
    """
    topology = workload.fit_topology(topology)
    return run_training(ModelTransport(topology, config or RunConfig()), workload, policy, spec)
