"""Links, what crosses them, and the one interface every sharing rule implements (`LinkModel`).

Each NPU has, per dim (B is the dim's per-NPU bandwidth, all its links together):

- Ring: two outgoing links of B/2, one per direction. Every stage spreads its bytes evenly over
  both (the ring algorithm runs two counter-rotating half-rings, half the data each), so an
  uncontended ring keeps its time.
- FullyConnected of P NPUs: P-1 links of B/(P-1), one per peer distance. A ring step puts half
  its bytes on the link to the next NPU and half on the link to the previous one
  (`cost.ring_both_ways`; one way, to the next NPU, under the ASTRA-sim compat modes and on 2
  NPUs), a halving-doubling step the link to its partner, a direct or all-to-all step all of them.
- Switch: one up-link and one down-link of B to the dim's switch; a message goes up, then down.
- A shared port (`topology.Port`, e.g. one NIC that dims 1 and 2 leave through): an out and an
  in direction of the port's rate that every transfer of those dims crosses as well.

What a rule is given is a `Flow`: a stage (or a message) as `Step`s in turn, each step its
`Transfer`s (bytes over a route of hops, each hop links with the share of the bytes they carry),
then a fixed delay (``hops * latency + endpoint delay``). What it answers: when each flow ends
(`Host.ended`), and the bytes each link carried (`LinkModel.carried`, busy time `busy_ns`). The
container it runs in (`Host`) owns the event loop and may hold a step until what it receives is
in (every NPU's links: `world`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from ..errors import UsageError
from ..topology import Topology
from .events import EventLoop


@dataclass(frozen=True)
class Link:
    """One direction of one physical link of an NPU, or of a shared port.

    Attributes:
        name: e.g. ``dim0.cw``, ``dim1.peer+3``, ``dim2.up``, ``port0.out``.
        dim: the dim it belongs to (-1 for a shared port).
        bytes_per_ns: its rate.
    """

    name: str
    dim: int
    bytes_per_ns: float


def physical_links(topology: Topology) -> tuple[Link, ...]:
    """Every link of one NPU, dim by dim, then the shared ports (out, in)."""
    out: list[Link] = []
    for d, dim in enumerate(topology.dims):
        b = dim.bandwidth_bytes_per_ns
        if dim.npus == 1:
            continue
        if dim.kind == "Ring":
            out += [Link(f"dim{d}.cw", d, b / 2), Link(f"dim{d}.ccw", d, b / 2)]
        elif dim.kind == "FullyConnected":
            out += [Link(f"dim{d}.peer+{k}", d, b / (dim.npus - 1)) for k in range(1, dim.npus)]
        else:
            out += [Link(f"dim{d}.up", d, b), Link(f"dim{d}.down", d, b)]
    for i, port in enumerate(topology.ports):
        out += [
            Link(f"port{i}.out", -1, port.bandwidth_bytes_per_ns),
            Link(f"port{i}.in", -1, port.bandwidth_bytes_per_ns),
        ]
    return tuple(out)


def describe_links(topology: Topology) -> str:
    """One NPU's links in a line, e.g. ``dim 0: up, down 419.1 GB/s; NIC(1+2): 46.57 GB/s each way``."""
    parts = []
    for d, dim in enumerate(topology.dims):
        b = dim.bandwidth_gbps
        if dim.npus == 1:
            continue
        if dim.kind == "Ring":
            parts.append(f"dim {d}: 2 x {b / 2:g} GB/s (both ways round)")
        elif dim.kind == "FullyConnected":
            parts.append(f"dim {d}: {dim.npus - 1} x {b / (dim.npus - 1):.4g} GB/s (one per peer)")
        else:
            parts.append(f"dim {d}: up, down {b:g} GB/s")
    for port in topology.ports:
        parts.append(f"NIC({'+'.join(map(str, port.dims))}): {port.bandwidth_gbps:g} GB/s each way")
    return "; ".join(parts)


Usage = tuple[tuple[int, float], ...]  # (link index, bytes on the link per byte of the transfer)


@dataclass(frozen=True)
class Transfer:
    """Bytes over a route: its hops in order, each the links it crosses there with their shares.

    The hops are used at once by a cut-through rule (``fair``) and one after the other by a
    store-and-forward one (``store-forward``). What it is made of, for a rule that shares per
    message or cuts messages into packets (``packet``): `messages` messages of `message_bytes`
    each on a link they cross (a Ring's half of each message each way; 0: ``bytes / messages``).
    """

    bytes: float
    hops: tuple[Usage, ...]
    messages: int = 1
    message_bytes: float = 0.0

    @property
    def each_bytes(self) -> float:
        """One message's bytes on a link it crosses."""
        return self.message_bytes or self.bytes / self.messages


@dataclass(frozen=True)
class Step:
    """One step of a flow: its transfers leave at once, and once they are through, a fixed delay.

    Most steps are one transfer (the stage's step as one NPU sends it); ASTRA-sim 2.x's steps
    are one per message. `bytes`, `usage`, `links` and `loads` describe them together (shares
    weighted by each transfer's bytes); `solo_rate` is their rate alone on their links (`rated`).
    `alone_ns` is the step's time alone as the cost model sums it (what ``ideal`` answers).
    """

    transfers: tuple[Transfer, ...]
    delay_ns: float = 0.0
    alone_ns: float = math.nan
    solo_rate: float = 0.0
    bytes: float = field(init=False)
    hops: tuple[Usage, ...] = field(init=False)  # the one transfer's hops (empty for several)
    usage: Usage = field(init=False)
    links: frozenset[int] = field(init=False)
    loads: tuple[tuple[int, float], ...] = field(init=False)  # (link, bytes it carries)

    def __post_init__(self) -> None:
        total = sum(t.bytes for t in self.transfers)
        if len(self.transfers) == 1:
            (only,) = self.transfers
            hops, usage = only.hops, tuple(u for hop in only.hops for u in hop)
        else:
            hops = ()
            usage = tuple(
                (link, share * t.bytes / total)
                for t in self.transfers
                for hop in t.hops
                for link, share in hop
            )
        object.__setattr__(self, "bytes", total)
        object.__setattr__(self, "hops", hops)
        object.__setattr__(self, "usage", usage)
        object.__setattr__(self, "links", frozenset(link for link, _ in usage))
        object.__setattr__(self, "loads", tuple((link, total * share) for link, share in usage))


def one_transfer(
    nbytes: float,
    hops: tuple[Usage, ...],
    delay_ns: float,
    capacity,
    messages: int = 1,
    message_bytes: float = 0.0,
) -> Step:
    """A step of one transfer (of `messages` messages), its solo rate on links of these capacities set."""
    return rated(Step((Transfer(nbytes, hops, messages, message_bytes),), delay_ns), capacity)


def rated(step: Step, capacity) -> Step:
    """The step with its rate alone on its links (`Step.solo_rate`): its tightest link's."""
    rate = min((capacity[link] / share for link, share in step.usage), default=math.inf)
    return Step(step.transfers, step.delay_ns, step.alone_ns, rate)


@dataclass(eq=False, slots=True)
class Flow:
    """A stage (or a message) on the links: its steps, the one it is in, and its rule's state.

    Attributes:
        owner: what ends with it, handed back to the container (`Host.ended`).
        steps: its steps in turn.
        uniform: every step uses the same links (a candidate for ``fair``'s solo shortcut).
        start_ns: when it started (``ideal`` counts its steps' times from here).
        lead_ns: a delay before its first step, as an event of its own (ASTRA-sim 2.x's first
            endpoint delay); None: the first step leaves at once.
        k: the step it is in.
    """

    owner: Any
    steps: tuple[Step, ...]
    uniform: bool = False
    start_ns: float = 0.0
    lead_ns: float | None = None
    k: int = 0
    # the rule's state (`fair`; `store_forward` keeps `parts`)
    left: float = 0.0  # bytes of step k's transfer still to go at the loop's time
    rate: float = 0.0  # its rate since the last change of the moving set
    end_ns: float = math.inf  # when it ends at that rate
    solo_ns: float = -1.0  # alone since then from step `solo_k` on (`end_ns` is then the stage's end)
    solo_k: int = 0
    overlap_ns: float = math.inf  # when its transfers first meet another solo stage's
    windows: list | None = None  # its transfers from step `solo_k` on, once asked for
    parts: int = 0  # transfers of step k (or parts of a hop) not through yet


class Host(Protocol):
    """The container a rule runs in: its event loop, and what it does between a flow's steps."""

    loop: EventLoop

    def begin(self, flow: Flow) -> None:
        """Step ``flow.k`` starts: its transfers leave now."""

    def through(self, flow: Flow) -> bool:
        """Step ``flow.k``'s own transfers are through: whether it goes on now (the rule resumes it).

        One NPU's view says yes; every NPU's links wait for what the step receives too, and
        `LinkModel.resume` it (and the steps that waited for it) themselves, then say no.
        """
        ...

    def ended(self, owner: Any) -> None:
        """A flow's last step and its delay are over."""


def check_link_scale(topology: Topology, scales: tuple[tuple[int, int, float], ...]) -> None:
    """Refuse a ``--link-scale`` that names a dim or rank the topology does not have (one line)."""
    for d, rank, _ in scales:
        if not 0 <= d < len(topology.dims) or not 0 <= rank < topology.npus:
            raise UsageError(
                f"--link-scale names dim {d} of rank {rank}, but {topology.label()} has "
                f"{len(topology.dims)} dims and {topology.npus} NPUs"
            )


class Settings(Protocol):
    """What a rule may read of a run's settings when it is made (`config.RunConfig` has it)."""

    @property
    def compat(self) -> str:
        """The compat mode (empty, or ASTRA-sim's), whose details a rule may follow."""
        ...

    @property
    def mtu_bytes(self) -> int | None:
        """The packet's bytes asked for (``--mtu``; None: the topology's, else the rule's default)."""
        ...


class LinkModel(ABC):
    """A sharing rule: how transfers that overlap in time share the links (docs/design.md#link-rules).

    Made by `made` (`rules.make_rule`), which a rule with parameters of its own (an MTU, a compat
    mode's details) overrides to take them from the topology or the run's settings.
    It runs each flow's steps in turn on the host's event loop: a step's transfers leave at once
    (`Host.begin`); when they are through (`Host.through`) it goes on (`resume`) at once or when
    the host says, its delay passes and the next step leaves; after the last, `Host.ended`. A
    flow's steps count towards `carried` when they leave (where `count_bytes`). A rule whose
    events' times move with others (a fair share: `moving`) reports the next by `next_ns` and runs
    it in `fire`; all others it puts on the loop.

    Attributes:
        name: its ``--network`` name.
        routes: whether its flows carry transfers; False: each step is its time alone
            (`Step.alone_ns`), as ``ideal`` takes it.
        per_event: the container takes stage ends after each event rather than each instant
            (ASTRA-sim's handlers run at once).
        moving: it has events of its own (`next_ns`, `advance`, `fire`): the loop asks it.
        carried: bytes each link has carried (their busy time at their rate: `busy_ns`).
        count_bytes: whether `carried` is kept (one NPU's view counts its links' bytes from its
            stages instead, `results.link_results`).
    """

    name: ClassVar[str] = ""
    routes: ClassVar[bool] = True
    moving: ClassVar[bool] = False
    per_event = False

    def __init__(self, links: tuple[Link, ...], host: Host, *, count_bytes: bool = True):
        self.host, self.loop = host, host.loop
        self.links = links
        self.capacity = [link.bytes_per_ns for link in links]
        self.carried = [0.0] * len(links)
        self.count_bytes = count_bytes

    @classmethod
    def made(
        cls,
        links: tuple[Link, ...],
        host: Host,
        topology: Topology,
        settings: Settings,
        count_bytes: bool = True,
    ) -> LinkModel:
        """The rule for a run on these links: `cls(links, host)` unless the rule takes parameters."""
        return cls(links, host, count_bytes=count_bytes)

    def prepared(self, steps: tuple[Step, ...]) -> tuple[Step, ...]:
        """A plan's steps as this rule runs them (a container that keeps plans keeps these): as given."""
        return steps

    @abstractmethod
    def start(self, flow: Flow) -> None:
        """The flow starts now (its first step, or its lead delay)."""

    @abstractmethod
    def resume(self, flow: Flow) -> None:
        """Step ``flow.k`` may go on (`Host.through`): its delay, then the next step."""

    def next_ns(self) -> float:
        """When its own next event falls (inf: none, every event of it is on the loop)."""
        return math.inf

    def advance(self, t_ns: float) -> None:  # noqa: B027 - most rules have nothing between events
        """Time moves on to t_ns (the loop's time is still the old one): nothing moves in between here."""

    def fire(self, t_ns: float) -> None:  # noqa: B027 - most rules keep every event on the loop
        """Run its own events due at t_ns (`next_ns`): none here."""

    def idle(self) -> bool:
        """Whether nothing moves on its links but what waits on the loop."""
        return True

    def busy_ns(self) -> list[float]:
        """Each link's busy time: the bytes it carried at its rate."""
        return [b / c for b, c in zip(self.carried, self.capacity)]

    def _count(self, step: Step) -> None:
        if self.count_bytes:
            carried = self.carried
            for link, nbytes in step.loads:
                carried[link] += nbytes

    def _leaving(self, flow: Flow) -> Step | None:
        """Step ``flow.k`` leaves now (its bytes count, the host hears); None after the last: it ended."""
        if flow.k == len(flow.steps):
            self.host.ended(flow.owner)
            return None
        step = flow.steps[flow.k]
        self._count(step)
        self.host.begin(flow)
        return step


class Unshared(LinkModel):
    """A rule whose transfers share nothing: each takes `transfer_ns` alone, whatever else runs.

    A subclass says how long a step's transfers take (`transfer_ns`); this runs the steps: the
    transfers end, the host resumes the step, its delay passes, the next step leaves.
    """

    @abstractmethod
    def transfer_ns(self, step: Step) -> float:
        """How long the step's transfers take alone."""

    def start(self, flow: Flow) -> None:
        """The flow's first step leaves now."""
        self._begin(flow)

    def _begin(self, flow: Flow) -> None:
        step = self._leaving(flow)
        if step is not None:
            self.loop.at(self.loop.now_ns + self.transfer_ns(step), self._through, flow)

    def _through(self, flow: Flow) -> None:
        if self.host.through(flow):
            self.resume(flow)

    def resume(self, flow: Flow) -> None:
        """Its delay, then the next step."""
        self.loop.at(self.loop.now_ns + flow.steps[flow.k].delay_ns, self._next, flow)

    def _next(self, flow: Flow) -> None:
        flow.k += 1
        self._begin(flow)
