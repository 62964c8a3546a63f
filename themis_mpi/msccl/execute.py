"""Prove an MSCCL algorithm without MPI: run every GPU's program on data in one process.

`run` follows a `program.Schedule` and applies each step's meaning to every GPU's memory:

| type | meaning (``recv``: the message received; ``+``: the reduction) |
| --- | --- |
| ``s`` | send ``src`` |
| ``r`` | ``dst = recv`` |
| ``rcs`` | ``dst = recv``, send it on |
| ``rrs`` | send ``recv + src`` on (nothing stored) |
| ``rrc`` | ``dst = recv + src`` |
| ``rrcs`` | ``dst = recv + src``, send it on |
| ``cpy`` | ``dst = src`` |
| ``re`` | ``dst = dst + src`` |
| ``nop`` | nothing (it only waits) |

The memory is an `Algebra`'s: numpy arrays of real elements (`run_data`: inputs from
`verify.input_values`, every other chunk NaN, the result compared element by element with what
the collective must give), or symbolic chunks (`run_symbolic`: each input chunk is the set of one
contribution, a reduction the union of multisets, and every output chunk must hold exactly the
contributions the collective sums there). Every step moves whole chunks and treats every element
of a chunk alike, so the symbolic run proves the algorithm for any size; with `check.races` (no
two unordered steps touch a chunk that one of them writes) it holds for every order the runtime
may take, not only the schedule's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..collectives import DEFAULT_DTYPE
from ..errors import UsageError
from ..verify import input_values
from .ir import (
    COPY,
    OUTPUT,
    RECV_REDUCE_COPY,
    RECV_REDUCE_COPY_SEND,
    RECV_REDUCE_SEND,
    REDUCE,
    ROOT,
    SEND,
    Algorithm,
)
from .program import GpuProgram, Op, Ref, View, connection, schedule, storage_chunks, views

Contribution = tuple[int, int]  # (GPU, chunk of its input)
Value = tuple[Contribution, ...] | None  # a chunk as a sorted multiset of contributions; None: nothing
REDOPS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


@dataclass
class Algebra:
    """What a chunk is: how storages are made, and how two chunks reduce."""

    new: Callable[[int], Any]  # a storage of n chunks, every chunk empty
    reduce: Callable[[Any, Any], Any]  # two runs of chunks, reduced chunk by chunk


class Memory:
    """One GPU's storages, seen through its buffers' views (``i``, ``o``, ``s``)."""

    def __init__(self, views_: dict[str, View], sizes: dict[str, int], algebra: Algebra):
        self.views = views_
        self.storages = {name: algebra.new(n) for name, n in sizes.items()}

    def span(self, ref: Ref) -> tuple[Any, int, int]:
        """The storage of a reference and its chunk range there."""
        view = self.views[ref.buffer]
        return self.storages[view.storage], view.base + ref.offset, view.base + ref.offset + ref.count

    def read(self, ref: Ref) -> Any:
        """A copy of the chunks."""
        storage, a, b = self.span(ref)
        return storage[a:b].copy()

    def write(self, ref: Ref, value: Any) -> None:
        """Store chunks."""
        storage, a, b = self.span(ref)
        storage[a:b] = value


def apply(op: Op, mem: Memory, algebra: Algebra, received: Any = None) -> Any:
    """One step on one GPU's memory (module doc's table): what it sends, given what it received.

    This is all a runtime needs of a step's meaning; it moves the messages itself (here `run`,
    under MPI the emulator).
    """
    data = received
    src = None if op.src is None else mem.read(op.src)
    if op.type in (RECV_REDUCE_SEND, RECV_REDUCE_COPY, RECV_REDUCE_COPY_SEND):
        data = algebra.reduce(received, src)
    elif op.type == REDUCE and op.dst is not None:
        data = algebra.reduce(mem.read(op.dst), src)
    elif op.type in (SEND, COPY):
        data = src
    if op.dst is not None:
        mem.write(op.dst, data)
    return data if op.send_peer >= 0 else None


def run(progs: tuple[GpuProgram, ...], order, memories: list[Memory], algebra: Algebra) -> None:
    """Apply every step in `order` (a `Schedule.order`), messages passed in memory."""
    mail: dict[tuple[int, int, int, int], Any] = {}
    for g, t, k in order:
        op = progs[g].threadblocks[t][k]
        received = mail.pop(connection(op, g, False)) if op.recv_peer >= 0 else None
        sent = apply(op, memories[g], algebra, received)
        if op.send_peer >= 0:
            mail[connection(op, g, True)] = sent


def expected(algo: Algorithm, gpu: int) -> list[Value]:
    """What each output chunk of a GPU must hold: the contributions the collective puts there.

    None where the collective leaves a chunk unspecified (a reduce's non-root outputs).
    """
    p, c = algo.ngpus, algo.nchunksperloop
    k = c // p
    everyone = range(p)
    coll = algo.coll
    if coll == "allreduce" or (coll == "reduce" and gpu == ROOT):
        return [tuple((q, j) for q in everyone) for j in range(c)]
    if coll == "reduce":
        return [None] * c
    if coll == "broadcast":
        return [((ROOT, j),) for j in range(c)]
    if coll == "allgather":
        return [((j // k, j % k),) for j in range(c)]
    if coll == "reduce_scatter":
        return [tuple((q, gpu * k + j) for q in everyone) for j in range(k)]
    return [((j // k, gpu * k + j % k),) for j in range(c)]  # alltoall


def _merge(a: Value, b: Value) -> Value:
    return None if a is None or b is None else tuple(sorted(a + b))


SYMBOLIC = Algebra(new=lambda n: [None] * n, reduce=lambda a, b: [_merge(x, y) for x, y in zip(a, b)])


def _memories(algo: Algorithm, inplace: bool, algebra: Algebra) -> list[Memory]:
    return [
        Memory(views(algo, g, inplace), storage_chunks(algo, g, inplace), algebra) for g in range(algo.ngpus)
    ]


def describe(value: Value) -> str:
    """A chunk's contributions in words: ``input chunk 3 of GPUs 0-7``, ``nothing``..."""
    if value is None:
        return "nothing (never written, or reduced with such a chunk)"
    by_chunk: dict[int, list[int]] = {}
    for g, j in value:
        by_chunk.setdefault(j, []).append(g)
    parts = []
    for j, gs in sorted(by_chunk.items()):
        twice = len(gs) != len(set(gs))
        ranks = sorted(set(gs))
        span = (
            f"{ranks[0]}-{ranks[-1]}"
            if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2
            else (",".join(map(str, ranks)))
        )
        parts.append(
            f"input chunk {j} of GPU{'s' if len(ranks) > 1 else ''} {span}{' (some twice)' if twice else ''}"
        )
    return " + ".join(parts)


def _output_ref(algo: Algorithm, gpu: int, inplace: bool) -> Ref:
    return Ref(OUTPUT, 0, views(algo, gpu, inplace)[OUTPUT].size)


def run_symbolic(algo: Algorithm, progs: tuple[GpuProgram, ...], order, inplace: bool) -> list[str]:
    """Every output chunk that does not hold what the collective puts there, in words (module doc)."""
    memories = _memories(algo, inplace, SYMBOLIC)
    for g, mem in enumerate(memories):
        view = mem.views["i"]
        mem.write(Ref("i", 0, view.size), [((g, j),) for j in range(view.size)])
    run(progs, order, memories, SYMBOLIC)
    wrong = []
    for g, mem in enumerate(memories):
        got = mem.read(_output_ref(algo, g, inplace))
        for j, (want, have) in enumerate(zip(expected(algo, g), got)):
            if want is not None and want != have:
                wrong.append(
                    f"GPU {g} output chunk {j} holds {describe(have)}, but the {algo.coll} puts "
                    f"{describe(want)} there"
                )
    return wrong


@dataclass(frozen=True)
class DataCheck:
    """The result of a run on numpy data.

    Attributes:
        wrong: elements of all outputs that differ from the collective's result.
        elements: elements checked.
        first: the first wrong output chunk in words ("" when all are right).
    """

    wrong: int
    elements: int
    first: str = ""


def run_data(
    algo: Algorithm,
    progs: tuple[GpuProgram, ...],
    order,
    inplace: bool,
    elems_per_chunk: int = 3,
    dtype: str = DEFAULT_DTYPE,
    redop: str = "sum",
) -> DataCheck:
    """Run on real numpy chunks of `elems_per_chunk` elements and count the wrong output elements.

    Input chunk j of GPU g holds ``input_values(g, P, j*E, (j+1)*E)``; everything else starts as
    NaN (-1 for integer types), so an output the algorithm never writes is wrong.
    """
    e, p = elems_per_chunk, algo.ngpus
    fill = np.nan if np.dtype(dtype).kind == "f" else -1
    numeric = Algebra(new=lambda n: np.full((n, e), fill, dtype=dtype), reduce=REDOPS[redop])

    def chunk_values(g: int, j: int) -> np.ndarray:
        return input_values(g, p, j * e, (j + 1) * e, dtype)

    memories = _memories(algo, inplace, numeric)
    for g, mem in enumerate(memories):
        size = mem.views["i"].size
        mem.write(Ref("i", 0, size), np.array([chunk_values(g, j) for j in range(size)]).reshape(size, e))
    run(progs, order, memories, numeric)
    wrong, total, first = 0, 0, ""
    for g, mem in enumerate(memories):
        got = mem.read(_output_ref(algo, g, inplace))
        for j, want in enumerate(expected(algo, g)):
            if want is None:
                continue
            value = REDOPS[redop].reduce([chunk_values(q, i) for q, i in want], axis=0)
            bad = int(np.count_nonzero(got[j] != value))
            total += e
            wrong += bad
            if bad and not first:
                x = int(np.argmax(got[j] != value))
                first = (
                    f"GPU {g} output chunk {j}: {bad} of {e} elements differ from the {algo.coll}'s "
                    f"result (element {x} holds {got[j][x]:g}, expected {value[x]:g})"
                )
    return DataCheck(wrong, total, first)


@dataclass(frozen=True)
class Proof:
    """What `prove` found, per placement the algorithm declares.

    Attributes:
        placements: the placements run ("in place", "out of place").
        symbolic: output chunks that hold the wrong contributions, in words.
        data: the numpy runs, one per placement.
    """

    placements: tuple[str, ...]
    symbolic: tuple[str, ...]
    data: tuple[DataCheck, ...]

    @property
    def ok(self) -> bool:
        """Whether the algorithm computes its collective."""
        return not self.symbolic and not any(d.wrong for d in self.data)

    def first(self) -> str:
        """The first wrong result in words."""
        return self.symbolic[0] if self.symbolic else next(d.first for d in self.data if d.wrong)


def prove(algo: Algorithm, progs: tuple[GpuProgram, ...], elems_per_chunk: int = 3) -> Proof:
    """Run a checked algorithm symbolically and on numpy data, in each placement it declares."""
    order = schedule(progs).order
    names, symbolic, data = [], [], []
    for inplace in algo.placements:
        names.append("in place" if inplace else "out of place")
        symbolic += run_symbolic(algo, progs, order, inplace)
        data.append(run_data(algo, progs, order, inplace, elems_per_chunk))
    return Proof(tuple(names), tuple(symbolic), tuple(data))


def require_proof(algo: Algorithm, progs: tuple[GpuProgram, ...], source: str) -> Proof:
    """`prove`, with a wrong result as one `UsageError` line."""
    proof = prove(algo, progs)
    if not proof.ok:
        raise UsageError(f"{source}: wrong result: {proof.first()}")
    return proof
