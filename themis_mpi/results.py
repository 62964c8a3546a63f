"""What a run returns: result dataclasses and the figures computed from a finished run.

Bandwidths are in GB/s with 1 GB = 2^30 bytes. algbw is ``size / time``; busbw scales it by
nccl-tests' factor (``2 (N-1)/N`` for all-reduce, ``(N-1)/N`` otherwise) so that it compares with
the per-NPU link bandwidth. Utilization is ``ideal / actual`` (docs/design.md#metric); a dim's
utilization is its busy time over the collective time. Results are frozen: a run builds each one
whole.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .algorithms import custom_stage
from .cost import CostModel, link_bytes_per_ns
from .engine import CollectiveRun, MessageRun, StageRun
from .timing.links import physical_links
from .timing.routes import StepPlanner, step_planner
from .timing.rules import IDEAL
from .topology import Topology
from .units import BYTES_PER_GB


def busbw_factor(op: str, npus: int) -> float:
    """nccl-tests' bus-bandwidth factor for an op over npus NPUs."""
    if npus <= 1:
        return 0.0
    if op == "broadcast":  # every NPU but the root receives S: busbw = algbw
        return 1.0
    return 2.0 * (npus - 1) / npus if op == "all_reduce" else (npus - 1) / npus


ASTRA_WINDOW_NS = 10_000.0  # ASTRA-sim's report_percentage(10000): 10 us windows


@dataclass(frozen=True)
class DimResult:
    """One dim's share of a run on one NPU: busy time, bytes sent, stages served.

    `utilization` is busy time over the run's time; `astra_busy_pct` is ASTRA-sim's figure (a dim
    counts as busy while a stage is queued or running, averaged over complete 10 us windows; None
    when the run is shorter than one window), see `astra_busy_pct`.
    """

    dim: int
    busy_us: float
    bytes: int
    stages: int
    utilization: float
    astra_busy_pct: float | None = None

    def to_dict(self) -> dict:
        """Plain values for JSON."""
        return asdict(self)


@dataclass(frozen=True)
class LinkResult:
    """One physical link (or shared port direction) of one NPU over a run (`network`).

    `busy_pct` is the bytes it carried over what it could carry in the run's time: never above
    100 under a sharing rule. Results list their links under a sharing rule only; under
    ``ideal`` (no sharing) `link_results` of a run's records shows how much a schedule overdraws.
    """

    name: str
    bytes: float
    busy_pct: float

    def to_dict(self) -> dict:
        """Plain values for JSON."""
        return asdict(self)


@dataclass(frozen=True)
class CollectiveResult:
    """One collective's outcome, the same on every rank (a row of `run` and `model`).

    Times are virtual microseconds except `wall_s` (the slowest rank's wall seconds); under the
    wall clock `time_us` is the measured wall time divided by the time scale and `virtual_us`
    keeps the virtual one. `wrong` is summed over ranks (None when not checked, and in the model).
    `dim_bound_us` is the per-dim bound of the schedule that ran, ``max_d(bytes_d / B_d)``;
    `schedule` names what the policy chose (e.g. ``themis-lat/scf/16`` under predictive) and
    `decision_s` is the coordinator's time to choose it. `chunks` is the chunk count that ran
    and `requested_chunks` the one asked for (``-c``; a policy that sizes chunks may differ).
    """

    op: str
    involved: list[int]
    issued_us: float
    size_bytes: int
    count: int
    dtype: str
    redop: str
    chunks: int
    time_us: float
    ideal_us: float
    algbw_gbps: float
    busbw_gbps: float
    utilization: float
    dims: list[DimResult]
    policy: str = ""
    intra: str = ""
    clock: str = "model"
    wrong: int | None = None
    wall_s: float = 0.0
    virtual_us: float | None = None
    topology: str = ""
    npus: int = 0
    iters: int = 1
    time_scale: float = 1.0
    dim_bound_us: float = 0.0
    schedule: str = ""
    decision_s: float = 0.0
    network: str = IDEAL
    links: list[LinkResult] = field(default_factory=list)
    requested_chunks: int = 0
    beyond_physics: bool = False

    def to_dict(self) -> dict:
        """Plain values for JSON (dims as a list of dicts)."""
        return asdict(self)


@dataclass(frozen=True)
class TrainingResult:
    """Training iterations of a workload under one policy (a row of `train`).

    Per iteration (docs/time-model.md#training-rows): `compute_us` is this NPU's (rank 0's)
    compute, `max_compute_us` the slowest NPU's, `stage_compute_us` each pipeline stage's (one
    entry without a pipeline). The iteration splits as ``compute_us + wait_us + exposed_comm_us``:
    `wait_us` (``max_compute_us - compute_us``) is the time this NPU waits for the slowest NPU's
    extra compute (a straggler, a heavier stage), `exposed_comm_us` the communication beyond it.
    """

    policy: str
    intra: str
    chunks: int
    transport: str
    iterations: int
    total_us: float
    iteration_us: float
    last_iteration_us: float
    compute_us: float
    exposed_comm_us: float
    collectives: int
    dims: list[DimResult]
    wrong: int | None = None
    wall_s: float = 0.0
    speedup: float | None = None
    workload: str = ""
    topology: str = ""
    npus: int = 0
    decision_s: float = 0.0
    network: str = IDEAL
    links: list[LinkResult] = field(default_factory=list)
    scheduler: str = "fifo"  # the communication scheduler between collectives (`policies.scheduler`)
    partition_mib: float = 0.0  # its partitions (0: whole tensors)
    beyond_physics: bool = False  # (`beyond_physics`)
    max_compute_us: float = 0.0  # the slowest NPU's compute per iteration
    wait_us: float = 0.0  # waited for the slowest NPU's extra compute: max_compute_us - compute_us
    stage_compute_us: list[float] = field(default_factory=list)  # per pipeline stage

    def to_dict(self) -> dict:
        """Plain values for JSON (dims as a list of dicts)."""
        return asdict(self)

    @classmethod
    def timed(
        cls,
        *,
        total_ns: float,
        iterations: int,
        last_iteration_ns: float,
        compute_ns: float,
        max_compute_ns: float | None = None,
        stage_compute_ns: Sequence[float] | None = None,
        **fields: Any,
    ) -> TrainingResult:
        """A row from its times in ns (totals over the iterations): per-iteration means in us.

        `max_compute_ns`: the slowest NPU's compute (None: this NPU's); `stage_compute_ns`: each
        pipeline stage's (None: this NPU's, one stage).
        """
        mean_ns = total_ns / iterations
        slowest_ns = max(compute_ns, compute_ns if max_compute_ns is None else max_compute_ns)
        stages = [compute_ns] if stage_compute_ns is None else list(stage_compute_ns)
        return checked(
            cls(
                iterations=iterations,
                total_us=total_ns / 1e3,
                iteration_us=mean_ns / 1e3,
                last_iteration_us=last_iteration_ns / 1e3,
                compute_us=compute_ns / iterations / 1e3,
                exposed_comm_us=max(0.0, mean_ns - slowest_ns / iterations) / 1e3,
                max_compute_us=slowest_ns / iterations / 1e3,
                wait_us=(slowest_ns - compute_ns) / iterations / 1e3,
                stage_compute_us=[float(ns) / iterations / 1e3 for ns in stages],
                **fields,
            )
        )


def dim_results(
    records: list[StageRun],
    topology: Topology,
    cost: Callable[[int], CostModel],
    time_us: float,
    span_ns: tuple[float, float] = (0.0, 0.0),
    links: Sequence[LinkResult] = (),
    messages: Sequence[MessageRun] = (),
) -> list[DimResult]:
    """Per dim: busy time, bytes and stages of the given stage runs, and busy share of time_us.

    `span_ns` (virtual start and end) gives ASTRA-sim's windowed busy share as well. With
    `links` (a sharing rule's run) a dim's utilization is its busiest link's, which stages that
    share the dim cannot push above 100 %; without, it is the stages' time on the dim. A dim's
    custom stages (``msccl:FILE``, while the run holds them: `algorithms.custom_stage`) count
    what their files' programs sent (`run.custom.DimStages.load`), not the built-in's. Either
    way it counts the point-to-point `messages` too (docs/time-model.md#dim-busy-share): the links
    carried them; without links a message adds its bytes' time at one link's rate on every dim
    it crosses, sends and receives apart, the busier direction counting (as the busiest link).
    """
    astra = astra_busy_pct(records, len(topology.dims), span_ns[1], start_ns=span_ns[0])
    names = [link.name for link in physical_links(topology)]
    out = []
    for d, mine in enumerate(runs_by_dim(records, len(topology.dims))):
        busy_us = sum([r.end_ns - r.start_ns for r in mine]) / 1e3
        if messages and not links:
            rate = link_bytes_per_ns(topology.dims[d])
            ways = [
                sum(m.nbytes for m in messages if m.send == send and any(x == d for x, _ in m.path))
                for send in (True, False)
            ]
            busy_us += max(ways) / rate / 1e3
        shapes = Counter([(r.stage.itemsize, r.stage.op, r.stage.full_elems) for r in mine])
        custom = custom_stage(topology.dims[d])  # (a dim's msccl:FILE: what its programs sent)
        sent = sum(
            (cost(size).stage_bytes(d, op, elems) if custom is None else custom.load(op, elems, size)[0]) * n
            for (size, op, elems), n in shapes.items()
        )
        utilization = busy_us / time_us if time_us > 0 else 0.0
        if links:
            prefix = f"dim{d}."
            utilization = max(
                (x.busy_pct / 100 for x, n in zip(links, names) if n.startswith(prefix)), default=0.0
            )
        out.append(DimResult(d, busy_us, int(sent), len(mine), utilization, finite_or_none(astra[d])))
    return out


def link_results(
    records: Sequence[StageRun],
    topology: Topology,
    cost: Callable[[int], CostModel],
    time_us: float,
    carried: Sequence[float] | None = None,
) -> list[LinkResult]:
    """Bytes every link of one NPU carried for the given stage runs, and its busy share of time_us.

    `carried`: the bytes themselves, where every NPU's links ran (`timing.world.World`: messages
    and the peers' transfers into this NPU's down-links included). A dim's custom stages put on
    its links what their files' programs put on NPU 0's (`run.custom.DimStages.load`).
    """
    links = physical_links(topology)
    if carried is not None:
        return _link_rows(links, list(carried), time_us)
    carried = [0.0] * len(links)
    planners: dict[int, StepPlanner] = {}  # by element size
    shapes = Counter(
        (r.stage.itemsize, r.stage.dim, r.stage.op, r.stage.full_elems)
        for r in records
        if not isinstance(r, MessageRun)
    )
    for (itemsize, dim, op, elems), n in shapes.items():
        custom = custom_stage(topology.dims[dim])
        if custom is not None:  # a dim's msccl:FILE: what its programs put on NPU 0's links
            index = {link.name: i for i, link in enumerate(links)}
            sent, on_links = custom.load(op, elems, itemsize)
            port = topology.port_of(dim)  # (its messages out and in through the port, as `routes`)
            ports = {} if port is None else {f"port{port}.out": sent, f"port{port}.in": sent}
            for name, nbytes in {**on_links, **ports}.items():
                carried[index[name]] += n * nbytes
            continue
        planner = planners.get(itemsize) or planners.setdefault(
            itemsize, step_planner(topology, cost(itemsize))
        )
        for step in planner.stage_steps(dim, op, elems):
            for link, share in step.usage:
                carried[link] += n * step.bytes * share
    return _link_rows(links, carried, time_us)


def _link_rows(links: Sequence, carried: Sequence[float], time_us: float) -> list[LinkResult]:
    span_ns = time_us * 1e3
    return [
        LinkResult(link.name, b, 100 * b / (link.bytes_per_ns * span_ns) if span_ns > 0 else 0.0)
        for link, b in zip(links, carried)
    ]


OVERDRAWN = 1 + 1e-9  # a link's bytes over what its rate carries in the row's time, beyond float rounding


def beyond_physics(
    records: Sequence[StageRun],
    topology: Topology,
    cost: Callable[[int], CostModel],
    time_us: float,
    links: Sequence[LinkResult] = (),
) -> bool:
    """Whether a row's time is beyond physics: a link or shared port carried more than its rate allows.

    The test (docs/time-model.md#beyond-physics): some physical link or shared-port direction of
    one NPU (`link_results`: the bytes the row's stages put on it; `links` where a sharing rule
    counted them) carried more bytes than its rate carries in the row's time. A busbw above the
    links' rate is such a row. Under a sharing rule no row is (the rule never lets a link run
    above its rate); under ``ideal`` stages that run at once, or dims behind one port, overdraw.
    nccl dims are not: the NCCL-like model is fitted to measured times, not made of links.
    """
    if topology.flat:
        return False
    loads = links or link_results(records, topology, cost, time_us)
    return any(x.busy_pct > 100 * OVERDRAWN for x in loads)


class BeyondPhysics(RuntimeError):
    """A row a sharing rule made faster than its links allow: a bug of themis-mpi, never printed."""


def physics_violation(row: Any, unbound: bool | None = None) -> str | None:
    """What in a finished row beats physics, or None (the one check of every row, fresh or resumed).

    `row` is a result's fields (`vars`) or a row read back (`--resume`); `unbound`: its topology
    has nccl or ina dims (None: read from the row's topology label). A link or port above its
    rate is allowed only under ``ideal``, which shares nothing and says so (`beyond_physics`);
    otherwise a collective never ends before its bound (``ideal_us``: every link of every dim busy,
    on the model's or the virtual clock; nccl dims are fitted times and ina dims reduce in the
    switch, so ideal_us bounds neither), and an iteration never ends before the slowest NPU's
    compute (``max_compute_us``; ``compute_us`` in a row without it).
    """
    rule = row.get("network", IDEAL)
    if row.get("beyond_physics"):
        return None if rule == IDEAL else f"a link or port above its rate under --network {rule}"
    time_us, bound_us = row.get("time_us"), row.get("ideal_us")
    if unbound is None:  # a row read back: its topology's label (a file's name says nothing: no bound)
        label = str(row.get("topology", ""))
        unbound = ",nccl" in label or ",ina" in label or label.endswith((".json", ".yml", ".yaml"))
    measured = row.get("clock", "model") == "wall"
    if time_us is not None and bound_us and not (unbound or measured) and time_us < bound_us / OVERDRAWN:
        return f"time_us {time_us:.9g} below its bound ideal_us {bound_us:.9g}, with no link over its rate"
    iteration_us = row.get("iteration_us")
    compute_us = max((row.get(k) or 0.0) for k in ("compute_us", "max_compute_us"))
    if iteration_us is not None and iteration_us < compute_us / OVERDRAWN:
        return (
            f"an iteration of {iteration_us:.9g} us shorter than the slowest NPU's compute, "
            f"{compute_us:.9g} us"
        )
    return None


def checked(result: Any, unbound: bool | None = None) -> Any:
    """The result, once `physics_violation` finds nothing in it (else `BeyondPhysics`: a bug to report)."""
    why = physics_violation(vars(result), unbound)
    if why:
        raise BeyondPhysics(
            f"a {type(result).__name__} beats physics ({why}); please report it with its command"
        )
    return result


def runs_by_dim(runs: Sequence[StageRun], n_dims: int) -> list[list[StageRun]]:
    """The runs of each dim, in their order (one pass)."""
    by_dim: list[list[StageRun]] = [[] for _ in range(n_dims)]
    for r in runs:
        by_dim[r.stage.dim].append(r)
    return by_dim


def finite_or_none(value: float) -> float | None:
    """The value, or None for NaN and infinities (JSON has neither)."""
    return value if math.isfinite(value) else None


def ideal_time_us(op: str, size_bytes: int, topology: Topology, dims) -> float:
    """Bandwidth-only lower bound of a collective on the involved dims (docs/design.md#metric).

    All-reduce: ``2 S (N-1)/N / sum(B_d)``; reduce-scatter and all-gather: half of that;
    all-to-all: ``S (N-1)/N / sum(B_d)``; broadcast: ``S / sum(B_d)``. S is the per-NPU size in
    bytes. Dims that leave the NPU through one shared port (`topology.Port`) count together as at
    most the port's rate.
    """
    n = topology.group_npus(dims)
    if n == 1:
        return 0.0
    involved = [d for d in dims if topology.dims[d].npus > 1]
    bandwidth = sum(topology.dims[d].bandwidth_bytes_per_ns for d in involved if topology.port_of(d) is None)
    for port in topology.ports:
        through = sum(topology.dims[d].bandwidth_bytes_per_ns for d in involved if d in port.dims)
        bandwidth += min(through, port.bandwidth_bytes_per_ns) if through else 0.0
    factor = 2.0 if op == "all_reduce" else n / (n - 1) if op == "broadcast" else 1.0  # broadcast: S in
    return factor * size_bytes * (n - 1) / n / bandwidth / 1e3


def summarize(
    run: CollectiveRun,
    topology: Topology,
    cost: Callable[[int], CostModel],
    *,
    policy: str,
    intra: str,
    schedule: str = "",
    decision_s: float = 0.0,
    clock: str = "model",
    wrong: int | None = None,
    wall_s: float = 0.0,
    time_scale: float = 1.0,
    wall_time_us: float | None = None,
    network: str = IDEAL,
) -> CollectiveResult:
    """The whole result of one collective: times, bandwidths, utilization, per-dim figures.

    `wall_time_us` (the wall clock's own measure) replaces the engine's virtual collective time,
    which is then kept as ``virtual_us``; the other keywords are the run's, as `CollectiveResult`
    names them.
    """
    coll = run.collective
    virtual_us = (run.end_ns - run.issued_ns) / 1e3
    time_us = virtual_us if wall_time_us is None else wall_time_us
    ideal_us = ideal_time_us(coll.op, coll.size_bytes, topology, coll.dims)
    algbw, busbw = bandwidths(coll.op, coll.size_bytes, time_us, topology.group_npus(coll.dims))
    links = link_results(run.runs, topology, cost, time_us) if network != IDEAL else []
    dims = dim_results(run.runs, topology, cost, time_us, (run.issued_ns, run.end_ns), links)
    beyond = beyond_physics(run.runs, topology, cost, time_us, links)
    return checked(
        CollectiveResult(
            op=coll.op,
            involved=list(coll.dims),
            issued_us=run.issued_ns / 1e3,
            size_bytes=coll.size_bytes,
            count=coll.count,
            dtype=coll.dtype,
            redop=coll.redop,
            chunks=len(run.bounds) - 1,
            time_us=time_us,
            ideal_us=ideal_us,
            algbw_gbps=algbw,
            busbw_gbps=busbw,
            utilization=ideal_us / time_us if time_us > 0 else 1.0,
            dims=dims,
            policy=policy,
            intra=intra,
            clock=clock,
            wrong=wrong,
            wall_s=wall_s,
            virtual_us=None if wall_time_us is None else virtual_us,
            topology=topology.label(),
            npus=topology.npus,
            time_scale=time_scale,
            dim_bound_us=dim_bound_us(dims, topology),
            schedule=schedule,
            decision_s=decision_s,
            network=network,
            links=links,
            requested_chunks=coll.chunks,
            beyond_physics=beyond,
        ),
        unbound=topology.flat or any(d.algorithm == "ina" for d in topology.dims),
    )


def dim_bound_us(dims: Sequence[DimResult], topology: Topology) -> float:
    """The per-dim bound of a schedule: ``max_d(bytes_d / B_d)`` in us (bytes one NPU sent on d)."""
    return max(
        (d.bytes / topology.dims[d.dim].bandwidth_bytes_per_ns / 1e3 for d in dims),
        default=0.0,
    )


def bandwidths(op: str, size_bytes: int, time_us: float, npus: int) -> tuple[float, float]:
    """Algbw and busbw in GB/s (2^30 B) of a collective of size_bytes that took time_us."""
    if time_us <= 0:
        return 0.0, 0.0
    algbw = size_bytes / (time_us * 1e-6) / BYTES_PER_GB
    return algbw, algbw * busbw_factor(op, npus)


def flat_row(row: dict) -> dict:
    """A result's dict with its per-dim and per-link lists spread into columns, for CSV.

    ``dim0_busy_us``, ... for the dims; ``dim0.up_busy_pct``, ... for the links; ``stage0_compute_us``,
    ... for a training row's stages.
    """
    out = {k: v for k, v in row.items() if k not in ("dims", "links", "stage_compute_us")}
    for s, us in enumerate(row.get("stage_compute_us", [])):
        out[f"stage{s}_compute_us"] = us
    out["involved"] = " ".join(map(str, out.get("involved", []))) if "involved" in out else None
    for d in row.get("dims", []):
        for key, value in d.items():
            if key != "dim":
                out[f"dim{d['dim']}_{key}"] = value
    for link in row.get("links", []):
        out[f"{link['name']}_busy_pct"] = link["busy_pct"]
    return {k: v for k, v in out.items() if v is not None or k != "involved"}


def median(values: Sequence[float]) -> float:
    """The median, in plain Python: `numpy.median` imports `numpy.ma` (25 ms of CPU on every rank)."""
    ordered = sorted(values)
    n = len(ordered)
    return (ordered[n // 2] + ordered[(n - 1) // 2]) / 2


def percentile(values, q: float) -> float:
    """The q-th percentile (0-100) of values, 0 for none."""
    return float(np.percentile(values, q)) if len(values) else 0.0


def astra_busy_pct(
    runs: Sequence[StageRun],
    n_dims: int,
    end_ns: float,
    window_ns: float = ASTRA_WINDOW_NS,
    since: str = "queued",
    start_ns: float = 0.0,
) -> list[float]:
    """Per-dim utilization as ASTRA-sim 1.0 reports it for one NPU, in percent.

    ASTRA-sim's ``SchedulerUnit`` counts the chunks in a dim's queue (``active_Streams``: waiting
    or running) and its ``UsageTracker`` marks the dim busy while that count is above zero
    (``notify_stream_added`` / ``notify_stream_removed`` in Sys.cc). ``report_percentage(10000)``
    (Workload.cc, UsageTracker.cc) cuts ``[start, end)`` into 10 us windows and reports the busy
    share of every *complete* window (a last partial window is dropped); the mean is the figure.

    Args:
        runs: the stage records of one NPU.
        n_dims: dims of the topology.
        end_ns: the report time (the collective's end).
        window_ns: window length (ASTRA-sim: 10000 cycles of 1 ns).
        since: "queued" (ASTRA-sim: a queued stage makes its dim busy) or "start".
        start_ns: where the first window starts (the collective's issue).

    Returns:
        One percentage per dim; NaN when no window is complete.
    """
    by_dim = runs_by_dim(runs, n_dims)
    if since == "queued":
        spans = [[(r.queued_ns, r.end_ns) for r in mine] for mine in by_dim]
    else:
        spans = [[(r.start_ns, r.end_ns) for r in mine] for mine in by_dim]
    return [window_busy_pct(s, start_ns, end_ns, window_ns) for s in spans]


def window_busy_pct(
    spans: Sequence[tuple[float, float]], start_ns: float, end_ns: float, window_ns: float
) -> float:
    """Mean busy share (percent) of the complete windows of [start, end) covered by the union of spans.

    Every complete window counts equally, so the mean of their shares is the busy time within
    the complete windows over their total length: one pass over the merged spans.
    """
    n_windows = int((end_ns - start_ns) // window_ns)
    if n_windows <= 0:
        return math.nan
    lo, hi = start_ns, start_ns + n_windows * window_ns
    busy, reach = 0.0, lo  # reach: how far the union of the spans seen so far extends
    for a, b in sorted(spans):
        if a < reach:  # (comparisons, not max/min: this loop runs once per stage)
            a = reach
        if b > hi:
            b = hi
        if b > a:
            busy += b - a
            reach = b
    return 100.0 * busy / (hi - lo)
