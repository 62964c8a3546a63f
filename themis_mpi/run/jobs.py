"""Several training jobs on one network: each job's workload on its dims and NPUs, all at once.

A job is a text workload with a placement (`Placement`): the dims its collectives use (all by
default) and, optionally, a slice of the NPUs (``at=D/I``: the NPUs whose coordinate on dim D is
I; D is then not among the job's dims). The job sees the sub-topology of its dims
(`Job.sub_topology`): its workload is fitted and its collectives are made there, then lifted to
the whole topology's dims (`Job.lift`). Every NPU runs one engine, and every job placed on it is
a `TrainingLoop` process of that engine: jobs on the same NPUs share its dims' queues and slots
and, under ``--network fair|store-forward``, the links and shared ports. Two jobs may use the same
dim on the same NPUs: their collectives then queue on that dim as two collectives of one job do.

Model and emulator:

- Jobs that cover every NPU run on the one-NPU model (every NPU does the same), under every
  network rule.
- Jobs on slices (``at=``) share no port with another slice's jobs, since ports are per NPU and
  a job's groups never cross its slice; the model runs each slice's jobs on their own (every
  slice is symmetric inside), so a slice alone on its NPUs keeps its solo time. All jobs take
  ``at=`` on one dim, or none does (a job over every NPU beside sliced ones would make the NPUs
  differ, which only the per-NPU models run, and jobs do not run on them yet).
- On the emulator every rank runs the jobs whose placement holds it; control calls (schedules,
  results) are made by every rank for every job, in job order.

A job's iteration time runs from its start (``delay_us=``, a late start that interleaves jobs)
to the end of its last collective and update, over its iterations. ``compute_scale=F`` scales
one job's compute and update times (on top of ``--compute-scale``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..collectives import Collective
from ..config import RunConfig
from ..cost import loop_tick_ns
from ..engine import CollectiveRun, Engine, ProcessGenerator, Transport
from ..errors import UsageError
from ..limits import MAX_SCALE, in_range
from ..model import ModelTransport
from ..policies import Schedule, default_scheduler
from ..results import DimResult, TrainingResult
from ..timing.planner import JOBS, Run, plan, run_on
from ..topology import Topology
from ..workloads.text import Layer, Workload
from ..workloads.training import TrainingLoop, TrainingSpec, distinct_collectives, partitions
from .collective import execute
from .coordinator import PolicyLike, policy_name, share_schedules

MAX_JOBS = 16
KEYS = ("dims", "at", "delay_us", "compute_scale")


@dataclass(frozen=True)
class Placement:
    """Where a job runs.

    Attributes:
        dims: the dims its collectives use, ascending (None: every dim).
        at: ``(dim, index)``: only the NPUs whose coordinate on that dim is index (None: all).
        delay_ns: the job starts this late (virtual ns).
        compute_scale: a factor on the job's compute and update times, on top of the run's
            (``--compute-scale``): jobs of different speeds on one network.
    """

    dims: tuple[int, ...] | None = None
    at: tuple[int, int] | None = None
    delay_ns: float = 0.0
    compute_scale: float = 1.0

    def text(self) -> str:
        """The placement as ``--job`` takes it (empty when it is the default)."""
        parts = []
        if self.dims is not None:
            parts.append("dims=" + ",".join(map(str, self.dims)))
        if self.at is not None:
            parts.append(f"at={self.at[0]}/{self.at[1]}")
        if self.delay_ns:
            parts.append(f"delay_us={self.delay_ns / 1e3:g}")
        if self.compute_scale != 1.0:
            parts.append(f"compute_scale={self.compute_scale:g}")
        return ":".join(parts)


def parse_placement(text: str) -> Placement:
    """``dims=0,1:at=2/0:delay_us=50:compute_scale=2`` (every key optional, "" = every dim and NPU)."""
    dims: tuple[int, ...] | None = None
    at: tuple[int, int] | None = None
    delay_ns, scale = 0.0, 1.0
    seen: set[str] = set()
    for item in filter(None, text.split(":")):
        key, eq, value = item.partition("=")
        if not eq or key not in KEYS or key in seen:
            why = "is not dims=D,D.., at=D/I, delay_us=US or compute_scale=F"
            why = "names a key twice" if key in seen else why
            raise UsageError(f"placement {text!r}: {item!r} {why}")
        seen.add(key)
        try:
            if key == "dims":
                dims = tuple(sorted({int(d) for d in value.split(",")}))
                if any(d < 0 for d in dims) or not dims:
                    raise ValueError
            elif key == "at":
                d, slash, i = value.partition("/")
                if not slash or int(d) < 0 or int(i) < 0:
                    raise ValueError
                at = (int(d), int(i))
            elif key == "delay_us":
                delay_ns = float(value) * 1e3
            else:
                scale = float(value)
        except ValueError:
            raise UsageError(f"placement {text!r}: bad value in {item!r}") from None
        if key == "delay_us":
            in_range("a job's delay_us", delay_ns / 1e3, 0, MAX_SCALE * 1e6)
        if key == "compute_scale":
            in_range("a job's compute_scale", scale, 0, MAX_SCALE)
    return Placement(dims, at, delay_ns, scale)


@dataclass(frozen=True)
class Job:
    """A workload and its placement.

    Attributes:
        workload: the parsed text workload.
        placement: its dims, NPUs and start.
        label: how it is named in tables (``path@placement``).
    """

    workload: Workload
    placement: Placement = Placement()
    label: str = ""

    def dims(self, topology: Topology) -> tuple[int, ...]:
        """The whole topology's dims the job uses."""
        return self.placement.dims if self.placement.dims is not None else tuple(range(len(topology.dims)))

    def sub_topology(self, topology: Topology) -> Topology:
        """The topology of the job's dims alone: what its workload sees."""
        dims = self.dims(topology)
        if len(dims) == len(topology.dims):
            return topology
        return topology.with_dims([topology.dims[d] for d in dims])

    def lift(self, topology: Topology, collective: Collective) -> Collective:
        """A collective of the sub-topology on the whole topology's dims."""
        dims = self.dims(topology)
        return replace(collective, dims=tuple(dims[d] for d in collective.dims))

    def runs_on(self, topology: Topology, rank: int) -> bool:
        """Whether NPU `rank` is in the job's slice."""
        if self.placement.at is None:
            return True
        d, i = self.placement.at
        stride = int(np.prod(topology.shape[:d], dtype=np.int64))
        return rank // stride % topology.dims[d].npus == i


def check_jobs(jobs: Sequence[Job], topology: Topology, spec: TrainingSpec) -> None:
    """Refuse, in one line, placements the topology cannot take and workloads that do not fit."""
    n = len(topology.dims)
    if not 1 <= len(jobs) <= MAX_JOBS:
        raise UsageError(f"give 1 to {MAX_JOBS} jobs, not {len(jobs)}")
    ats = {job.placement.at[0] if job.placement.at else None for job in jobs}
    if len(ats) > 1:
        raise UsageError(
            "all jobs take at= on one dim, or none does (a job over every NPU beside sliced jobs "
            "would make the NPUs differ)"
        )
    for job in jobs:
        dims, at = job.dims(topology), job.placement.at
        if any(d >= n for d in dims):
            raise UsageError(
                f"job {job.label}: dims {list(dims)}, but {topology.label()} has dims 0..{n - 1}"
            )
        if at is not None:
            d, i = at
            if d >= n or i >= topology.dims[d].npus:
                raise UsageError(f"job {job.label}: at={d}/{i} is no slice of {topology.label()}")
            if d in dims:
                raise UsageError(f"job {job.label}: at={d}/{i} slices dim {d}, which the job also uses")
        sub = job.sub_topology(topology)
        if job.workload.fit_topology(sub) != sub:
            raise UsageError(
                f"job {job.label}: its model-parallel group {job.workload.model_parallel_group} does not "
                f"fit its dims {list(dims)}; give it dims whose sizes multiply to it"
            )
        try:
            distinct_collectives(job.workload, sub, spec)  # (refuses a workload that does not fit)
        except UsageError as exc:
            raise UsageError(f"job {job.label} on its dims {list(dims)}: {exc}") from None


class JobLoop(TrainingLoop):
    """A job's `TrainingLoop` on its sub-topology, issuing its collectives on the whole one's dims.

    It also records when the job started and when its last collective and update ended.
    """

    def __init__(
        self, job: Job, topology: Topology, spec: TrainingSpec, schedules, tick_ns: float, rank: int
    ):
        scale = job.placement.compute_scale
        spec = replace(spec, compute_scale=spec.compute_scale * scale) if scale != 1.0 else spec
        super().__init__(job.workload, job.sub_topology(topology), spec, schedules, tick_ns, rank=rank)
        self.job, self.whole = job, topology
        self.start_ns = self.end_ns = 0.0
        self.runs: list[CollectiveRun] = []
        self.engine: Engine | None = None  # the engine it ran on (None: not on this NPU)

    def _issue_parts(self, engine: Engine, coll: Collective, need) -> list[CollectiveRun]:
        parts = partitions(coll, self.spec, self.topology.group_npus(coll.dims))
        self.collectives_issued += len(parts)
        runs = [engine.issue(self.job.lift(self.whole, p), self.schedules[p], need=need) for p in parts]
        self.runs += runs
        return runs

    def _finished(self, engine: Engine, layer: Layer, runs: list[CollectiveRun]) -> ProcessGenerator:
        yield from super()._finished(engine, layer, runs)
        self.end_ns = max(self.end_ns, engine.now_ns)

    def job_process(self, engine: Engine) -> ProcessGenerator:
        """Wait for the job's start, then run its iterations."""
        self.engine = engine
        if self.job.placement.delay_ns:
            yield engine.timeout(self.job.placement.delay_ns)
        self.start_ns = engine.now_ns
        yield from self.process(engine)
        self.end_ns = max(self.end_ns, engine.now_ns)


@dataclass
class JobsResult:
    """Several jobs' training under one policy: one `TrainingResult` row per job, in job order.

    Attributes:
        policy: the inter-dim policy.
        network: the sharing rule.
        jobs: each job's row (``workload`` is the job's label, ``dims`` its own stages).
        placements: each job's placement text.
        start_us: each job's start.
    """

    policy: str
    network: str
    jobs: list[TrainingResult]
    placements: list[str] = field(default_factory=list)
    start_us: list[float] = field(default_factory=list)

    @property
    def makespan_us(self) -> float:
        """When the last job ended."""
        return max((s + r.total_us for s, r in zip(self.start_us, self.jobs)), default=0.0)

    def to_dict(self) -> dict:
        """Plain values for JSON."""
        return {
            "policy": self.policy,
            "network": self.network,
            "makespan_us": self.makespan_us,
            "jobs": [
                dict(r.to_dict(), placement=p, start_us=s)
                for r, p, s in zip(self.jobs, self.placements, self.start_us)
            ],
        }


def _collectives(jobs: Sequence[Job], topology: Topology, spec: TrainingSpec) -> list[Collective]:
    """Every job's distinct collectives on the whole topology, in job then file order, once each."""
    out: dict[Collective, None] = {}
    for job in jobs:
        for c in distinct_collectives(job.workload, job.sub_topology(topology), spec):
            out.setdefault(job.lift(topology, c))
    return list(out)


def _loops(jobs, topology, spec, by_whole, tick_ns, rank) -> list[JobLoop]:
    """One `JobLoop` per job, its schedules keyed by its own (sub-topology) collectives."""
    loops = []
    for job in jobs:
        sub = job.sub_topology(topology)
        mine = {c: by_whole[job.lift(topology, c)] for c in distinct_collectives(job.workload, sub, spec)}
        loops.append(JobLoop(job, topology, spec, mine, tick_ns, rank))
    return loops


def _groups(jobs: Sequence[Job]) -> list[list[int]]:
    """Job indices by slice: the jobs that share NPUs (every job, when none is sliced)."""
    groups: dict[tuple[int, int] | None, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(job.placement.at, []).append(i)
    return list(groups.values())


def _model_loops(topology, config, jobs, spec, by_whole) -> tuple[list[JobLoop], list[Engine]]:
    """Every slice's jobs on the one-NPU model, each slice on its own engine."""
    loops: list[JobLoop | None] = [None] * len(jobs)
    engines = []
    for group in _groups(jobs):
        engine = Engine(topology, ModelTransport(topology, config), config)
        mine = _loops([jobs[i] for i in group], topology, spec, by_whole, loop_tick_ns(config.compat), 0)
        for i, loop in zip(group, mine):
            loops[i] = loop
            engine.process(loop.job_process(engine))
        engine.run()
        engines.append(engine)
    return [loop for loop in loops if loop is not None], engines


def jobs_oracle(topology: Topology, config: RunConfig, jobs: Sequence[Job], spec: TrainingSpec):
    """The model as an oracle: the jobs' mean iteration time in us under given schedules."""
    collectives = _collectives(jobs, topology, spec)

    def evaluate(schedules: Sequence[Schedule]) -> float:
        loops, _ = _model_loops(topology, config, jobs, spec, dict(zip(collectives, schedules)))
        return float(np.mean([(lp.end_ns - lp.start_ns) / spec.iterations for lp in loops])) / 1e3

    return evaluate


def run_jobs(transport: Transport, jobs: Sequence[Job], policy: PolicyLike, spec: TrainingSpec) -> JobsResult:
    """Several jobs' training iterations at once; every collective on real data (and checked) in MPI.

    Placements must have passed `check_jobs`. Stragglers are not taken here.
    """
    topo, config = transport.topology, transport.config
    timing = plan(Run(topo, config, JOBS, slow_compute=spec.heterogeneous))
    collectives = _collectives(jobs, topo, spec)
    oracle = jobs_oracle(topo, config, jobs, spec) if transport.rank == 0 else None
    schedules, decision_s = share_schedules(transport, policy, collectives, evaluate=oracle)
    by_whole = dict(zip(collectives, schedules))

    def on_model() -> tuple[list[JobLoop], float]:  # every slice's jobs on one NPU of it
        t0 = time.perf_counter()
        loops, _ = _model_loops(topo, config, jobs, spec, by_whole)
        return loops, time.perf_counter() - t0

    def on_rank(npu: Transport) -> tuple[list[JobLoop], float]:  # the jobs whose placement holds this NPU
        engine = Engine(topo, npu, config)
        loops = _loops(jobs, topo, spec, by_whole, loop_tick_ns(config.compat), npu.rank)

        def begin() -> None:
            for loop in loops:
                if loop.job.runs_on(topo, npu.rank):
                    engine.process(loop.job_process(engine))

        return loops, execute(npu, engine, "the jobs", begin)[1]

    loops, wall_s = run_on(timing, transport, on_rank, on_model=on_model)
    rows = [_row(transport, loops[i], i, policy, spec, wall_s, decision_s) for i in range(len(jobs))]
    return JobsResult(
        policy_name(policy),
        config.network,
        [r for r, _ in rows],
        [job.placement.text() for job in jobs],
        [s for _, s in rows],
    )


def _row(
    transport: Transport,
    loop: JobLoop,
    index: int,
    policy: PolicyLike,
    spec: TrainingSpec,
    wall_s: float,
    decision_s: float,
) -> tuple[TrainingResult, float]:
    """One job's row and start (us), the same on every rank (the ranks that ran it say)."""
    topo = transport.topology
    n = len(topo.dims)
    last = loop.iteration_starts[-1] if loop.iteration_starts else 0.0  # (0 where it does not run)
    values = np.concatenate(
        [
            [loop.start_ns, loop.end_ns, last, loop.compute_ns, loop.collectives_issued],
            _per_dim(loop, transport.cost, n).ravel(),
        ]
    )
    values = np.asarray(transport.reduce(values, "max", f"job {index}'s result"), dtype=float)
    start_ns, end_ns, last_ns, compute_ns, issued = values[:5]
    per_dim = values[5:].reshape(n, 3)
    wrongs = [r.wrong for r in loop.runs if r.wrong is not None]
    wrong = None
    if transport.checks_data:
        wrong = int(
            transport.reduce(np.array([sum(wrongs)], np.int64), "sum", f"job {index}'s wrong elements")[0]
        )
    total_ns = end_ns - start_ns
    dims = [
        DimResult(d, float(busy), int(sent), int(stages), busy * 1e3 / total_ns if total_ns > 0 else 0.0)
        for d, (busy, sent, stages) in enumerate(per_dim)
    ]
    row = TrainingResult.timed(
        total_ns=total_ns,
        iterations=spec.iterations,
        last_iteration_ns=end_ns - last_ns,
        compute_ns=compute_ns,
        policy=policy_name(policy),
        intra=transport.config.intra,
        chunks=spec.chunks,
        transport=transport.name,
        collectives=int(issued),
        dims=dims,
        wrong=wrong,
        wall_s=wall_s,
        workload=loop.job.label or loop.job.workload.path,
        topology=topo.label(),
        npus=topo.npus,
        decision_s=decision_s,
        network=transport.config.network,
        scheduler=default_scheduler(transport.config),
        partition_mib=spec.partition_mib,
    )
    return row, start_ns / 1e3


def _per_dim(loop: JobLoop, cost, n_dims: int) -> np.ndarray:
    """Per dim: busy us, bytes and stages of the job's collectives on this NPU (zeros where it runs not)."""
    coll_ids = {r.coll_id for r in loop.runs}
    records = [r for r in loop.engine.records if r.stage.coll in coll_ids] if loop.engine else []
    per_dim = np.zeros((n_dims, 3))
    for r in records:
        per_dim[r.stage.dim] += [
            (r.end_ns - r.start_ns) / 1e3,
            cost(r.stage.itemsize).stage_bytes(r.stage.dim, r.stage.op, r.stage.full_elems),
            1,
        ]
    return per_dim


def solo_times_us(
    topology: Topology, config: RunConfig, jobs: Sequence[Job], policy: PolicyLike, spec: TrainingSpec
) -> list[float]:
    """Each job's iteration time alone on the network, on the model (what sharing costs it)."""
    return [
        run_jobs(
            ModelTransport(topology, config),
            [replace(job, placement=replace(job.placement, delay_ns=0.0))],
            policy,
            spec,
        )
        .jobs[0]
        .iteration_us
        for job in jobs
    ]


def jobs_table(results: Sequence[JobsResult], solo_us: Sequence[Sequence[float]] | None = None) -> str:
    """One line per policy and job: iteration, exposed communication, and the slowdown over solo."""
    width = max([3] + [len(r.workload) for res in results for r in res.jobs])
    lines = [
        f"#{'policy':>9} {'job':<{width}} {'start_us':>9} {'iteration_us':>13} {'compute_us':>11} "
        f"{'exposed_us':>11} {'#wrong':>7} {'solo_us':>10} {'slowdown':>9}"
    ]
    for k, res in enumerate(results):
        for i, (r, s) in enumerate(zip(res.jobs, res.start_us)):
            wrong = "N/A" if r.wrong is None else r.wrong
            solo = solo_us[k][i] if solo_us else None
            slow = f"{r.iteration_us / solo:.3f}x" if solo else "-"
            solo_text = f"{solo:.2f}" if solo else "-"
            lines.append(
                f" {r.policy:>9} {r.workload:<{width}} {s:>9.2f} {r.iteration_us:>13.2f} "
                f"{r.compute_us:>11.2f} {r.exposed_comm_us:>11.2f} {wrong:>7} {solo_text:>10} {slow:>9}"
            )
    return "\n".join(lines)
