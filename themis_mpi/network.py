"""Links that concurrent traffic shares: the physical resources under every dim, and the sharing rules.

Each NPU has, per dim (B is the dim's per-NPU bandwidth, all its links together, as before):

- Ring: two outgoing links of B/2, one per direction. Every stage spreads its bytes evenly over
  both (the ring algorithm runs two counter-rotating half-rings, half the data each), so an
  uncontended ring keeps its time.
- FullyConnected of P NPUs: P-1 links of B/(P-1), one per peer distance. A ring step uses the
  link to the next NPU, a halving-doubling step the link to its partner (distance = the step's
  mask), a direct or all-to-all step all of them.
- Switch: one up-link and one down-link of B to the dim's switch; a message goes up, then down.
  An in-network reduction (ina) sends its up-traffic and receives its down-traffic at the
  switch's efficiency.
- A shared port (`topology.Port`, e.g. one NIC that dims 1 and 2 leave through): an out and an
  in direction of the port's rate that every transfer of those dims crosses as well.

A stage's step is a transfer of its bytes over its links, then a fixed delay (``hops *
latency + endpoint delay``): alone on its links it takes exactly the cost model's step time.
The sharing rule (`RunConfig.network`) says how transfers that overlap in time share links:

- ``ideal``: they share nothing (the cost model alone, ASTRA-sim 1.0's congestion-unaware rule;
  `Network` is not used).
- ``fair``: max-min fair sharing of every link among the transfers using it at each instant,
  cut-through at switches (a transfer uses its up- and down-link at once).
- ``store-forward``: each link serves whole transfers in the order they reach it, and a switch
  forwards a transfer only after all of it has arrived (up, then down).

The model is one NPU's, as the model transport's is: collectives are symmetric, so every NPU
starts the same stages at the same times and the load that this NPU's own transfers put on its
outgoing links is the load on every link of that kind (and on its in-links, which its peers'
transfers fill alike). Both transports run this same code, so emulator and model agree exactly.
Point-to-point messages and per-rank graphs load NPUs unevenly: they run on every NPU's links
(`npunet.SharedWorld`, whose `npunet.NpuLinks` is this network over the links of all NPUs).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, replace

from .cost import (
    A2A,
    AG,
    AR,
    ASTRA_SIM_2,
    RS,
    CostModel,
    astra_steps,
    block_elems,
    ina_traffic,
    link_bytes_per_ns,
    steps,
)
from .errors import UsageError
from .topology import Topology

IDEAL, FAIR, STORE_FORWARD = "ideal", "fair", "store-forward"
RULES = (FAIR, STORE_FORWARD, IDEAL)
SATURATED = 1e-12  # relative slack within which a link counts as full when rates are filled


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


def check_rule(topology: Topology, rule: str) -> None:
    """Refuse a sharing rule the topology cannot take (nccl dims are timed flat, not per link)."""
    if rule != IDEAL and topology.flat:
        raise UsageError(
            f"--network {rule} shares the links of per-dim stages; nccl dims take --network ideal"
        )


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
class Step:
    """One step of a stage on the links: a transfer of `bytes`, then `delay_ns`.

    `hops` are the transfer's link groups in order: they are used at once under ``fair``
    (cut-through) and one after the other under ``store-forward``; `usage` is all of them.
    """

    bytes: float
    hops: tuple[Usage, ...]
    delay_ns: float
    usage: Usage = ()
    links: frozenset[int] = frozenset()  # the links of `usage`
    solo_rate: float = 0.0  # its rate alone on its links

    def __post_init__(self) -> None:
        usage = tuple(u for hop in self.hops for u in hop)
        object.__setattr__(self, "usage", usage)
        object.__setattr__(self, "links", frozenset(link for link, _ in usage))


class StepPlanner:
    """The link steps of a stage on one topology (one element size, `CostModel`'s settings)."""

    def __init__(self, topology: Topology, cost: CostModel):
        self.topology, self.cost = topology, cost
        self.links = physical_links(topology)
        self.index = {link.name: i for i, link in enumerate(self.links)}
        self._memo: dict[tuple, tuple[tuple[Step, ...], bool]] = {}

    def stage_steps(self, dim_index: int, op: str, full_elems: int) -> tuple[Step, ...]:
        """The steps of a stage, as the cost model times them alone."""
        return self.stage_plan(dim_index, op, full_elems)[0]

    def stage_plan(self, dim_index: int, op: str, full_elems: int) -> tuple[tuple[Step, ...], bool]:
        """The steps of a stage, and whether every step uses the same links (a solo candidate)."""
        key = (dim_index, op, full_elems)
        plan = self._memo.get(key)
        if plan is None:
            steps = tuple(
                replace(st, solo_rate=min(self.links[link].bytes_per_ns / share for link, share in st.usage))
                for st in self._plan(dim_index, op, full_elems)
            )
            plan = self._memo[key] = (steps, all(step.usage == steps[0].usage for step in steps))
        return plan

    def stage_peers(
        self, dim_index: int, op: str, full_elems: int
    ) -> tuple[tuple[tuple[int, float], ...], ...]:
        """Per step, whom an NPU sends to: (distance ahead on the dim, share of the step's bytes).

        It receives from the same distances behind. A Ring step sends half each way (to the peer
        d ahead clockwise, d behind counter-clockwise); a ring step elsewhere the next NPU; a
        halving-doubling step the peer at the step's distance (its mask) ahead, as the
        FullyConnected link it uses says; direct, all-to-all and in-network steps every peer.
        """
        dim = self.topology.dims[dim_index]
        p = dim.npus
        every = tuple((k, 1.0 / (p - 1)) for k in range(1, p))
        if dim.algorithm == "ina" and op != A2A and p > 1:
            return (every,)
        block = block_elems(full_elems, p) * self.cost.itemsize
        out: list[tuple[tuple[int, float], ...]] = []
        for msg, n in steps(dim, op, full_elems, self.cost.itemsize):
            distance = 1 if dim.algorithm in ("ring", "nccl") else max(1, msg // max(block, 1))
            if n > 1:
                out.append(every)
            elif dim.kind == "Ring":
                out.append(((distance % p, 0.5), (-distance % p, 0.5)))
            else:
                out.append(((distance % p, 1.0),))
        return tuple(out)

    def _port(self, dim_index: int, out: float, into: float) -> tuple[Usage, Usage]:
        port = self.topology.port_of(dim_index)
        if port is None:
            return (), ()
        return ((self.index[f"port{port}.out"], out),), ((self.index[f"port{port}.in"], into),)

    def _plan(self, d: int, op: str, full_elems: int) -> tuple[Step, ...]:
        dim, itemsize = self.topology.dims[d], self.cost.itemsize
        delay_ns = dim.hops * dim.latency_ns + self.cost.endpoint_delay_ns
        i = self.index
        if dim.algorithm == "ina" and op != A2A and dim.npus > 1:
            up, down = ina_traffic(dim, op, full_elems, itemsize)
            v = float(max(up, down))
            cu, cd = up / v / dim.efficiency, down / v / dim.efficiency
            p_out, p_in = self._port(d, cu, cd)
            return (Step(v, (((i[f"dim{d}.up"], cu), *p_out), ((i[f"dim{d}.down"], cd), *p_in)), delay_ns),)
        block = block_elems(full_elems, dim.npus) * itemsize
        out = []
        for msg, n in steps(dim, op, full_elems, itemsize):
            v = float(msg * n)
            p_out, p_in = self._port(d, 1.0, 1.0)
            if dim.kind == "Ring":
                hops: tuple[Usage, ...] = (((i[f"dim{d}.cw"], 0.5), (i[f"dim{d}.ccw"], 0.5), *p_out, *p_in),)
            elif dim.kind == "Switch":
                hops = (((i[f"dim{d}.up"], 1.0), *p_out), ((i[f"dim{d}.down"], 1.0), *p_in))
            elif n > 1:  # direct and all-to-all: one message per peer, every link
                share = 1.0 / (dim.npus - 1)
                hops = (tuple((i[f"dim{d}.peer+{k}"], share) for k in range(1, dim.npus)) + p_out + p_in,)
            else:  # ring: the next NPU; halving-doubling: the partner at the step's distance
                distance = 1 if dim.algorithm == "ring" else max(1, msg // block)
                hops = (((i[f"dim{d}.peer+{distance}"], 1.0), *p_out, *p_in),)
            out.append(Step(v, hops, delay_ns))
        return tuple(out)


_PLANNERS: dict[tuple, StepPlanner] = {}  # stage plans are pure: runs of one topology share them


def step_planner(topology: Topology, cost: CostModel) -> StepPlanner:
    """The planner of a topology and element size, shared by every run and result that needs it."""
    key = (topology, cost.itemsize, cost.endpoint_delay_ns)
    planner = _PLANNERS.get(key)
    if planner is None:
        if len(_PLANNERS) >= 64:  # (a sweep over many topologies keeps the memory bounded)
            _PLANNERS.clear()
        planner = _PLANNERS[key] = StepPlanner(topology, cost)
    return planner


def max_min_rates(usages: list[Usage], capacity: list[float], users: list[int] | None = None) -> list[float]:
    """Max-min fair rates (bytes per ns) of transfers on links (progressive filling).

    Every transfer's rate grows at the same pace until a link it uses is full; then it keeps
    that rate while the others grow on. A transfer that shares no link gets its links' rate
    directly (the same number whatever else runs). `users`, when the caller keeps it, is how
    many of these transfers use each link.
    """
    if users is None:
        users = [0] * len(capacity)
        for usage in usages:
            for link, _ in usage:
                users[link] += 1
    rates = [0.0] * len(usages)
    active = []
    for f, usage in enumerate(usages):
        rate, shared = math.inf, False
        for link, share in usage:
            if users[link] > 1:
                shared = True
            r = capacity[link] / share
            if r < rate:
                rate = r
        if shared:
            active.append(f)
        else:
            rates[f] = rate
    left: dict[int, float] = {}
    while active:
        load: dict[int, float] = {}
        for f in active:
            for link, share in usages[f]:
                load[link] = load.get(link, 0.0) + share
        step = math.inf
        for link, w in load.items():
            r = left.setdefault(link, capacity[link]) / w
            if r < step:
                step = r
        full = set()
        for link, w in load.items():
            left[link] -= step * w
            if left[link] <= SATURATED * capacity[link]:
                full.add(link)
        still = []
        for f in active:
            rates[f] += step
            for link, _ in usages[f]:
                if link in full:
                    break
            else:
                still.append(f)
        active = still
    return rates


# a solo stage's transfer: start, end, its step, bytes left at its start, rate
Window = tuple[float, float, int, float, float]


def _windows(steps: tuple[Step, ...], k: int, t_ns: float, left: float, rate: float) -> list[Window]:
    """A stage's transfers alone at `rate`, from step k with `left` bytes at t_ns (as `_solo_end` sums)."""
    windows = []
    while True:
        end = t_ns + left / rate
        windows.append((t_ns, end, k, left, rate))
        delay_ns = steps[k].delay_ns
        k += 1
        if k == len(steps):
            return windows
        t_ns, left = (end + delay_ns if delay_ns > 0 else end), steps[k].bytes


def _first_meet(mine: list[Window], theirs: list[Window], after_ns: float) -> float:
    """The first instant after `after_ns` at which a transfer of each list is under way (inf if none)."""
    n, m, i, j = len(mine), len(theirs), 0, 0
    while i < n and mine[i][1] <= after_ns:
        i += 1
    while j < m and theirs[j][1] <= after_ns:
        j += 1
    while i < n and j < m:
        a, b = mine[i], theirs[j]
        start = a[0] if a[0] > b[0] else b[0]
        if start < after_ns:
            start = after_ns
        if start < (a[1] if a[1] < b[1] else b[1]):
            return start
        if a[1] <= b[1]:
            i += 1
        else:
            j += 1
    return math.inf


def _solo_end(steps: tuple[Step, ...], k: int, t_ns: float, left: float, rate: float) -> float:
    """The end of a stage alone at `rate` from step k with `left` bytes at t_ns (as `_windows` sums)."""
    while True:
        end = t_ns + left / rate
        delay_ns = steps[k].delay_ns
        if delay_ns > 0:
            end = end + delay_ns
        k += 1
        if k == len(steps):
            return end
        t_ns, left = end, steps[k].bytes


@dataclass(eq=False)
class _Flow:
    """A stage on the links: its steps, where it is, and what is left of its transfer."""

    run: object
    steps: tuple[Step, ...]
    k: int = 0
    left: float = 0.0  # fair: bytes of step k's transfer still to go at `Network.now_ns`
    rate: float = 0.0  # fair: its rate since the last change of the moving set
    end_ns: float = math.inf  # fair: when it ends at that rate
    hop: int = 0  # store-forward: the hop being served
    waiting: int = 0  # store-forward: the hop's links not done yet
    solo_ns: float = -1.0  # fair: alone since then from step k on (`end_ns` is then the stage's end)
    uniform: bool = False  # every step uses the same links
    overlap_ns: float = math.inf  # fair, solo: when its transfers first meet another solo stage's
    windows: list[Window] | None = None  # fair, solo: its transfers from step k, once asked for


class Network:
    """One NPU's links under a sharing rule: stages start, and it says when each one ends.

    `start` a stage at the current time; `next` advances to the earliest stage end at or before
    a horizon and returns ``(t, stages ending at t)``, or ``(horizon, [])``.

    Under ``fair`` a stage whose steps all use the same links and that finds them free runs
    *solo*: its end is summed at once, step by step in the order the step-wise path sums it, so
    both give the same number; when another transfer joins one of its links, the solo stage is
    placed where it is at that instant and goes on step by step, sharing. Solo stages may share
    links when their transfers interleave (one sends while the other waits out its delay, as
    latency-bound stages behind one NIC do): each is solo until their transfers first meet; two
    then share in closed form (`_meet`), more go on step by step. A stage left alone on its
    links goes solo again.
    """

    solo = True  # (a test turns the shortcut off to compare it with the step-wise path)

    def __init__(self, topology: Topology, rule: str, cost):
        if rule not in (FAIR, STORE_FORWARD):
            raise UsageError(f"unknown sharing rule {rule!r}; use one of {', '.join(RULES)}")
        if topology.flat:
            raise UsageError(
                f"--network {rule} shares the links of per-dim stages; nccl dims take --network ideal"
            )
        self.rule, self.cost = rule, cost
        self.topology = topology
        self._planners: dict[int, StepPlanner] = {}
        self.links = physical_links(topology)
        self.capacity = [link.bytes_per_ns for link in self.links]
        self.now_ns = 0.0
        self._moving: list[_Flow] = []  # fair: transfers in progress
        self._users = [0] * len(self.links)  # fair: moving transfers on each link
        self._rates_stale = False
        self._timers: list[tuple[float, int, str, object]] = []  # (time, seq, what, flow or link)
        self._seq = 0
        self._fifo: list[deque] = [deque() for _ in self.links]  # store-forward: (flow, bytes)
        self._ended: list[object] = []

    # --- stages in and out ---------------------------------------------------------------------

    def start(self, run) -> None:
        """A stage starts now (``run.start_ns``, the engine's time, which is this network's)."""
        s = run.stage
        planner = self._planners.get(s.itemsize)
        if planner is None:
            planner = self._planners[s.itemsize] = step_planner(self.topology, self.cost(s.itemsize))
        if not self._moving and not self._timers:  # idle: a new run's engine may start from 0
            self.now_ns = run.start_ns
        steps, uniform = planner.stage_plan(s.dim, s.op, s.full_elems)
        self._begin_step(_Flow(run, steps, uniform=uniform))

    def next(self, horizon_ns: float) -> tuple[float, list]:
        """Advance to the earliest stage end at or before the horizon: (t, stages), or (horizon, [])."""
        while True:
            if self._ended:
                ended, self._ended = self._ended, []
                return self.now_ns, ended
            t = self._next_event_ns()
            if t > horizon_ns:
                self._advance(horizon_ns)
                return horizon_ns, []
            self._advance(t)
            self._fire(t)

    # --- time ------------------------------------------------------------------------------------

    def _schedule(self, t_ns: float, what: str, item: object) -> None:
        heapq.heappush(self._timers, (t_ns, self._seq, what, item))
        self._seq += 1

    def _next_event_ns(self) -> float:
        if self._rates_stale:
            self._set_rates()
        t = self._timers[0][0] if self._timers else math.inf
        for f in self._moving:
            if f.end_ns < t:
                t = f.end_ns
        return t

    def _advance(self, t_ns: float) -> None:
        """Move the fair transfers on to t_ns (their ends stay as their rates set them)."""
        dt = t_ns - self.now_ns
        if dt > 0:
            for f in self._moving:
                if f.solo_ns < 0:
                    f.left -= f.rate * dt
        self.now_ns = t_ns

    def _fire(self, t_ns: float) -> None:
        """Everything due at t_ns: transfers that are done, delays that are over, links that free."""
        done = [f for f in self._moving if f.end_ns <= t_ns] if self._moving else None
        if done:
            self._moving = [f for f in self._moving if f.end_ns > t_ns]
            for f in done:
                f.left = 0.0
                self._leave(f.steps[f.k].usage)
            for f in done:
                if f.solo_ns >= 0:  # a solo stage is over
                    self._ended.append(f.run)
                else:
                    self._transfer_done(f)
        while self._timers and self._timers[0][0] <= t_ns:
            _, _, what, item = heapq.heappop(self._timers)
            if what == "delay":
                flow = item
                assert isinstance(flow, _Flow)
                flow.k += 1
                self._begin_step(flow)
            elif what == "overlap":
                flow = item
                assert isinstance(flow, _Flow)
                if flow.solo_ns >= 0 and flow.overlap_ns == t_ns:
                    self._meet(flow)
            else:
                self._link_done(item)  # type: ignore[arg-type]

    def _begin_step(self, flow: _Flow) -> None:
        """Start the flow's step k, or end the stage after its last step."""
        if flow.k == len(flow.steps):
            self._ended.append(flow.run)
            return
        step = flow.steps[flow.k]
        if self.rule == FAIR:
            flow.left, flow.rate, flow.end_ns = step.bytes, 0.0, math.inf  # (set by `_join`)
            self._moving.append(flow)
            self._join(flow, step)
        else:
            flow.hop = 0
            self._enter_hop(flow)

    def _transfer_done(self, flow: _Flow) -> None:
        """Step k's transfer is all there: its delay, then the next step."""
        if self.rule == FAIR:
            self._after_transfer(flow)
        else:
            self._schedule(self.now_ns + flow.steps[flow.k].delay_ns, "delay", flow)

    def _after_transfer(self, flow: _Flow) -> None:
        """Its transfer is done: the step's delay, then the next step (at once without a delay)."""
        delay_ns = flow.steps[flow.k].delay_ns
        if delay_ns > 0:
            self._schedule(self.now_ns + delay_ns, "delay", flow)
        else:
            flow.k += 1
            self._begin_step(flow)

    def _join(self, flow: _Flow, step: Step) -> None:
        """A transfer starts: alone on its links it takes their rate, else every rate is set anew."""
        users, usage = self._users, step.usage
        for link, _ in usage:
            if users[link]:
                break
        else:
            link = -1
        overlap_ns = -math.inf  # (no solo stage to interleave with)
        if link >= 0:  # a link is in use: solo stages on any of mine share from now on, or interleave
            mine, solos, plain = step.links, [], False
            for other in self._moving:
                if other is not flow and not mine.isdisjoint(other.steps[other.k].links):
                    if other.solo_ns >= 0:
                        solos.append(other)
                    else:
                        plain = True
            if solos and not plain and flow.uniform and self.solo:
                windows = _windows(flow.steps, flow.k, self.now_ns, flow.left, step.solo_rate)
                overlap_ns = self._first_overlap(windows, solos)
            if overlap_ns >= self.now_ns:  # they interleave until then (`_meet`): it goes solo beside them
                for link, _ in usage:
                    users[link] += 1
                self._go_solo(flow, step.solo_rate, overlap_ns, windows)
                return
            for other in solos:
                if other.solo_ns >= 0:  # (not yet with one it interleaved with)
                    self._unsolo(other)
        alone = True
        for link, _ in usage:
            if users[link]:
                alone = False
            users[link] += 1
        if not alone or self._rates_stale:
            self._rates_stale = True
            return
        if flow.uniform and self.solo:  # solo: its end summed as `_after_transfer` and `_begin_step` would
            self._go_solo(flow, step.solo_rate, math.inf, None)
        else:
            flow.rate = step.solo_rate
            flow.end_ns = self.now_ns + flow.left / flow.rate

    def _go_solo(self, flow: _Flow, rate: float, overlap_ns: float, windows: list[Window] | None) -> None:
        """The stage is solo from now at its links' rate, until its transfers meet another's (if ever)."""
        flow.rate, flow.solo_ns, flow.overlap_ns, flow.windows = rate, self.now_ns, overlap_ns, windows
        if windows is None:
            flow.end_ns = _solo_end(flow.steps, flow.k, self.now_ns, flow.left, rate)
        else:
            self._solo_until(flow, windows, overlap_ns)

    def _solo_until(self, flow: _Flow, windows: list[Window], overlap_ns: float) -> None:
        """Its transfers are these windows: it ends after the last one's delay, or meets another."""
        flow.windows, flow.overlap_ns = windows, overlap_ns
        delay_ns = flow.steps[-1].delay_ns
        flow.end_ns = windows[-1][1] + delay_ns if delay_ns > 0 else windows[-1][1]
        if overlap_ns < math.inf:
            self._schedule(overlap_ns, "overlap", flow)

    def _solo_windows(self, flow: _Flow) -> list[Window]:
        """A solo stage's transfers from the step it went solo in."""
        if flow.windows is None:
            flow.windows = _windows(flow.steps, flow.k, flow.solo_ns, flow.left, flow.rate)
        return flow.windows

    def _first_overlap(self, mine: list[Window], solos: list[_Flow]) -> float:
        """When transfers in these windows would first meet a transfer of one of the solo stages."""
        first = math.inf
        for other in solos:
            t = _first_meet(mine, self._solo_windows(other), self.now_ns)
            if t < first:
                first = t
        return first

    def _partners(self, flow: _Flow) -> list[_Flow]:
        """The other solo stages on the flow's links (those it interleaves with)."""
        mine = flow.steps[flow.k].links
        return [
            f
            for f in self._moving
            if f.solo_ns >= 0 and f is not flow and not mine.isdisjoint(f.steps[f.k].links)
        ]

    def _meet(self, flow: _Flow) -> None:
        """Two solo stages' transfers meet now: they share their links until one is through, then go on solo.

        Each takes its max-min rate beside the other until one transfer is done, the other goes
        on at its own rate, and both keep their later steps (each alone at its rate), as the
        step-wise path would run them; if they meet again, the same at that instant. With a
        third solo stage on their links, all go step by step instead.
        """
        partners = self._partners(flow)
        if len(partners) != 1 or self._partners(partners[0]) != [flow]:
            self._unsolo(flow)
            return
        other = partners[0]
        place_a, place_b = self._transfer_now(flow), self._transfer_now(other)
        if place_a is None or place_b is None:  # (one is between transfers: not a meeting after all)
            self._unsolo(flow)
            return
        (wa, left_a), (wb, left_b) = place_a, place_b
        now = self.now_ns
        usages = [flow.steps[wa[2]].usage, other.steps[wb[2]].usage]  # (`_users` counts just these two there)
        rate_a, rate_b = max_min_rates(usages, self.capacity, self._users)
        end_a, end_b = now + left_a / rate_a, now + left_b / rate_b
        first_ns = end_a if end_a < end_b else end_b
        windows_a = self._shared(flow, wa[2], left_a, rate_a, first_ns, end_a <= end_b)
        windows_b = self._shared(other, wb[2], left_b, rate_b, first_ns, end_b <= end_a)
        self._solo_until(flow, windows_a, _first_meet(windows_a, windows_b, first_ns))
        self._solo_until(other, windows_b, math.inf)

    def _transfer_now(self, flow: _Flow) -> tuple[Window, float] | None:
        """A solo stage's window under way now and the bytes left of it, or None between transfers."""
        now = self.now_ns
        for w in self._solo_windows(flow):
            if now < w[1]:
                return (w, w[3] - w[4] * (now - w[0])) if w[0] <= now else None
        return None

    def _shared(
        self, flow: _Flow, k: int, left: float, rate: float, first_ns: float, first: bool
    ) -> list[Window]:
        """A solo stage's windows from now: step k's transfer at `rate` until `first_ns`, alone after."""
        steps, now = flow.steps, self.now_ns
        if first:  # its transfer is the one through at first_ns
            windows = [(now, first_ns, k, left, rate)]
            end = first_ns
        else:
            rest = left - rate * (first_ns - now)
            end = first_ns + rest / flow.rate
            windows = [(now, first_ns, k, left, rate), (first_ns, end, k, rest, flow.rate)]
        if k + 1 < len(steps):
            delay_ns = steps[k].delay_ns
            start = end + delay_ns if delay_ns > 0 else end
            windows += _windows(steps, k + 1, start, steps[k + 1].bytes, flow.rate)
        return windows

    def _unsolo(self, flow: _Flow) -> None:
        """Place a solo stage where it is now: in a step's transfer (left bytes), or in its delay.

        The solo stages it interleaved with go step by step too (their transfers may meet now).
        """
        steps, now = flow.steps, self.now_ns
        windows = self._solo_windows(flow)
        flow.solo_ns = -1.0
        for i, (start, end, k, left, rate) in enumerate(windows):
            if now < end:  # in the transfer of step k
                flow.k, flow.left, flow.rate, flow.end_ns = k, left - rate * (now - start), rate, end
                self._rates_stale = True
                break
            delay_ns = steps[k].delay_ns
            last = i + 1 == len(windows) or windows[i + 1][2] != k
            if last and delay_ns > 0 and now < end + delay_ns:  # in the delay after step k: off the links
                flow.k = k
                self._moving.remove(flow)
                self._leave(steps[k].usage)
                self._schedule(end + delay_ns, "delay", flow)
                break
        for other in self._partners(flow):
            if other.solo_ns >= 0:  # (not yet with one it interleaved with)
                self._unsolo(other)

    def _leave(self, usage: Usage) -> None:
        """A transfer ends: the others' rates change only if one shared a link with it."""
        users = self._users
        for link, _ in usage:
            users[link] -= 1
            if users[link]:
                self._rates_stale = True

    def _set_rates(self) -> None:
        """The max-min rates of the transfers that are not solo (a solo stage shares with solo stages only).

        A stage left alone on its links goes solo again from where it is.
        """
        moving = [f for f in self._moving if f.solo_ns < 0]
        self._rates_stale = False
        if not moving:
            return
        users = self._users
        if len(moving) == 1:  # (alone: its links' rate)
            rates = [moving[0].steps[moving[0].k].solo_rate]
        else:
            rates = max_min_rates([f.steps[f.k].usage for f in moving], self.capacity, users)
        for f, r in zip(moving, rates):
            if f.uniform and self.solo:
                for link, _ in f.steps[f.k].usage:
                    if users[link] != 1:
                        break
                else:
                    self._go_solo(f, r, math.inf, None)
                    continue
            if r != f.rate:
                f.rate = r
                f.end_ns = self.now_ns + f.left / r

    # --- store-forward ----------------------------------------------------------------------------

    def _enter_hop(self, flow: _Flow) -> None:
        """Queue the flow's current hop on each of its links (each serves in arrival order)."""
        step = flow.steps[flow.k]
        hop = step.hops[flow.hop]
        flow.waiting = len(hop)
        for link, share in hop:
            queue = self._fifo[link]
            queue.append((flow, step.bytes * share))
            if len(queue) == 1:
                self._serve(link)

    def _serve(self, link: int) -> None:
        _, nbytes = self._fifo[link][0]
        self._schedule(self.now_ns + nbytes / self.capacity[link], "link", link)

    def _link_done(self, link: int) -> None:
        queue = self._fifo[link]
        flow, _ = queue.popleft()
        if queue:
            self._serve(link)
        flow.waiting -= 1
        if flow.waiting == 0:
            step = flow.steps[flow.k]
            flow.hop += 1
            if flow.hop < len(step.hops):
                self._enter_hop(flow)
            else:
                self._transfer_done(flow)


# --- ASTRA-sim 2.x's congestion-aware backend (``--compat astra-sim-2 --network store-forward``) ---

LinkKey = tuple[int, str]  # (dim, name): ``cw``/``ccw`` on a Ring, ``peer+k``, ``up``/``down``


def astra2_route(dim_index: int, kind: str, npus: int, distance: int) -> tuple[LinkKey, ...]:
    """The links a message to the peer `distance` ahead crosses, one per hop (NPU 0's view).

    A Ring takes the shorter way (ties clockwise) and stores and forwards at every NPU; a Switch
    is the sender's up-link, then the receiver's down-link; a FullyConnected dim, one link.
    """
    if kind == "Ring":
        if npus - distance < distance:
            return ((dim_index, "ccw"),) * (npus - distance)
        return ((dim_index, "cw"),) * distance
    if kind == "Switch":
        return ((dim_index, "up"), (dim_index, "down"))
    return ((dim_index, f"peer+{distance}"),)


def uneven_dims(topology: Topology) -> tuple[int, ...]:
    """The dims whose links carry uneven loads under 2.x's congestion-aware backend.

    Halving-doubling on a Ring of more than 2 NPUs: its partners are XOR partners (NPU i sends
    to i + 2^k when bit k of i is 0, else to i - 2^k) and a message goes the shorter way round,
    ties clockwise, so some NPUs send clockwise and others counter-clockwise (for 2^k = 2 on 8
    NPUs: 0 and 1 clockwise, 2 and 3 counter-clockwise). Every other algorithm and dim kind is
    rotation-symmetric: the ring and direct algorithms send to the peers d ahead (or behind,
    `astra2_anticlockwise`) for the same d on every NPU, and on a Switch or a FullyConnected
    dim a message crosses links that only its sender (up-link, peer link) or its receiver
    (down-link) uses. There one NPU's view (`Astra2Network`) is exact; on an uneven dim every
    NPU runs (`npunet.Astra2World`).
    """
    return tuple(
        d
        for d, dim in enumerate(topology.dims)
        if dim.kind == "Ring" and dim.algorithm == "halving_doubling" and dim.npus > 2
    )


def astra2_anticlockwise(stage) -> bool:
    """Whether ASTRA-sim 2.x runs this stage anticlockwise: the all-gather stages of an all-reduce.

    ``Sys::generate_collective`` takes an all-reduce's phase queues from ``QueueLevels``: its
    reduce-scatter and all-reduce phases from ``get_next_queue_at_level_first`` (Clockwise), its
    all-gather phases from ``get_next_queue_at_level_last``, which always answers Anticlockwise
    (``QueueLevelHandler.cc``). Every phase of another collective, and of 2.x's ``baseline``
    optimization (one AR per dim), comes from ``get_next_queue_at_level``: Clockwise with the
    analytical frontend's one queue per dim (``--num-queues-per-dim``, default 1).
    """
    return stage.op == AG and any(op != AG for _, op, _ in stage.plan)


def astra2_messages(
    cost: CostModel, dim_index: int, op: str, full_elems: int, anticlockwise: bool = False
) -> tuple[tuple[int, tuple[int, ...], int, float], ...]:
    """A stage's steps as ASTRA-sim 2.x sends them: (message bytes, peer distances, XOR mask, delay).

    The messages and their order are `cost.astra_steps`'s. A direct or all-to-all step sends to
    every peer at once (distances 1 .. P-1), a ring step to the next NPU (1), a halving-doubling
    step to its XOR partner: mask 1, 2, 4, ... in RS, back down in AG (the distance from NPU 0;
    mask 0 for the others). An `anticlockwise` stage (`astra2_anticlockwise`) sends to the
    peers behind instead, in the same order (P-1 .. 1, as ``AllToAll`` walks ``get_receiver``;
    a ring step to P-1); halving-doubling keeps its partners, whose direction its own rule sets.
    The delay after the step's last arrival is the endpoint delay and the local reduction
    (`CostModel._astra_gaps`).
    """
    dim = cost.topology.dims[dim_index]
    p = dim.npus
    gaps = cost._astra_gaps(dim_index, op, full_elems)
    out = []
    halves = ((RS, full_elems), (AG, full_elems)) if op == AR else ((op, full_elems),)
    i = 0
    for half, elems in halves:
        for k, (nbytes, n, _, _) in enumerate(astra_steps(dim, half, elems, cost.itemsize, True)):
            mask = 0
            if n > 1:
                distances = tuple(range(1, p))
            elif dim.algorithm == "ring":
                distances = (1,)
            else:
                mask = 1 << k if half == RS else p >> (k + 1)
                distances = (mask,)
            if anticlockwise and not mask:
                distances = tuple(p - d for d in distances)
            after = gaps[i][1:] if i == 0 else gaps[i]  # (message, endpoint[, reduction])
            out.append((nbytes, distances, mask, sum(after[1:])))
            i += 1
    return tuple(out)


def astra2_stage_steps(
    topology: Topology, cost: CostModel, dim_index: int, op: str, full_elems: int, anticlockwise: bool = False
) -> tuple[tuple[int, tuple[tuple[LinkKey, ...], ...], float], ...]:
    """A stage's steps on NPU 0's links: (message bytes, a route per message, delay after the last)."""
    dim = topology.dims[dim_index]
    return tuple(
        (nbytes, tuple(astra2_route(dim_index, dim.kind, dim.npus, d) for d in distances), delay)
        for nbytes, distances, _, delay in astra2_messages(cost, dim_index, op, full_elems, anticlockwise)
    )


@dataclass(eq=False)
class _Astra2Flow:
    run: object
    steps: tuple
    k: int = 0
    pending: int = 0


class Astra2Network:
    """ASTRA-sim 2.x's congestion-aware analytical backend, seen from one NPU of a symmetric collective.

    Every link is a FIFO of whole messages: a free link holds a message for ``trunc(bytes / B)``
    and delivers it to the next device ``trunc(latency + bytes / B)`` after it took it (``Link.cpp``
    of astra-network-analytical), so the next message's serialization overlaps this one's
    latency; a device forwards a message once all of it has arrived. B is one link's rate in one
    direction (`cost.link_bytes_per_ns`). By symmetry the messages other NPUs put on one of this
    NPU's links are this NPU's own at the same point of their routes, so each message re-enters
    this NPU's link of its next hop's kind (`astra2_route`). A stage sends its step's messages
    after the stage's first endpoint delay, and each next step's once the last message of the
    step before has arrived and the endpoint delay (and reduction) has passed.
    """

    def __init__(self, topology: Topology, cost):
        if topology.flat:
            raise UsageError("--compat astra-sim-2 times per-dim stages; nccl dims are not part of it")
        self.topology, self.cost = topology, cost
        self.now_ns = 0.0
        self._timers: list[tuple[float, int, str, object]] = []
        self._seq = 0
        self._fifo: dict[LinkKey, deque] = {}
        self._busy: dict[LinkKey, bool] = {}
        self._ended: list[object] = []
        self._plans: dict[tuple, tuple] = {}

    def start(self, run) -> None:
        """A stage starts now: its first messages leave after one endpoint delay."""
        s = run.stage
        key = (s.itemsize, s.dim, s.op, s.full_elems, astra2_anticlockwise(s))
        steps = self._plans.get(key)
        if steps is None:
            steps = self._plans[key] = astra2_stage_steps(
                self.topology, self.cost(s.itemsize), s.dim, s.op, s.full_elems, key[-1]
            )
        if not self._timers and not any(self._busy.values()):
            self.now_ns = run.start_ns
        flow = _Astra2Flow(run, steps)
        if not steps:
            self._ended.append(run)
            return
        self._schedule(self.now_ns + self.cost(s.itemsize).endpoint_delay_ns, "send", flow)

    def next(self, horizon_ns: float) -> tuple[float, list]:
        """Advance to the earliest stage end at or before the horizon: (t, stages), or (horizon, [])."""
        while True:
            if self._ended:
                ended, self._ended = self._ended, []
                return self.now_ns, ended
            if not self._timers or self._timers[0][0] > horizon_ns:
                self.now_ns = max(self.now_ns, horizon_ns) if horizon_ns < math.inf else self.now_ns
                return horizon_ns, []
            t, _, what, item = heapq.heappop(self._timers)
            self.now_ns = t
            if what == "send":
                self._send(item)  # type: ignore[arg-type]
            elif what == "free":
                self._free(item)  # type: ignore[arg-type]
            elif what == "arrive":
                self._arrive(item)  # type: ignore[arg-type]
            else:
                self._step_done(item)  # type: ignore[arg-type]

    def _schedule(self, t_ns: float, what: str, item: object) -> None:
        heapq.heappush(self._timers, (t_ns, self._seq, what, item))
        self._seq += 1

    def _send(self, flow: _Astra2Flow) -> None:
        nbytes, routes, _ = flow.steps[flow.k]
        flow.pending = len(routes)
        for route in routes:
            self._enter([flow, route, 0, nbytes])

    def _enter(self, msg: list) -> None:
        link = msg[1][msg[2]]
        if self._busy.get(link):
            self._fifo.setdefault(link, deque()).append(msg)
        else:
            self._transmit(link, msg)

    def _transmit(self, link: LinkKey, msg: list) -> None:
        self._busy[link] = True
        dim = self.topology.dims[link[0]]
        serial = msg[3] / link_bytes_per_ns(dim)
        self._schedule(self.now_ns + math.floor(dim.latency_ns + serial), "arrive", msg)
        self._schedule(self.now_ns + math.floor(serial), "free", link)

    def _free(self, link: LinkKey) -> None:
        self._busy[link] = False
        queue = self._fifo.get(link)
        if queue:
            self._transmit(link, queue.popleft())

    def _arrive(self, msg: list) -> None:
        msg[2] += 1
        if msg[2] < len(msg[1]):
            self._enter(msg)
            return
        flow = msg[0]
        flow.pending -= 1
        if flow.pending == 0:
            self._schedule(self.now_ns + flow.steps[flow.k][2], "done", flow)

    def _step_done(self, flow: _Astra2Flow) -> None:
        flow.k += 1
        if flow.k < len(flow.steps):
            self._send(flow)
        else:
            self._ended.append(flow.run)


def make_network(topology: Topology, rule: str, cost, compat: str = ""):
    """The links under a sharing rule: ASTRA-sim 2.x's congestion-aware backend under its compat."""
    if compat == ASTRA_SIM_2:
        if rule != STORE_FORWARD:
            raise UsageError(f"--compat {compat} shares links as store-forward only (or --network ideal)")
        if uneven_dims(topology):
            return EveryNpuNeeded(topology)
        return Astra2Network(topology, cost)
    return Network(topology, rule, cost)


class EveryNpuNeeded:
    """2.x's congestion-aware links on an uneven dim (`uneven_dims`), where one NPU's view is not exact.

    A single collective (``model``, ``run``, a policy's model oracle) runs every NPU instead
    (`npunet.Astra2World`, which replaces this on the transport); anything else is refused here,
    in one line, when its first stage starts.
    """

    def __init__(self, topology: Topology):
        self.dims = uneven_dims(topology)

    def start(self, run) -> None:
        """Refuse: this run would need every NPU's links, which only single collectives have."""
        raise UsageError(
            f"--compat astra-sim-2 --network store-forward with halving-doubling on Ring dim {self.dims[0]} "
            "runs every NPU, for single collectives (model, run) only; "
            "use --network ideal or another algorithm"
        )

    def next(self, horizon_ns: float) -> tuple[float, list]:
        """Nothing runs here."""
        return horizon_ns, []
