"""An LLM's training iteration priced on the model: `workload gpt --run`'s rows, for the CLI and the API.

`price_all` runs the generated iteration with each parallelism's collectives left out in turn
(and on a free network) and splits the iteration into compute, the pipeline bubble (the
schedule's ideal part and stage imbalance) and what each parallelism's communication costs;
`price_cell` is one cell of a sweep of it (`gpt_cells`), `PricedResult` its row. The activations
in flight per stage follow Korthikanti et al. (MLSys 2023). The printing is the CLI's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

from ..config import RunConfig
from ..model import ModelTransport
from ..policies import InterPolicy
from ..progress import Progress, Runs
from ..results import TrainingResult
from ..topology import Topology
from ..workloads.chakra import Graph
from ..workloads.llm import Layout, LazyTraces, LlmConfig, fit_groups, in_flight, stage_order
from ..workloads.training import TrainingSpec
from .sweep import TrainingCell, training_cells
from .training import run_graph

DEFAULT_CHUNKS = 4  # `workload gpt --run`'s -c and `api.price_gpt`'s chunks, when no fit gives one


def layer_activation_bytes(c: LlmConfig) -> int:
    """Activations one layer keeps for one micro-batch's backward on one TP rank, in bytes.

    Korthikanti et al. (MLSys 2023), Table 2, 16-bit activations: ``S*b*H*(10 + 24/t + 5*a*S/(H*t))``
    with tensor parallelism t and a heads; with full recompute only the layer's input, ``2*S*b*H``.
    """
    sbh = c.seq * c.micro_batch * c.hidden
    if c.recompute:
        return 2 * sbh
    return round(sbh * (10 + 24 / c.tp + 5 * c.heads * c.seq / (c.hidden * c.tp)))


def stage_activation_bytes(c: LlmConfig) -> list[int]:
    """Activations in flight per pipeline stage: the most micro-batches it holds x its layers x a layer's.

    A stage holds the forwards it has not yet run backward (`in_flight`: ``min(p - s, m)`` under
    1F1B, m under GPipe), each of ``L / (p*V)`` layers (one virtual stage).
    """
    per_unit = c.layers_per_stage * layer_activation_bytes(c)
    return [n * per_unit for n in stage_flight(c)]


def stage_flight(c: LlmConfig) -> list[int]:
    """The most micro-batches (virtual-stage forwards) each pipeline stage holds at once (`in_flight`)."""
    return [in_flight(stage_order(c.schedule, c.pp, s, c.micro_batches, c.chunks)) for s in range(c.pp)]


def price(c: LlmConfig, layout: Layout, policy: str, config: RunConfig, spec: TrainingSpec) -> dict:
    """One iteration on the model, and what each parallelism's communication and the bubble cost it."""
    return price_all(c, layout, [(policy, config)], spec)[policy]


def price_all(
    c: LlmConfig,
    layout: Layout,
    policies: list[tuple[str, RunConfig]],
    spec: TrainingSpec,
    progress: Progress | None = None,
) -> dict[str, dict]:
    """`price` under each (policy, config); the runs without collectives are run once for all.

    Per policy: the iteration, and X = iteration - the iteration with X's collectives left out,
    for TP, DP and EP (0 without run where the model has none of X's collectives). Shared: PP =
    the iteration with every collective left out - the same on a free network (1 PB/s, no
    latency), and the bubble = that free iteration - the compute (rank 0's, the first stage's).
    No policy schedules anything in those two runs (they hold no collective), so they are run
    once, under the first policy. `progress` is told the graph nodes done over every run.

    The iteration splits into parts that add up (docs/workloads.md, "LLM training"): compute +
    the schedule's ideal bubble ``(p-1)/(m*V)`` x compute + stage imbalance (the rest of the
    bubble) + exposed communication (the iteration - the free one). Each row also lists the compute
    per pipeline stage (`stage_compute_us`) and the activations in flight per stage
    (`stage_activation_bytes`).

    Stragglers (`spec`'s slow NPUs and jitter, each config's late NPUs and scaled links) run in
    every one of these runs, the free one too: each part is then what it costs this straggling
    iteration (compute is rank 0's; a slower stage's extra time falls in the imbalance). Under
    ``--network ideal`` they are refused in one line (`timing.planner.plan`).
    """
    return _priced(c, layout, policies, spec, progress)[0]


def present_collectives(c: LlmConfig, layout: Layout) -> dict[str, bool]:
    """Which of TP, DP and EP have collectives in this layout (each such is left out in a run)."""
    return {"TP": bool(layout.tp), "DP": bool(layout.dp or layout.edp), "EP": c.moe and bool(layout.ep)}


def price_runs(c: LlmConfig, layout: Layout, policies: int) -> int:
    """How many iterations `price_all` runs for that many policies.

    Two shared (collectives left out, on the topology and on a free network), then per policy
    the full iteration and one per parallelism with collectives.
    """
    return 2 + policies * (1 + sum(present_collectives(c, layout).values()))


def _priced(
    c: LlmConfig,
    layout: Layout,
    policies: list[tuple[str, RunConfig]],
    spec: TrainingSpec,
    progress: Progress | None,
) -> tuple[dict[str, dict], dict[str, TrainingResult]]:
    """`price_all`'s rows, and each policy's full iteration as a training row."""
    present = present_collectives(c, layout)
    runs = Runs(progress, price_runs(c, layout, len(policies)))

    def run(policy: str, config: RunConfig, drop: frozenset[str], topo: Topology) -> TrainingResult:
        graph = Graph(f"<gpt {policy}>", LazyTraces(c, layout, drop))  # type: ignore[arg-type]
        return run_graph(ModelTransport(topo, config), graph, policy, spec, None, runs.next())

    topo = layout.topology
    free = topo.free()
    colls = frozenset(("TP", "DP", "EP"))
    first, first_config = policies[0]
    messages = run(first, first_config, colls, topo).iteration_us
    idle_row = run(first, first_config, colls, free)
    idle, compute = idle_row.iteration_us, idle_row.compute_us
    ideal_bubble = (c.pp - 1) / (c.micro_batches * c.chunks) * compute
    out, fulls = {}, {}
    for policy, config in policies:
        fulls[policy] = run(policy, config, frozenset(), topo)
        full = fulls[policy].iteration_us
        row: dict = {"iteration_us": full, "compute_us": compute, "exposed_us": full - idle}
        for k in ("TP", "DP", "EP"):
            row[k] = full - run(policy, config, frozenset((k,)), topo).iteration_us if present[k] else 0.0
        row["PP"] = messages - idle
        row["bubble_us"] = idle - compute
        row["ideal_bubble_us"] = ideal_bubble
        row["imbalance_us"] = idle - compute - ideal_bubble
        row["stage_compute_us"] = idle_row.stage_compute_us
        row["stage_activation_bytes"] = stage_activation_bytes(c)
        out[policy] = row
    return out, fulls


@dataclass(frozen=True)
class PricedResult(TrainingResult):
    """A `workload gpt --run` row: the full iteration's training row and `price_all`'s split of it.

    `exposed_us` is the iteration minus the free one (`price_all`); TP, PP, DP and EP the time
    each parallelism's communication costs; the bubble split into the schedule's ideal part and
    stage imbalance; the activations in flight per pipeline stage.
    """

    exposed_us: float = 0.0
    TP: float = 0.0
    PP: float = 0.0
    DP: float = 0.0
    EP: float = 0.0
    bubble_us: float = 0.0
    ideal_bubble_us: float = 0.0
    imbalance_us: float = 0.0
    stage_activation_bytes: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Plain values, the activations per stage spread as ``stageK_activation_bytes`` (a flat row)."""
        out = asdict(self)
        for s, b in enumerate(out.pop("stage_activation_bytes")):
            out[f"stage{s}_activation_bytes"] = b
        return out


def price_cell(
    c: LlmConfig,
    layouts: dict[Topology, Layout],
    transport: ModelTransport,
    policy: InterPolicy,
    spec: TrainingSpec,
    progress: Progress | None = None,
) -> PricedResult:
    """One cell of `workload gpt --run`'s sweep (`functools.partial` of it is the sweep's `run`).

    `layouts` holds each fitted topology's layout; the cell's policy and settings are the
    transport's. The policy is named, so each of `price_all`'s runs starts it afresh, as before.
    """
    rows, fulls = _priced(c, layouts[transport.topology], [(policy.name, transport.config)], spec, progress)
    row, full = rows[policy.name], fulls[policy.name]
    return PricedResult(
        **{f.name: getattr(full, f.name) for f in fields(TrainingResult)},
        **{k: row[k] for k in ("exposed_us", "TP", "PP", "DP", "EP", "bubble_us", "ideal_bubble_us")},
        imbalance_us=row["imbalance_us"],
        stage_activation_bytes=row["stage_activation_bytes"],
    )


def gpt_cells(
    c: LlmConfig,
    topologies: Sequence[Topology],
    chunks: Sequence[int],
    policies: str | Sequence[str],
    bases: Sequence[RunConfig],
    spec: TrainingSpec,
) -> tuple[list[TrainingCell], dict[Topology, Layout]]:
    """`workload gpt --run`'s cells: topologies x chunks x policies x `bases` (one per --network rule).

    Each topology is fitted to the model's groups as given (`fit_groups`); the cells run on the
    fitted one, whose layout the returned mapping holds (`price_cell` takes it). Each policy runs
    with its own intra-dim policy.
    """
    layouts = {}
    pairs = []
    for given in topologies:
        layout = fit_groups(c, given)
        layouts[layout.topology] = layout
        pairs.append((given, layout.topology))
    return training_cells(pairs, chunks, policies, ["auto"], bases, spec), layouts
