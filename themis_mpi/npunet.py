"""Every NPU's links and engines at once: one global event loop (`World`), two kinds of links.

A `World` runs every NPU's engine in a greenlet on one time-ordered loop; its links are either
ASTRA-sim 2.x's congestion-aware backend (`Astra2World`) or every NPU's links under ``--network
fair`` or ``store-forward`` (`SharedWorld`, whose `NpuLinks` is `network.Network` over the links
of all NPUs). Both exist because one NPU's view is exact only when every NPU does the same.

**ASTRA-sim 2.x.** `network.Astra2Network` sees the backend from one NPU and relies on symmetry:
the messages other
NPUs put on its links are its own at the same point of their routes. Halving-doubling on a Ring
breaks that. Its partners are XOR partners (``HalvingDoubling.cc``: NPU i sends to i + m when
``(i / m) % 2 == 0``, else to i - m) and the backend routes each message the shorter way round,
ties clockwise (``Ring.cpp``). For m = 2 on 8 NPUs, NPUs 0 and 1 send two hops clockwise, NPUs 2
and 3 two hops counter-clockwise: links carry different loads, and NPUs end their steps at
different times (`network.uneven_dims` says where).

Here every NPU has its own links (per NPU, dim and direction: ``cw``/``ccw`` on a Ring, ``up`` and
``down`` on a Switch, one per peer on a FullyConnected dim), with `Astra2Network`'s rules: a FIFO
of whole messages per link, ``trunc(bytes / B)`` of serialization, arrival ``trunc(latency +
bytes / B)`` after the link took the message, store-and-forward at every NPU on the way. A step
on NPU i sends its messages and posts its receives at once (``HalvingDoubling::ready``); it ends
when the messages it *receives* have arrived (at once if they came before it posted the
receive: ``CommonNetworkApi::sim_recv``), then the endpoint delay and the reduction pass and the
next step sends. Under symmetry a received message arrives when the NPU's own does, which is
`Astra2Network`'s rule, so both give the same times there (a test).

`Astra2World` runs every NPU's engine in a greenlet on one event queue, in time order: events of
one instant run in the order they were scheduled (``EventQueue``/``EventList`` of the backend),
and an NPU whose stage ended runs at once, before the next event, as ASTRA-sim's handlers do. An
NPU starts transfers only at its current time, which is the queue's, so the loop is exact (no
look-ahead, no rollback). Both transports run this same simulation, so emulator and model agree.

**Fair and store-forward.** Point-to-point messages (Chakra send/recv, pipelines) load only their
sender's and receiver's links, and per-rank graphs load NPUs unevenly, so there every NPU's links
run (`shared_every_npu` says when; `NpuLinks` has the rules): a stage step of NPU i is one
transfer over i's links, ending once its own transfer and those it receives in that step are
done, and a message is one transfer over its dimension-ordered route. Symmetric runs keep the
one-NPU network, which gives the same times (a test) much faster.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from .config import RunConfig
from .cost import A2A, ASTRA_SIM_2, CostModel, CostModels, link_bytes_per_ns
from .engine import CollectiveRun, MessageRun, StageRun, VirtualClock
from .errors import UsageError
from .network import (
    FAIR,
    IDEAL,
    STORE_FORWARD,
    Network,
    Step,
    astra2_anticlockwise,
    astra2_messages,
    physical_links,
    step_planner,
    uneven_dims,
)
from .network import _Flow as _LinkFlow
from .npus import GreenletControl, Greenlets
from .topology import Topology

T = TypeVar("T")
MAX_NPUS = 4096  # NPUs one process runs at once


def every_npu(topology: Topology, config: RunConfig) -> bool:
    """Whether a run needs every NPU's network: 2.x's congestion-aware backend on an uneven dim."""
    return config.compat == ASTRA_SIM_2 and config.network == STORE_FORWARD and bool(uneven_dims(topology))


NpuStep = tuple[int, tuple[int, ...], tuple[int, ...], float]  # bytes, send peers, recv peers, delay


def npu_stage_steps(
    cost: CostModel, dim_index: int, op: str, full_elems: int, coord: int, anticlockwise: bool = False
) -> tuple[NpuStep, ...]:
    """The stage's steps at one coordinate: (message bytes, peers sent to, peers received from, delay).

    Peers are coordinates on the dim: `network.astra2_messages`'s distances ahead (sent to) and
    behind (received from), or the XOR partner of a halving-doubling step.
    """
    p = cost.topology.dims[dim_index].npus
    out = []
    for nbytes, distances, mask, delay in astra2_messages(cost, dim_index, op, full_elems, anticlockwise):
        sends: tuple[int, ...]
        recvs: tuple[int, ...]
        if mask:
            sends = recvs = (coord ^ mask,)
        else:
            sends = tuple((coord + d) % p for d in distances)
            recvs = tuple((coord - d) % p for d in distances)
        out.append((nbytes, sends, recvs, delay))
    return tuple(out)


Link = tuple[int, int, Any]  # (rank, dim, "cw" | "ccw" | "up" | "down" | peer coordinate)


def npu_route(topology: Topology, rank: int, dim_index: int, peer: int) -> tuple[Link, ...]:
    """The links a message from `rank` to the NPU at coordinate `peer` of a dim crosses, in order.

    A Ring goes the shorter way round, ties clockwise, through every NPU on the way (``Ring.cpp``);
    a Switch is the sender's up-link, then the receiver's down-link; a FullyConnected dim, the
    sender's link to that peer.
    """
    dims = topology.dims
    dim = dims[dim_index]
    p = dim.npus
    stride = int(np.prod([d.npus for d in dims[:dim_index]], dtype=np.int64))
    c = (rank // stride) % p
    base = rank - c * stride
    if dim.kind == "Ring":
        cw = (peer - c) % p
        step, name, hops = (-1, "ccw", p - cw) if p - cw < cw else (1, "cw", cw)
        out = []
        for _ in range(hops):
            out.append((base + c * stride, dim_index, name))
            c = (c + step) % p
        return tuple(out)
    if dim.kind == "Switch":
        return ((rank, dim_index, "up"), (base + peer * stride, dim_index, "down"))
    return ((rank, dim_index, peer),)


def stage_key(run: StageRun) -> tuple[int, int, int]:
    """A stage's name on every NPU: (collective, chunk, stage index)."""
    s = run.stage
    return (s.coll, s.chunk, s.index)


@dataclass(eq=False)
class _Flow:
    """A running stage on one NPU: its steps, the step it is in, the receipts it still waits for."""

    rank: int
    run: StageRun
    key: tuple[int, int, int]  # (collective, chunk, stage index): the same stage on every NPU
    steps: tuple[NpuStep, ...]
    peers: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # per step: send and recv ranks
    k: int = 0
    pending: int = 0


@dataclass(eq=False)
class _Message:
    route: tuple[Link, ...]
    hop: int
    nbytes: int
    key: tuple  # (receiver, sender, stage key, step): what the receive matches


class _Npu:
    """Where one NPU's greenlet stands: stages ended and not yet taken, and what it waits for."""

    __slots__ = ("ended", "waiting")

    def __init__(self) -> None:
        self.ended: list[StageRun] = []
        self.waiting = False  # in `wait_next` (its horizon, when finite, is in `World._timed`)


class World(Greenlets):
    """Every NPU's engine in a greenlet on one time-ordered event loop; the links are a subclass's.

    `Astra2World` has ASTRA-sim 2.x's congestion-aware links, `SharedWorld` the links of every
    NPU under ``--network fair`` or ``store-forward``. A subclass says when its next event is
    (`_next_ns`), runs it (`_fire_next`), and starts stages (`start`); the world runs the NPUs.

    Args:
        topology: the network.
        config: the run settings.
        replayable: keep every NPU's stage starts and ends for `replay` (the emulator's ranks
            need them; the model does not, and they are most of the memory of a long run).
    """

    def __init__(self, topology: Topology, config: RunConfig, replayable: bool = True):
        if topology.npus > MAX_NPUS:
            raise UsageError(f"every NPU's links run at most {MAX_NPUS} NPUs, not {topology.npus}")
        super().__init__(topology.npus)
        self.topology, self.config = topology, config
        self.cost = CostModels(topology, config.endpoint_delay_ns, config.compat, config.endpoint)
        self.strides = [int(np.prod(topology.shape[:d], dtype=np.int64)) for d in range(len(topology.dims))]
        self.now_ns = 0.0
        self.replayable = replayable
        self.npus = [_Npu() for _ in range(self.n)]
        self._timed: dict[int, float] = {}  # waiting NPUs with a finite horizon: the horizon
        # per NPU: every stage's start (by its key) and the stage ends in the order it took them
        self.starts: list[dict[tuple[int, int, int], float]] = [{} for _ in range(self.n)]
        self.order: list[list[list[tuple[int, int, int]]]] = [
            [[] for _ in topology.dims] for _ in range(self.n)
        ]
        self.ends: list[list[tuple[float, tuple[tuple[int, int, int], ...]]]] = [[] for _ in range(self.n)]

    # --- what a subclass's links say ---------------------------------------------------------------

    def start(self, rank: int, run: StageRun) -> None:
        """A stage (or a message) starts on NPU `rank` now."""
        raise NotImplementedError

    def _next_ns(self) -> float:
        """When the links' next event is (inf: none)."""
        raise NotImplementedError

    def _fire_next(self, t_ns: float) -> None:
        """Run the links' next event, due at t_ns (now_ns becomes t_ns)."""
        raise NotImplementedError

    def _advance(self, t_ns: float) -> None:
        """Time moves on to t_ns with no event on the links (an NPU's horizon)."""
        self.now_ns = t_ns

    def link_bytes(self, rank: int) -> list[float] | None:
        """Bytes each of NPU `rank`'s links carried (`network.physical_links` order), where known."""
        return None

    def _begin(self, rank: int, run: StageRun) -> None:
        """Note a stage's start on NPU `rank` (its key's start time, and its place on its dim)."""
        if not self.replayable:
            return
        key = stage_key(run)
        self.starts[rank][key] = run.start_ns
        if not isinstance(run, MessageRun):
            self.order[rank][run.stage.dim].append(key)

    def _ended(self, rank: int, run: StageRun) -> None:
        npu = self.npus[rank]
        npu.ended.append(run)
        if npu.waiting:
            npu.waiting = False
            self._timed.pop(rank, None)
            self.ready.append(rank)

    def replay(self, rank: int) -> Replay:
        """NPU `rank`'s stage ends of the run, for an engine that takes the same decisions.

        With them go the stages' numbers on their dim, the same on every NPU (`Replay.number`),
        and the bytes its links carried.
        """
        assert self.replayable, "a world run without its starts and ends cannot be replayed"
        numbers = {key: i for keys in self.order[rank] for i, key in enumerate(sorted(keys))}
        return Replay(rank, self.starts[rank], self.ends[rank], numbers, self.link_bytes(rank))

    # --- the NPUs ---------------------------------------------------------------------------------

    def wait(self, rank: int, horizon_ns: float) -> None:
        """NPU `rank` waits until a stage of its ends or the queue reaches the horizon."""
        npu = self.npus[rank]
        npu.waiting = True
        if horizon_ns < math.inf:
            self._timed[rank] = horizon_ns
        self._yield()

    def transport(self, rank: int) -> WorldTransport:
        """NPU `rank`'s transport."""
        return WorldTransport(self, rank)

    def _idle(self) -> bool:
        """Run what comes first: the links' next event or the NPUs' earliest horizon (False: neither).

        At a tie the event comes first, as `Astra2Network.next` and `Network.next` do.
        """
        horizon = min(self._timed.values(), default=math.inf)
        t_ns = self._next_ns()
        if t_ns < math.inf and t_ns <= horizon:
            self._fire_next(t_ns)
        elif horizon < math.inf:
            self._advance(horizon)
            for rank in sorted(r for r, h in self._timed.items() if h == horizon):
                del self._timed[rank]
                self.npus[rank].waiting = False
                self.ready.append(rank)
        else:
            return False
        return True

    def _stalled(self) -> str:
        """Who waits for what, and what the links know of it."""
        stuck = [r for r, n in enumerate(self.npus) if n.waiting]
        if not stuck and not self.arrived:
            return ""
        what = f"NPU {stuck[0]} waits for a message" if stuck else f"NPUs {self.arrived[:4]} at a meeting"
        return f"every NPU waits and none can move ({len(stuck)} on messages): {what}{self._why()}"

    def _why(self) -> str:
        """What the links know of a deadlock, as a clause (empty if nothing)."""
        return ""


class Astra2World(World):
    """Every NPU's engine on ASTRA-sim 2.x's congestion-aware links, in one process and time order.

    Args:
        topology: the network (1 GB = 2^30 B per link and direction, as `cost.link_bytes_per_ns`).
        config: the run settings (``--compat astra-sim-2``, ``--network store-forward``).
    """

    def __init__(self, topology: Topology, config: RunConfig):
        if config.compat != ASTRA_SIM_2 or config.network != STORE_FORWARD:
            raise UsageError("every NPU's links run under --compat astra-sim-2 --network store-forward only")
        if topology.flat:
            raise UsageError("--compat astra-sim-2 times per-dim stages; nccl dims are not part of it")
        super().__init__(topology, config)
        self._events: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self._busy: set[Link] = set()
        self._fifo: dict[Link, deque[_Message]] = defaultdict(deque)
        self._arrived: dict[tuple, int] = defaultdict(int)  # messages in before their receive
        self._posted: dict[tuple, deque[_Flow]] = defaultdict(deque)  # receives before their message
        self._plans: dict[tuple, tuple[NpuStep, ...]] = {}
        self._routes: dict[tuple[int, int, int], tuple[Link, ...]] = {}
        self._links = [(dim.latency_ns, link_bytes_per_ns(dim)) for dim in topology.dims]  # per dim
        self.arrival_ns: dict[tuple, float] = {}  # when the last message under each key arrived

    # --- the links --------------------------------------------------------------------------------

    def _schedule(self, t_ns: float, fn: Callable[[Any], None], arg: Any) -> None:
        heapq.heappush(self._events, (t_ns, self._seq, fn, arg))
        self._seq += 1

    def start(self, rank: int, run: StageRun) -> None:
        """A stage starts on NPU `rank` now: its first messages leave after one endpoint delay."""
        if isinstance(run, MessageRun):
            raise UsageError("point-to-point messages are not part of --compat astra-sim-2")
        s = run.stage
        self._begin(rank, run)
        dim = self.topology.dims[s.dim]
        c = (rank // self.strides[s.dim]) % dim.npus
        cost = self.cost(s.itemsize)
        key = (s.itemsize, s.dim, s.op, s.full_elems, c, astra2_anticlockwise(s))
        steps = self._plans.get(key)
        if steps is None:
            steps = self._plans[key] = npu_stage_steps(cost, s.dim, s.op, s.full_elems, c, key[-1])
        if not steps:
            self._ended(rank, run)
            return
        base = rank - c * self.strides[s.dim]
        stride = self.strides[s.dim]
        peers = tuple(
            (tuple(base + q * stride for q in sends), tuple(base + q * stride for q in recvs))
            for _, sends, recvs, _ in steps
        )
        flow = _Flow(rank, run, stage_key(run), steps, peers)
        self._schedule(run.start_ns + cost.endpoint_delay_ns, self._send, flow)

    def _send(self, flow: _Flow) -> None:
        """Step k: send its messages, then post its receives (`HalvingDoubling::ready`)."""
        nbytes, sends, _, _ = flow.steps[flow.k]
        send_ranks, recv_ranks = flow.peers[flow.k]
        s = flow.run.stage
        for q, dst in zip(sends, send_ranks):
            self.message(flow.rank, s.dim, q, nbytes, (dst, flow.rank, flow.key, flow.k))
        flow.pending = len(recv_ranks)
        for src in recv_ranks:
            key = (flow.rank, src, flow.key, flow.k)
            if self._arrived.get(key):
                self._arrived[key] -= 1
                if not self._arrived[key]:
                    del self._arrived[key]
                self._schedule(self.now_ns, self._received, flow)  # (`sim_recv`: a 0 ns event)
            else:
                self._posted[key].append(flow)

    def message(self, rank: int, dim: int, peer: int, nbytes: int, key: tuple) -> None:
        """Send a message now from NPU `rank` to the NPU at coordinate `peer` of a dim.

        `key` is what the receive matches, ``(receiver, sender, ...)``; its arrival time is kept
        in `arrival_ns` (the last one under that key).
        """
        route = self._routes.get((rank, dim, peer))
        if route is None:
            route = self._routes[(rank, dim, peer)] = npu_route(self.topology, rank, dim, peer)
        self._enter(_Message(route, 0, nbytes, key))

    def drain(self) -> None:
        """Run every queued event in time order: the links alone, with no NPU's engine (tools, tests)."""
        while self._events:
            t, _, fn, arg = heapq.heappop(self._events)
            self.now_ns = t
            fn(arg)

    def _enter(self, msg: _Message) -> None:
        link = msg.route[msg.hop]
        if link in self._busy:
            self._fifo[link].append(msg)
        else:
            self._transmit(link, msg)

    def _transmit(self, link: Link, msg: _Message) -> None:
        """The link takes the message: free after its serialization, there after latency + serialization."""
        self._busy.add(link)
        latency_ns, rate = self._links[link[1]]
        serial = msg.nbytes / rate
        self._schedule(self.now_ns + math.floor(latency_ns + serial), self._arrive, msg)
        self._schedule(self.now_ns + math.floor(serial), self._free, link)

    def _free(self, link: Link) -> None:
        self._busy.discard(link)
        queue = self._fifo.get(link)
        if queue:
            self._transmit(link, queue.popleft())

    def _arrive(self, msg: _Message) -> None:
        msg.hop += 1
        if msg.hop < len(msg.route):  # store and forward: on to the next link
            self._enter(msg)
            return
        self.arrival_ns[msg.key] = self.now_ns
        posted = self._posted.get(msg.key)
        if posted:
            flow = posted.popleft()
            if not posted:
                del self._posted[msg.key]
            self._received(flow)
        else:
            self._arrived[msg.key] += 1

    def _received(self, flow: _Flow) -> None:
        flow.pending -= 1
        if flow.pending == 0:
            self._schedule(self.now_ns + flow.steps[flow.k][3], self._step_done, flow)

    def _step_done(self, flow: _Flow) -> None:
        flow.k += 1
        if flow.k < len(flow.steps):
            self._send(flow)
        else:
            self._ended(flow.rank, flow.run)

    def _next_ns(self) -> float:
        return self._events[0][0] if self._events else math.inf

    def _fire_next(self, t_ns: float) -> None:
        t, _, fn, arg = heapq.heappop(self._events)
        self.now_ns = t
        fn(arg)


def shared_every_npu(config: RunConfig, messages: bool, per_rank: bool, slow_compute: bool = False) -> bool:
    """Whether a run needs every NPU's links under fair or store-forward (`SharedWorld`).

    Point-to-point messages load their sender's and receiver's links only, per-rank graphs
    load NPUs unevenly, and stragglers (late NPUs, scaled links, NPUs that compute slower) put
    them out of step: one NPU's view (`network.Network`) is exact for none of them.
    """
    uneven = messages or per_rank or slow_compute or config.asymmetric
    return config.network != IDEAL and not config.compat and uneven


@dataclass(eq=False)
class _NpuFlow(_LinkFlow):
    """A stage (or a message) on every NPU's links: its NPU, key and receipts per step."""

    rank: int = -1
    key: tuple | None = None  # the stage's key; None for a message
    recvs: tuple[tuple[int, ...], ...] = ()  # per step: the NPUs it receives from
    consumers: tuple[int, ...] = ()  # per step: how many NPUs receive from it
    pending: int = 0  # its own transfer and the receipts it still waits for


class NpuLinks(Network):
    """Every NPU's links (`network.physical_links` per NPU) under ``fair`` or ``store-forward``.

    The rules are `network.Network`'s, over the links of all NPUs at once: under ``fair`` the
    rates are max-min fair over every transfer of every NPU on every link, cut-through; under
    ``store-forward`` each link is a FIFO of whole transfers, hop by hop. A stage step of NPU i
    is one transfer over i's links as `network.StepPlanner` spreads it (a Ring: half each way
    on i's two links; a Switch: i's up-link, then the receivers' down-links; FullyConnected:
    i's link to the peer; a shared port: i's out and the receivers' in). The step ends when
    its own transfer is done and the transfers it receives in that step (the same stage's
    step on its peers, `StepPlanner.stage_peers`) are done, then its fixed delay. When every
    NPU does the same at the same time, each link carries what the one-NPU `Network` puts on
    its link of that kind, so both give the same times (a test).

    A point-to-point message is one transfer over the route `route` gives, then its fixed delay
    (``hops * latency + endpoint delay`` per dim crossed, as `cost.CostModel.p2p_ns`).
    `link_scale` ``(dim, rank, factor)``: that NPU's links of that dim (both ways) at factor
    times their rate (``--link-scale``).
    """

    solo = False  # (a step's end waits for its peers: no summing ahead)

    def __init__(
        self,
        topology: Topology,
        rule: str,
        cost: CostModels,
        link_scale: tuple[tuple[int, int, float], ...] = (),
    ):
        super().__init__(topology, rule, cost)
        local = physical_links(topology)
        self.per_npu = len(local)
        self.local = {link.name: i for i, link in enumerate(local)}
        scale = {(d, r): f for d, r, f in link_scale}  # (a straggler's links of a dim, both ways)
        self.links = tuple(
            replace(
                link,
                name=f"npu{r}.{link.name}",
                bytes_per_ns=link.bytes_per_ns * scale.get((link.dim, r), 1.0),
            )
            for r in range(topology.npus)
            for link in local
        )
        self.capacity = [link.bytes_per_ns for link in self.links]
        self._users = [0] * len(self.links)
        self._fifo = [deque() for _ in self.links]
        self.carried = [0.0] * len(self.links)  # bytes each link took
        self.strides = [int(np.prod(topology.shape[:d], dtype=np.int64)) for d in range(len(topology.dims))]
        self._plans: dict[tuple, tuple] = {}
        self._sent: dict[tuple, int] = {}  # (key, step, sender) -> receivers yet to take it
        self._waiting: dict[tuple, list[_NpuFlow]] = {}  # (key, step, sender) -> receivers waiting

    def _coord(self, rank: int, d: int) -> tuple[int, int]:
        """The NPU's coordinate on dim d, and the rank at coordinate 0 of its group there."""
        stride = self.strides[d]
        c = (rank // stride) % self.topology.dims[d].npus
        return c, rank - c * stride

    def stage(self, rank: int, key: tuple, run: StageRun) -> bool:
        """Start a stage of NPU `rank` now; False if it has no step (it ends at once)."""
        s = run.stage
        plan_key = (s.itemsize, s.dim, s.op, s.full_elems, rank)
        plan = self._plans.get(plan_key)
        if plan is None:
            plan = self._plans[plan_key] = self._plan(rank, s.itemsize, s.dim, s.op, s.full_elems)
        steps, recvs, consumers = plan
        if not steps:
            return False
        flow = _NpuFlow(((rank, run),), steps, rank=rank, key=key, recvs=recvs, consumers=consumers)
        self._begin_step(flow)
        return True

    def _plan(self, rank: int, itemsize: int, d: int, op: str, full_elems: int) -> tuple:
        """A stage's steps on NPU `rank`'s links (and its receivers'), its peers per step."""
        planner = step_planner(self.topology, self.cost(itemsize))
        dim = self.topology.dims[d]
        p, stride = dim.npus, self.strides[d]
        c, base = self._coord(rank, d)
        ina = dim.algorithm == "ina" and op != A2A
        port = self.topology.port_of(d)
        theirs = set() if ina else {self.local.get(f"dim{d}.down", -1)}  # links of the receiver
        if port is not None and not ina:
            theirs.add(self.local[f"port{port}.in"])
        own, n_links = rank * self.per_npu, self.per_npu
        steps, recvs, consumers = [], [], []
        planned = zip(planner.stage_steps(d, op, full_elems), planner.stage_peers(d, op, full_elems))
        for step, peers in planned:
            to = [(base + (c + k) % p * stride, w) for k, w in peers]
            hops = []
            for hop in step.hops:
                usage: dict[int, float] = {}
                for link, share in hop:
                    if link in theirs:
                        for r, w in to:
                            usage[r * n_links + link] = usage.get(r * n_links + link, 0.0) + share * w
                    else:
                        usage[own + link] = usage.get(own + link, 0.0) + share
                hops.append(tuple(usage.items()))
            mine = Step(step.bytes, tuple(hops), step.delay_ns)
            rate = min(self.capacity[link] / share for link, share in mine.usage)
            steps.append(replace(mine, solo_rate=rate))
            recvs.append(tuple(sorted({base + (c - k) % p * stride for k, _ in peers})))
            consumers.append(len({r for r, _ in to}))
        return tuple(steps), tuple(recvs), tuple(consumers)

    def route(self, src: int, dst: int) -> tuple[tuple[tuple[int, float], ...], ...]:
        """The links a message from `src` to `dst` crosses, one hop each, dimension-ordered.

        It crosses the dims where the two NPUs' coordinates differ, the lowest dim first: on a
        Ring the shorter way round (ties clockwise) through every NPU on the way; on a Switch
        the sender's up-link, then the receiver's down-link; on a FullyConnected dim the
        direct link. A dim with a shared port adds the port's out at its first hop and the
        next NPU's port in at its last.
        """
        hops: list[list[tuple[int, float]]] = []
        x, n_links = src, self.per_npu
        for d, dim in enumerate(self.topology.dims):
            a, base = self._coord(x, d)
            b, _ = self._coord(dst, d)
            if a == b:
                continue
            p, stride = dim.npus, self.strides[d]
            y = base + b * stride
            if dim.kind == "Ring":
                cw = (b - a) % p
                name, step, count = ("ccw", -1, p - cw) if p - cw < cw else ("cw", 1, cw)
                seg = []
                for _ in range(count):
                    seg.append([((base + a * stride) * n_links + self.local[f"dim{d}.{name}"], 1.0)])
                    a = (a + step) % p
            elif dim.kind == "Switch":
                up, down = self.local[f"dim{d}.up"], self.local[f"dim{d}.down"]
                seg = [[(x * n_links + up, 1.0)], [(y * n_links + down, 1.0)]]
            else:
                seg = [[(x * n_links + self.local[f"dim{d}.peer+{(b - a) % p}"], 1.0)]]
            port = self.topology.port_of(d)
            if port is not None:
                seg[0].append((x * n_links + self.local[f"port{port}.out"], 1.0))
                seg[-1].append((y * n_links + self.local[f"port{port}.in"], 1.0))
            hops += seg
            x = y
        return tuple(tuple(hop) for hop in hops)

    def message(self, ends: tuple, src: int, dst: int, nbytes: int, delay_ns: float) -> None:
        """Start a message's transfer now; `ends` are its (rank, run) pairs, ended together."""
        step = Step(float(nbytes), self.route(src, dst), delay_ns)
        rate = min((self.capacity[link] / share for link, share in step.usage), default=math.inf)
        self._begin_step(_NpuFlow(ends, (replace(step, solo_rate=rate),)))

    def _begin_step(self, flow: _LinkFlow) -> None:
        assert isinstance(flow, _NpuFlow)
        if flow.k < len(flow.steps):
            step = flow.steps[flow.k]
            carried = self.carried
            for link, share in step.usage:
                carried[link] += step.bytes * share
            if flow.key is not None:  # its receipts: the transfers of its peers' same step
                flow.pending = 1
                for src in flow.recvs[flow.k]:
                    tag = (flow.key, flow.k, src)
                    left = self._sent.get(tag)
                    if left is None:
                        self._waiting.setdefault(tag, []).append(flow)
                        flow.pending += 1
                    elif left == 1:
                        del self._sent[tag]
                    else:
                        self._sent[tag] = left - 1
        super()._begin_step(flow)

    def _transfer_done(self, flow: _LinkFlow) -> None:
        """Its transfer is there: the step ends once its receipts are too (theirs may end now)."""
        assert isinstance(flow, _NpuFlow)
        if flow.key is None:
            super()._transfer_done(flow)
            return
        tag = (flow.key, flow.k, flow.rank)
        waiters = self._waiting.pop(tag, [])
        left = flow.consumers[flow.k] - len(waiters)
        if left > 0:
            self._sent[tag] = left
        flow.pending -= 1
        if flow.pending == 0:
            super()._transfer_done(flow)
        for other in waiters:
            other.pending -= 1
            if other.pending == 0:
                super()._transfer_done(other)


class SharedWorld(World):
    """Every NPU's engine on every NPU's links under ``--network fair`` or ``store-forward`` (`NpuLinks`).

    Runs that the one-NPU `network.Network` cannot time exactly run here
    (`shared_every_npu`): point-to-point messages, per-rank graphs and stragglers (a late NPU
    starts later; a scaled link is that NPU's link at that factor, `NpuLinks`). A message's two sides
    match by (sender, receiver, tag) in issue order; its transfer starts once both are issued
    (the later issue is now) and both sides end when it has arrived and its fixed delay has
    passed, as `engine.MessageRun` says under ``ideal``. A stage matches its peers' by its key
    (collective, chunk, stage index), so the NPUs of a group must issue the same collectives in
    the same order, as the emulator's do.

    Args:
        topology: the network.
        config: the run settings (``--network fair`` or ``store-forward``, no ``--compat``).
    """

    def __init__(self, topology: Topology, config: RunConfig, replayable: bool = True):
        if config.network not in (FAIR, STORE_FORWARD) or config.compat:
            raise UsageError("every NPU's shared links take --network fair or store-forward, no --compat")
        super().__init__(topology, config, replayable)
        self.links = NpuLinks(topology, config.network, self.cost, config.link_scale)
        self._counts: dict[tuple, int] = defaultdict(int)
        self._posted: dict[tuple, StageRun] = {}  # a message's first side, until the other comes

    def start(self, rank: int, run: StageRun) -> None:
        """A stage or a message side starts on NPU `rank` now."""
        self._begin(rank, run)
        if isinstance(run, MessageRun):
            self._message(rank, run)
        elif not self.links.stage(rank, stage_key(run), run):
            self._ended(rank, run)

    def _message(self, rank: int, run: MessageRun) -> None:
        src, dst = (rank, run.peer) if run.send else (run.peer, rank)
        side = (src, dst, run.tag, run.send)
        k = self._counts[side]
        self._counts[side] = k + 1
        other = self._posted.pop((src, dst, run.tag, not run.send, k), None)
        if other is None:
            self._posted[side + (k,)] = run
            return
        send, recv = (run, other) if run.send else (other, run)
        assert isinstance(send, MessageRun)
        cost = self.cost(1)
        dims = self.topology.dims
        delay_ns = 0.0
        for d, hops in send.path:
            delay_ns = delay_ns + (hops * dims[d].latency_ns + cost.endpoint_delay_ns)
        self.links.message(((src, send), (dst, recv)), src, dst, send.nbytes, delay_ns)

    def _next_ns(self) -> float:
        return self.links._next_event_ns()

    def _fire_next(self, t_ns: float) -> None:
        links = self.links
        links._advance(t_ns)
        self.now_ns = t_ns
        links._fire(t_ns)
        ended, links._ended = links._ended, []
        for ends in ended:
            for rank, run in ends:  # type: ignore[attr-defined]
                self._ended(rank, run)

    def _advance(self, t_ns: float) -> None:
        self.links._advance(t_ns)
        self.now_ns = t_ns

    def _why(self) -> str:
        """A stage waiting for a peer that started the dim's stages in another order, or a lone message."""
        if not self.replayable:  # (no starts kept: the stall says who waits, not why)
            return ""
        for (key, _, sender), flows in self.links._waiting.items():
            if key not in self.starts[sender]:
                rank = flows[0].rank
                dim = self.order[rank]
                d = next(i for i, keys in enumerate(dim) if key in keys)
                theirs = [k for k in self.order[sender][d] if k not in self.order[rank][d]][:1]
                return (
                    f"; NPU {rank} runs stage {key} on dim {d} and waits for NPU {sender}, which started "
                    f"another stage {theirs[0] if theirs else '?'} there first: the NPUs of a dim group "
                    "started its stages in different orders (their loads differ) and hold its slots "
                    "(more --active-chunks-per-dim, or fewer chunks, may help)"
                )
        if self._posted:
            src, dst, tag, send, _ = next(iter(self._posted))
            side = "send" if send else "receive"
            return f"; a {side} from NPU {src} to NPU {dst} (tag {tag}) has no matching side"
        return ""

    def link_bytes(self, rank: int) -> list[float] | None:
        """Bytes each of NPU `rank`'s links carried (`network.physical_links` order)."""
        n = self.links.per_npu
        return self.links.carried[rank * n : (rank + 1) * n]


class WorldTransport(GreenletControl):
    """One NPU of a `World`: the engine's transport, times only (`engine.Transport`).

    Args:
        world: what the NPUs share.
        rank: this NPU's rank (dim 0 varies fastest).
    """

    def __init__(self, world: World, rank: int):
        self.world, self.rank = world, rank
        self.topology, self.config = world.topology, world.config
        self.clock = VirtualClock()
        self.cost = world.cost
        self._npu = world.npus[rank]

    @property
    def link_bytes(self) -> list[float] | None:
        """Bytes each of this NPU's links carried so far, where the world's links know them."""
        return self.world.link_bytes(self.rank)

    def open(self, run: CollectiveRun) -> None:
        """No data."""

    def close(self, run: CollectiveRun) -> None:
        """Nothing to check."""

    def start(self, run: StageRun) -> None:
        """Hand the stage or message to the links at its start, the world's time then.

        Only a late NPU's first work starts ahead of the world (`--npu-delay-us`): it waits for it.
        """
        while self.world.now_ns < run.start_ns:
            self.world.wait(self.rank, run.start_ns)
        self.world.start(self.rank, run)

    def wait_next(self, horizon_ns: float, certain: bool = True) -> tuple[float, list[StageRun]]:
        """This NPU's next stage ends (all at the world's time), or ``(horizon, [])``."""
        npu = self._npu
        if not npu.ended:
            self.world.wait(self.rank, horizon_ns)
        if npu.ended:
            ended, npu.ended = npu.ended, []
            if self.world.replayable:
                self.world.ends[self.rank].append((self.world.now_ns, tuple(stage_key(r) for r in ended)))
            return self.world.now_ns, ended
        return horizon_ns, []


class Replay:
    """One NPU's stage (and message) ends from a `World`, handed to an engine that takes the same decisions.

    It has a network's interface (`start`, `next`): the MPI transport uses it in place of the
    links and moves the data meanwhile. An engine is deterministic: given the same stage ends at
    the same times it starts the same stages at the same times, so the rank's engine walks the
    same path as the NPU's did in the world, and the ends come back in the order and batches the
    NPU took them. A start that differs is a bug, and raised.

    NPUs may start a dim's stages in different orders here (ASTRA-sim's NPUs do: a stage ends
    at different times on different NPUs), so a stage's start number on its dim is not the same
    on every NPU; `number` is (the stage's place among the dim's stages in sorted order).
    """

    def __init__(
        self,
        rank: int,
        starts: dict[tuple[int, int, int], float],
        ends: list[tuple[float, tuple[tuple[int, int, int], ...]]],
        numbers: dict[tuple[int, int, int], int],
        link_bytes: list[float] | None = None,
    ):
        self.rank, self.starts, self.ends, self.numbers = rank, starts, ends, numbers
        self.link_bytes = link_bytes  # what its links carried in the world, where known
        self._i = 0
        self._started: dict[tuple[int, int, int], StageRun] = {}

    def start(self, run: StageRun) -> None:
        """The stage starts; it must be the world's, at the world's time."""
        key = stage_key(run)
        if self.starts.get(key) != run.start_ns:
            raise RuntimeError(
                f"NPU {self.rank} started stage {key} at {run.start_ns} ns, "
                f"in the run of every NPU at {self.starts.get(key)}"
            )
        self._started[key] = run

    def number(self, run: StageRun) -> int:
        """The stage's number on its dim, the same on every NPU (the emulator tags its messages with it)."""
        return self.numbers[stage_key(run)]

    def next(self, horizon_ns: float) -> tuple[float, list]:
        """The next batch of ends at or before the horizon, or ``(horizon, [])``."""
        if self._i < len(self.ends):
            t_ns, keys = self.ends[self._i]
            if t_ns <= horizon_ns:
                if any(k not in self._started for k in keys):
                    raise RuntimeError(
                        f"NPU {self.rank} ends stages {keys} at {t_ns} ns that it did not start"
                    )
                self._i += 1
                return t_ns, [self._started.pop(k) for k in keys]
        return horizon_ns, []
