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

**Classes by state** (`state_classes`, issue 43; under ``fair`` only, stage steps only). Where
the refinement keeps every NPU apart (halving-doubling's or a one-way ring's partner differs at
each step, so a straggler's class of 1 sets every NPU apart by structure), NPUs may still run
alike in time: NPUs that receive, at one step, from different classes whose transfers start
and run alike. Classes by state are any partition (first: the NPUs' start colours,
`start_colours`), not equitable, *proven in the run*: the run stops (`Split`) at the first
instant a class's members would see different events, splits every class that instant's checks
see apart (`Split.merged`: the instant's events run on, time moves no further) and starts again
(`world.by_state`; engines are greenlets, so from t = 0). Any refinement is exact (the run
proves whatever classes it is given), so splitting more than the first class costs no exactness.

A representative's step stands for its members' transfers, each over its own links and its
peers' at the step's distances; the peers of the members fall in several classes. On class
B's representative's link the step counts the members' shares on B's links summed, over
``|B|`` (`state_step`): a guess at the rates, which the checks below decide. It receives from
the representatives of every member's senders' classes, and is taken by those of every
member's receivers' classes (`recvs`, `consumers` in `world.World._plan`).

Induction over the run's instants: members of a class start a stage together (their engines,
of one kind, took the same decisions from the same ends: they start alike, by the start
colours, and every end is checked). Suppose at some instant every class's members have the
same state as their representative, and every member's transfer runs at its representative's
rate (the *lift*). Then:

- *Rates* (`check_rates`). The lift is every NPU's allocation under ``fair`` iff it is max-min
  fair on every NPU's links, i.e. (i) no link carries more than its capacity and (ii) every
  transfer crosses a bottleneck: a link that is full and on which no transfer is faster. Both
  are checked on every member's link, from the representatives' rates: member b's link x
  carries the shares of the transfers whose members send through it (`Lift.weights`, where they
  differ from member to member; else the representatives' link's own load), and member a's
  transfer crosses the links `Lift.maps` say. Max-min allocations are unique, so then every
  NPU's rates are the lift. Checked whenever time moves past an instant whose rates the rule
  set (not between two events of one instant: those rates hold for no time). Where not:
  the class of the overloaded link splits by its members' shares, or the sender's class by
  whether its transfer has a bottleneck.
- *Ends* (`check_end`). Member a's step ends at the later of its own transfer's end (its
  representative's, by the rates) and the ends of its senders' transfers (their classes'
  representatives'). The representative's step ends at the latest of all; every member must
  end then: its own transfer ends then, or one of its senders' does. Where not, the class
  splits into the members that do and those that do not.

So every member's next events are its representative's. Each split makes a class finer (never
trivially: each check splits off a proper part), so the runs end: at worst at every NPU, where
every NPU runs as before (as also past `world.STATE_BUDGET`). What the checks do not decide
is left out: point-to-point messages and a dim's custom files for each NPU refuse
(`Inexact`: every NPU runs). Every float the run uses is the representatives' run's own; the
checks compare with a relative slack of `FULL` (a link full, a rate the top one).

``packet`` would need more: its per-sender queues and round robin see each message, not a
fluid share, so a representative's link that stands for members of different senders' classes
would need those senders' packets to interleave alike on every member's link; not done (every
NPU runs, as before).
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
from .links import Step, Usage, one_transfer
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


class Split(Exception):
    """Classes by state: members of one class seen apart in the run (module doc): it restarts split.

    Attributes:
        parts: per class seen apart, (its ranks, per member the part it goes to: members of one
            key stay together); every class the checks of one instant saw apart (`merged`).
    """

    def __init__(self, members: np.ndarray, keys: np.ndarray, why: str):
        super().__init__(f"a class of {len(members)} NPUs splits: {why}")
        self.parts: tuple[tuple[np.ndarray, np.ndarray], ...] = ((members, keys),)

    @staticmethod
    def merged(splits: list[Split]) -> Split:
        """One split for several seen at one instant: the run restarts with all of them made.

        Any refinement of classes by state is exact (the run proves whatever classes it is
        given); splitting every class an instant's checks see apart, not the first only, saves
        the runs that would each find one more.
        """
        if len(splits) == 1:
            return splits[0]
        out = Split(*splits[0].parts[0], f"{len(splits)} checks at one instant")
        out.parts = tuple(part for split in splits for part in split.parts)
        return out


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
    state: bool = False  # by state: not equitable, proven in the run (`state_classes`)
    members: tuple[np.ndarray, ...] = ()  # (by state) each class's ranks, ascending
    pos: np.ndarray | None = None  # (by state) every rank's index in its class's `members`

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
    colour, kind_of = start_colours(topology, config, kinds)
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


def start_colours(
    topology: Topology, config: RunConfig, kinds: Mapping[int, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """Every NPU's colour by what sets it apart before the run (delay, kind, links' scales), and its kind."""
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
    return colour, kind_of


def state_classes(colour: np.ndarray, kind_of: np.ndarray) -> Classes:
    """Classes by state from any colouring (`Classes.state`: the run proves them, `Split` where not)."""
    _, first, of = np.unique(colour, return_index=True, return_inverse=True)
    order = np.argsort(first)  # classes by their lowest rank
    renumber = np.empty_like(order)
    renumber[order] = np.arange(len(order))
    of = renumber[of.ravel()]
    by = np.argsort(of, kind="stable")
    sizes = np.bincount(of)
    members = tuple(np.split(by, np.cumsum(sizes)[:-1]))
    reps = tuple(int(m[0]) for m in members)
    pos = np.empty_like(of)
    for m in members:
        pos[m] = np.arange(len(m))
    return Classes(of, reps, sizes, frozenset(), kind_of, frozenset(), True, members, pos)


def refined(colour: np.ndarray, split: Split) -> np.ndarray:
    """The colouring with each class split as `split` says (two parts of one class: by both keys)."""
    columns = [colour]
    for members, keys in split.parts:
        key = np.zeros_like(colour)
        key[members] = keys + 1
        columns.append(key)
    _, out = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
    return out.ravel()


@dataclass(frozen=True)
class Lift:
    """A representative's step on one of the representatives' links, as its members' transfers take it.

    Attributes:
        link: the representatives' link q (class B's representative's link x).
        cls: class B.
        weights: per member of B, the share its link x takes of the step's members' transfers
            (None: the same for every member of B, q's share).
        maps: per distance of the step whose peers fall in B, per member of the sender's class
            A, the index in B of the member whose link x its transfer crosses (-1: not in B); for
            A's own links, each member's own.
        plain: alike for every member: `weights` None and every member of A crosses one of
            B's links.
    """

    link: int
    cls: int
    weights: np.ndarray | None
    maps: tuple[np.ndarray, ...]
    plain: bool


@dataclass(frozen=True)
class StatePlan:
    """A representative's stage step by state (`state_step`): what the run checks of it.

    Attributes:
        lifts: its entries (`Lift`), one per representatives' link.
        plain: every entry plain (`Lift.plain`).
        groups: the members by the representatives of the NPUs they receive from, where they
            differ: (those representatives, the members' indices in their class); () where alike.
    """

    lifts: tuple[Lift, ...]
    plain: bool
    groups: tuple[tuple[tuple[int, ...], np.ndarray], ...]


def state_step(
    classes: Classes, rank: int, step: Step, peers, d_npus: int, stride: int, per_npu: int, capacity
) -> tuple[Step, tuple[int, ...], int, StatePlan]:
    """A representative's stage step under classes by state: its step, senders, consumers, checks.

    Each member's transfer crosses its own links and those of its peers at the step's distances
    (`peers`: (distance, share)s on a dim of `d_npus` NPUs, ranks `stride` apart). On class B's
    representative's link the step's share counts the members' shares there summed over B's
    members' links, over ``|B|`` (`Classes.step`'s ``|A| / |B|`` where every member sends into
    B once). The senders are the representatives of every member's senders' classes; the
    consumers, the classes of every member's receivers.
    """
    of, reps, sizes, pos = classes.of, classes.reps, classes.sizes, classes.pos
    assert pos is not None
    a = int(of[rank])
    members = classes.members[a]
    c = (members // stride) % d_npus
    base = members - c * stride
    rep_c = (rank // stride) % d_npus
    hops: list[Usage] = []
    lifts: dict[int, list] = {}  # q -> [class, weights over B, maps]
    own = np.arange(len(members))
    for hop in step.hops:
        usage: dict[int, float] = {}
        for link, share in hop:
            j, x = divmod(link, per_npu)
            if j == rank:  # its own link: every member's own, alike
                usage[link] = usage.get(link, 0.0) + share
                entry = lifts.setdefault(link, [a, None, []])
                entry[1] = share + (0.0 if entry[1] is None else entry[1])
                entry[2].append(own)
                continue
            k = ((j // stride) % d_npus - rep_c) % d_npus
            to = base + (c + k) % d_npus * stride
            to_cls = of[to]
            for b, n in zip(*np.unique(to_cls, return_counts=True)):
                b = int(b)
                q = reps[b] * per_npu + x
                usage[q] = usage.get(q, 0.0) + share * float(n / sizes[b])
                theirs = classes.members[b]
                cb = (theirs // stride) % d_npus
                got = share * (of[theirs - cb * stride + (cb - k) % d_npus * stride] == a)
                entry = lifts.setdefault(q, [b, None, []])
                entry[1] = got if entry[1] is None else entry[1] + got
                entry[2].append(np.where(to_cls == b, pos[to], -1))
        hops.append(tuple(usage.items()))
    made_lifts, loads = [], []
    for q, (b, w, maps) in lifts.items():
        w = np.asarray(w, dtype=float)
        loads.append((q, step.bytes * float(w.flat[0])))  # (what B's representative's own link x takes)
        uniform = w.ndim == 0 or bool(np.ptp(w) <= 1e-12 * np.max(w))
        covering = bool(np.any(np.stack(maps) >= 0, axis=0).all())
        made_lifts.append(Lift(q, b, None if uniform else w, tuple(maps), uniform and covering))
    senders = np.stack([of[base + (c - k) % d_npus * stride] for k, _ in peers], axis=1)
    receivers = {int(x) for k, _ in peers for x in np.unique(of[base + (c + k) % d_npus * stride])}
    rep_of = np.asarray(reps)
    keys = np.sort(rep_of[senders], axis=1)
    distinct, which = np.unique(keys, axis=0, return_inverse=True)
    groups: tuple = ()
    if len(distinct) > 1:
        which = which.ravel()
        groups = tuple(
            (tuple(sorted({int(r) for r in row})), np.flatnonzero(which == i))
            for i, row in enumerate(distinct)
        )
    (made,) = step.transfers
    out = one_transfer(step.bytes, tuple(hops), step.delay_ns, capacity, made.messages, made.message_bytes)
    object.__setattr__(out, "loads", tuple(loads))  # (the bytes counted: the representatives' own)
    recvs = tuple(sorted({int(r) for r in np.unique(rep_of[senders])}))
    plan = StatePlan(tuple(made_lifts), all(lift.plain for lift in made_lifts), groups)
    return out, recvs, len(receivers), plan


def check_end(
    classes: Classes, rank: int, plan: StatePlan, own_ns: float, got: Mapping[int, float], t_ns: float
) -> None:
    """A step of a class by state ends at t_ns: every member must end then (else `Split`, module doc).

    A member ends at the later of its own transfer's end and its senders' (their classes'
    representatives'); the representative at the latest of all. Where they differ, the class
    splits by each member's end (every distinct end at once, not only on time or not).
    """
    if own_ns == t_ns or not plan.groups:
        return
    ends = [max(own_ns, max(got[s] for s in senders)) for senders, _ in plan.groups]
    if all(end == t_ns for end in ends):
        return
    a = int(classes.of[rank])
    keys = np.zeros(int(classes.sizes[a]), np.int64)
    distinct = sorted(set(ends))
    for (_, idx), end in zip(plan.groups, ends):
        keys[idx] = distinct.index(end)
    raise Split(classes.members[a], keys, "its members end at different times")


LOADS = "its links carry different loads"  # (why a class splits by its members' link loads)
FULL = 1e-10  # relative slack within which a link counts as full, its rate as the top one (`check_rates`)


def check_rates(classes: Classes, flows: Iterable[tuple[Any, StatePlan]], capacity, per_npu: int) -> None:
    """The representatives' rates lift to every NPU's max-min, else `Split` (of all seen apart; module doc).

    `flows` are the moving transfers, each with its step's plan. The lift (each member's
    transfer at its representative's rate) is every NPU's max-min allocation iff no member's
    link is over its capacity and every member's transfer crosses a link that is full and
    where no transfer is faster (its bottleneck). Links every transfer takes alike for every
    member (`Lift.plain`) carry on each member's link what the representatives' link carries.
    """
    flows = list(flows)
    splits: list[Split] = []  # (every class this instant's rates see apart: `Split.merged`)
    load: dict[int, float] = defaultdict(float)
    top: dict[int, float] = defaultdict(float)
    odd: set[int] = set()
    for f, plan in flows:
        r = f.rate
        for lift in plan.lifts:
            if lift.weights is not None:
                odd.add(lift.link)
        for q, share in f.steps[f.k].usage:
            load[q] += share * r
            if r > top[q]:
                top[q] = r
    member_load: dict[int, np.ndarray] = {}
    member_top: dict[int, np.ndarray] = {}
    if odd:
        for q in odd:
            n = int(classes.sizes[int(classes.of[q // per_npu])])
            member_load[q], member_top[q] = np.zeros(n), np.zeros(n)
        for f, plan in flows:
            r = f.rate
            usage = dict(f.steps[f.k].usage)
            for lift in plan.lifts:
                q = lift.link
                if q not in odd:
                    continue
                w = usage[q] if lift.weights is None else lift.weights
                member_load[q] += w * r
                member_top[q] = np.maximum(member_top[q], np.where(np.asarray(w) > 0, r, 0.0))
        for q in sorted(odd):
            if member_load[q].max() > capacity[q] * (1 + FULL):
                splits.append(Split(*_odd_split(classes, flows, q, per_npu), LOADS))
    held = False  # (a transfer held by no member's link: every NPU runs, unless a split may help)
    for f, plan in flows:
        r = f.rate
        if plan.plain and not any(lift.link in odd for lift in plan.lifts):
            continue  # (every member's links carry what the representatives' do: its bottleneck lifts)
        a = int(classes.of[f.owner.rank])
        reach = np.zeros(int(classes.sizes[a]), bool)
        for lift in plan.lifts:
            q = lift.link
            if q in odd:
                full = (member_load[q] >= capacity[q] * (1 - FULL)) & (r >= member_top[q] * (1 - FULL))
            else:
                full = np.full(1, load[q] >= capacity[q] * (1 - FULL) and r >= top[q] * (1 - FULL))
            if full.size == 1 and not full[0]:
                continue
            for m in lift.maps:
                at = m >= 0
                reach[at] |= full[np.where(at, m, 0)][at] if full.size > 1 else full[0]
        if reach.all():
            continue
        if reach.any():
            why = "its transfers are held by different links"
            splits.append(Split(classes.members[a], reach.astype(np.int64), why))
            continue
        odds = [lift.link for lift in plan.lifts if lift.link in odd]
        if odds:
            splits.append(Split(*_odd_split(classes, flows, odds[0], per_npu), LOADS))
            continue
        held = True
    if splits:
        raise Split.merged(splits)
    if held:
        raise Inexact("a transfer held by no link of its members'")


def _odd_split(classes: Classes, flows: list, q: int, per_npu: int) -> tuple[np.ndarray, np.ndarray]:
    """Class B of link q, its members by the shares of the transfers their links x carry."""
    b = int(classes.of[q // per_npu])
    rows = [
        lift.weights
        for _, plan in flows
        for lift in plan.lifts
        if lift.link == q and lift.weights is not None
    ]
    _, keys = np.unique(np.stack(rows, axis=1), axis=0, return_inverse=True)
    return classes.members[b], keys.ravel()


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
