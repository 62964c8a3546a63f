"""Where bytes go: the links each step of a stage crosses, and a message's route, on one NPU or on every NPU.

One NPU's view (`StepPlanner`, `astra2_steps`) stands for a symmetric collective: the load other
NPUs put on this NPU's links is its own at the same point. Every NPU's links (`NpuRoutes`) are
each NPU's `links.physical_links` in turn (NPU r's link i is ``r * per_npu + i``); a stage step of
NPU i crosses i's links and its receivers', and a message goes dimension-ordered, hop by hop.

ASTRA-sim 2.x's routes (`astra2_route`, `astra2_messages`) are its backend's: a Ring the shorter
way round (ties clockwise), store-and-forward at every NPU; a Switch the sender's up-link, then
the receiver's down-link; a FullyConnected dim, one link; halving-doubling partners are XOR
partners, which makes some Ring dims uneven (`uneven_dims`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..cost import A2A, AG, AR, RS, CostModel, astra_steps, block_elems, ina_traffic, ring_both_ways, steps
from ..topology import Topology
from .links import Link, Step, Transfer, Usage, check_link_scale, one_transfer, physical_links, rated


class StepPlanner:
    """The link steps of a stage on one NPU's links (one element size, `CostModel`'s settings)."""

    def __init__(self, topology: Topology, cost: CostModel):
        self.topology, self.cost = topology, cost
        self.links = physical_links(topology)
        self.capacity = [link.bytes_per_ns for link in self.links]
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
            planned = tuple(self._plan(dim_index, op, full_elems))
            plan = self._memo[key] = (planned, all(step.usage == planned[0].usage for step in planned))
        return plan

    def stage_peers(
        self, dim_index: int, op: str, full_elems: int
    ) -> tuple[tuple[tuple[int, float], ...], ...]:
        """Per step, whom an NPU sends to: (distance ahead on the dim, share of the step's bytes).

        It receives from the same distances behind. A Ring step sends half each way (to the peer
        d ahead clockwise, d behind counter-clockwise), and so does a ring step on a
        FullyConnected dim (`cost.ring_both_ways`); a ring step elsewhere the next NPU; a
        halving-doubling step the peer at the step's distance (its mask) ahead, as the
        FullyConnected link it uses says; direct, all-to-all and in-network steps every peer.
        """
        dim = self.topology.dims[dim_index]
        p = dim.npus
        every = tuple((k, 1.0 / (p - 1)) for k in range(1, p))
        if dim.algorithm == "ina" and op != A2A and p > 1:
            return (every,)
        block = block_elems(full_elems, p) * self.cost.itemsize
        both = dim.kind == "Ring" or ring_both_ways(dim, self.cost.astra)
        out: list[tuple[tuple[int, float], ...]] = []
        for msg, n in steps(dim, op, full_elems, self.cost.itemsize):
            distance = 1 if dim.algorithm in ("ring", "nccl") else max(1, msg // max(block, 1))
            if n > 1:
                out.append(every)
            elif both:
                out.append(((distance % p, 0.5), (-distance % p, 0.5)))
            else:
                out.append(((distance % p, 1.0),))
        return tuple(out)

    def message_hops(self, d: int, k: int) -> tuple[tuple[Usage, ...], int]:
        """A message from this NPU to the peer k ahead on dim d: its links hop by hop, and its hops.

        A Switch: the up-link, then the down-link (2 hops); a Ring: the shorter way round, its
        direction's link carrying what the NPUs behind send through it (k hops, k times the
        bytes); a FullyConnected dim: the link to that peer. The dim's port, out and in.
        """
        dim, i = self.topology.dims[d], self.index
        p_out, p_in = self._port(d, 1.0, 1.0)
        if dim.kind == "Switch":
            return (((i[f"dim{d}.up"], 1.0), *p_out), ((i[f"dim{d}.down"], 1.0), *p_in)), 2
        if dim.kind == "Ring":
            way, n_hops = ("ccw", dim.npus - k) if dim.npus - k < k else ("cw", k)
            return (((i[f"dim{d}.{way}"], float(n_hops)), *p_out, *p_in),), n_hops
        return (((i[f"dim{d}.peer+{k}"], 1.0), *p_out, *p_in),), 1

    def _port(self, dim_index: int, out: float, into: float) -> tuple[Usage, Usage]:
        port = self.topology.port_of(dim_index)
        if port is None:
            return (), ()
        return ((self.index[f"port{port}.out"], out),), ((self.index[f"port{port}.in"], into),)

    def _plan(self, d: int, op: str, full_elems: int) -> list[Step]:
        dim, itemsize, capacity = self.topology.dims[d], self.cost.itemsize, self.capacity
        delay_ns = dim.hops * dim.latency_ns + self.cost.endpoint_delay_ns
        i = self.index
        if dim.algorithm == "ina" and op != A2A and dim.npus > 1:
            up, down = ina_traffic(dim, op, full_elems, itemsize)
            v = float(max(up, down))
            cu, cd = up / v / dim.efficiency, down / v / dim.efficiency
            p_out, p_in = self._port(d, cu, cd)
            ina = (((i[f"dim{d}.up"], cu), *p_out), ((i[f"dim{d}.down"], cd), *p_in))
            return [one_transfer(v, ina, delay_ns, capacity)]
        block = block_elems(full_elems, dim.npus) * itemsize
        both = ring_both_ways(dim, self.cost.astra)
        out = []
        for msg, n in steps(dim, op, full_elems, itemsize):
            v = float(msg * n)
            p_out, p_in = self._port(d, 1.0, 1.0)
            hops: tuple[Usage, ...]
            if dim.kind == "Ring":
                hops = (((i[f"dim{d}.cw"], 0.5), (i[f"dim{d}.ccw"], 0.5), *p_out, *p_in),)
            elif dim.kind == "Switch":
                hops = (((i[f"dim{d}.up"], 1.0), *p_out), ((i[f"dim{d}.down"], 1.0), *p_in))
            elif n > 1:  # direct and all-to-all: one message per peer, every link
                share = 1.0 / (dim.npus - 1)
                hops = (tuple((i[f"dim{d}.peer+{k}"], share) for k in range(1, dim.npus)) + p_out + p_in,)
            elif both:  # ring both ways round: half to the next NPU, half to the previous one
                ends = ((i[f"dim{d}.peer+1"], 0.5), (i[f"dim{d}.peer+{dim.npus - 1}"], 0.5))
                hops = ((*ends, *p_out, *p_in),)
            else:  # ring: the next NPU; halving-doubling: the partner at the step's distance
                distance = 1 if dim.algorithm == "ring" else max(1, msg // block)
                hops = (((i[f"dim{d}.peer+{distance}"], 1.0), *p_out, *p_in),)
            half = 0.5 if dim.kind == "Ring" or both else 1.0  # (a message going half each way)
            out.append(one_transfer(v, hops, delay_ns, capacity, n, msg * half))
        return out


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


# --- ASTRA-sim 2.x's congestion-aware backend (``--compat astra-sim-2 --network store-forward``) ---


def astra2_route(kind: str, npus: int, distance: int) -> tuple[str, ...]:
    """The links (by name on their dim) a message to the peer `distance` ahead crosses, one per hop.

    A Ring takes the shorter way (ties clockwise) and stores and forwards at every NPU; a Switch
    is the sender's up-link, then the receiver's down-link; a FullyConnected dim, one link.
    """
    if kind == "Ring":
        if npus - distance < distance:
            return ("ccw",) * (npus - distance)
        return ("cw",) * distance
    if kind == "Switch":
        return ("up", "down")
    return (f"peer+{distance}",)


def uneven_dims(topology: Topology) -> tuple[int, ...]:
    """The dims whose links carry uneven loads under 2.x's congestion-aware backend.

    Halving-doubling on a Ring of more than 2 NPUs: its partners are XOR partners (NPU i sends
    to i + 2^k when bit k of i is 0, else to i - 2^k) and a message goes the shorter way round,
    ties clockwise, so some NPUs send clockwise and others counter-clockwise (for 2^k = 2 on 8
    NPUs: 0 and 1 clockwise, 2 and 3 counter-clockwise). Every other algorithm and dim kind is
    rotation-symmetric: the ring and direct algorithms send to the peers d ahead for the same
    d on every NPU, and on a Switch or a FullyConnected dim a message crosses links that only
    its sender (up-link, peer link) or its receiver (down-link) uses. There one NPU's view is
    exact; on an uneven dim every NPU runs (`world.World`).
    """
    return tuple(
        d
        for d, dim in enumerate(topology.dims)
        if dim.kind == "Ring" and dim.algorithm == "halving_doubling" and dim.npus > 2
    )


class Astra2Step(NamedTuple):
    """A step of a stage as ASTRA-sim 2.x sends it, seen from NPU 0.

    Attributes:
        nbytes: bytes of each message.
        distances: the peers it sends to, as distances ahead on the dim.
        mask: the XOR partner's mask of a halving-doubling step (0 for other steps).
        delay_ns: after the step's last arrival: the endpoint delay and the local reduction.
    """

    nbytes: int
    distances: tuple[int, ...]
    mask: int
    delay_ns: float


class NpuStep(NamedTuple):
    """A step of a stage at one coordinate of its dim (2.x): its bytes, whom it sends to and hears from.

    Attributes:
        nbytes: bytes of each message.
        sends: the coordinates it sends to.
        recvs: the coordinates it receives from.
        delay_ns: after the step's last receipt: the endpoint delay and the local reduction.
    """

    nbytes: int
    sends: tuple[int, ...]
    recvs: tuple[int, ...]
    delay_ns: float


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
) -> tuple[Astra2Step, ...]:
    """A stage's steps as ASTRA-sim 2.x sends them (`Astra2Step`).

    The messages and their order are `cost.astra_steps`'s. A direct or all-to-all step sends to
    every peer at once (distances 1 .. P-1), a ring step to the next NPU (1), a halving-doubling
    step to its XOR partner: mask 1, 2, 4, ... in RS, back down in AG (the distance from NPU 0;
    mask 0 for the others). An `anticlockwise` stage (`astra2_anticlockwise`) sends to the
    peers behind instead, in the same order (P-1 .. 1, as ``AllToAll`` walks ``get_receiver``;
    a ring step to P-1); halving-doubling keeps its partners, whose direction its own rule sets.
    The delay after the step's last arrival is the endpoint delay and the local reduction
    (`CostModel.astra_gaps`).
    """
    dim = cost.topology.dims[dim_index]
    p = dim.npus
    gaps = cost.astra_gaps(dim_index, op, full_elems)
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
            out.append(Astra2Step(nbytes, distances, mask, sum(after[1:])))
            i += 1
    return tuple(out)


def astra2_steps(
    planner: StepPlanner, dim_index: int, op: str, full_elems: int, anticlockwise: bool = False
) -> tuple[Step, ...]:
    """A stage's steps on NPU 0's links as 2.x sends them: a transfer per message, then the step's delay."""
    dim = planner.topology.dims[dim_index]
    index = planner.index
    out = []
    for step in astra2_messages(planner.cost, dim_index, op, full_elems, anticlockwise):
        transfers = tuple(
            Transfer(float(step.nbytes), tuple(((index[f"dim{dim_index}.{name}"], 1.0),) for name in route))
            for route in (astra2_route(dim.kind, dim.npus, d) for d in step.distances)
        )
        out.append(Step(transfers, step.delay_ns))
    return tuple(out)


def npu_stage_steps(
    cost: CostModel, dim_index: int, op: str, full_elems: int, coord: int, anticlockwise: bool = False
) -> tuple[NpuStep, ...]:
    """The stage's steps at one coordinate (`NpuStep`).

    Peers are coordinates on the dim: `astra2_messages`'s distances ahead (sent to) and behind
    (received from), or the XOR partner of a halving-doubling step.
    """
    p = cost.topology.dims[dim_index].npus
    out = []
    for step in astra2_messages(cost, dim_index, op, full_elems, anticlockwise):
        sends: tuple[int, ...]
        recvs: tuple[int, ...]
        if step.mask:
            sends = recvs = (coord ^ step.mask,)
        else:
            sends = tuple((coord + d) % p for d in step.distances)
            recvs = tuple((coord - d) % p for d in step.distances)
        out.append(NpuStep(step.nbytes, sends, recvs, step.delay_ns))
    return tuple(out)


class NpuRoutes:
    """Every NPU's links (`physical_links` of each; NPU r's link i is ``r * per_npu + i``), and routes.

    Args:
        topology: the network.
        link_scale: ``(dim, rank, factor)``: that NPU's links of that dim (both ways) at factor
            times their rate (``--link-scale``).
    """

    def __init__(self, topology: Topology, link_scale: tuple[tuple[int, int, float], ...] = ()):
        check_link_scale(topology, link_scale)
        self.topology = topology
        local = physical_links(topology)
        self.per_npu = len(local)
        self.local = {link.name: i for i, link in enumerate(local)}
        scale = {(d, r): f for d, r, f in link_scale}  # (a straggler's links of a dim, both ways)
        self.links = tuple(
            Link(f"npu{r}.{link.name}", link.dim, link.bytes_per_ns * scale.get((link.dim, r), 1.0))
            for r in range(topology.npus)
            for link in local
        )
        self.capacity = [link.bytes_per_ns for link in self.links]
        self.strides = [int(np.prod(topology.shape[:d], dtype=np.int64)) for d in range(len(topology.dims))]

    def coord(self, rank: int, d: int) -> tuple[int, int]:
        """The NPU's coordinate on dim d, and the rank at coordinate 0 of its group there."""
        stride = self.strides[d]
        c = (rank // stride) % self.topology.dims[d].npus
        return c, rank - c * stride

    def stage(self, rank: int, cost: CostModel, d: int, op: str, full_elems: int) -> tuple:
        """A stage's steps on NPU `rank`'s links (and its receivers'), and per step its peers.

        Returns the steps, per step the NPUs it receives from, and per step how many NPUs
        receive from it.
        """
        planner = step_planner(self.topology, cost)
        dim = self.topology.dims[d]
        p, stride = dim.npus, self.strides[d]
        c, base = self.coord(rank, d)
        ina = dim.algorithm == "ina" and op != A2A
        port = self.topology.port_of(d)
        theirs = set() if ina else {self.local.get(f"dim{d}.down", -1)}  # links of the receiver
        if port is not None and not ina:
            theirs.add(self.local[f"port{port}.in"])
        own, n_links = rank * self.per_npu, self.per_npu
        out, recvs, consumers = [], [], []
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
            (made,) = step.transfers
            out.append(
                one_transfer(
                    step.bytes, tuple(hops), step.delay_ns, self.capacity, made.messages, made.message_bytes
                )
            )
            recvs.append(tuple(sorted({base + (c - k) % p * stride for k, _ in peers})))
            consumers.append(len({r for r, _ in to}))
        return tuple(out), tuple(recvs), tuple(consumers)

    def custom_stage(self, rank: int, cost: CostModel, d: int, levels) -> tuple:
        """NPU `rank`'s steps of a dim's custom stage, as `stage` gives a built-in stage's.

        `levels` are its steps, one per level (`algorithms.CustomStage.npu_steps`: the ranges it
        sends to and receives from coordinates of the dim). A level's step is a transfer per
        message over its route (`route`: the sender's links, on a Ring every NPU's on the way,
        a Switch's down-link and the port in of the receiver), then the longest of its messages'
        hops (sent or received) times the dim's latency and the endpoint delay, as a built-in
        step's; it ends once its own transfers are through and the level's messages from its
        peers are too (an NPU that only receives at a level waits for them; one with no message
        there goes on at once).
        """
        dim = self.topology.dims[d]
        _, base = self.coord(rank, d)
        stride = self.strides[d]
        out, recvs, consumers = [], [], []
        for level in levels:
            sends = [(base + q * stride, b - a) for q, a, b in level.sends]
            froms = sorted({base + q * stride for q, _, _ in level.recvs})
            transfers = tuple(Transfer(float(n * cost.itemsize), self.route(rank, dst)) for dst, n in sends)
            hops = [len(t.hops) for t in transfers] + [len(self.route(src, rank)) for src in froms]
            delay_ns = max(hops) * dim.latency_ns + cost.endpoint_delay_ns if hops else 0.0
            out.append(rated(Step(transfers, delay_ns), self.capacity))
            recvs.append(tuple(froms))
            consumers.append(len({dst for dst, _ in sends}))
        return tuple(out), tuple(recvs), tuple(consumers)

    def route(self, src: int, dst: int) -> tuple[Usage, ...]:
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
            a, base = self.coord(x, d)
            b, _ = self.coord(dst, d)
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

    def message(self, src: int, dst: int, nbytes: int, delay_ns: float) -> Step:
        """A message's one step: its bytes over `route`, then its fixed delay."""
        return one_transfer(float(nbytes), self.route(src, dst), delay_ns, self.capacity)

    def astra2_route(self, rank: int, dim_index: int, peer: int) -> tuple[Usage, ...]:
        """The links a 2.x message from `rank` to the NPU at coordinate `peer` of a dim crosses, in order.

        A Ring goes the shorter way round, ties clockwise, through every NPU on the way
        (``Ring.cpp``); a Switch is the sender's up-link, then the receiver's down-link; a
        FullyConnected dim, the sender's link to that peer.
        """
        dim = self.topology.dims[dim_index]
        c, base = self.coord(rank, dim_index)
        stride, n = self.strides[dim_index], self.per_npu
        hops = []
        for name in astra2_route(dim.kind, dim.npus, (peer - c) % dim.npus):
            if dim.kind == "Switch" and name == "down":
                at = base + peer * stride
            else:
                at = base + c * stride
            hops.append(((at * n + self.local[f"dim{dim_index}.{name}"], 1.0),))
            if dim.kind == "Ring":
                c = (c + (1 if name == "cw" else -1)) % dim.npus
        return tuple(hops)


def transfer_step(nbytes: float, hops: tuple[Usage, ...]) -> Step:
    """A bare transfer as a step of its own (a 2.x message: its sender's step waits for nothing of it)."""
    return Step((Transfer(nbytes, hops),))
