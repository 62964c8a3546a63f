"""Per-dim algorithms on real data: which element ranges each step sends and receives.

A stage works in place on a region ``[lo, hi)`` of the rank's buffer, split into P blocks with
`block_bounds`. After a reduce-scatter the rank with coordinate c along the dim owns block c;
an all-gather undoes exactly that split. Plans are pure functions of (algorithm, op, P, c,
region), so they are tested without MPI; `cost.steps` gives the same steps' nominal sizes.

A custom algorithm (``msccl:FILE`` on a dim) gives its own steps and stage times while a run
holds it (`custom_stages`): `plan` takes its steps for the dim's (built-in algorithm, size), and
one NPU's view (`timing.symmetric`) its times (`custom_stage`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from .collectives import block_bounds
from .cost import A2A, AG, AR, RS

COPY, REDUCE, SWAP = "copy", "reduce", "swap"


@dataclass(frozen=True)
class Step:
    """One algorithm step: messages sent and received at once.

    Attributes:
        sends: (peer, start, stop) element ranges sent from the buffer.
        recvs: (peer, start, stop) element ranges received.
        mode: copy (received straight into place), reduce (into scratch, then reduced into
            place) or swap (into scratch, copied into place once the sends are done).
    """

    sends: tuple[tuple[int, int, int], ...]
    recvs: tuple[tuple[int, int, int], ...]
    mode: str


class CustomStage(Protocol):
    """A custom algorithm as one dim's stages (`run.custom.DimStages` is one).

    Attributes:
        every_npu: its stages run on every NPU's links, each NPU by its own steps
            (`npu_steps`): one NPU's view cannot stand for the file where stages share links.
    """

    every_npu: bool

    def npu_steps(self, op: str, c: int, full_elems: int, itemsize: int) -> list[Step]:
        """The rank at coordinate c's steps of a stage on every NPU's links, one per level.

        Step k of every rank of the dim is the same level (a step with no messages where the
        rank has none), so a message sent in a rank's step k is received in its peer's.
        """
        ...

    def steps(self, op: str, c: int, lo: int, hi: int) -> list[Step]:
        """The steps of the rank at coordinate c on ``[lo, hi)``, as `plan` gives them."""
        ...

    def time_ns(self, op: str, full_elems: int, itemsize: int) -> float:
        """How long one stage of `full_elems` elements takes on the dim's links alone."""
        ...

    def load(self, op: str, full_elems: int, itemsize: int) -> tuple[float, dict[str, float]]:
        """What one such stage puts on the dim: (bytes an NPU sends, bytes each of its links carries).

        The links are named as `timing.links.physical_links` names the run's (``dim0.up``, ...).
        """
        ...

    def flow(self, op: str, full_elems: int, planner: Any) -> tuple[tuple[Any, ...], bool] | None:
        """One stage as steps over one NPU's links (`timing.links.Step`), and whether they use the same links.

        `planner` is the run's `timing.routes.StepPlanner` of the stage's element size (its
        links by name, their rates, its cost model). None: the stage is timed alone (`time_ns`).
        """
        ...


_CUSTOM: dict[tuple[str, int], CustomStage] = {}  # (algorithm name or msccl:FILE, dim size) -> stage


@contextmanager
def custom_stages(stages: Mapping[tuple[str, int], CustomStage]) -> Iterator[None]:
    """While it is held, `plan` and `custom_stage` take these stages for their (name, dim size)."""
    saved = dict(_CUSTOM)
    _CUSTOM.update(stages)
    try:
        yield
    finally:
        _CUSTOM.clear()
        _CUSTOM.update(saved)


def custom_stage(dim: Any) -> CustomStage | None:
    """The custom stage of a dim (`topology.Dim`) while a run holds it; None: its built-in algorithm.

    (A dim's ``msccl-auto:DIR`` whose files do not fit falls back to the built-in one.)
    """
    return _CUSTOM.get((dim.custom, dim.npus)) if dim.custom else None


def plan(algorithm: str, op: str, p: int, c: int, lo: int, hi: int, both_ways: bool = False) -> list[Step]:
    """The steps of one stage for the rank at coordinate c of a P-NPU dim, on ``[lo, hi)``.

    With `both_ways` the ring runs both ways round (`cost.ring_both_ways`): the first half of
    each block goes clockwise (to the next NPU), the second half counter-clockwise (to the
    previous one), in the same steps; block c still ends reduced on rank c.

    An AR stage (the baseline's All-Reduce phase on its last dim) is the RS steps, which leave
    block c reduced, followed by the AG steps, which spread every reduced block back over the
    whole region; the region stays ``[lo, hi)`` throughout.

    In-network aggregation (``ina``) has one step per stage, as its cost does; the switch's
    reduction is emulated over the sub-communicator: RS and AG run as direct steps, and an AR
    stage sends the whole region to every peer and reduces all they send into place.
    """
    custom = _CUSTOM.get((algorithm, p))
    if custom is not None and op != A2A:
        return custom.steps(op, c, lo, hi)
    if algorithm == "ina" and op == AR and p > 1:
        peers = [(j, lo, hi) for j in range(p) if j != c]
        return [Step(tuple(peers), tuple(peers), REDUCE)]
    if algorithm == "ina":
        algorithm = "direct"
    if algorithm == "nccl":  # the NCCL-like model moves data as a ring; `cost` times it flat
        algorithm = "ring"
    if op == AR:
        return plan(algorithm, RS, p, c, lo, hi, both_ways) + plan(algorithm, AG, p, c, lo, hi, both_ways)
    b = block_bounds(lo, hi, p)

    def blk(i: int) -> tuple[int, int]:
        return b[i % p], b[i % p + 1]

    def rng(first: int, last: int) -> tuple[int, int]:  # blocks first..last-1
        return b[first], b[last]

    if p == 1:
        return []
    if op == A2A:
        return plan_all_to_all(p, c, 1, p, lo, hi)
    if algorithm == "direct":
        others = [j for j in range(p) if j != c]
        if op == RS:
            return [Step(tuple((j, *blk(j)) for j in others), tuple((j, *blk(c)) for j in others), REDUCE)]
        return [Step(tuple((j, *blk(c)) for j in others), tuple((j, *blk(j)) for j in others), COPY)]
    if algorithm == "ring" and both_ways:
        return ring_steps_both_ways(op, p, c, b)
    if algorithm == "ring":
        nxt, prv = (c + 1) % p, (c - 1) % p
        if op == RS:
            return [Step(((nxt, *blk(c - s - 1)),), ((prv, *blk(c - s - 2)),), REDUCE) for s in range(p - 1)]
        return [Step(((nxt, *blk(c - s)),), ((prv, *blk(c - s - 1)),), COPY) for s in range(p - 1)]
    # halving-doubling (P is a power of two)
    steps = []
    if op == RS:
        first, last, m = 0, p, p // 2
        while m >= 1:
            partner = c ^ m
            mid = first + (last - first) // 2
            keep, give = ((mid, last), (first, mid)) if c & m else ((first, mid), (mid, last))
            steps.append(Step(((partner, *rng(*give)),), ((partner, *rng(*keep)),), REDUCE))
            first, last = keep
            m //= 2
        return steps
    m = 1
    while m < p:
        partner = c ^ m
        mine, theirs = c & ~(m - 1), partner & ~(m - 1)
        steps.append(Step(((partner, *rng(mine, mine + m)),), ((partner, *rng(theirs, theirs + m)),), COPY))
        m *= 2
    return steps


def ring_steps_both_ways(op: str, p: int, c: int, b: list[int]) -> list[Step]:
    """The ring's RS or AG steps both ways round on the blocks bounded by `b` (`plan`).

    The clockwise ring moves the first half of each block (to the next NPU, from the previous
    one), the counter-clockwise ring the second half, its mirror image.
    """
    nxt, prv = (c + 1) % p, (c - 1) % p

    def cw(i: int) -> tuple[int, int]:
        i %= p
        return b[i], b[i] + (b[i + 1] - b[i]) // 2

    def ccw(i: int) -> tuple[int, int]:
        i %= p
        return b[i] + (b[i + 1] - b[i]) // 2, b[i + 1]

    if op == RS:
        return [
            Step(
                ((nxt, *cw(c - s - 1)), (prv, *ccw(c + s + 1))),
                ((prv, *cw(c - s - 2)), (nxt, *ccw(c + s + 2))),
                REDUCE,
            )
            for s in range(p - 1)
        ]
    return [
        Step(((nxt, *cw(c - s)), (prv, *ccw(c + s))), ((prv, *cw(c - s - 1)), (nxt, *ccw(c + s + 1))), COPY)
        for s in range(p - 1)
    ]


def plan_all_to_all(p: int, c: int, stride: int, group: int, lo: int, hi: int) -> list[Step]:
    """One dim's stage of a hierarchical all-to-all on ``[lo, hi)``.

    The region holds `group` equal blocks, one per destination NPU of the group, numbered in
    mixed radix (dim 0 fastest); this dim's digit has weight `stride` and size `p`. The rank at
    coordinate c sends every block whose digit is k to the peer at k, and receives the peer's
    blocks into the same positions. After one stage per dim, block j holds what NPU j sent this
    NPU. Elements past ``group * floor(n / group)`` are padding and stay in place.
    """
    b = (hi - lo) // group
    steps_sends, steps_recvs = [], []
    for k in range(p):
        if k == c:
            continue
        blocks = [q for q in range(group) if (q // stride) % p == k]
        steps_sends += [(k, lo + q * b, lo + (q + 1) * b) for q in blocks]
        steps_recvs += [(k, lo + q * b, lo + (q + 1) * b) for q in blocks]
    return [Step(tuple(steps_sends), tuple(steps_recvs), SWAP)]
