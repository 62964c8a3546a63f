"""Collectives: chunking, the stage list of each chunk, and which block a rank owns.

A collective of ``count`` elements per NPU is split into C chunks of nearly equal size (they
differ by at most one element, the way `numpy.array_split` splits). Each chunk becomes a list of
stages, one per dim visit, built from the chunk's dim order (see `policies`).

Sizes: ``size_bytes`` is the larger buffer of the operation, the input of a reduce-scatter and
the output of an all-gather, so that the algbw/busbw of nccl-tests apply unchanged.

Timing prices bytes, never elements: the data path moves whole elements of the dtype, but a
stage is priced at the collective's nominal bytes in 4-byte words (`PRICED_ITEMSIZE`), split at
word granularity (`priced_chunks`, then `chunk_plan` on words), so a time does not depend on the
element type (and a float32 run keeps the times it always had).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .cost import A2A, AG, AR, RS, block_elems
from .errors import UsageError
from .limits import MAX_CHUNKS, MAX_SIZE_BYTES
from .nccl import CALL
from .topology import Topology

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast")
PER_DIM_OPS = OPS[:4]  # what per-dim stages run: broadcast only on nccl dims (the NCCL-like model)
DTYPES = ("float32", "float64", "int32", "int64")
DEFAULT_DTYPE = "float64"  # every command's and the API's element type (a time does not depend on it)
REDOPS = ("sum", "max", "min")
AR_EVERY_DIM = 2  # `fuse_last` value of ASTRA-sim 2.x's baseline: a full AR stage on every dim


def block_bounds(lo: int, hi: int, parts: int) -> list[int]:
    """Bounds of `parts` nearly equal pieces of [lo, hi): piece i is [b[i], b[i+1])."""
    q, r = divmod(hi - lo, parts)
    return [lo + i * q + min(i, r) for i in range(parts + 1)]


def split_bounds(n: int, parts: int) -> np.ndarray:
    """`block_bounds` of [0, n) as an int64 array."""
    return np.array(block_bounds(0, n, parts), dtype=np.int64)


@dataclass(slots=True)
class Stage:
    """One chunk's visit of one dim (read-only by convention: frozen would cost 5x to create).

    Attributes:
        coll: collective id (issue order).
        chunk: chunk index within the collective.
        index: position in the chunk's stage list.
        n_stages: stages of the chunk.
        dim: dim index.
        op: RS, AG, AR (an all-reduce on one dim: RS then AG steps) or A2A.
        full_elems: nominal units before an RS, after an AG (the stage's larger buffer), priced
            at `itemsize` bytes each: timing prices bytes, so stages are built in priced words
            (`PRICED_ITEMSIZE`, `priced_chunks`) whatever the dtype the data moves in.
        key_bytes: the SCF key: the larger of the stage's input and output bytes.
        itemsize: bytes per unit of `full_elems` (`PRICED_ITEMSIZE`).
        plan: the chunk's whole plan ``((dim, op, full_elems), ...)``: the NCCL-like model
            (`cost.CostModel.flat_steps_ns`) times a stage from it.
    """

    coll: int
    chunk: int
    index: int
    n_stages: int
    dim: int
    op: str
    full_elems: int
    key_bytes: int
    itemsize: int
    plan: tuple = ()


@dataclass(frozen=True)
class Collective:
    """A collective as issued: operation, elements per NPU, dtype, chunks, involved dims.

    Attributes:
        op: all_reduce, reduce_scatter, all_gather or all_to_all.
        count: elements of the larger buffer per NPU.
        dtype: numpy dtype name.
        chunks: requested chunk count (capped at `count`).
        dims: involved dim indices.
        redop: sum, max or min.
        nominal_bytes: the bytes the collective stands for, which timing prices (a size that is
            no multiple of the element, e.g. a workload's 1000003 B); 0 means ``count x
            itemsize``. `of_bytes` makes a collective from it.
    """

    op: str
    count: int
    dtype: str
    chunks: int
    dims: tuple[int, ...]
    redop: str = "sum"
    nominal_bytes: int = 0

    @classmethod
    def of_bytes(
        cls, op: str, size_bytes: int, dtype: str, chunks: int, dims: tuple[int, ...], redop: str = "sum"
    ) -> Collective:
        """The collective of `size_bytes` nominal bytes: its whole elements (at least one) move."""
        count = max(1, int(size_bytes) // np.dtype(dtype).itemsize) if dtype in DTYPES else 1
        return cls(op, count, dtype, chunks, dims, redop, int(size_bytes))

    def __post_init__(self):
        if self.op not in OPS:
            raise UsageError(f"unknown op {self.op!r}; use one of {', '.join(OPS)}")
        if self.dtype not in DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}; use one of {', '.join(DTYPES)}")
        if self.redop not in REDOPS:
            raise UsageError(f"unknown reduction {self.redop!r}; use one of {', '.join(REDOPS)}")
        if self.count < 1:
            raise UsageError(f"size must be at least one element, got {self.count} elements")
        if self.nominal_bytes and max(1, self.nominal_bytes // self.itemsize) != self.count:
            raise UsageError(
                f"{self.nominal_bytes} B is not {self.count} {self.dtype} elements (nominal_bytes)"
            )
        if self.size_bytes > MAX_SIZE_BYTES:
            raise UsageError(f"size must be at most {MAX_SIZE_BYTES} B per NPU, got {self.size_bytes} B")
        if not 1 <= self.chunks <= MAX_CHUNKS:
            raise UsageError(f"chunks must be >= 1 and at most {MAX_CHUNKS}, got {self.chunks}")

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return np.dtype(self.dtype).itemsize

    @property
    def size_bytes(self) -> int:
        """Nominal bytes of the larger buffer per NPU (what timing prices)."""
        return self.nominal_bytes or self.count * self.itemsize

    @property
    def n_chunks(self) -> int:
        """Chunks really used: no chunk is empty."""
        return min(self.chunks, self.count)

    def chunk_bounds(self) -> np.ndarray:
        """Element bounds of the chunks in the buffer."""
        return split_bounds(self.count, self.n_chunks)


PRICED_ITEMSIZE = 4  # bytes of a priced word: a unit of `Stage.full_elems` (float32's element)


def priced_words(collective: Collective) -> int:
    """The collective's nominal bytes in priced words (rounded down, at least one)."""
    return max(1, collective.size_bytes // PRICED_ITEMSIZE)


def priced_chunks(collective: Collective, bounds) -> tuple[int, list[int], int]:
    """How timing prices a schedule's chunks (`bounds`): unit bytes, units per chunk, units in all.

    The one place that turns a schedule's chunks into priced sizes, in words of
    `PRICED_ITEMSIZE` B whatever the element type. Nearly equal chunks (as
    `Collective.chunk_bounds` cuts them, whatever their count) are the collective's nominal words
    split into as many chunks; bounds that end at `priced_words` (a policy that sizes its chunks,
    themisFlex) are word bounds already (`element_bounds` maps them onto elements). A float32
    collective's words are its elements: its times are unchanged. Other uneven bounds (a
    plugin's schedule in elements) are priced in those elements.
    """
    n, words = len(bounds) - 1, priced_words(collective)
    if np.array_equal(bounds, split_bounds(collective.count, n)):
        return PRICED_ITEMSIZE, np.diff(split_bounds(words, n)).tolist(), words
    sizes = np.diff(np.asarray(bounds, dtype=np.int64)).tolist()
    if bounds[-1] == words:
        return PRICED_ITEMSIZE, sizes, words
    return collective.itemsize, sizes, collective.count


def element_bounds(collective: Collective, bounds) -> np.ndarray:
    """The element bounds the data moves in, for a schedule's bounds (words or elements).

    Bounds that end at the collective's count are element bounds, returned as they are (a
    float32 collective's words are its elements). Word bounds, which end at `priced_words`, map
    word w to element ``w * PRICED_ITEMSIZE // itemsize``: an element moves with the chunk whose
    words hold its last byte. Monotone, from 0 to the count, so every element moves exactly once.
    A chunk of words that holds no element's last byte (a 1-word float64 chunk at an even word)
    gets zero elements: it is still timed at its words, and its stages move no data.
    """
    bounds = np.asarray(bounds, dtype=np.int64)
    if bounds[-1] == collective.count:
        return bounds
    return bounds * PRICED_ITEMSIZE // collective.itemsize


def active_dims(topology: Topology, collective: Collective, order) -> list[int]:
    """The order restricted to involved dims with more than one NPU."""
    return [int(d) for d in order if d in collective.dims and topology.dims[d].npus > 1]


def rs_dims(topology: Topology, collective: Collective, order) -> list[int]:
    """The dims a chunk reduce-scatters over, in order (an all-gather's, reversed)."""
    dims = active_dims(topology, collective, order)
    return dims[::-1] if collective.op == "all_gather" else dims


def owned_region(p: int, c: int, lo: int, hi: int) -> tuple[int, int]:
    """The block of [lo, hi) a reduce-scatter over P NPUs leaves at coordinate c.

    It is also the region an all-gather starts from. The one place that says which block a rank
    owns: the algorithms, the MPI transport and the checks all use it.
    """
    b = block_bounds(lo, hi, p)
    return b[c], b[c + 1]


def chunk_plan(
    topology: Topology, collective: Collective, chunk_elems: int, order, fuse_last: int = False
) -> list[tuple]:
    """A chunk's stages as ``(dim, op, full_elems)``, in execution order.

    Sizes are in whatever unit `chunk_elems` is: the engine gives priced words (`priced_chunks`).

    All-reduce: reduce-scatter along `order`, then all-gather back along its reverse. The last
    dim's RS and AG are separate stages (Themis), or with `fuse_last` one AR stage that holds
    the dim for both halves (the baseline: ASTRA-sim's ``Sys::generate_collective`` with
    ``localBWAware`` builds an All-Reduce phase there). An ina last dim is always one AR stage:
    in-network aggregation reduces and returns the chunk in one pass through the switch, where
    separate halves would send it up twice.
    With ``fuse_last == AR_EVERY_DIM`` (ASTRA-sim 2.x's ``baseline`` optimization) an all-reduce
    is one AR stage of the whole chunk on every dim in turn.
    Reduce-scatter: RS along `order`. All-gather: AG along `order`, growing to `chunk_elems`.
    All-to-all: one A2A stage per dim along `order`, size unchanged.
    Broadcast (nccl dims only: the NCCL-like model times it): an all-gather's stages, then a
    ``(CALL, "broadcast", 0)`` item that names the call's collective to `nccl.plan_collective`.
    """
    op = collective.op
    if op == "broadcast":
        if not topology.flat:
            raise UsageError(
                "broadcast is timed by the NCCL-like model only: give a topology of nccl dims "
                "(e.g. a calibrate fit, -t FIT.json); per-dim stages have no broadcast"
            )
        gather = replace(collective, op="all_gather")
        return [*chunk_plan(topology, gather, chunk_elems, order, fuse_last), (CALL, op, 0)]
    if op == "all_to_all":
        return [(d, A2A, chunk_elems) for d in active_dims(topology, collective, order)]
    down = rs_dims(topology, collective, order)
    sizes, n = [], chunk_elems
    for d in down:
        sizes.append(n)
        n = block_elems(n, topology.dims[d].npus)
    rs = [(d, RS, s) for d, s in zip(down, sizes)]
    ag = [(d, AG, s) for d, s in zip(down[::-1], sizes[::-1])]
    plan = {"all_reduce": rs + ag, "reduce_scatter": rs, "all_gather": ag}[op]
    if op == "all_reduce" and fuse_last == AR_EVERY_DIM:
        return [(d, AR, chunk_elems) for d in down]
    if op == "all_reduce" and rs and (fuse_last or topology.dims[rs[-1][0]].algorithm == "ina"):
        plan = [*rs[:-1], (rs[-1][0], AR, rs[-1][2]), *ag[1:]]
    return plan


class ChunkStages(Sequence[Stage]):
    """One chunk's stages, each made when asked (as the engine queues it), from the chunk's plan.

    A collective queues all its chunks at once and most wait: made up front, their stages were
    most of a long run's memory on every NPU's links (issue 43).

    Args:
        items: the chunk's stages as ``(dim, op, full_elems)``.
        coll: the collective's id.
        chunk: the chunk's index.
        unit_bytes: bytes a unit of ``full_elems`` is priced at.
        whole: the chunk's whole plan (`Stage.plan`).
    """

    __slots__ = ("items", "coll", "chunk", "unit_bytes", "whole")

    def __init__(self, items: tuple, coll: int, chunk: int, unit_bytes: int, whole: tuple):
        self.items, self.coll, self.chunk, self.unit_bytes, self.whole = items, coll, chunk, unit_bytes, whole

    @classmethod
    def of(
        cls, plan: list[tuple], coll_id: int, chunk: int, unit_bytes: int, call: tuple = ()
    ) -> ChunkStages:
        """The stages of one chunk's plan (`chunk_plan` on priced units of `unit_bytes`).

        `call` ends the stages' plan on a flat (NCCL-like) topology: ``(("call", call units, first
        chunk),)``, so that `nccl.chunk_ns` gives the chunk its share of the whole call; a plan's own
        `CALL` items (a broadcast's) go there too.
        """
        items = tuple(item for item in plan if item[0] != CALL)
        whole = items + tuple(call) + tuple(item for item in plan if item[0] == CALL)
        return cls(items, coll_id, chunk, unit_bytes, whole)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: Any) -> Any:
        d, kind, full = self.items[i]
        unit = self.unit_bytes
        return Stage(self.coll, self.chunk, i, len(self.items), d, kind, full, full * unit, unit, self.whole)


def chunk_stages(
    topology: Topology,
    collective: Collective,
    coll_id: int,
    chunk: int,
    chunk_units: int,
    order,
    fuse_last: int = False,
    unit_bytes: int = PRICED_ITEMSIZE,
) -> list[Stage]:
    """The stages of one chunk of `chunk_units` priced units (`priced_chunks`), in execution order."""
    plan = chunk_plan(topology, collective, chunk_units, order, fuse_last)
    return list(ChunkStages.of(plan, coll_id, chunk, unit_bytes))
