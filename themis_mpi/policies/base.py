"""The policy interface: what an inter-dim and an intra-dim policy get and return.

An inter-dim policy (`InterPolicy`) turns a collective into a `Schedule`: its chunks (element
bounds in the buffer) and every chunk's dim order. The default `InterPolicy.schedule` walks the
stream of chunks and asks `order` for each one (and `size` first, for a policy that sizes its
chunks). A policy that needs the whole picture overrides `schedule` (or `schedule_all`, which
sees every collective of a training run at once).

An intra-dim policy (`IntraPolicy`) orders one dim's queue: `position` says where a newly queued
stage goes among the waiting ones. Running stages are never pre-empted.

Both kinds are small classes with a `name` and a one-line `description`, found by name in the
registry (`registry`), which also loads third-party policies from the ``themis_mpi.policies``
entry-point group.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..algorithms import custom_stage
from ..collectives import PRICED_ITEMSIZE, Collective, Stage, priced_chunks, priced_words, split_bounds
from ..config import RunConfig
from ..cost import A2A, CostModel
from ..errors import PolicyError
from ..limits import MAX_CHUNKS  # a sized stream may not cut a collective into more chunks than this
from ..timing.links import physical_links
from ..topology import Topology


def baseline_order(op: str, n_dims: int) -> list[int]:
    """Hierarchical order: ascending dims, except a standalone all-gather, which descends."""
    order = list(range(n_dims))
    return order[::-1] if op == "all_gather" else order


@dataclass(frozen=True)
class Schedule:
    """A collective's schedule as rank 0 broadcasts it.

    Attributes:
        bounds: bounds of the chunks, int64 of shape (chunks + 1,), strictly increasing, from 0
            to the collective's count (elements) or to its `collectives.priced_words` (priced
            words, as a policy that sizes its chunks cuts them; `collectives.element_bounds`).
        orders: every chunk's dim order (the first phase's), int32 of shape (chunks, n_dims).
        fuse_last: an all-reduce runs its last dim as one AR stage (the baseline's rule).
        intra: the intra-dim policy this collective's stages queue by ("" = the run's).
        label: what produced it, e.g. ``themis-lat/scf/16`` for a choice of `predictive`.
    """

    bounds: np.ndarray
    orders: np.ndarray
    fuse_last: int = False  # bool, or AR_EVERY_DIM (collectives)
    intra: str = ""
    label: str = ""

    @property
    def n_chunks(self) -> int:
        """Chunks of the schedule."""
        return len(self.orders)

    def chunk_elems(self, k: int) -> int:
        """Units (elements or words, as `bounds`) of chunk k."""
        return int(self.bounds[k + 1] - self.bounds[k])


def fixed_schedule(collective: Collective, orders, fuse_last: int = False, intra: str = "") -> Schedule:
    """A schedule on the collective's nominal chunks (`Collective.chunk_bounds`)."""
    return Schedule(collective.chunk_bounds(), np.asarray(orders, dtype=np.int32), fuse_last, intra)


@dataclass
class PolicyContext:
    """What a policy may look at besides the collective.

    Attributes:
        topology: the network.
        config: the run settings (intra-dim policy, endpoint delay, compat, ...).
        cost: the cost model of each element size (`cost.CostModels`), the one the run is timed with.
        evaluate_collective: the model as an oracle, when the run offers one: the time in us
            one collective takes alone under a schedule (the run's settings, a fresh engine).
        evaluate: the same for the whole run: the time in us (the collective's, or a training
            iteration's) the run would take with these schedules, one per collective handed to
            `InterPolicy.schedule_all`, in order.
    """

    topology: Topology
    config: RunConfig
    cost: Callable[[int], CostModel]
    evaluate_collective: Callable[[Collective, Schedule], float] | None = None
    evaluate: Callable[[Sequence[Schedule]], float] | None = None

    def stage_ns(self, d: int, op: str, full_elems: int, itemsize: int = PRICED_ITEMSIZE) -> float:
        """A stage's time alone, as the policies estimate it: the one seam for every estimate.

        A dim whose stages a custom algorithm runs (``msccl:RS.xml+AG.xml`` on it, while the run
        holds them: `algorithms.custom_stage`) takes its file's time (`CustomStage.time_ns`),
        not its built-in algorithm's (`cost.CostModel.stage_end_ns`).
        """
        custom = custom_stage(self.topology.dims[d])
        if custom is not None and op != A2A:
            return custom.time_ns(op, full_elems, itemsize)
        return self.cost(itemsize).stage_end_ns(d, op, full_elems, 0.0)

    def custom_scale(self, d: int, op: str, full_elems: int, itemsize: int = PRICED_ITEMSIZE) -> float:
        """How much longer a dim's custom stage holds its links than Themis's bytes say (1.0 without one).

        Themis's tracker counts a stage's (P-1)/P of its region at the dim's bandwidth, whatever
        the built-in algorithm; a file's stage holds the dim as long as NPU 0's busiest link of
        the dim is busy with what the file puts on it (`CustomStage.load`). An exported ring,
        direct or halving-doubling on a Switch gives 1.0; the one-way ring on a Ring dim 2.0.
        """
        custom = custom_stage(self.topology.dims[d])
        if custom is None or op == A2A:
            return 1.0
        dim = self.topology.dims[d]
        _, carried = custom.load(op, full_elems, itemsize)
        links = [link for link in physical_links(self.topology) if link.dim == d]
        busy_ns = max((carried.get(link.name, 0.0) / link.bytes_per_ns for link in links), default=0.0)
        counted_ns = full_elems * itemsize * (dim.npus - 1) / dim.npus / dim.bandwidth_bytes_per_ns
        return busy_ns / counted_ns if counted_ns > 0 else 1.0


@dataclass(slots=True)
class Chunk:
    """One chunk of the stream, as a policy sees it (read-only by convention; frozen is 4x slower).

    For a policy that sizes its chunks (`InterPolicy.sizes_chunks`), offset, elems and remaining
    count priced words of `collectives.PRICED_ITEMSIZE` B, not elements, so its sizes do not
    depend on the dtype (`collectives.element_bounds` maps them onto elements).

    Attributes:
        index: chunk index in the collective.
        offset: its first element (word).
        elems: its elements (words; the nominal size when `InterPolicy.size` is asked).
        remaining: elements (words) from `offset` to the end of the buffer.
        collective: the collective it belongs to.
        priced_bytes: the bytes timing prices it at (`collectives.priced_chunks`).
    """

    index: int
    offset: int
    elems: int
    remaining: int
    collective: Collective
    priced_bytes: int = 0

    @property
    def bytes(self) -> int:
        """Bytes of the chunk, as timing prices them."""
        return self.priced_bytes or self.elems * self.collective.itemsize

    @property
    def op(self) -> str:
        """The collective's op."""
        return self.collective.op


class InterPolicy:
    """An inter-dim policy: each chunk's dim order (and size, for policies that size chunks).

    Subclasses set `name` and `description` and implement `order`; the rest is optional. One
    instance serves a whole run (state may carry from one collective to the next); `begin` is
    called before each collective's chunks.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    fuses_last_dim: ClassVar[int] = False  # an all-reduce's last dim as one AR stage (baseline)
    default_intra: ClassVar[str] = "scf"  # the intra-dim policy `--intra auto` pairs it with
    sizes_chunks: ClassVar[bool] = False  # ask `size` for every chunk's size in priced words
    compat_only: ClassVar[str] = ""  # a compat's own policy: in `-p all` under that compat only

    def begin(self, context: PolicyContext, collective: Collective) -> None:
        """A new collective: reset per-collective state (the default does nothing)."""

    def order(self, chunk: Chunk) -> Sequence[int]:
        """The chunk's order: a permutation of all dims (the first phase's visiting order)."""
        raise NotImplementedError

    def size(self, chunk: Chunk) -> int:
        """The chunk's size in priced words, between 1 and ``chunk.remaining`` (when `sizes_chunks`)."""
        return chunk.elems

    def schedule(self, context: PolicyContext, collective: Collective) -> Schedule:
        """The collective's schedule: the stream of chunks, each sized and ordered in turn."""
        self.begin(context, collective)
        n_dims = len(context.topology.dims)
        nominal = collective.chunk_bounds()
        if not self.sizes_chunks:
            edges, (unit, priced, _) = nominal.tolist(), priced_chunks(collective, nominal)
            chosen = []
            for k in range(collective.n_chunks):
                lo = edges[k]
                chunk = Chunk(k, lo, edges[k + 1] - lo, collective.count - lo, collective, priced[k] * unit)
                chosen.append(checked_order(self, self.order(chunk), n_dims, chunk))
            orders = np.array(chosen, dtype=np.int32).reshape(collective.n_chunks, n_dims)
            return Schedule(nominal, orders, self.fuses_last_dim, label=self.name)
        words = priced_words(collective)  # sized in priced words, whatever the dtype (`element_bounds`)
        n_nominal = min(collective.chunks, words)
        nominal = split_bounds(words, n_nominal)
        bounds: list[int] = [0]
        rows: list[list[int]] = []
        offset = 0
        while offset < words:
            k = len(rows)
            if k >= MAX_CHUNKS:
                raise PolicyError(f"policy {self.name!r} cut a collective into more than {MAX_CHUNKS} chunks")
            step = int(nominal[k + 1] - nominal[k]) if k < n_nominal else int(nominal[1])
            remaining = words - offset
            ask = min(step, remaining)
            size = self.size(Chunk(k, offset, ask, remaining, collective, ask * PRICED_ITEMSIZE))
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 0 < size <= remaining:
                raise PolicyError(
                    f"policy {self.name!r} sized chunk {k} at {size!r} words; "
                    f"it must be an integer between 1 and {remaining}"
                )
            chunk = Chunk(k, offset, int(size), remaining, collective, int(size) * PRICED_ITEMSIZE)
            rows.append(checked_order(self, self.order(chunk), n_dims, chunk))
            offset += int(size)
            bounds.append(offset)
        return Schedule(
            np.array(bounds, dtype=np.int64),
            np.array(rows, dtype=np.int32),
            self.fuses_last_dim,
            label=self.name,
        )

    def schedule_all(self, context: PolicyContext, collectives: Sequence[Collective]) -> list[Schedule]:
        """Every collective's schedule, in order (a training run hands them all at once)."""
        return [self.schedule(context, c) for c in collectives]


def checked_order(policy: InterPolicy, order, n_dims: int, chunk: Chunk) -> list[int]:
    """The order as a list of ints, or a `PolicyError` naming the policy when it is no permutation.

    Its items must be integers: a float (0.9) or a string ("210") is refused, not rounded or split.
    """
    values = None
    if not isinstance(order, (str, bytes)):
        try:
            items = list(order)
        except TypeError:
            items = []
        if items and all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in items):
            values = [int(d) for d in items]
    if values is None or sorted(values) != list(range(n_dims)):
        raise PolicyError(
            f"policy {policy.name!r} returned order {reprlib.repr(order)} for chunk {chunk.index}; "
            f"it must be a permutation of the {n_dims} dims 0..{n_dims - 1}, as integers"
        )
    return values


@dataclass(slots=True)
class QueueView:
    """One dim's queue as an intra-dim policy sees it (the engine's own: read it, never modify it).

    Attributes:
        waiting: the waiting stages, head first (running stages are not in it).
        running: stages running on the dim now.
        compat: "" or "astra-sim-1.0" (ASTRA-sim's rules where they differ).
    """

    waiting: Sequence[Stage]
    running: int
    compat: str = ""


class IntraPolicy:
    """An intra-dim policy: where a newly queued stage goes among one dim's waiting stages."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def position(self, queue: QueueView, stage: Stage) -> int:
        """Index in ``queue.waiting`` before which the new stage goes (``len`` = the tail)."""
        raise NotImplementedError
