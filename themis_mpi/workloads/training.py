"""Training iterations of a workload as one engine process, following ASTRA-sim 1.0's layer loops.

The loop depends on the workload's parallelism, as in ASTRA-sim 1.0's ``Workload.cc``
(``iterate_*``). Every collective a layer issues counts as finished the layer's update time
after its last chunk (``Layer::call``: ``*_Comm_Finished_After_Delay``); a collective that
involves no dim finishes at once.

- Forward, layer by layer: wait until the layer's weight-gradient collective of the previous
  iteration has finished, compute, then (all but DATA and DLRM) issue the forward collective
  and wait for it. DLRM issues only its embedding all-to-all, without waiting, and waits for it
  after the last bottom-MLP layer.
- Backward, last layer first:
  - DATA (and DLRM): weight-gradient compute, issue its collective (in the background), then,
    but for layer 0, input-gradient compute. DLRM issues the embedding's backward all-to-all
    after the input-gradient compute of the first top layer, and (HYBRID_DLRM, not _ENHANCED)
    waits for it after layer 0's weight gradient.
  - MODEL, the hybrids and the transformers: input-gradient compute, issue its collective in
    the background (not for layer 0, except the transformers), weight-gradient compute, issue
    its collective in the background, then wait for the input-gradient collective. With
    activation checkpointing, a layer that initiates a recompute first runs the forward of the
    layers from the nearest checkpoint at or before it up to (not including) itself.
- MICRO issues every iteration's weight-gradient collective at once; DISTRIBUTED_INFERENCE runs
  forward passes only.

Gradient buckets (``TrainingSpec.bucket_mib``, 0 by default: one collective per layer, as above
and as ASTRA-sim runs it) fuse weight-gradient collectives the way PyTorch DDP does (`bucket_plan`):
walking the layers from the last to the first, consecutive weight-gradient collectives of the
same op and dims fill a bucket until it holds at least the cap, and the bucket's collective is
issued where its last gradient (its lowest layer) would have issued its own. Every member layer
counts as finished its own update time after the bucket's collective, so the next iteration's
forward of a layer waits for its bucket.

Partitions (``TrainingSpec.partition_mib``, 0 by default: whole tensors) slice every collective
into collectives of at most that many MiB (`partitions`), as P3 and ByteScheduler slice tensors;
a layer's collective finishes when its last partition has. Every collective is issued with the
`policies.Need` of its result, which the communication scheduler ranks by (`policies.scheduler`):
a weight gradient is needed by its layer's forward in the next iteration (its place, and the
forward compute before it; in the last iteration by nothing, as a Chakra graph of the run has it);
any other collective by the running pass at once.

Several collectives are in flight at once and share the dims' queues. Every distinct collective's
schedule (chunk bounds, orders, queue policy) is chosen up front by the coordinator (the Themis
loads reset per collective, so this is what choosing them at issue gives) and broadcast once.
ASTRA-sim also spends one cycle on every step of its loop; with ``compat="astra-sim-1.0"`` the
loop does too (`TrainingLoop.tick_ns`).

Under the endpoint model (`cost.Endpoint`) compute and collectives share the NPU's memory
bandwidth H, by a rule every rank applies to the same engine state: a stage that starts while a
compute phase runs gets ``(1 - compute_share)`` of its memory share (`cost.CostModel`), and a
compute phase (taken as memory-bound) that starts while stages run progresses at the rate
``max(1 - min(D, (1 - compute_share) H) / H, MIN_COMPUTE_RATE)``, D being the running stages'
average memory bytes per ns (`cost.CostModel.memory_rate`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..collectives import DEFAULT_DTYPE, DTYPES, Collective
from ..engine import CollectiveRun, Engine, Event, ProcessGenerator
from ..errors import UsageError
from ..limits import (
    MAX_BUCKET_MIB,
    MAX_CHUNKS,
    MAX_ITERS,
    MAX_JITTER_SIGMA,
    MAX_SCALE,
    MAX_SIZE_BYTES,
    MIN_BUCKET_MIB,
    in_range,
)
from ..policies import BLOCKING, UNKNOWN, Need, Schedule
from ..progress import Progress, tell
from ..topology import Topology
from .text import PHASES, Layer, Workload

MIN_COMPUTE_RATE = 1 / 64  # compute never stops entirely under the endpoint model


@dataclass(frozen=True)
class TrainingSpec:
    """How a workload is run: chunks and dtype of its collectives, iterations, what-if scales.

    Attributes:
        chunks: chunks per collective.
        dtype: element type of the collectives (sizes in the file are bytes).
        iterations: training iterations.
        compute_scale: factor on every compute and update time: the what-if of another
            accelerator (0.25 = four times faster; `scripts/generate_workloads.py --peak-tflops`
            regenerates the times themselves).
        comm_scale: factor on every collective's size (ASTRA-sim's comm-scale): the what-if of
            another gradient and activation precision (2 = fp32 instead of the files' 2 bytes)
            or of layers that many times wider in bytes.
        bucket_mib: gradient bucket cap in MiB (0: one weight-gradient collective per layer);
            see `bucket_plan`.
        first_bucket_mib: the first bucket's cap (None: `bucket_mib`; DDP uses 1 MiB).
        partition_mib: slice every collective into partitions of at most this many MiB (0:
            whole tensors); see `partitions`.
        npu_compute_scale: ``(rank, factor)``: that NPU's compute and update times times factor
            (a straggler: 1.5 = half as fast again).
        compute_jitter: sigma of a lognormal factor of mean 1 drawn for every compute phase of
            every NPU (0: none), from a generator seeded with ``(seed, rank)``.
        seed: the jitter's seed.
    """

    chunks: int = 64
    dtype: str = DEFAULT_DTYPE
    iterations: int = 2
    compute_scale: float = 1.0
    comm_scale: float = 1.0
    bucket_mib: float = 0.0
    first_bucket_mib: float | None = None
    partition_mib: float = 0.0
    npu_compute_scale: tuple[tuple[int, float], ...] = ()
    compute_jitter: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        in_range("chunks", self.chunks, 1, MAX_CHUNKS)
        if self.dtype not in DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}; use one of {', '.join(DTYPES)}")
        in_range("iterations", self.iterations, 1, MAX_ITERS)
        in_range("compute scale", self.compute_scale, 0, MAX_SCALE)
        in_range("comm scale", self.comm_scale, 1 / MAX_SCALE, MAX_SCALE)
        if self.bucket_mib != 0:
            in_range("bucket size", self.bucket_mib, MIN_BUCKET_MIB, MAX_BUCKET_MIB, "MiB (or 0)")
        if self.first_bucket_mib is not None:
            if self.bucket_mib == 0:
                raise UsageError("a first bucket size needs a bucket size (--bucket-mib)")
            in_range("first bucket size", self.first_bucket_mib, MIN_BUCKET_MIB, MAX_BUCKET_MIB, "MiB")
        if self.partition_mib != 0:
            in_range("partition size", self.partition_mib, MIN_BUCKET_MIB, MAX_BUCKET_MIB, "MiB (or 0)")
        ranks = [rank for rank, _ in self.npu_compute_scale]
        if len(set(ranks)) != len(ranks):
            raise UsageError(f"--npu-compute-scale names a rank twice: {sorted(ranks)}")
        for rank, factor in self.npu_compute_scale:
            in_range("--npu-compute-scale rank", rank, 0, 1 << 20)
            in_range(f"--npu-compute-scale of rank {rank}", factor, 1 / MAX_SCALE, MAX_SCALE)
        in_range("--compute-jitter", self.compute_jitter, 0, MAX_JITTER_SIGMA, "(lognormal sigma)")
        in_range("--seed", self.seed, 0, 2**63 - 1)

    @property
    def heterogeneous(self) -> bool:
        """Whether NPUs compute at different paces (the model must then run every NPU)."""
        return bool(self.npu_compute_scale or self.compute_jitter)

    def npu_factor(self, rank: int | np.ndarray) -> Any:
        """The factor on one NPU's compute and update times (`npu_compute_scale`); per NPU for ranks."""
        if isinstance(rank, np.ndarray):
            factors = np.ones(len(rank))
            for r, f in self.npu_compute_scale:
                factors[r] = f
            return factors
        return dict(self.npu_compute_scale).get(rank, 1.0)

    def scaled_ns(self, ns: float, factor: Any, jitter: Iterator | None = None) -> Any:
        """One NPU's time of a compute phase or an update given as `ns`: the one scaling of both.

        Times the compute scale, then (where there is a time) the NPU's factor (`npu_factor`)
        and, for a compute phase, its stream's next jitter draw (`jitter`; None: an update, not
        jittered). A text workload's loop and a graph's compute nodes (`chakra.plan_graph`) both
        scale so, so one slow NPU means the same for either.
        """
        delay_ns = ns * self.compute_scale
        if delay_ns > 0:
            delay_ns *= factor if jitter is None else factor * next(jitter)
        return delay_ns

    def jitter(self, rank: int | np.ndarray):
        """One NPU's jitter factors, one per compute phase in its program order (always 1 without).

        For an array of ranks, each NPU's factors together (`timing.vectors.NpuVectors`). Update times are
        not jittered: they run in processes of their own, whose order between compute phases
        depends on when collectives end, and the draws must not.
        """
        sigma = self.compute_jitter
        if isinstance(rank, np.ndarray):
            streams = [self.jitter(int(r)) for r in rank]
            while True:
                yield np.array([next(s) for s in streams]) if sigma else 1.0
        rng = np.random.default_rng([self.seed, rank])
        while True:  # mean 1: exp(N(-sigma^2/2, sigma))
            yield float(rng.lognormal(-sigma * sigma / 2, sigma)) if sigma else 1.0


def timed(delay_ns: Any) -> bool:
    """Whether a `TrainingSpec.scaled_ns` takes time: a positive one (every NPU's, an array, only then)."""
    return isinstance(delay_ns, np.ndarray) or delay_ns > 0


def shares_memory(engine: Engine) -> bool:
    """Whether compute and collectives share the memory: an engine whose run has the endpoint model.

    (A `TrainingLoop` also drives recorders that only write the loop down, `chakra`.)
    """
    transport = getattr(engine, "transport", None)
    return transport is not None and transport.config.endpoint.on


def compute_rate(engine: Engine) -> float:
    """The pace of a compute phase starting now: 1, or less while collectives use the memory.

    The rule of the module doc; 1 unless the endpoint model is on. Every rank sees the same
    running stages at the same virtual time, so every rank computes the same rate.
    """
    if not shares_memory(engine):
        return 1.0
    endpoint = engine.transport.config.endpoint
    demand = sum(engine.transport.cost(r.stage.itemsize).memory_rate(r) for r in engine.running_stages())
    hbm = endpoint.hbm_bytes_per_ns
    return max(1.0 - min(demand, (1.0 - endpoint.compute_share) * hbm) / hbm, MIN_COMPUTE_RATE)


def collective_of(
    workload: Workload, layer: Layer, phase: str, topology: Topology, spec: TrainingSpec
) -> Collective | None:
    """The Collective a layer's phase issues, or None (no collective, no size, or no dims).

    The file's bytes are per NPU and, as ASTRA-sim reads them, the input of the collective: an
    all-gather's output (the size of a `Collective`) is that times the group's NPUs.
    """
    p = layer.phase(phase)
    dims = tuple(d for d in workload.dims(layer, phase, topology) if topology.dims[d].npus > 1)
    if p.op is None or p.size_bytes <= 0 or not dims:
        return None
    size_bytes = p.size_bytes * (topology.group_npus(dims) if p.op == "all_gather" else 1) * spec.comm_scale
    if size_bytes > MAX_SIZE_BYTES:
        raise UsageError(
            f"layer {layer.name}'s {phase} collective would move {size_bytes:.3g} B per NPU "
            f"(at most {MAX_SIZE_BYTES} B)"
        )
    return Collective.of_bytes(p.op, int(size_bytes), spec.dtype, spec.chunks, dims)


def partitions(collective: Collective, spec: TrainingSpec, group_npus: int) -> list[Collective]:
    """A collective sliced into partitions of at most ``spec.partition_mib`` MiB, in buffer order.

    Each partition is a collective of its own, with the collective's op, dtype and dims, so that
    a scheduler can put another tensor's partitions between them. It keeps the tensor's chunk
    size: ``chunks x its bytes / the tensor's`` chunks, rounded, at least one (slicing a
    tensor of 16 chunks into 4 partitions gives 4 chunks each, not 64 chunks in all). A partition holds
    a multiple of the group's NPUs in elements (every NPU's share of an all-gather,
    reduce-scatter or all-to-all stays whole), at least one such multiple; the last partition
    takes the rest. The collective itself when it fits in one partition (or `partition_mib` is 0).
    """
    if not spec.partition_mib:
        return [collective]
    grain = 1 if collective.op == "all_reduce" else group_npus
    per = max(grain, int(spec.partition_mib * 2**20) // collective.itemsize // grain * grain)
    per_bytes, total = per * collective.itemsize, collective.size_bytes
    if total <= per_bytes:
        return [collective]
    full, rest_bytes = divmod(total, per_bytes)
    rest = rest_bytes // collective.itemsize
    if rest % grain or (rest_bytes and not rest):  # (no whole group or element: the last one takes it)
        full, rest_bytes = full - 1, rest_bytes + per_bytes

    def part(nbytes: int) -> Collective:
        chunks = max(1, (2 * collective.chunks * nbytes + total) // (2 * total))
        return Collective.of_bytes(collective.op, nbytes, collective.dtype, chunks, collective.dims)

    return [part(per_bytes)] * full + ([part(rest_bytes)] if rest_bytes else [])


@dataclass(frozen=True)
class Bucket:
    """Weight-gradient collectives fused into one, as a DDP gradient bucket.

    Attributes:
        layers: the member layers' indices in backward order (last layer first).
        collective: the fused collective: its members' op, dtype, chunks and dims, their
            element counts summed.
    """

    layers: tuple[int, ...]
    collective: Collective

    @property
    def issuer(self) -> int:
        """The layer whose weight gradient is ready last (the lowest): it issues the bucket."""
        return self.layers[-1]


def bucket_plan(workload: Workload, topology: Topology, spec: TrainingSpec) -> list[Bucket]:
    """The gradient buckets of a workload, in backward order ([] when `spec.bucket_mib` is 0).

    PyTorch DDP's rule (``compute_bucket_assignment_by_size``): walking the layers from the
    last to the first, every weight-gradient collective joins the open bucket; the bucket closes
    as soon as it holds at least its cap (so it may pass the cap by its last gradient), the first
    bucket's cap being `spec.first_bucket_mib` and every later one's `spec.bucket_mib`. A
    collective of another op or other dims than the open bucket's (another group) closes it
    first: only consecutive collectives of one kind and group are fused. Layers without a
    weight-gradient collective are skipped. A pure function of the workload, the topology and
    the spec, so every rank knows the plan (and the fused collectives) before the run.
    """
    if not spec.bucket_mib:
        return []
    caps = [spec.first_bucket_mib or spec.bucket_mib, spec.bucket_mib]
    buckets: list[Bucket] = []
    members: list[tuple[int, Collective]] = []

    def close() -> None:
        first = members[0][1]
        size_bytes = sum(c.size_bytes for _, c in members)
        if size_bytes > MAX_SIZE_BYTES:
            raise UsageError(
                f"a gradient bucket would move {size_bytes} B per NPU (at most {MAX_SIZE_BYTES})"
            )
        fused = Collective.of_bytes(first.op, size_bytes, first.dtype, first.chunks, first.dims)
        buckets.append(Bucket(tuple(i for i, _ in members), fused))
        members.clear()

    for layer in reversed(workload.layers):
        coll = collective_of(workload, layer, "wg", topology, spec)
        if coll is None:
            continue
        if members and (coll.op, coll.dims) != (members[0][1].op, members[0][1].dims):
            close()
        members.append((layer.index, coll))
        cap_bytes = caps[min(len(buckets), 1)] * 2**20
        if sum(c.size_bytes for _, c in members) >= cap_bytes:
            close()
    if members:
        close()
    return buckets


def distinct_collectives(workload: Workload, topology: Topology, spec: TrainingSpec) -> list[Collective]:
    """Every distinct collective the workload issues, in file order (a bucket's at its issuer).

    Every rank computes this before the first collective, so a workload that does not fit the
    topology is refused on every rank at once.
    """
    return list(dict.fromkeys(listed_collectives(workload, topology, spec)))


def listed_collectives(workload: Workload, topology: Topology, spec: TrainingSpec) -> list[Collective]:
    """The collectives (partitions) of one iteration as the file lists them, repeats kept, in file order.

    What one iteration costs in collectives (`timing.planner.chunk_steps`, the run's estimate).
    """
    buckets = {b.issuer: b.collective for b in bucket_plan(workload, topology, spec)}
    out = []
    for layer in workload.layers:
        for phase in PHASES:
            if phase == "wg" and buckets:
                coll = buckets.get(layer.index)
            else:
                coll = collective_of(workload, layer, phase, topology, spec)
            if coll is not None:
                out += partitions(coll, spec, topology.group_npus(coll.dims))
    return out


HYBRID_LOOPS = (
    "MODEL",
    "HYBRID_DATA_MODEL",
    "HYBRID_MODEL_DATA",
    "HYBRID_CUSTOMIZED",
    "HYBRID_TRANSFORMER",
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD",
)
DLRM_LOOPS = ("HYBRID_DLRM", "HYBRID_DLRM_ENHANCED")


class TrainingListener(Protocol):
    """What a `TrainingLoop` announces before it acts (the ET converter records it)."""

    def issuing(self, layer: Layer, phase: str) -> None:
        """The next collective issued is this layer's phase ("fwd", "ig" or "wg")."""

    def updating(self, layer: Layer) -> None:
        """The next timeout is this layer's weight update."""


class TrainingLoop:
    """The layer loop of one NPU, as an engine process (`process`).

    Args:
        workload: the parsed workload.
        topology: the network.
        spec: chunks, dtype, iterations and scales.
        schedules: the schedule of every distinct collective (see `distinct_collectives`).
        tick_ns: time of one step of the loop (ASTRA-sim: one cycle; 0 by default).
        listener: told what each collective and update is before the engine sees it (the ET
            converter names its nodes so); None by default.
        rank: whose compute pace and jitter (`TrainingSpec.npu_factor`); every rank's at once
            for an array of ranks (`timing.vectors.NpuVectors`).
        progress: told each layer step done (a layer's forward, or its backward) of all of them.
    """

    def __init__(
        self,
        workload: Workload,
        topology: Topology,
        spec: TrainingSpec,
        schedules: dict[Collective, Schedule],
        tick_ns: float = 0.0,
        listener: TrainingListener | None = None,
        rank: int | np.ndarray = 0,
        progress: Progress | None = None,
    ):
        self.wl, self.topology, self.spec, self.schedules = workload, topology, spec, schedules
        self.npu_factor = spec.npu_factor(rank)  # a straggler's compute pace
        self.jitter = spec.jitter(rank)
        self.tick_ns = tick_ns
        self.listener = listener
        self.iteration_starts: list[float] = []
        self.forward_starts: list[list[float]] = []  # per iteration, when each layer's forward compute began
        self.wg_runs: dict[tuple[int, int], list[CollectiveRun]] = {}  # (iteration, layer): its partitions
        self.compute_ns = 0.0
        self.collectives_issued = 0
        n = len(workload.layers)
        self.buckets = {i: b for b in bucket_plan(workload, topology, spec) for i in b.layers}
        self.wg_done: list[Event | None] = [None] * n  # weight-gradient collective finished (after update)
        self.ig_done: list[Event | None] = [None] * n
        self.fwd_done: list[Event | None] = [None] * n
        # when the next forward pass needs each layer's weight gradient (its place, compute before it)
        fwd_ns = [layer.fwd.compute_ns * spec.compute_scale for layer in workload.layers]
        self.needs = [Need(i, float(sum(fwd_ns[:i]))) for i in range(n)]
        self.progress = progress
        passes = 1 if workload.parallelism in ("MICRO", "DISTRIBUTED_INFERENCE") else 2
        self.steps_done, self.steps_total = 0, spec.iterations * n * passes

    # --- steps ---------------------------------------------------------------------------------

    def _compute(self, engine: Engine, compute_ns: float) -> ProcessGenerator:
        delay_ns = self.spec.scaled_ns(compute_ns, self.npu_factor, self.jitter)
        if timed(delay_ns):
            shared = shares_memory(engine)
            if shared:
                delay_ns /= compute_rate(engine)
                engine.computing += 1
            self.compute_ns += delay_ns
            yield engine.timeout(delay_ns)
            if shared:
                engine.computing -= 1

    def _tick(self, engine: Engine) -> ProcessGenerator:
        if self.tick_ns:
            yield engine.timeout(self.tick_ns)

    def _issue(self, engine: Engine, layer: Layer, phase: str) -> Event | None:
        """Issue the layer's phase collective; the event of its finish (after the update time)."""
        if phase == "wg" and self.buckets:
            return self._issue_bucket(engine, layer)
        coll = collective_of(self.wl, layer, phase, self.topology, self.spec)
        if coll is None:
            return None
        if self.listener is not None:
            self.listener.issuing(layer, phase)
        runs = self._issue_parts(engine, coll, self._wg_need(layer.index) if phase == "wg" else BLOCKING)
        if phase == "wg":
            self.wg_runs[len(self.iteration_starts) - 1, layer.index] = runs
        finish = self._finished(engine, layer, runs)
        return engine.process(self._then_step(finish) if phase == "wg" else finish)

    def _wg_need(self, layer: int) -> Need:
        """When a weight gradient is needed: by the layer's next forward; never in the last iteration."""
        last = len(self.iteration_starts) >= self.spec.iterations and self.wl.parallelism != "MICRO"
        return UNKNOWN if last else self.needs[layer]

    def _issue_parts(self, engine: Engine, coll: Collective, need: Need) -> list[CollectiveRun]:
        """Issue a collective's partitions (`partitions`), each under its schedule."""
        parts = partitions(coll, self.spec, self.topology.group_npus(coll.dims))
        self.collectives_issued += len(parts)
        return [engine.issue(part, self.schedules[part], need=need) for part in parts]

    def _issue_bucket(self, engine: Engine, layer: Layer) -> Event | None:
        """A bucket's issuer issues the fused collective and sets every member's finish event.

        Each member layer finishes its own update time after the bucket's collective; the other
        members issue nothing (None: their events are set when the issuer comes).
        """
        bucket = self.buckets.get(layer.index)
        if bucket is None or layer.index != bucket.issuer:
            return None
        coll = bucket.collective
        if self.listener is not None:
            self.listener.issuing(layer, "wg")
        runs = self._issue_parts(engine, coll, self._wg_need(min(bucket.layers)))
        for i in bucket.layers:
            self.wg_runs[len(self.iteration_starts) - 1, i] = runs
            finish = self._finished(engine, self.wl.layers[i], runs)
            self.wg_done[i] = engine.process(self._then_step(finish) if i == layer.index else finish)
        return self.wg_done[layer.index]

    def _finished(self, engine: Engine, layer: Layer, runs: list[CollectiveRun]) -> ProcessGenerator:
        yield from runs
        update_ns = self.spec.scaled_ns(layer.update_ns, self.npu_factor)
        if timed(update_ns):
            if self.listener is not None:
                self.listener.updating(layer)
            yield engine.timeout(update_ns)

    def _then_step(self, finish: ProcessGenerator) -> ProcessGenerator:
        """A weight gradient's `_finished`, then its layer's backward step is done."""
        yield from finish
        self._stepped()

    def _stepped(self) -> None:
        """One more layer step done (`progress`): a forward, or a backward once its gradient is applied."""
        self.steps_done += 1
        tell(self.progress, self.steps_done, self.steps_total)

    @staticmethod
    def _wait(event: Event | None) -> ProcessGenerator:
        if event is not None:
            yield event

    # --- the loops -----------------------------------------------------------------------------

    def process(self, engine: Engine) -> ProcessGenerator:
        """Every iteration: forward, then backward (as the workload's parallelism has it)."""
        kind = self.wl.parallelism
        layers = self.wl.layers
        if kind == "MICRO":  # every iteration's weight-gradient collective at once
            self.iteration_starts += [engine.now_ns] * self.spec.iterations
            for _ in range(self.spec.iterations):
                for layer in layers:
                    if self._issue(engine, layer, "wg") is None:
                        self._stepped()
            return
        for _ in range(self.spec.iterations):
            self.iteration_starts.append(engine.now_ns)
            self.forward_starts.append([])
            yield from self._forward(engine, 0, len(layers))
            if kind == "DISTRIBUTED_INFERENCE":
                continue
            if kind in HYBRID_LOOPS:
                yield from self._backward_hybrid(engine)
            else:
                yield from self._backward_data(engine)

    def _forward(self, engine: Engine, first: int, stop: int) -> ProcessGenerator:
        """Layers first..stop-1."""
        kind = self.wl.parallelism
        for i in range(first, stop):
            layer = self.wl.layers[i]
            yield from self._wait(self.wg_done[i])
            if stop == len(self.wl.layers) and first == 0:  # (not a recompute under checkpointing)
                self.forward_starts[-1].append(engine.now_ns)
            yield from self._compute(engine, layer.fwd.compute_ns)
            if kind in DLRM_LOOPS:
                if layer.fwd.op == "all_to_all":
                    self.fwd_done[i] = self._issue(engine, layer, "fwd")  # overlaps the bottom MLP
                elif i == self.wl.dlrm_last_bottom_layer:
                    yield from self._wait(self.fwd_done[0])
            elif kind != "DATA":
                yield from self._wait(self._issue(engine, layer, "fwd"))
            yield from self._tick(engine)
            if stop == len(self.wl.layers) and first == 0:
                self._stepped()

    def _backward_data(self, engine: Engine) -> ProcessGenerator:
        """DATA and DLRM: weight gradient, then input gradient, layer by layer."""
        last_bottom = self.wl.dlrm_last_bottom_layer if self.wl.parallelism in DLRM_LOOPS else None
        for i in reversed(range(len(self.wl.layers))):
            layer = self.wl.layers[i]
            yield from self._compute(engine, layer.wg.compute_ns)
            self.wg_done[i] = self._issue(engine, layer, "wg")
            if self.wg_done[i] is None:  # (else once the gradient is applied: `_finished`)
                self._stepped()
            if self.wl.parallelism == "HYBRID_DLRM":
                yield from self._wait(self.ig_done[i])
                self.ig_done[i] = None
            yield from self._tick(engine)
            if i == 0:
                return
            yield from self._compute(engine, layer.ig.compute_ns)
            if last_bottom is not None and i == last_bottom + 1:  # the embedding's backward all-to-all
                self.ig_done[0] = self._issue(engine, self.wl.layers[0], "ig")
            yield from self._tick(engine)

    def _backward_hybrid(self, engine: Engine) -> ProcessGenerator:
        """MODEL, hybrids, transformers: input gradient (in the background), weight gradient, wait."""
        transformer = self.wl.parallelism.startswith("HYBRID_TRANSFORMER")
        for i in reversed(range(len(self.wl.layers))):
            layer = self.wl.layers[i]
            if i in self.wl.checkpoint_initiates:
                start = max([c for c in self.wl.checkpoints if c <= i], default=0)
                yield from self._tick(engine)
                yield from self._forward(engine, start, i)
            yield from self._compute(engine, layer.ig.compute_ns)
            ig = self._issue(engine, layer, "ig") if i > 0 or transformer else None
            yield from self._tick(engine)
            yield from self._compute(engine, layer.wg.compute_ns)
            self.wg_done[i] = self._issue(engine, layer, "wg")
            if self.wg_done[i] is None:
                self._stepped()
            yield from self._wait(ig)
            yield from self._tick(engine)
