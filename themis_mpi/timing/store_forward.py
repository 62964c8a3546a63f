"""``store-forward``: each link a FIFO of whole transfers; a transfer moves on once all of it has arrived.

This is ASTRA-sim 2.x's congestion-aware link (``Link.cpp`` of astra-network-analytical), written
once: a free link takes the transfer at the head of its queue and holds it for its serialization
(``bytes / rate``); the transfer arrives at the next device once serialized, and enters the link
of its next hop there (store and forward). A hop of several links (a Ring step spread over both
directions, a port beside the dim's link) waits for all of them. The step's transfers through,
its delay passes (an event of its own, even of 0 ns) and the next step leaves.

Its compat details are parameters (`StoreForward.astra2` sets them as the 2.x runs need):

- `trunc`: serialization and arrival in whole ns, ``trunc(bytes / rate)`` and
  ``trunc(latency + bytes / rate)``;
- `latency_ns` per link: the link delivers a transfer that long after its serialization and is
  free for the next one meanwhile (the latency pipelined behind the next serialization); without
  it a step's latency is its fixed delay, after its transfers;
- `per_event`: the container hands back stage ends after every event, as ASTRA-sim's handlers
  run at once, instead of after every instant.

The one-NPU view (`symmetric`) and every NPU's links (`world`) run it, under this project's rules
and under ``--compat astra-sim-2``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from ..cost import ASTRA_SIM_2
from ..topology import Topology
from .links import Flow, Host, Link, LinkModel, Settings, Transfer


class _Part:
    """One transfer of a step on its way: the hop it is at and that hop's links not done yet."""

    __slots__ = ("flow", "transfer", "hop", "waiting")

    def __init__(self, flow: Flow, transfer: Transfer):
        self.flow, self.transfer, self.hop, self.waiting = flow, transfer, 0, 0


class StoreForward(LinkModel):
    """Every link a FIFO of whole transfers, hop by hop (module doc).

    Args:
        links: the links it runs (one NPU's, or every NPU's).
        host: the container; its loop runs every event.
        trunc: whole-ns serialization and arrival (ASTRA-sim 2.x).
        latency_ns: per link, the delivery latency pipelined behind the next serialization
            (ASTRA-sim 2.x); None: none (the step's delay holds the latency).
        per_event: stage ends after every event (ASTRA-sim 2.x's handlers), not every instant.
    """

    name = "store-forward"

    def __init__(
        self,
        links: tuple[Link, ...],
        host: Host,
        *,
        trunc: bool = False,
        latency_ns: Sequence[float] | None = None,
        per_event: bool = False,
        count_bytes: bool = True,
    ):
        super().__init__(links, host, count_bytes=count_bytes)
        self.trunc, self.latency_ns, self.per_event = trunc, latency_ns, per_event
        self._queue: list[deque[tuple[_Part, float]]] = [deque() for _ in links]
        self._serving: list[_Part | None] = [None] * len(links)  # what each link holds (None: free)

    @classmethod
    def made(
        cls,
        links: tuple[Link, ...],
        host: Host,
        topology: Topology,
        settings: Settings,
        count_bytes: bool = True,
    ) -> LinkModel:
        """This project's rule, or ASTRA-sim 2.x's backend under ``--compat astra-sim-2`` (`astra2`)."""
        if settings.compat == ASTRA_SIM_2:
            return cls.astra2(links, host, topology, count_bytes)
        return cls(links, host, count_bytes=count_bytes)

    @classmethod
    def astra2(
        cls, links: tuple[Link, ...], host: Host, topology: Topology, count_bytes: bool = True
    ) -> StoreForward:
        """ASTRA-sim 2.x's congestion-aware backend: whole ns, its dims' latencies pipelined, per event."""
        latency = [topology.dims[link.dim].latency_ns if link.dim >= 0 else 0.0 for link in links]
        return cls(links, host, trunc=True, latency_ns=latency, per_event=True, count_bytes=count_bytes)

    def start(self, flow: Flow) -> None:
        """The flow's first step leaves now, or after its lead delay."""
        if not flow.steps:
            self.host.ended(flow.owner)
        elif flow.lead_ns is None:
            self._begin(flow)
        else:
            self.loop.at(self.loop.now_ns + flow.lead_ns, self._begin, flow)

    def resume(self, flow: Flow) -> None:
        """Its delay (an event, even of 0 ns), then the next step."""
        self.loop.at(self.loop.now_ns + flow.steps[flow.k].delay_ns, self._next, flow)

    def _next(self, flow: Flow) -> None:
        flow.k += 1
        self._begin(flow)

    def _begin(self, flow: Flow) -> None:
        """Step k's transfers enter their first links, or the flow ends after its last step."""
        step = self._leaving(flow)
        if step is None:
            return
        flow.parts = len(step.transfers)
        for transfer in step.transfers:
            self._enter(_Part(flow, transfer))

    def _enter(self, part: _Part) -> None:
        """The part's current hop: each of its links takes its share now, or queues it."""
        transfer = part.transfer
        hop = transfer.hops[part.hop]
        part.waiting = len(hop)
        serving = self._serving
        for link, share in hop:
            if serving[link] is not None:
                self._queue[link].append((part, transfer.bytes * share))
            else:
                self._take(link, part, transfer.bytes * share)

    def _take(self, link: int, part: _Part, nbytes: float) -> None:
        """The link takes the bytes: free after their serialization, delivered then (or a latency later)."""
        self._serving[link] = part
        serial = nbytes / self.capacity[link]
        loop = self.loop
        now = loop.now_ns
        if self.latency_ns is None:
            loop.at(now + (math.floor(serial) if self.trunc else serial), self._served, link)
            return
        arrive = self.latency_ns[link] + serial
        loop.at(now + (math.floor(arrive) if self.trunc else arrive), self._arrive, part)
        loop.at(now + (math.floor(serial) if self.trunc else serial), self._free, link)

    def _free(self, link: int) -> None:
        self._serving[link] = None
        queue = self._queue[link]
        if queue:
            self._take(link, *queue.popleft())

    def _served(self, link: int) -> None:
        """Serialized and delivered at once: the link serves its next, then the part has crossed it."""
        part = self._serving[link]
        self._free(link)
        self._arrive(part)  # type: ignore[arg-type]

    def _arrive(self, part: _Part) -> None:
        """One link of the part's hop is done; with all, on to the next hop, or the transfer is through."""
        part.waiting -= 1
        if part.waiting:
            return
        part.hop += 1
        if part.hop < len(part.transfer.hops):
            self._enter(part)
            return
        flow = part.flow
        flow.parts -= 1
        if flow.parts == 0 and self.host.through(flow):
            self.resume(flow)
