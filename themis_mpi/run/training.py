"""Training iterations of a text workload, or a Chakra graph, from start to end on any transport.

Every collective of the run is known before the first one is issued, so rank 0 chooses all their
schedules at once (`coordinator.share_schedules`, with the model of the whole run as its oracle,
`training_oracle`); every rank then runs the workload as an engine process (`collective.execute`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..collectives import Collective
from ..config import RunConfig
from ..cost import loop_tick_ns
from ..engine import Engine, Transport
from ..errors import UsageError
from ..model import ModelTransport
from ..policies import Schedule, default_scheduler
from ..progress import Progress
from ..results import TrainingResult, beyond_physics, dim_results, link_results
from ..timing.planner import GRAPH, GREENLETS, TRAINING, WORLD, Run, graph_ranks, plan, run_on
from ..timing.rules import IDEAL
from ..timing.vectors import npu0
from ..topology import Topology
from ..workloads.chakra import Graph, GraphReplay, graph_collectives, plan_graph
from ..workloads.chakra import Plan as GraphPlan
from ..workloads.text import Workload
from ..workloads.training import TrainingLoop, TrainingSpec, distinct_collectives
from .collective import check_ranks, execute, wrong_elements
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
    max_compute_ns: float | None = None,
    stage_compute_ns: Sequence[float] | None = None,
) -> TrainingResult:
    """The row of a training run or a graph replay, from its engine (`total_ns`: the last rank's end).

    `max_compute_ns` and `stage_compute_ns`: as `TrainingResult.timed` takes them.
    """
    topo, network = transport.topology, transport.config.network
    total_ns = engine.now_ns if total_ns is None else total_ns
    carried = transport.link_bytes  # what every NPU's links carried, where they ran
    span_us = total_ns / 1e3
    links = link_results(engine.records, topo, transport.cost, span_us, carried) if network != IDEAL else []
    return TrainingResult.timed(
        total_ns=total_ns,
        iterations=iterations,
        last_iteration_ns=last_iteration_ns,
        compute_ns=compute_ns,
        max_compute_ns=max_compute_ns,
        stage_compute_ns=stage_compute_ns,
        policy=policy_name(policy),
        intra=transport.config.intra,
        chunks=spec.chunks,
        transport=transport.name,
        collectives=collectives,
        dims=dim_results(
            engine.records, topo, transport.cost, span_us, (0.0, total_ns), links, engine.messages
        ),
        wrong=wrong_elements(transport, engine),
        wall_s=wall_s,
        workload=workload,
        topology=topo.label(),
        npus=topo.npus,
        decision_s=decision_s,
        network=network,
        links=links,
        beyond_physics=beyond_physics(engine.records, topo, transport.cost, span_us, links),
        scheduler=default_scheduler(transport.config),
        partition_mib=spec.partition_mib,
    )


def run_training(
    transport: Transport,
    workload: Workload,
    policy: PolicyLike,
    spec: TrainingSpec,
    progress: Progress | None = None,
) -> TrainingResult:
    """Training iterations of a workload; every collective on real data (and checked) in MPI.

    The transport's topology must fit the workload (see `workloads.text.Workload.fit_topology`).
    What times it is the planner's choice (`timing.planner.plan`); this runs the loop on every
    NPU that choice runs (`training_on`). `progress` is told the layer steps of every NPU run.
    """
    topo, config = transport.topology, transport.config
    if spec.heterogeneous and config.compat:
        raise UsageError(
            f"--compat {config.compat} has identical NPUs: drop --npu-compute-scale, --compute-jitter"
        )
    check_ranks(topo, config, [r for r, _ in spec.npu_compute_scale])
    timing = plan(Run(topo, config, TRAINING, slow_compute=spec.heterogeneous))
    collectives = distinct_collectives(workload, topo, spec)
    oracle = training_oracle(topo, config, workload, spec) if transport.rank == 0 else None
    schedules, decision_s = share_schedules(transport, policy, collectives, evaluate=oracle)
    by_collective = dict(zip(collectives, schedules))
    order = _start_order(workload, topo, spec, config, by_collective) if timing.agreed else None

    def body(npu: Transport) -> TrainingResult:
        return training_on(
            npu, workload, policy, spec, by_collective, order, decision_s, timing.every_npu, progress
        )

    kinds = None if spec.compute_jitter else dict(spec.npu_compute_scale)  # (jitter: each NPU its own)
    row = run_on(timing, transport, body, kinds=kinds)
    return replace(row, transport=transport.name) if timing.simulator == WORLD else row


def training_on(
    npu: Transport,
    workload: Workload,
    policy: PolicyLike,
    spec: TrainingSpec,
    schedules: dict[Collective, Schedule],
    order: list | None,
    decision_s: float,
    spans: bool,
    progress: Progress | None = None,
) -> TrainingResult:
    """The training loop on one NPU's engine (or every NPU's, vectorised): its row.

    With `spans` the run spans every NPU: it ends with the last NPU's last event, and the rest is
    NPU 0's.
    """
    topo, config = npu.topology, npu.config
    engine = Engine(topo, npu, config)
    tick_ns = loop_tick_ns(config.compat)
    loop = TrainingLoop(workload, topo, spec, schedules, tick_ns, rank=npu.ranks, progress=progress)
    if order is not None:
        engine.agree(order)

    def begin():
        engine.now_ns = npu.issue_ns  # a late NPU starts then
        return engine.process(loop.process(engine))

    _, wall_s = execute(npu, engine, "training", begin)
    total_ns = engine.now_ns
    slowest_ns = float(npu.reduce([float(np.max(loop.compute_ns))], "max", "the slowest NPU's compute")[0])
    if spans:
        _, total_ns = npu.span_ns(engine)
        loop.iteration_starts[-1] = npu0(loop.iteration_starts[-1])
        loop.compute_ns = npu0(loop.compute_ns)
    return _training_result(
        npu,
        engine,
        policy,
        spec,
        wall_s,
        iterations=spec.iterations,
        total_ns=total_ns,
        last_iteration_ns=total_ns - loop.iteration_starts[-1],
        compute_ns=loop.compute_ns,
        max_compute_ns=slowest_ns,
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
    progress: Progress | None = None,
) -> TrainingResult:
    """A Chakra execution graph once; every collective and message on real data in MPI.

    `ranks` whose graphs give the distinct collectives: all of them by default where each rank
    runs its own graph (MPI, every NPU's links), rank 0 on the model. ``iterations`` and the
    per-iteration times come from the graph's ``themis_iterations`` metadata (1 unless it was
    converted from a text workload). What times it is the planner's choice (`graph_on` runs it
    on each NPU; the linked ranks of per-rank graphs with messages run in `run.linked`). `progress`
    is told the graph nodes each NPU has finished.
    """
    topo, config = transport.topology, transport.config
    if graph_stragglers(topo, config, spec):
        check_ranks(topo, config, [r for r, _ in spec.npu_compute_scale])
    mine = plan_graph(graph.trace(transport.rank), topo, transport.rank, spec, graph.groups)
    plans = {transport.rank: mine}
    timing = plan(graph_run(topo, config, graph, mine, spec))
    here = graph_ranks(timing, transport)
    stages = [transport.rank]  # rank 0 and the ranks it exchanges messages with: the pipeline's stages
    if mine.messages and not graph.symmetric:
        stages = linked_ranks(plans, lambda r: plan_graph(graph.trace(r), topo, r, spec, graph.groups))
    stage_ns = [plans[r].compute_ns for r in stages]
    if here is None:  # the linked ranks, on the model
        if spec.partition_mib:
            raise UsageError(
                "--partition-mib is not supported for per-rank Chakra traces with messages on the model"
            )
        ranks = stages
    elif ranks is None or timing.simulator == WORLD:
        ranks = here
    kinds = graph_kinds(graph, bool(mine.messages), spec)
    firsts: dict[int, int] = {}  # (every NPU in this process: a kind's ranks run its first rank's plan)
    if kinds is not None and timing.simulator in (WORLD, GREENLETS):  # (every NPU in this process)
        ranks = sorted({repr(kind): r for r, kind in sorted(kinds.items(), reverse=True)}.values()) or [0]
        firsts = {} if graph.groups else kind_firsts(kinds, topo.npus)  # (a group's dims: each rank's own)
    collectives = graph_collectives(graph, topo, spec, ranks)
    schedules = dict(zip(collectives, share_orders(transport, policy, collectives)))
    t0 = time.perf_counter()
    stragglers = timing.run.stragglers
    row = run_on(
        timing,
        transport,
        lambda npu: graph_on(npu, graph, policy, spec, schedules, progress, stage_ns, stragglers, firsts),
        keep_starts=True,
        kinds=kinds,
        on_model=lambda: _linked(transport, graph, policy, spec, plans, schedules, progress, stage_ns),
        deadlock="the graph deadlocks on every NPU's links",
    )
    if timing.simulator == WORLD:
        return replace(row, transport=transport.name, wall_s=time.perf_counter() - t0)
    return row


def graph_stragglers(topology: Topology, config: RunConfig, spec: TrainingSpec) -> bool:
    """Whether a graph runs with stragglers (refused in one line, before any graph is planned).

    No rule but the sharing ones takes them (`timing.planner.plan`: ``ideal``, the compat modes).
    """
    if not (config.asymmetric or spec.heterogeneous):
        return False
    plan(Run(topology, config, GRAPH, slow_compute=spec.heterogeneous))
    return True


def graph_run(
    topology: Topology, config: RunConfig, graph: Graph, mine: GraphPlan, spec: TrainingSpec
) -> Run:
    """A graph's run as the planner sees it: its messages, per-rank files and stragglers."""
    return Run(
        topology,
        config,
        GRAPH,
        messages=bool(mine.messages),
        per_rank=not graph.symmetric,
        slow_compute=spec.heterogeneous,
    )


def graph_kinds(graph: Graph, messages: bool, spec: TrainingSpec | None = None) -> dict[int, Any] | None:
    """What sets ranks' graphs apart, by rank, for classes (`timing.planner.run_on`), or None.

    One graph for every rank without messages: nothing ({}); generated per-rank graphs say it
    (``traces.kind``: ranks of one kind run one graph, their peers at the same rank offsets);
    other per-rank graphs (files) and a shared graph with messages (absolute peers): None.
    A slow NPU (`spec`'s ``npu_compute_scale``) runs its graph at its own pace: its kind is
    its graph's and its factor, a kind of its own beside its graph's other ranks; jitter gives
    every NPU its own pace (None: every NPU runs), as it does for text workloads.
    """
    if spec is not None and spec.compute_jitter:
        return None
    if graph.symmetric:
        kinds: dict[int, Any] | None = None if messages else {}
    else:
        kind = getattr(graph.traces, "kind", None)
        kinds = None if kind is None else {r: kind(r) for r in range(len(graph.traces))}
    if kinds is None or spec is None:
        return kinds
    return kinds | {r: (kinds.get(r), f) for r, f in spec.npu_compute_scale if f != 1}


def kind_firsts(kinds: Mapping[int, Any], npus: int) -> dict[int, int]:
    """Each rank's kind's first rank (`graph_kinds`; a rank it does not name is of kind None).

    A kind's ranks run its first rank's graph and plan, their peers moved (`chakra.Plan.shifted`):
    every NPU's links then hold one graph and one plan per kind, not one per NPU.
    """
    firsts: dict[str, int] = {}
    return {r: firsts.setdefault(repr(kinds.get(r)), r) for r in range(npus)}


def graph_on(
    npu: Transport,
    graph: Graph,
    policy: PolicyLike,
    spec: TrainingSpec,
    schedules: dict[Collective, Schedule],
    progress: Progress | None = None,
    stage_compute_ns: Sequence[float] = (),
    stragglers: bool = False,
    firsts: Mapping[int, int] | None = None,
) -> TrainingResult:
    """The graph of NPU `npu.rank` on its engine: its row (the iteration ends with the last rank).

    `stage_compute_ns`: each pipeline stage's compute (`run_graph`). With `stragglers` (NPUs at
    different paces) a late NPU starts its graph late, and a shared graph too ends with the last
    rank. `firsts`: the rank whose plan each rank runs, shifted to it (`kind_firsts`); a rank
    it does not name runs its own.
    """
    topo = npu.topology
    first = (firsts or {}).get(npu.rank, npu.rank)
    mine = plan_graph(graph.trace(first), topo, first, spec, graph.groups).shifted(npu.rank)
    engine = Engine(topo, npu, npu.config)
    replay = GraphReplay(mine, schedules, spec, topo, progress)

    def begin():
        engine.now_ns = npu.issue_ns  # a late NPU starts then
        return engine.process(replay.process(engine))

    _, wall_s = execute(npu, engine, "the graph replay", begin)
    total_ns, slowest_ns = engine.now_ns, mine.compute_ns
    if stragglers or not graph.symmetric:  # the iteration ends with the last rank
        total_ns, slowest_ns = map(float, npu.reduce([engine.now_ns, mine.compute_ns], "max"))
    return _graph_row(
        npu, engine, policy, spec, wall_s, graph, mine, replay, total_ns, stage_compute_ns, slowest_ns
    )


def _linked(
    transport: Transport,
    graph: Graph,
    policy: PolicyLike,
    spec: TrainingSpec,
    plans: dict[int, GraphPlan],
    schedules: dict[Collective, Schedule],
    progress: Progress | None = None,
    stage_compute_ns: Sequence[float] = (),
) -> TrainingResult:
    """Per-rank graphs with messages on the model: the linked ranks' engines in lock step (`run.linked`)."""
    t0 = time.perf_counter()
    engines = run_linked(transport.topology, transport.config, plans, schedules, progress)
    engine, wall_s = engines[0], time.perf_counter() - t0
    replay = GraphReplay(plans[0], schedules)
    replay.collectives_issued = len(engine.collectives)
    total_ns = max(e.now_ns for e in engines.values())
    slowest_ns = max(plans[r].compute_ns for r in engines)
    row = (wall_s, graph, plans[0], replay, total_ns, stage_compute_ns, slowest_ns)
    return _graph_row(transport, engine, policy, spec, *row)


def _graph_row(
    transport: Transport,
    engine: Engine,
    policy: PolicyLike,
    spec: TrainingSpec,
    wall_s: float,
    graph: Graph,
    mine: GraphPlan,
    replay: GraphReplay,
    total_ns: float,
    stage_compute_ns: Sequence[float],
    max_compute_ns: float,
) -> TrainingResult:
    """A graph replay's row (`stage_compute_ns`, `max_compute_ns`: as `TrainingResult.timed` takes them)."""
    return _training_result(
        transport,
        engine,
        policy,
        spec,
        wall_s,
        iterations=graph.iterations,
        last_iteration_ns=total_ns / graph.iterations,
        compute_ns=mine.compute_ns,
        max_compute_ns=max([max_compute_ns, *stage_compute_ns]),
        stage_compute_ns=list(stage_compute_ns) or None,
        collectives=replay.collectives_issued,
        workload=graph.source,
        total_ns=total_ns,
    )


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
