"""NPUs that provably see the same events, each class simulated once (`Classes`, `npu_classes`).

A straggler (a late NPU, a slow NPU's compute, a scaled link) breaks the symmetry that lets one
NPU's view time a run, but most NPUs still behave alike. Colour refinement finds which: NPUs
start coloured by what sets them apart (their delay, their program's kind, their links' scales)
and are split, round after round, by the colours of the NPUs they send to and receive from at
each step of each stage pattern the run uses (the step's peers at distances on one dim,
`routes.StepPlanner.stage_peers`), until no class splits. The result is an equitable partition:
two NPUs of one class see, at every step, the same number of peers of each class with the same
shares. By induction over the run's events, NPUs of one class then start and end every stage at
the same times (they start alike, and every step ends from the ends of peers alike), so one
representative per class (its lowest rank) stands for all.

On every NPU's links (`world.World`) a representative's transfer crosses its own links and its
receivers' down-links; the class of those receivers holds ``|B|`` links that ``|A|`` senders load
alike, so on the representative's link of that class its transfer counts ``|A| / |B|`` times
its share summed over that class (`Classes.step`): the load every such link carries in the run
of every NPU. That is exact for a rule where a transfer's share on a link is what it takes of the
link at its rate, fluid max-min sharing (`FLUID`: ``fair``); under a rule that queues messages
one by one (``store-forward``) or any other, every NPU runs. A stage pattern the classes were not
refined by stops the run (`Unproven`), which starts again refined by it (`world.by_classes`).

**Messages.** Ranks of one kind (`kinds`) run one program whose point-to-point peers lie at the
same rank offsets (a generated LLM's ranks of one pipeline stage: `workloads.llm.LazyTraces.kind`).
A message pattern (`Message`: the sender's kind, the offset to its receiver) refines as a stage
pattern does: every NPU by the class of the NPU it sends to at that offset and of the one it
receives from. Then ``r -> r + offset`` maps the senders' class A one to one onto the receivers'
class B (each member of A sends into B, each member of B receives from A), so ``|A| = |B|``, and
the representatives' message (A's sends, B's receives, matched by the classes, tag, offset and
order: `world.World._message`) stands for each member's, its share on B's links weighed
``|A| / |B| = 1``. A message whose route crosses a third NPU's links (a Ring's hops, a second
dim's switch) refines so by each such NPU too, at its offset from the sender (every sender's
route must cross NPUs at the same offsets, else every NPU runs: `Inexact`): its class C is then
A moved by that offset, ``|C| = |A|``, and the share there counts once as well.

**The packet rule** (`packet`) is admitted where every weight is 1 (`Classes.step` checks each
step it weighs, `Inexact` otherwise: every NPU runs; e.g. NPUs alike but for their pipeline
stage, not a lone straggler's class of 1 sending to a class of 7). Then each representative's
link carries, transfer for transfer, the transfers a member's link carries in the run of every
NPU: the same shares and messages (`PacketStep.messages`, kept through the weighing), so the
per-message max-min rates are the same. What else packet decides is per sender link (its queue
of whole-packet transfers, the round robin that starts a transfer a packet after the one before,
the half packet of residual wait): those links are an NPU's own (`PacketStep.sends`): they
carry that NPU's own transfers, which a representative starts in the order any member does, and
the messages it forwards, one per sender of a class moved one to one onto its own (a message's
route, above), the same in the representatives' run. A receiver's down-link
may merge two members' transfers into one of twice the share (two receivers of one class),
which the max-min rates and the packet rule's "is anything on this link" tests treat alike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import RunConfig
from ..topology import Topology
from .fair import Fair
from .links import Step, one_transfer
from .packet import Packet
from .rules import rule_class

FLUID: tuple[type, ...] = (Fair,)  # rules where a share counts as that many transfers (module doc)
UNIT: tuple[type, ...] = (Packet,)  # rules admitted where every share counts once (module doc)
Pattern = tuple[int, tuple[tuple[tuple[int, float], ...], ...]]  # (dim, per step (distance, share)s)
Message = tuple[int, int]  # (the sender's kind, the receiver's rank less the sender's)


class Unproven(Exception):
    """A stage pattern the classes were not refined by: the run stops, to run again refined by it."""

    def __init__(self, pattern: Pattern | None = None, message: Message | None = None):
        what = f"a stage pattern on dim {pattern[0]}" if pattern else f"a message pattern {message}"
        super().__init__(f"{what} the classes were not refined by")
        self.pattern, self.message = pattern, message


class Inexact(Exception):
    """A step classes cannot weigh exactly under the run's rule (module doc): every NPU runs."""


def fluid(rule: str) -> bool:
    """Whether a rule's transfers may stand for several (`FLUID`): classes run on its links, any weights.

    The rule's own class, not a subclass: `packet` builds on `fair`'s machinery, but its
    per-sender order of packets is no fluid share (it is admitted where every weight is 1: `UNIT`).
    """
    return rule_class(rule) in FLUID


def admitted(rule: str) -> bool:
    """Whether classes may run under a rule: a fluid one, or one checked run by run (`UNIT`)."""
    return fluid(rule) or rule_class(rule) in UNIT


@dataclass(frozen=True)
class Classes:
    """NPUs in classes that see the same events (module doc).

    Attributes:
        of: every rank's class.
        reps: each class's representative, its lowest rank (ascending: rank 0 first).
        sizes: each class's NPUs.
        patterns: the stage patterns the classes are refined by.
        kinds: every rank's kind, numbered (0: none given).
        messages: the message patterns the classes are refined by.
    """

    of: np.ndarray
    reps: tuple[int, ...]
    sizes: np.ndarray
    patterns: frozenset[Pattern]
    kinds: np.ndarray
    messages: frozenset[Message] = frozenset()

    @property
    def count(self) -> int:
        """How many classes (NPUs simulated)."""
        return len(self.reps)

    def rep(self, rank: int) -> int:
        """The representative of a rank's class."""
        return self.reps[self.of[rank]]

    def step(self, rank: int, step: Step, per_npu: int, capacity: list[float], unit: bool = False) -> Step:
        """A representative's step on representatives' links, its shares weighed by class sizes (module doc).

        Link ``j * per_npu + x`` (NPU j's link x) becomes its representative's link x; a share
        there counts ``|A| / |B|`` times, A the sender's class and B that NPU's. With `unit`
        (a rule admitted where every weight is 1), any other weight raises `Inexact`.
        """
        a = self.sizes[self.of[rank]]
        hops = []
        for hop in step.hops:
            usage: dict[int, float] = {}
            for link, share in hop:
                j, x = divmod(link, per_npu)
                b = self.of[j]
                if unit and a != self.sizes[b]:
                    raise Inexact(f"a class of {a} NPUs sends to one of {self.sizes[b]}")
                q = self.reps[b] * per_npu + x
                usage[q] = usage.get(q, 0.0) + share * float(a / self.sizes[b])
            hops.append(tuple(usage.items()))
        (made,) = step.transfers
        return one_transfer(
            step.bytes, tuple(hops), step.delay_ns, capacity, made.messages, made.message_bytes
        )

    def recvs(self, ranks: Iterable[int]) -> tuple[int, ...]:
        """The representatives of the NPUs a step receives from."""
        return tuple(sorted({self.rep(r) for r in ranks}))

    def consumers(self, ranks: Iterable[int]) -> int:
        """How many representatives take a transfer sent to these NPUs: their classes."""
        return len({int(self.of[r]) for r in ranks})


def pattern_key(dim: int, peers: tuple[tuple[tuple[int, float], ...], ...]) -> Pattern:
    """A stage's pattern: its dim and its distinct steps' peers (order and repeats do not split NPUs)."""
    return dim, tuple(sorted(set(peers)))


def npu_classes(
    topology: Topology,
    config: RunConfig,
    kinds: Mapping[int, Any],
    patterns: Iterable[Pattern],
    messages: Iterable[Message] = (),
    vias: Callable[[int, int], set[int]] | None = None,
    likely: Iterable[Message] = (),
) -> Classes:
    """The coarsest classes of NPUs alike in their start and in their peers' classes (module doc).

    Args:
        topology: the network.
        config: the run settings: late NPUs and scaled links set NPUs apart.
        kinds: what else sets an NPU's program apart (e.g. its compute factor, its graph), by rank.
        patterns: the stage patterns to refine by.
        messages: the message patterns to refine by.
        vias: the NPUs a message from one NPU to another crosses the links of (its ends too);
            needed with `messages`.
        likely: message patterns the run may meet (`message_family`), refined by where they
            can be proven, left out where not.
    """
    n = topology.npus
    kind_ids: dict[str, int] = {}
    kind_of = np.zeros(n, np.int64)
    for r, kind in sorted(kinds.items()):
        kind_of[r] = kind_ids.setdefault(repr(kind), len(kind_ids) + 1)
    keys: dict[int, list] = defaultdict(list)
    for r, delay_ns in config.npu_delay_ns:
        keys[r].append(("late", float(delay_ns)))
    for r in kinds:
        keys[r].append(("kind", int(kind_of[r])))
    for d, r, f in config.link_scale:
        keys[r].append(("link", d, float(f)))
    colour = np.zeros(n, np.int64)
    distinct: dict[tuple, int] = {}
    for r, key in sorted(keys.items()):
        colour[r] = distinct.setdefault(tuple(sorted(key)), len(distinct) + 1)
    patterns, messages = frozenset(patterns), set(messages)
    tables = [t for d, steps in sorted(patterns) for step in steps for t in _tables(topology, d, step)]
    for kind, offset in sorted(messages | set(likely)):
        assert vias is not None, "message patterns need their routes"
        try:
            tables += _message_tables(kind_of, kind, offset, vias)
        except Inexact:
            if (kind, offset) in messages:
                raise
            continue
        messages.add((kind, offset))
    count = len(np.unique(colour))
    while True:
        padded = np.append(colour, -1)  # (index n: no such peer)
        columns = [colour[:, None]] + [np.sort(padded[t], axis=1) for t in tables]
        _, colour = np.unique(np.concatenate(columns, axis=1), axis=0, return_inverse=True)
        colour = colour.ravel()
        new = int(colour.max()) + 1
        if new == count:
            break
        count = new
    _, first = np.unique(colour, return_index=True)
    order = np.argsort(first)  # classes by their lowest rank
    renumber = np.empty_like(order)
    renumber[order] = np.arange(len(order))
    of = renumber[colour]
    reps = tuple(int(r) for r in first[order])
    return Classes(of, reps, np.bincount(of), patterns, kind_of, frozenset(messages))


def message_family(kind_of: np.ndarray, message: Message) -> set[Message]:
    """A message pattern met, and its likes: every kind's at that offset either way (`npu_classes`' `likely`).

    Refining by a pattern no NPU sends keeps the classes exact (only finer), and a pipeline's
    stages send at one offset forward and back: one run learns them all.
    """
    return {(int(kind), o) for kind in np.unique(kind_of) for o in (message[1], -message[1])} | {message}


def _message_tables(
    kind_of: np.ndarray, kind: int, offset: int, vias: Callable[[int, int], set[int]]
) -> list[np.ndarray]:
    """A message pattern's tables: per NPU its peer at each offset of the route, and who routes via it.

    The offsets are the receiver's and those of the NPUs whose links the route crosses; each
    table's twin holds, per NPU, the sender of that kind whose route puts it there (index n
    where an NPU has none). The route must cross NPUs at the same offsets from every sender of
    the kind, within range; else they cannot be proven alike (`Inexact`).
    """
    n = len(kind_of)
    ranks = np.arange(n)
    senders = kind_of == kind
    members = ranks[senders]
    if members.min() + offset < 0 or members.max() + offset >= n:
        raise Inexact(f"NPUs of one kind send at offset {offset} past the last NPU")
    ats = {tuple(sorted({v - int(r) for v in vias(int(r), int(r) + offset)} | {offset})) for r in members}
    if len(ats) > 1:
        raise Inexact(f"messages at offset {offset} cross NPUs at different offsets from their senders")
    out = []
    for at in ats.pop():
        if at == 0:
            continue
        frm = ranks - at
        inside = (frm >= 0) & (frm < n)
        back = np.where(inside & senders[np.clip(frm, 0, n - 1)], frm, n)
        out += [np.where(senders, ranks + at, n)[:, None], back[:, None]]
    return out


def _tables(topology: Topology, d: int, step: tuple[tuple[int, float], ...]) -> list[np.ndarray]:
    """A step's neighbour tables: per share, every NPU's peers ahead, and (a table each) behind."""
    dim, n = topology.dims[d], topology.npus
    stride = int(np.prod(topology.shape[:d], dtype=np.int64))
    ranks = np.arange(n)
    c = (ranks // stride) % dim.npus
    by_share: dict[float, list[int]] = defaultdict(list)
    for k, w in step:
        by_share[w].append(k)
    out = []
    for _, ks in sorted(by_share.items()):
        for sign in (1, -1):
            out.append(np.stack([ranks + ((c + sign * k) % dim.npus - c) * stride for k in ks], axis=1))
    return out
