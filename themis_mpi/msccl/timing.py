"""Custom algorithms' prices, and a standalone timing model of MSCCL programs for the synthesizer.

`reduction_ns` prices a reducing step's reduction under the endpoint model, as the built-in
algorithms' stages pay theirs; `timing.programs` (the run's timing of a custom algorithm) takes it.

`time_programs` here is the synthesizer's own plan (`msccl.synthesis`, `cli.synthesize`): each
step's end, given a `Network` that says which links a message holds and how long it takes:

- A threadblock runs its steps in order; a step starts when the threadblock's previous step has
  ended and the steps it waits for have ended.
- A receiving step's receive ends when the matched message has arrived (or at the step's start,
  if it arrived before); a reducing step then adds `reduce_ns` of its bytes; a sending step then
  posts its message, which ends the step when it has arrived. A fused step (``rcs``, ``rrs``,
  ``rrcs``) therefore forwards after it has received all of its chunks (store and forward, no
  pipelining inside a step). ``cpy`` costs nothing, ``re`` its `reduce_ns`, ``nop`` nothing.
- Channels and threadblocks run in parallel as their waits allow.
- With ``serial=True`` a link carries one message at a time: a message holds every link of its
  route for its whole time, and each link serves messages in the order they were posted (no
  overtaking). Without it messages never wait for each other.

Reductions are free by default, as `cost` prices a built-in algorithm's reduction unless the
endpoint model is on.

`AlphaBeta` is the network of a topology as docs/time-model.md draws one NPU's links
(`timing.links.physical_links`): a Ring dim two links of B/2 (clockwise to the next NPU, counter-clockwise
to the previous), a FullyConnected dim one link of B/(P-1) per peer, a Switch dim an up- and a
down-link of B. A message between two NPUs crosses the dims where their coordinates differ,
lowest dim first; in each it takes ``hops * latency + bytes / rate`` (a Ring the shorter way
round through the NPUs on the way, ties clockwise on even channels and counter-clockwise on odd
ones; a Switch up then down, 2 hops; a FullyConnected dim the direct link), one dim after the
other. Shared ports are not modelled here.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..cost import REDUCE_MEM, CostModel
from ..errors import UsageError
from ..timing.links import physical_links
from ..topology import Topology
from .ir import REDUCES
from .program import GpuProgram, Op, connection

LinkId = Hashable


def reduction_ns(cost: CostModel, d: int | None = None) -> Callable[[float], float]:
    """What reducing a received message of n bytes adds to a step on dim d (0 without the endpoint model).

    With ``d=None`` (a file over every NPU) the topology must have one dim of more than one NPU:
    the endpoint model gives each dim its own share of the memory, so a reduction is priced by a dim.

    The endpoint model prices a built-in reduce-scatter step of b bytes as ``hops * latency +
    max(b / B, REDUCE_MEM * b / M_d) + endpoint delay`` (`cost.CostModel.step_time_ns`): memory
    traffic and transfer overlap. A custom step's message already pays the transfer, so its
    reduction adds what that step pays beyond it, the same function's difference. Copies add
    nothing (a copying step's memory traffic is not priced). ACE is refused: its engine reduces.
    """
    if not cost.endpoint.on:
        return lambda n_bytes: 0.0
    if cost.endpoint.ace:
        raise UsageError("custom algorithms do not take --ace (its engine reduces and copies); drop --ace")
    if d is None:
        dims = [e for e, dim in enumerate(cost.topology.dims) if dim.npus > 1]
        if len(dims) > 1:
            raise UsageError(
                "under the endpoint model a custom algorithm over every NPU runs on one dim (a reduction "
                "is priced by its dim's share of the memory); give each dim its own file"
            )
        d = dims[0] if dims else 0
    dim, rate = cost.topology.dims[d], cost.memory_bytes_per_ns[d]

    def extra_ns(n_bytes: float) -> float:
        b: Any = n_bytes  # (a chunk's bytes may be fractional; the step prices them alike)
        return cost.step_time_ns(dim, b, 1, REDUCE_MEM * n_bytes / rate) - cost.step_time_ns(dim, b, 1)

    return extra_ns


class Network(Protocol):
    """What the timing model needs of a network: a message's links and its time."""

    def route(self, src: int, dst: int, chan: int) -> tuple[LinkId, ...]:
        """The links a message from GPU src to GPU dst on a channel holds."""
        ...

    def message_ns(self, src: int, dst: int, chan: int, n_bytes: float) -> float:
        """The time of such a message of n_bytes, alone on its links."""
        ...


class AlphaBeta:
    """A topology's links and an alpha-beta time per message (module doc); GPU g is NPU g."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.rates = {link.name: link.bytes_per_ns for link in physical_links(topology)}
        self.strides = [math.prod(d.npus for d in topology.dims[:i]) for i in range(len(topology.dims))]

    def coords(self, npu: int) -> tuple[int, ...]:
        """An NPU's coordinate in each dim (dim 0 fastest)."""
        return tuple((npu // s) % d.npus for s, d in zip(self.strides, self.topology.dims))

    def _segments(self, src: int, dst: int, chan: int) -> list[tuple[int, int, tuple[tuple[int, str], ...]]]:
        """Per dim crossed: (dim, hops, ((npu, link name), ...))."""
        a, b = list(self.coords(src)), self.coords(dst)
        out = []
        for d, dim in enumerate(self.topology.dims):
            if a[d] == b[d]:
                continue
            here = sum(c * s for c, s in zip(a, self.strides))
            p, k = dim.npus, (b[d] - a[d]) % dim.npus
            if dim.kind == "Ring":
                cw = k < p - k or (k == p - k and chan % 2 == 0)
                hops, step = (k, 1) if cw else (p - k, -1)
                name = f"dim{d}.{'cw' if cw else 'ccw'}"
                links = tuple(
                    (here + ((a[d] + step * i) % p - a[d]) * self.strides[d], name) for i in range(hops)
                )
                out.append((d, hops, links))
            elif dim.kind == "FullyConnected":
                out.append((d, 1, ((here, f"dim{d}.peer+{k}"),)))
            else:
                there = here + (b[d] - a[d]) * self.strides[d]
                out.append((d, 2, ((here, f"dim{d}.up"), (there, f"dim{d}.down"))))
            a[d] = b[d]
        return out

    def route(self, src: int, dst: int, chan: int) -> tuple[LinkId, ...]:
        """Every (NPU, link name) the message crosses."""
        return tuple(link for _, _, links in self._segments(src, dst, chan) for link in links)

    def message_ns(self, src: int, dst: int, chan: int, n_bytes: float) -> float:
        """The sum over the dims crossed of ``hops * latency + bytes / rate``."""
        return sum(
            hops * self.topology.dims[d].latency_ns + n_bytes / min(self.rates[name] for _, name in links)
            for d, hops, links in self._segments(src, dst, chan)
        )


@dataclass
class Timing:
    """The result: when every step ended, and how long each link was busy.

    Attributes:
        end_ns: the last step's end.
        step_end_ns: (gpu, threadblock, step) -> its end.
        link_busy_ns: link -> time it carried messages.
    """

    end_ns: float
    step_end_ns: dict[tuple[int, int, int], float]
    link_busy_ns: dict[LinkId, float] = field(default_factory=dict)


def time_programs(
    progs: tuple[GpuProgram, ...],
    chunk_bytes: float,
    network: Network,
    serial: bool = True,
    reduce_ns: Callable[[float], float] = lambda n_bytes: 0.0,
) -> Timing:
    """Every step's end (module doc), for chunks of `chunk_bytes`; the programs must be checked."""
    heap: list[tuple[float, int, str, tuple]] = []
    seq = 0

    def push(t: float, kind: str, item: tuple) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, seq, kind, item))
        seq += 1

    pc = {(p.gpu, t): 0 for p in progs for t in range(len(p.threadblocks))}
    free_at = dict.fromkeys(pc, 0.0)
    ended: dict[tuple[int, int, int], float] = {}
    arrival: dict[tuple[int, int, int, int], float] = {}
    waiting: dict[tuple, list[tuple[int, int]]] = {}  # a step's end or a message -> threadblocks
    link_free: dict[LinkId, float] = {}
    busy: dict[LinkId, float] = {}

    def finish(g: int, t: int, op: Op, end: float) -> None:
        ended[(g, t, op.step)] = end
        pc[(g, t)] += 1
        free_at[(g, t)] = end
        push(end, "run", (g, t))
        for who in waiting.pop((g, t, op.step), ()):
            push(max(end, free_at[who]), "run", who)

    def blocked(g: int, t: int, op: Op) -> tuple | None:
        for u, s in op.waits:
            if (g, u, s) not in ended:
                return (g, u, s)
        if op.recv_peer >= 0 and connection(op, g, False) not in arrival:
            return connection(op, g, False)
        return None

    for key in pc:
        push(0.0, "run", key)
    while heap:
        now, _, kind, item = heapq.heappop(heap)
        if kind == "post":  # a message leaves: its links in the order messages were posted
            g, t, op = item
            src, dst, chan, _ = connection(op, g, True)
            n_bytes = op.count * chunk_bytes
            route = network.route(src, dst, chan)
            begin = max([now] + [link_free.get(link, 0.0) for link in route]) if serial else now
            ns = network.message_ns(src, dst, chan, n_bytes)
            for link in route:
                link_free[link] = begin + ns
                busy[link] = busy.get(link, 0.0) + ns
            conn = connection(op, g, True)
            arrival[conn] = begin + ns
            for who in waiting.pop(conn, ()):
                push(max(begin + ns, free_at[who]), "run", who)
            finish(g, t, op, begin + ns)
            continue
        g, t = item
        tb = progs[g].threadblocks[t]
        if pc[(g, t)] >= len(tb) or now < free_at[(g, t)]:
            continue
        op = tb[pc[(g, t)]]
        what = blocked(g, t, op)
        if what is not None:
            waiting.setdefault(what, []).append((g, t))
            continue
        start = max([now] + [ended[(g, u, s)] for u, s in op.waits])
        if op.recv_peer >= 0:
            start = max(start, arrival[connection(op, g, False)])
        if op.type in REDUCES:
            start += reduce_ns(op.count * chunk_bytes)
        if op.send_peer >= 0:
            free_at[(g, t)] = math.inf  # busy until its message is posted and through
            push(start, "post", (g, t, op))
        else:
            finish(g, t, op, start)
    end = max(ended.values(), default=0.0)
    return Timing(end, ended, busy)
