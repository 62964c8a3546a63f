"""``packet`` (the default rule): links shared as a packet network shares them, in closed form.

A fluid rule over `fair`'s machinery, one event per transfer, that keeps what a packet-level
simulator (htsim: RoCE, per-flow round robin at the host, per-packet store-and-forward at the
switch) shows and ``fair`` misses (docs/time-model.md#the-packet-rule has the evidence). A
message of m bytes travels as n = ceil(m / mtu) packets of m / n bytes (``--mtu``):

- **Bandwidth, per message.** Transfers share every link max-min, as under ``fair``, but a
  transfer of k messages counts k times (`fair.max_min_rates` with weights): on a link, every
  message gets the same share (htsim's host round robin and SimGrid both share per flow).
- **A packet is never split.** A transfer whose messages are one packet each goes whole, at its
  links' rate, in the order such transfers reach the sender's links, ahead of the shared ones
  (those wait on the sender's links meanwhile).
- **Round robin at the sender.** A longer transfer that starts while its sender's links are
  sending waits for the packet in service, half a packet (`RESIDUAL`: the mean residual of
  fixed-size packets met at a random phase), before it takes its share; transfers that start on
  a sender's link at one instant take it one packet apart, in the order they started. So stages
  that share a link no longer end at one instant and wait their latency together. The sender's
  links are the NPU's own (up-link, Ring directions, FullyConnected links, a port's out); a
  Switch's down-link and a port's in take packets from every sender as they come and are only
  shared (`PacketStep.sends`).
- **Store-and-forward per packet.** Each hop after the first adds one packet at that hop's rate
  to the step's fixed delay: a Switch step alone takes m/B + one packet + its latency.
- **Latency after the transfer, off the links.** The fixed delay (hops x latency + endpoint
  delay + the packets above) follows the transfer, and the links are free meanwhile.

Of fair's shortcuts only the first is kept: a stage alone on its links is summed at once
(*solo*); a transfer that comes onto its links places it first (`Packet._place`), so the
step-wise path's times hold (a test). No randomness: the waits are fixed fractions of a packet
and events of one instant go in the order they were scheduled, the same on every rank, so the
emulator equals the model as under ``fair``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ..errors import UsageError
from ..limits import MAX_MTU_BYTES
from ..topology import Topology
from .fair import Fair, max_min_rates
from .links import Flow, Host, Link, LinkModel, Settings, Step

DEFAULT_MTU_BYTES = 4096  # the usual RoCE / InfiniBand MTU
RESIDUAL = 0.5  # mean residual of a fixed-size packet in service, met at a random phase (renewal theory)


@dataclass(frozen=True)
class PacketStep(Step):
    """A `links.Step` with its packets; its fixed delay includes the per-packet store-and-forward.

    Attributes:
        messages: the messages it sends (its shares of a link in the max-min split).
        packet_ns: one packet's serialisation on the sender's slowest link.
        atom: every message is one packet: the sender sends the transfer whole, never interleaved.
        sends: the sender's own links of the transfer, where its round robin runs.
    """

    messages: int = 1
    packet_ns: float = 0.0
    atom: bool = False
    sends: frozenset[int] = frozenset()


def packet_bytes(message_bytes: float, mtu_bytes: int) -> float:
    """One packet of a message: the message cut into ceil(m / mtu) equal packets."""
    return message_bytes / max(1, math.ceil(message_bytes / mtu_bytes)) if message_bytes > 0 else 0.0


def receives(link: Link) -> bool:
    """Whether a link takes packets into its NPU from many senders (a Switch's down-link, a port's in)."""
    return link.name.endswith((".down", ".in"))


def check_mtu(mtu_bytes: object) -> None:
    """Refuse an MTU that is not a whole number of bytes in [1, 1 GiB] (None: not given)."""
    if mtu_bytes is None:
        return
    if isinstance(mtu_bytes, bool) or not isinstance(mtu_bytes, int) or not 1 <= mtu_bytes <= MAX_MTU_BYTES:
        raise UsageError(f"--mtu must be a whole number of bytes in [1, 1G], got {mtu_bytes!r}")


def mtu_of(topology: Topology, settings: Settings) -> int:
    """The run's packet: ``--mtu`` (`mtu_bytes`), else the topology's ``MTU(...)``, else 4096."""
    return _mtu(topology, settings.mtu_bytes)


def _mtu(topology: Topology, mtu_bytes: int | None) -> int:
    return mtu_bytes or topology.mtu_bytes or DEFAULT_MTU_BYTES


def recorded_mtu(topology: Topology, network: str, mtu_bytes: int | None) -> int:
    """The packet a trace records (its ``mtu_bytes`` attribute): the run's under this rule, else 0."""
    return _mtu(topology, mtu_bytes) if network == Packet.name else 0


class Packet(Fair):
    """The packet rule (module doc) over `fair.Fair`'s machinery.

    Its hooks into it: where a transfer takes its share (`_enter`: now, after the packet in
    service, or queued whole), where one is through (`_through`: the next whole transfer goes),
    and the rates (`_set_rates`: per message, with the links a whole packet holds).

    Args:
        links: the links it runs (one NPU's, or every NPU's).
        host: the container.
        mtu_bytes: the packet.
    """

    name = "packet"

    def __init__(
        self,
        links: tuple[Link, ...],
        host: Host,
        *,
        mtu_bytes: int = DEFAULT_MTU_BYTES,
        count_bytes: bool = True,
    ):
        super().__init__(links, host, count_bytes=count_bytes)
        self.mtu_bytes = mtu_bytes
        self._atoms: list[deque[Flow]] = [deque() for _ in links]  # whole-packet transfers, in order
        self._held: set[Flow] = set()  # whole-packet transfers being sent
        self._joined = [-math.inf] * len(links)  # when the last transfer took (or takes) a share of a link
        self._last_ns = -math.inf  # the latest instant a transfer entered (a smaller one: a new run)
        self._plans: dict[int, tuple[tuple[Step, ...], tuple[Step, ...]]] = {}  # by id of steps

    @classmethod
    def made(
        cls,
        links: tuple[Link, ...],
        host: Host,
        topology: Topology,
        settings: Settings,
        count_bytes: bool = True,
    ) -> LinkModel:
        """The rule with the run's packet (`mtu_of`)."""
        return cls(links, host, mtu_bytes=mtu_of(topology, settings), count_bytes=count_bytes)

    # --- a flow's steps as packets ----------------------------------------------------------------

    def prepared(self, steps: tuple[Step, ...]) -> tuple[Step, ...]:
        """The steps cut into packets (every NPU's links keep their stage plans so, one per rank)."""
        return tuple(self.packetize(s) for s in steps)

    def start(self, flow: Flow) -> None:
        """The flow's first step leaves now, its steps cut into packets (memoised by its steps)."""
        if flow.steps and isinstance(flow.steps[0], PacketStep):  # (`prepared` already)
            super().start(flow)
            return
        plan = self._plans.get(id(flow.steps))
        if plan is None:
            if len(self._plans) >= 4096:  # (messages bring new steps: the memory stays bounded)
                self._plans.clear()
            plan = self._plans[id(flow.steps)] = (flow.steps, self.prepared(flow.steps))
        flow.steps = plan[1]
        super().start(flow)

    def packetize(self, step: Step) -> PacketStep:
        """The step under the packet rule: its packets, and a packet per hop after the first in its delay."""
        capacity = self.capacity
        messages = sum(t.messages for t in step.transfers)
        each = max((t.each_bytes for t in step.transfers), default=0.0)
        pkt = packet_bytes(each, self.mtu_bytes)
        forward_ns = max(
            (sum(pkt / min(capacity[link] for link, _ in hop) for hop in t.hops[1:]) for t in step.transfers),
            default=0.0,
        )
        sends = frozenset(link for link in step.links if not receives(self.links[link]))
        return PacketStep(
            step.transfers,
            step.delay_ns + forward_ns,
            step.alone_ns,
            step.solo_rate,
            messages=messages,
            packet_ns=pkt / min(capacity[link] for link in sends) if sends else 0.0,
            atom=0 < each <= self.mtu_bytes,
            sends=sends,
        )

    # --- where a transfer takes its share ---------------------------------------------------------

    def _enter(self, flow: Flow, step: Step) -> None:
        """A transfer starts: whole, after those queued before it; or shared, after the packet in service."""
        assert isinstance(step, PacketStep)
        if self.loop.now_ns < self._last_ns:  # a new run on these links, its clock from 0 again
            self._joined = [-math.inf] * len(self.links)
        self._last_ns = self.loop.now_ns
        if self.solo and flow.uniform and self._free(step):
            # (nothing on its links, nothing queued, no packet to wait for: what the general path
            # below comes to then, without placing anything or queueing the transfer first)
            if not step.atom:
                for link in step.sends:
                    self._joined[link] = self._last_ns
            super()._enter(flow, step)
            return
        self._place(step.links)
        if step.atom and step.sends:
            flow.left, flow.rate, flow.end_ns = step.bytes, 0.0, math.inf
            for link in step.sends:
                self._atoms[link].append(flow)
            self._send_atoms(step.sends)
            return
        now = at = self.loop.now_ns
        joined = self._joined
        for link in step.sends:  # one instant: a packet after the one before (round robin)
            if joined[link] >= now and joined[link] + step.packet_ns > at:
                at = joined[link] + step.packet_ns
        if at == now and any(self._users[link] or self._atoms[link] for link in step.sends):
            at = now + RESIDUAL * step.packet_ns  # the packet in service is not interrupted
        for link in step.sends:
            joined[link] = at
        if at > now:
            self.loop.at(at, self._join_now, flow)
        else:
            super()._enter(flow, step)

    def _free(self, step: PacketStep) -> bool:
        """Whether no transfer uses the step's links, none waits on its sender's, none took them just now."""
        users, atoms, joined, now = self._users, self._atoms, self._joined, self._last_ns
        for link in step.links:
            if users[link]:
                return False
        for link in step.sends:
            if atoms[link] or (not step.atom and joined[link] >= now and joined[link] + step.packet_ns > now):
                return False
        return True

    def _join_now(self, flow: Flow) -> None:
        """A transfer that waited for the packet in service takes its share."""
        step = flow.steps[flow.k]
        self._place(step.links)
        super()._enter(flow, step)

    def _place(self, links: frozenset[int]) -> None:
        """Solo stages on these links go on step by step from where they are.

        One whose transfer starts now took its links now, before whatever comes (step by step,
        a running stage's next step starts before the engine starts new stages at that instant).
        """
        if not self._had_solo:  # (every NPU's links: no stage goes solo, nothing to place)
            return
        now = self.loop.now_ns
        for f in [f for f in self._moving if f.solo_ns >= 0 and not links.isdisjoint(f.steps[f.k].links)]:
            if f.solo_ns < 0:  # (placed with one before it)
                continue
            self._unsolo(f)
            if f not in self._moving:  # (in a delay)
                continue
            step = f.steps[f.k]
            assert isinstance(step, PacketStep)
            if step.atom and step.sends:  # a whole packet in service
                self._held.add(f)
                for link in step.sends:
                    self._atoms[link].appendleft(f)
            elif f.left == step.bytes:
                for link in step.sends:
                    self._joined[link] = max(self._joined[link], now)

    def _send_atoms(self, links: frozenset[int]) -> None:
        """Send every whole-packet transfer that heads the queues of all its sender's links."""
        for link in links:
            queue = self._atoms[link]
            if not queue or queue[0] in self._held:
                continue
            flow = queue[0]
            step = flow.steps[flow.k]
            assert isinstance(step, PacketStep)
            if all(self._atoms[x][0] is flow for x in step.sends):
                self._place(step.links)
                alone = not any(self._users[x] for x in step.links)
                if alone and self.solo and flow.uniform and all(len(self._atoms[x]) == 1 for x in step.sends):
                    for x in step.sends:  # alone, none behind: a transfer like any, summed at once (solo)
                        self._atoms[x].popleft()
                    super()._enter(flow, step)
                    continue
                self._held.add(flow)
                self._moving.append(flow)
                for x in step.links:
                    self._users[x] += 1
                self._rates_stale = True

    def _through(self, flow: Flow) -> None:
        """A whole-packet transfer through frees its sender's links for the next one; then the host."""
        if flow in self._held:
            self._held.discard(flow)
            sends = flow.steps[flow.k].sends  # type: ignore[attr-defined]
            for link in sends:
                self._atoms[link].popleft()
            self._send_atoms(sends)
        super()._through(flow)

    # --- rates --------------------------------------------------------------------------------------

    def _set_rates(self) -> None:
        """Per-message max-min; a transfer whose sender's link sends a whole packet waits meanwhile.

        A stage left alone on its links, with no transfer about to join them, goes solo again.
        """
        self._rates_stale = False
        held: set[int] = set()
        for flow in self._held:
            held |= flow.steps[flow.k].sends  # type: ignore[attr-defined]
        shared, usages, weights = [], [], []
        for f in self._moving:
            if f.solo_ns >= 0:
                continue
            step = f.steps[f.k]
            if held and f not in self._held and not held.isdisjoint(step.sends):  # type: ignore[attr-defined]
                f.rate, f.end_ns = 0.0, math.inf
                continue
            shared.append(f)
            usages.append(step.usage)
            weights.append(step.messages)  # type: ignore[attr-defined]
        if len(shared) == 1:
            rates = [shared[0].steps[shared[0].k].solo_rate]
        else:
            rates = max_min_rates(usages, self.capacity, None, weights)
        users, joined, now = self._users, self._joined, self.loop.now_ns
        for f, r in zip(shared, rates):
            step = f.steps[f.k]
            if (
                self.solo
                and f.uniform
                and f not in self._held
                and all(users[link] == 1 for link in step.links)
                and all(joined[link] <= now for link in step.sends)  # type: ignore[attr-defined]
            ):
                self._go_solo(f, r, math.inf, None)
                continue
            if r != f.rate:
                f.rate = r
                f.end_ns = now + f.left / r
