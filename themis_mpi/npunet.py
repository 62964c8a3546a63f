"""ASTRA-sim 2.x's congestion-aware backend with every NPU: per-NPU links, one global event loop.

`network.Astra2Network` sees the backend from one NPU and relies on symmetry: the messages other
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
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict, deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import greenlet
import numpy as np

from .config import RunConfig
from .cost import AG, AR, ASTRA_SIM_2, RS, CostModel, CostModels, astra_steps, link_bytes_per_ns
from .engine import CollectiveRun, MessageRun, StageRun, VirtualClock
from .errors import UsageError
from .network import STORE_FORWARD, uneven_dims
from .topology import Topology

T = TypeVar("T")
MAX_NPUS = 4096  # NPUs one process runs at once


class Stalled(RuntimeError):
    """No NPU can move: a step that waits for a message nobody sends, or a meeting not all reach."""


def every_npu(topology: Topology, config: RunConfig) -> bool:
    """Whether a run needs every NPU's network: 2.x's congestion-aware backend on an uneven dim."""
    return config.compat == ASTRA_SIM_2 and config.network == STORE_FORWARD and bool(uneven_dims(topology))


NpuStep = tuple[int, tuple[int, ...], tuple[int, ...], float]  # bytes, send peers, recv peers, delay


def npu_stage_steps(
    cost: CostModel, dim_index: int, op: str, full_elems: int, coord: int
) -> tuple[NpuStep, ...]:
    """The stage's steps at one coordinate: (message bytes, peers sent to, peers received from, delay).

    Peers are coordinates on the dim. The messages and their order are `cost.astra_steps`'s (as
    `network.astra2_stage_steps`); the delay after the last receipt is the endpoint delay and the
    local reduction (`CostModel._astra_gaps`).
    """
    dim = cost.topology.dims[dim_index]
    p, c = dim.npus, coord
    gaps = cost._astra_gaps(dim_index, op, full_elems)
    out = []
    halves = ((RS, full_elems), (AG, full_elems)) if op == AR else ((op, full_elems),)
    i = 0
    for half, elems in halves:
        for k, (nbytes, n, _, _) in enumerate(astra_steps(dim, half, elems, cost.itemsize, True)):
            if n > 1:  # direct and all-to-all: every peer at once
                sends = tuple((c + d) % p for d in range(1, p))
                recvs = tuple((c - d) % p for d in range(1, p))
            elif dim.algorithm == "ring":
                sends, recvs = ((c + 1) % p,), ((c - 1) % p,)
            else:  # halving-doubling: the XOR partner, masks 1, 2, 4, ... in RS, back down in AG
                mask = 1 << k if half == RS else p >> (k + 1)
                sends = recvs = (c ^ mask,)
            after = gaps[i][1:] if i == 0 else gaps[i]  # (message, endpoint[, reduction])
            out.append((nbytes, sends, recvs, sum(after[1:])))
            i += 1
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
        self.waiting = False  # in `wait_next` (its horizon, when finite, is in `Astra2World._timed`)


class Astra2World:
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
        if topology.npus > MAX_NPUS:
            raise UsageError(f"every NPU's links run at most {MAX_NPUS} NPUs, not {topology.npus}")
        self.topology, self.config, self.n = topology, config, topology.npus
        self.cost = CostModels(topology, config.endpoint_delay_ns, config.compat, config.endpoint)
        self.strides = [int(np.prod(topology.shape[:d], dtype=np.int64)) for d in range(len(topology.dims))]
        self.now_ns = 0.0
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
        self.npus = [_Npu() for _ in range(self.n)]
        self.ready: deque[int] = deque()
        self._timed: dict[int, float] = {}  # waiting NPUs with a finite horizon: the horizon
        self.arrived: list[int] = []  # NPUs at the current meeting
        self.met: list[Any] = []
        self.slots: list[Any] = [None] * self.n
        self.hub: greenlet.greenlet | None = None
        # per NPU: every stage's start (by its key) and the stage ends in the order it took them
        self.starts: list[dict[tuple[int, int, int], float]] = [{} for _ in range(self.n)]
        self.order: list[list[list[tuple[int, int, int]]]] = [
            [[] for _ in topology.dims] for _ in range(self.n)
        ]
        self.ends: list[list[tuple[float, tuple[tuple[int, int, int], ...]]]] = [[] for _ in range(self.n)]

    # --- the links --------------------------------------------------------------------------------

    def _schedule(self, t_ns: float, fn: Callable[[Any], None], arg: Any) -> None:
        heapq.heappush(self._events, (t_ns, self._seq, fn, arg))
        self._seq += 1

    def start(self, rank: int, run: StageRun) -> None:
        """A stage starts on NPU `rank` now: its first messages leave after one endpoint delay."""
        s = run.stage
        self.starts[rank][stage_key(run)] = run.start_ns
        self.order[rank][s.dim].append(stage_key(run))
        dim = self.topology.dims[s.dim]
        c = (rank // self.strides[s.dim]) % dim.npus
        cost = self.cost(s.itemsize)
        key = (s.itemsize, s.dim, s.op, s.full_elems, c)
        steps = self._plans.get(key)
        if steps is None:
            steps = self._plans[key] = npu_stage_steps(cost, s.dim, s.op, s.full_elems, c)
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

    def _ended(self, rank: int, run: StageRun) -> None:
        npu = self.npus[rank]
        npu.ended.append(run)
        if npu.waiting:
            npu.waiting = False
            self._timed.pop(rank, None)
            self.ready.append(rank)

    def replay(self, rank: int) -> Replay:
        """NPU `rank`'s stage ends of the run, for an engine that takes the same decisions.

        With them go the stages' numbers on their dim, the same on every NPU (`Replay.number`).
        """
        numbers = {key: i for keys in self.order[rank] for i, key in enumerate(sorted(keys))}
        return Replay(rank, self.starts[rank], self.ends[rank], numbers)

    # --- the NPUs ---------------------------------------------------------------------------------

    def wait(self, rank: int, horizon_ns: float) -> None:
        """NPU `rank` waits until a stage of its ends or the queue reaches the horizon."""
        npu = self.npus[rank]
        npu.waiting = True
        if horizon_ns < math.inf:
            self._timed[rank] = horizon_ns
        self._yield()

    def gather(self, rank: int, value: Any, what: str) -> list[Any]:
        """Every NPU's value, on every NPU."""
        self.slots[rank] = value
        self.arrived.append(rank)
        if len(self.arrived) < self.n:
            self._yield()
            return self.met
        self.met = list(self.slots)
        self.ready.extend(self.arrived[:-1])
        self.arrived = []
        return self.met

    def _yield(self) -> None:
        assert self.hub is not None
        self.hub.switch()

    def run(self, body: Callable[[Astra2Transport], T]) -> list[T]:
        """Run `body(transport)` on every NPU; every NPU's return, by rank. The first failure is raised.

        When no NPU can run, the earliest of the next event and the NPUs' horizons comes next
        (an event first at a tie, as `Astra2Network.next` does).
        """
        results: list[Any] = [None] * self.n
        failures: list[BaseException] = []

        def npu(rank: int) -> None:
            try:
                results[rank] = body(Astra2Transport(self, rank))
            except greenlet.GreenletExit:
                raise
            except BaseException as exc:  # noqa: BLE001 - raised by run
                failures.append(exc)

        self.hub = greenlet.getcurrent()
        npus = [greenlet.greenlet(lambda r=r: npu(r), parent=self.hub) for r in range(self.n)]
        self.ready.extend(range(self.n))
        events = self._events
        try:
            while not failures:
                if self.ready:
                    npus[self.ready.popleft()].switch()
                    continue
                horizon = min(self._timed.values(), default=math.inf)
                if events and events[0][0] <= horizon:
                    t, _, fn, arg = heapq.heappop(events)
                    self.now_ns = t
                    fn(arg)
                elif horizon < math.inf:
                    self.now_ns = horizon
                    for rank in sorted(r for r, h in self._timed.items() if h == horizon):
                        del self._timed[rank]
                        self.npus[rank].waiting = False
                        self.ready.append(rank)
                else:
                    break
        finally:
            for g in npus:  # unwind the NPUs left waiting (a failure or a deadlock)
                if g and not g.dead:
                    g.throw(greenlet.GreenletExit)
        if failures:
            raise failures[0]
        stuck = [r for r, n in enumerate(self.npus) if n.waiting]
        if stuck or self.arrived:
            what = f"NPU {stuck[0]} waits for a message" if stuck else f"NPUs {self.arrived[:4]} at a meeting"
            raise Stalled(f"every NPU waits and none can move ({len(stuck)} on messages): {what}")
        return results


class Astra2Transport:
    """One NPU on `Astra2World`: the engine's transport, times only (`engine.Transport`).

    Args:
        world: what the NPUs share.
        rank: this NPU's rank (dim 0 varies fastest).
    """

    name = "npus"
    checks_data = False
    check_s = 0.0

    def __init__(self, world: Astra2World, rank: int):
        self.world, self.rank = world, rank
        self.topology, self.config = world.topology, world.config
        self.clock = VirtualClock()
        self.cost = world.cost
        self._npu = world.npus[rank]

    def bcast(self, array: np.ndarray, what: str, patient: bool = False) -> np.ndarray:
        """Rank 0's array on every NPU, in place."""
        array[...] = self.world.gather(self.rank, array.copy(), what)[0]
        return array

    def serving(self) -> AbstractContextManager[None]:
        """Nobody needs an answer while rank 0 decides."""
        return nullcontext()

    def barrier(self, what: str) -> None:
        """Every NPU has arrived."""
        self.world.gather(self.rank, None, what)

    def reduce(self, values, op: str, what: str = "a reduction of results") -> np.ndarray:
        """Element-wise sum, max or min over NPUs, on every NPU."""
        stacked = np.stack([np.asarray(v) for v in self.world.gather(self.rank, np.asarray(values), what)])
        if op == "sum":
            return stacked.sum(axis=0)
        return stacked.max(axis=0) if op == "max" else stacked.min(axis=0)

    def open(self, run: CollectiveRun) -> None:
        """No data."""

    def close(self, run: CollectiveRun) -> None:
        """Nothing to check."""

    def start(self, run: StageRun) -> None:
        """Hand the stage to the links (it starts at the world's time, which is this NPU's)."""
        if isinstance(run, MessageRun):
            raise UsageError("point-to-point messages are not part of --compat astra-sim-2")
        self.world.start(self.rank, run)

    def wait_next(self, horizon_ns: float, certain: bool = True) -> tuple[float, list[StageRun]]:
        """This NPU's next stage ends (all at the world's time), or ``(horizon, [])``."""
        npu = self._npu
        if not npu.ended:
            self.world.wait(self.rank, horizon_ns)
        if npu.ended:
            ended, npu.ended = npu.ended, []
            self.world.ends[self.rank].append((self.world.now_ns, tuple(stage_key(r) for r in ended)))
            return self.world.now_ns, ended
        return horizon_ns, []


class Replay:
    """One NPU's stage ends from `Astra2World`, handed to an engine that takes the same decisions.

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
    ):
        self.rank, self.starts, self.ends, self.numbers = rank, starts, ends, numbers
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
