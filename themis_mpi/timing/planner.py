"""What times a run, chosen in one place: one NPU, every NPU (vectorised, in event order), every NPU's links.

The run layer, the coordinator's oracle, jobs, the ASTRA-sim runner and the CLI describe their run
(`Run`) and ask `plan`; nothing else looks at which transport or world it has. The choice:

- NPUs alike (collectives, training, symmetric graphs), any rule: one NPU's view (`symmetric`,
  `ONE_NPU`); on the emulator each rank's messages time it (``ideal``), or one NPU's view; a
  collective under a sharing rule takes the model's memoised run and moves its data as one
  program in the model's order (`Plan.programmed`, `mpi.program`).
- Stragglers (late NPUs, scaled links, slow compute) on ``ideal``: every NPU vectorised
  (`vectors`, `VECTORS`), or as greenlets where the order of events matters (a gated scheduler,
  the endpoint model: `greenlets`, `GREENLETS`); on the emulator each rank's messages.
- Stragglers (in collectives, training and graphs), point-to-point messages or per-rank graphs
  under a sharing rule, and ASTRA-sim 2.x's backend on an uneven dim (`routes.uneven_dims`, single
  collectives only): every NPU's links (`world`, `WORLD`; on the model, stragglers in collectives,
  training and graphs, and generated per-rank graphs with their messages (a slow NPU's kind its
  own: `run.training.graph_kinds`), run one NPU per class where classes are proven equal,
  under ``fair`` and under ``packet`` where every weight is 1: `classes`, `world.by_classes`);
  on the emulator each rank replays that run (`replay`).
- Per-rank graphs with messages on ``ideal``: the linked ranks' engines in lock step
  (`run.linked`, `LINKED`); on the emulator each rank's messages.
- Several jobs (`run.jobs`): one NPU per slice of NPUs the jobs share (`SLICES`).
- A dim's custom files whose NPUs' rounds differ, where its stages share links under a sharing
  rule (`algorithms.CustomStage.every_npu`): every NPU's links, each NPU by its own levels
  (`WORLD`); on the emulator each rank replays that run.
- A collective a custom algorithm runs (``--algorithm msccl:FILE``): every NPU's program on
  every NPU's links of its group, under any rule (`programs`, `CUSTOM`); the model and every
  emulator rank compute that one deterministic run (`run.custom`).

Runs that none of these times are refused here in one line (stragglers in jobs, or in graphs
under ``ideal`` or a compat; messages under a compat, training on an uneven 2.x dim). Under
stragglers every NPU starts a dim's stages in one agreed order, the order of the same run with
NPUs alike (`Plan.agreed`; a graph's NPUs start theirs as their graphs issue them, matched by
key on every NPU's links, as per-rank graphs do): that symmetric run costs one NPU's view, a
small part of the run of every NPU it orders (1.6 of 26.8 ms for a 1024-NPU all-reduce in 64
chunks with one late NPU, docs/performance.md), and it is what defines the order (the decisions
of a run without stragglers), so it is kept.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from ..algorithms import custom_stage
from ..collectives import Collective
from ..config import RunConfig
from ..cost import A2A, ASTRA_SIM_2, RS, steps
from ..engine import Transport
from ..errors import Stalled, UsageError
from ..model import ModelTransport
from ..policies import default_scheduler, make_scheduler, origin, scheduler_origin
from ..topology import Topology
from .greenlets import NpuWorld
from .routes import uneven_dims
from .rules import IDEAL, rule_class
from .symmetric import Symmetric, Timer, one_npu_exact
from .vectors import NpuVectors
from .world import World, by_classes, expected_npus, state_may_run

T = TypeVar("T")
COLLECTIVE, TRAINING, GRAPH, JOBS = "collective", "training", "graph", "jobs"
ONE_NPU = "one NPU"
VECTORS = "every NPU, vectorised"
GREENLETS = "every NPU, in event order"
WORLD = "every NPU's links"
LINKED = "the linked ranks"
SLICES = "one NPU per slice"
CUSTOM = "every NPU's program on every NPU's links"

SAY_ABOVE_S = 30.0  # a command whose run `estimate`s more than this says so before it starts
# CPU us per chunk step (`chunk_steps`) on the development machine (2 cores, Python 3.11), from
# scripts/bench_estimate.py (docs/performance.md, "What a run will cost"): one NPU's view per step
# of that NPU; every NPU vectorised per step (the numpy calls serve every NPU at once) plus a little
# per NPU and step; every NPU in event order per NPU and step; every NPU's links per NPU and step
# at 64 NPUs, growing as NPUs^0.35 (more flows share each link's rate: HGX-H100 cuts, whose outer
# dims share a NIC, 0.40 from 64 to 256 NPUs, 0.19 from 64 to the whole preset's 1024).
STEP_US = {ONE_NPU: 4.0, SLICES: 4.0, LINKED: 4.0, VECTORS: 22.0, GREENLETS: 12.0, WORLD: 10.0}
VECTORS_NPU_STEP_US = 0.002
WORLD_NPUS, WORLD_GROWTH = 64, 0.35  # WORLD's STEP_US is at this many NPUs; per NPU-step x (N/64)^0.35
# Peak memory (`expected_bytes`), from GPT-3 175B with NPU 5 at 1.5x under packet on every NPU's links
# (scripts/bench_npus.py --world, docs/performance.md "Every NPU's links, faster"): peak RSS 365 MiB
# on the 64-NPU HGX cut (9,556 nodes a rank), 2.4 GiB on the 1024-NPU preset (9,820) once every
# NPU has started; tracemalloc: about 220 B per node an NPU replays (its event, callback list and
# waiter, `chakra.GraphReplay`) and 1 kB per node of a graph built and planned (one per kind of
# rank, `run.training.kind_firsts`: its nodes, attributes and ops). The process itself, each
# simulated NPU's engine, greenlet and links, each node it replays, each node of a built graph:
BASE_BYTES = 150 * 2**20
NPU_BYTES = 200 * 2**10
NODE_NPU_BYTES = 250
GRAPH_NODE_BYTES = 1000


@dataclass(frozen=True)
class Run:
    """A run as far as its timing cares.

    Attributes:
        topology: the network.
        config: the run settings (rule, compat, stragglers: late NPUs and scaled links).
        kind: collective(s), training (a text workload), graph (Chakra) or jobs.
        messages: it sends point-to-point messages.
        per_rank: NPUs run different programs (one graph per rank).
        slow_compute: NPUs compute at different paces (``--npu-compute-scale``, jitter).
        custom: a custom algorithm runs the collective (`msccl.custom.choose`).
    """

    topology: Topology
    config: RunConfig
    kind: str = COLLECTIVE
    messages: bool = False
    per_rank: bool = False
    slow_compute: bool = False
    custom: bool = False

    @property
    def stragglers(self) -> bool:
        """Whether NPUs run at different paces."""
        return self.config.asymmetric or self.slow_compute

    def to_dict(self) -> dict:
        """Plain values for JSON (the topology by its label)."""
        return dict(asdict(self), topology=self.topology.label(), config=repr(self.config))


@dataclass(frozen=True)
class Plan:
    """What times a run (module doc).

    Attributes:
        run: the run.
        simulator: `ONE_NPU`, `VECTORS`, `GREENLETS`, `WORLD`, `LINKED`, `SLICES` or `CUSTOM`.
        rule: the sharing rule's name.
    """

    run: Run
    simulator: str
    rule: str

    @property
    def every_npu(self) -> bool:
        """Whether its times span every NPU (the first issue, the last end), each NPU's own."""
        return self.simulator not in (ONE_NPU, SLICES)

    @property
    def agreed(self) -> bool:
        """Whether each dim starts its stages in one agreed order (NPUs at different paces; not graphs)."""
        return self.run.stragglers and self.run.kind != GRAPH

    @property
    def programmed(self) -> bool:
        """Whether the emulator may move the data as one program in the model's order (`mpi.program`).

        A collective with NPUs alike under a sharing rule, with the built-in policies: every
        rank's timer is then the same one NPU's view, so every rank starts the same stages in
        the same order at the same times, those of the model's run (which the driver memoises;
        a plugin's answers may change from call to call, so plugins take the general path).
        """
        run, config = self.run, self.run.config
        return (
            self.simulator == ONE_NPU
            and run.kind == COLLECTIVE
            and not (run.custom or run.stragglers or run.messages or run.per_rank or run.topology.flat)
            and not any(d.custom for d in run.topology.dims)  # (a dim's msccl stages: the engine's path)
            and rule_class(self.rule).routes
            and scheduler_origin(default_scheduler(config)) == "builtin"
            and origin(config.intra) == "builtin"
        )

    def describe(self) -> str:
        """In a few words, e.g. ``every NPU's links under --network fair``."""
        return f"{self.simulator} under --network {self.rule}"

    def to_dict(self) -> dict:
        """Plain values for JSON."""
        return {"run": self.run.to_dict(), "simulator": self.simulator, "rule": self.rule}


def vectorisable(config: RunConfig) -> bool:
    """Whether every NPU can run vectorised: not while the order of events matters.

    A gated communication scheduler starts a stage by what runs at that instant, and compute
    that shares the memory (`cost.Endpoint`) slows by what overlaps it: both need event order.
    """
    return not make_scheduler(default_scheduler(config)).gated and not config.endpoint.on


def plan(run: Run) -> Plan:
    """What times the run; a run nothing here times is refused in one line."""
    config, rule = run.config, run.config.network
    shares = rule_class(rule).routes
    if run.custom or (run.kind != COLLECTIVE and any(d.custom for d in run.topology.dims)):
        if run.kind != COLLECTIVE or run.stragglers or config.compat:
            raise UsageError(
                "custom algorithms (--algorithm msccl:FILE) run single collectives (model, run) "
                "with NPUs alike and no --compat"
            )
        return Plan(run, CUSTOM, rule)
    stages = [custom_stage(dim) for dim in run.topology.dims]  # (a dim's custom files, while held)
    if any(stage is not None and stage.every_npu for stage in stages):
        return Plan(run, WORLD, rule)
    if run.kind == JOBS and run.stragglers:
        raise UsageError("stragglers do not run with several jobs (--job) yet")
    if run.kind == GRAPH and run.stragglers and not (shares and not config.compat):
        raise UsageError(
            "stragglers in graphs run under a sharing rule (packet, fair, store-forward): "
            + (f"drop --compat {config.compat}" if config.compat else f"drop --network {rule}")
        )
    if run.kind == GRAPH and config.compat:
        if run.messages:
            raise UsageError("point-to-point messages are not supported with --compat")
        if run.per_rank and rule != IDEAL:
            raise UsageError(
                f"per-rank Chakra traces under --compat {config.compat} --network {rule} "
                "are not supported; use --network ideal"
            )
    if not one_npu_exact(run.topology, config):
        if run.kind != COLLECTIVE:
            raise UsageError(
                f"--compat {ASTRA_SIM_2} --network {rule} with halving-doubling on Ring dim "
                f"{uneven_dims(run.topology)[0]} runs every NPU, for single collectives (model, run) only; "
                "use --network ideal or another algorithm"
            )
        return Plan(run, WORLD, rule)
    if shares and not config.compat and (run.stragglers or run.messages or run.per_rank):
        return Plan(run, WORLD, rule)
    if run.stragglers:
        slow = run.kind == TRAINING and not vectorisable(config)
        return Plan(run, GREENLETS if slow else VECTORS, rule)
    if run.kind == GRAPH and run.per_rank and run.messages:
        return Plan(run, LINKED, rule)
    return Plan(run, SLICES if run.kind == JOBS else ONE_NPU, rule)


def emulator_timer(topology: Topology, config: RunConfig) -> Timer | None:
    """What times the emulator's stages where its messages do not: one NPU's view of a sharing rule.

    A dim's custom stages (``msccl:FILE`` on a dim) are timed by that view under every rule.

    None under ``ideal`` (the send times travel with the data), and where one NPU's view is not
    exact (the driver then replays a run of every NPU: `run_on`).
    """
    custom = any(d.custom for d in topology.dims)  # (a dim's custom stages: their time is the view's)
    if not (rule_class(config.network).routes or custom) or not one_npu_exact(topology, config):
        return None
    return Symmetric(topology, config, config.costs(topology))


def run_on(
    plan: Plan,
    transport: Transport,
    body: Callable[[Transport], T],
    keep_starts: bool = False,
    on_model: Callable[[], T] | None = None,
    deadlock: str = "",
    kinds: Mapping[int, Any] | None = None,
) -> T:
    """`body` on what times the run, for this transport: its return on this NPU (NPU 0 on the model).

    One NPU's view runs `body` on the transport itself, as does the emulator wherever its ranks
    time themselves. Every NPU on the model runs it on each NPU (vectorised, as greenlets, or on
    every NPU's links) and returns NPU 0's. Under ``mpiexec`` on every NPU's links, every rank
    runs that whole simulation (deterministic, on the same inputs) and then `body` on its
    transport's twin timed by its own rank's ends (`Transport.replaying`), while the data moves.

    Args:
        plan: the run's plan.
        transport: this process's (the model's, or an MPI rank's).
        body: the per-NPU run, on the transport it is given.
        keep_starts: on the model, keep every NPU's stage starts on its links (to say why they
            deadlock; the emulator's replay keeps them anyway); a run by classes that stalls
            runs again so.
        on_model: the model's own run where its one process stands for NPUs that differ: the
            linked ranks (`LINKED`), the slices of several jobs (`SLICES`).
        deadlock: NPUs of every NPU's links that wait for each other are a user's mistake,
            said in one line that starts with this (else the world's `errors.Stalled`).
        kinds: on the model on every NPU's links, what sets NPUs' programs apart (e.g. their
            compute factors, their graphs), by rank; ranks of one kind run one program, its
            messages' peers at the same rank offsets: one NPU per class runs where classes
            apply (`world.by_classes`); None: NPUs cannot be told apart so, every NPU runs.
    """
    model = isinstance(transport, ModelTransport)
    topology, config = transport.topology, transport.config
    if plan.simulator == WORLD:
        try:
            results = None
            if model and kinds is not None:  # (one NPU per class, where they apply)
                try:
                    results = by_classes(topology, config, kinds, body, keep=[transport.rank])
                except Stalled:  # (every NPU's run below says why, with its starts kept)
                    results = None
            if results is None:
                world = World(topology, config, replayable=keep_starts or not model, keep=[transport.rank])
                results = world.run(body)
        except Stalled as exc:  # (a receive nobody sends, or a group whose NPUs issue different stages)
            if not deadlock:
                raise
            raise UsageError(f"{deadlock}: {exc}") from None
        return results[0] if model else body(transport.replaying(world.replay(transport.rank)))
    if not model or plan.simulator == ONE_NPU:
        return body(transport)
    if plan.simulator == VECTORS:
        return body(NpuVectors(topology, config))
    if plan.simulator == GREENLETS:
        return NpuWorld(topology, config, keep=[transport.rank]).run(body)[0]  # (NPU 0's records only)
    assert on_model is not None, f"{plan.simulator} on the model needs its runner"
    return on_model()


def each_npu(plan: Plan, config: RunConfig, body: Callable[[Transport], T]) -> list[T]:
    """`body` on the model, every NPU's return where every NPU runs (one NPU's view: its one)."""
    topology = plan.run.topology
    if plan.simulator == WORLD:
        return World(topology, config, replayable=False).run(body)
    if plan.simulator == ONE_NPU:
        return [body(ModelTransport(topology, config))]
    raise UsageError(f"{plan.describe()} does not run for every NPU here")


def graph_ranks(plan: Plan, transport: Transport) -> Sequence[int] | None:
    """The ranks whose graphs a run's schedules must cover: every rank where each runs its own, else rank 0.

    Every NPU in event order (`GREENLETS`) runs each rank's graph where a caller forces it (a
    test comparing the linked ranks with every NPU: the planner picks it for training only).

    None for the linked ranks on the model (`LINKED`): rank 0 and every rank it exchanges
    messages with, which the caller follows (`run.linked.linked_ranks`).
    """
    model = isinstance(transport, ModelTransport)
    if plan.simulator in (WORLD, GREENLETS) or not model:
        return range(plan.run.topology.npus)
    return None if plan.simulator == LINKED else [0]


def chunk_steps(topology: Topology, collectives: Iterable[Collective]) -> int:
    """The algorithm steps one NPU runs for these collectives (each as issued): chunks x dim stages x steps.

    An all-reduce visits each of its dims twice (reduce-scatter, all-gather), an all-to-all
    takes one step per dim; a stage's steps are its dim algorithm's (`cost.steps`).
    """
    per_dim = [len(steps(dim, RS, dim.npus, 1)) for dim in topology.dims]
    total = 0
    for coll in collectives:
        visits = 2 if coll.op == "all_reduce" else 1
        total += coll.n_chunks * visits * sum(1 if coll.op == A2A else per_dim[d] for d in coll.dims)
    return total


def estimate(plan: Plan, steps_per_npu: int, slow_npus: Sequence[int] = ()) -> tuple[float, str]:
    """A cheap prediction of a run's wall seconds, and its reason in a few words.

    From what the planner chose: one NPU's view (and the linked ranks, the slices of jobs) costs
    per chunk step of that NPU; every NPU costs per NPU and step (vectorised: mostly per step,
    the numpy calls serve every NPU at once; on every NPU's links a little more per step the more
    NPUs share the links, and only the NPUs its classes simulate where they apply,
    `world.expected_npus`: a slow NPU each its own kind, graphs and messages every NPU). The
    constants (`STEP_US`) are CPU seconds of this machine, measured
    by a benchmark; a faster every-NPU simulator only moves them. Stragglers add the agreed
    order's one-NPU run. The themis policy's oracle runs and the run's start are not counted.

    Args:
        plan: the run's plan.
        steps_per_npu: the chunk steps one NPU runs over the whole run (`chunk_steps` of every
            collective it issues, each time it issues it).
        slow_npus: NPUs that compute slower (named in the reason).

    Returns:
        (seconds, reason); the reason e.g. ``every NPU's links under fair (NPU 5 computes slower,
        1024 NPUs x 4,480 chunk steps)``.
    """
    run, npus = plan.run, plan.run.topology.npus
    one_us = steps_per_npu * STEP_US[ONE_NPU]
    simulated = simulated_npus(plan, slow_npus) if plan.every_npu else npus
    if plan.simulator == VECTORS:
        cost_us = steps_per_npu * (STEP_US[VECTORS] + npus * VECTORS_NPU_STEP_US)
    elif plan.simulator == WORLD:
        cost_us = steps_per_npu * simulated * STEP_US[WORLD] * (simulated / WORLD_NPUS) ** WORLD_GROWTH
    elif plan.simulator == GREENLETS:
        cost_us = steps_per_npu * npus * STEP_US[GREENLETS]
    else:
        cost_us = steps_per_npu * STEP_US[plan.simulator]
    cost_us += one_us if plan.agreed else 0.0
    causes = [f"NPU {r} computes slower" for r in slow_npus][:2]
    causes += [f"NPU {r} starts late" for r, _ in run.config.npu_delay_ns][:2]
    causes += [f"link {d}:{r} is scaled" for d, r, _ in run.config.link_scale][:2]
    causes += ["NPUs run their own graphs"] * run.per_rank + ["point-to-point messages"] * run.messages
    if not one_npu_exact(run.topology, run.config):
        causes.append(f"uneven dim {uneven_dims(run.topology)[0]} under --compat {ASTRA_SIM_2}")
    size = (
        f"{npus} NPUs x {steps_per_npu:,} chunk steps" if plan.every_npu else f"{steps_per_npu:,} chunk steps"
    )
    if simulated < npus:
        size = f"{npus} NPUs as {simulated} classes x {steps_per_npu:,} chunk steps"
    elif plan.simulator == WORLD and state_may_run(run.config, run.per_rank or run.messages):
        size += ", at most: classes by state may run fewer NPUs"
    return cost_us / 1e6, f"{plan.simulator} under {plan.rule} ({', '.join([*causes, size])})"


def simulated_npus(plan: Plan, slow_npus: Sequence[int] = ()) -> int:
    """The NPUs a run simulates: one NPU's view one; every NPU's links its expected classes.

    Those of `world.expected_npus`, a slow NPU each its own kind; graphs with messages and
    per-rank graphs, and the other simulators of every NPU, every NPU.
    """
    run, npus = plan.run, plan.run.topology.npus
    if plan.simulator == WORLD and not (run.per_rank or run.messages):
        return expected_npus(run.topology, run.config, {r: r for r in slow_npus})
    return npus if plan.every_npu else 1


def expected_bytes(
    plan: Plan, nodes_per_npu: int = 0, graph_nodes: int = 0, slow_npus: Sequence[int] = ()
) -> float:
    """A cheap prediction of a run's peak memory in bytes (the constants by `BASE_BYTES`).

    Args:
        plan: the run's plan.
        nodes_per_npu: the graph nodes one NPU replays (0: a text workload).
        graph_nodes: the nodes of the graphs built and planned (one per kind of rank where kinds
            share them, `run.training.kind_firsts`).
        slow_npus: NPUs that compute slower (each its own class).
    """
    per_npu = NPU_BYTES + nodes_per_npu * NODE_NPU_BYTES
    return BASE_BYTES + simulated_npus(plan, slow_npus) * per_npu + graph_nodes * GRAPH_NODE_BYTES


def machine_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(expected: float, reason: str) -> None:
    """Refuse, before it starts, a run expected to need more memory than the machine has, in one line."""
    have = machine_bytes()
    if expected > have:
        raise UsageError(
            f"this run is expected to need ~{expected / 1e9:.2g} GB ({reason}) but this machine has "
            f"{have / 1e9:.3g} GB: a smaller shape, fewer chunks, no straggler, or --network ideal"
        )
