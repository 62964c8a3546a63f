"""The alpha-beta cost model of one stage on one dim (DESIGN.md section 4).

A message on dim d takes ``hops * latency_ns + bytes / link_bandwidth``. A Ring or Switch dim
has one port of the dim's bandwidth B per NPU: messages sent at once share it, so a step of
``n`` messages of ``b`` bytes costs ``hops * latency_ns + n * b / B + endpoint_delay_ns``. A
FullyConnected dim of P NPUs is P-1 links of B/(P-1), one per peer: a message to one peer uses
one link, messages to different peers go at once, so a step costs ``hops * latency_ns +
b * (P-1) / B + endpoint_delay_ns`` whatever n is (ring and halving-doubling move each message
at B/(P-1); direct and all-to-all drive all P-1 links and reach B).

With ``compat="astra-sim-1.0"`` the step times follow ASTRA-sim 1.0 exactly (its system layer at
branch ASTRA-sim-1.0 and its analytical backend), see `astra_steps`:

- a FullyConnected dim is P-1 links of B/(P-1), one per peer; a message to one peer uses one link
  and messages sent at once never contend (analytical backend ``HierarchicalTopology::send``,
  ``bandwidth_scalar = links_count / (P-1)``), so ring and halving-doubling move each message at
  B/(P-1) and direct reaches B; Switch and Ring messages get the full B each;
- a message takes ``floor(hops * latency_ns + bytes / link_bandwidth)`` ns (the backend adds them
  into an ``int``); halving-doubling on a Ring dim pays ``min(d, P-d)`` hops to a partner d away;
- a stage pays the endpoint delay once when it starts and once after every received message
  (``MemBus::send_from_*``: ``communication_delay`` per ``PacketBundle``; the P-1 messages of a
  direct step are in flight together, so they cost one delay);
- a received reduce-scatter message is reduced locally in ``3 * floor(bytes / 500000)`` ns
  (``PacketBundle::call``: ``mem_write + 2 mem_read`` of ``SimpleMemory``, 500000 B/ns).

Sizes are nominal: a stage on ``full_elems`` elements splits them into P blocks of
``ceil(full_elems / P)`` elements, the size every rank's timing uses even where the real blocks
are a little shorter. Timing therefore never differs between ranks, so every rank makes the same
scheduling decisions (padding in time, as a real implementation pads in memory).
"""

from __future__ import annotations

import math
from functools import lru_cache

from .errors import UsageError
from .topology import Dim, Topology

RS, AG, A2A, AR = "RS", "AG", "A2A", "AR"
P2P = "P2P"  # a point-to-point message (`CostModel.p2p_ns`), not a collective stage
ASTRA_SIM_1_0 = "astra-sim-1.0"
ASTRA_ENDPOINT_DELAY_NS = 10.0  # endpoint-delay of ASTRA-sim 1.0's system configurations
ASTRA_CYCLE_NS = 1.0  # one cycle of ASTRA-sim's clock: every step of its workload loop takes one
COMPATS = ("", ASTRA_SIM_1_0)
ASTRA_MEM_BYTES_PER_NS = 500000  # SimpleMemory(npu_access_bw_GB=500000) in the backend's main.cc
ASTRA_MEM_ACCESSES = 3  # PacketBundle::call: mem_write + mem_read + mem_read, each floored


def check_compat(compat: str) -> str:
    """The compat name, refused with one line when unknown."""
    if compat not in COMPATS:
        raise UsageError(f"unknown compat {compat!r}; use {ASTRA_SIM_1_0!r} or leave it empty")
    return compat


def reduction_ns(n_bytes: int) -> int:
    """ASTRA-sim 1.0's local reduction of a received message: ``3 * floor(bytes / 500000)`` ns."""
    return ASTRA_MEM_ACCESSES * (int(n_bytes) // ASTRA_MEM_BYTES_PER_NS)


def astra_steps(
    dim: Dim, op: str, full_elems: int, itemsize: int
) -> tuple[tuple[int, int, int, int | None], ...]:
    """ASTRA-sim 1.0's steps of one stage: (message bytes, messages at once, hops, reduced bytes).

    ``reduced bytes`` is None when the received message is not reduced. Which messages are
    reduced follows the ``processed`` flag of ``insert_packet`` in Ring.cc / HalvingDoubling.cc
    / AllToAll.cc: every message received in a reduce-scatter (or the RS half of an All-Reduce
    phase) is, except the last one of halving-doubling (its packet is a "zero latency" one); a
    halving-doubling reduction is charged on the size of the *next* message (``msg_size`` after
    the halving), the ring and direct ones on the received message. An All-Reduce phase (AR) is
    the RS steps then the AG steps on the same data.
    """
    p = dim.npus
    if p == 1:
        return ()
    block = block_elems(full_elems, p) * itemsize
    if op == AR:
        return astra_steps(dim, RS, full_elems, itemsize) + astra_steps(dim, AG, full_elems, itemsize)
    reduce = op == RS
    if op == A2A or dim.algorithm == "direct":
        return ((block, p - 1, dim.hops, block if reduce else None),)
    if dim.algorithm == "ring":
        return ((block, 1, dim.hops, block if reduce else None),) * (p - 1)
    n = p.bit_length() - 1  # halving-doubling: log2 P steps

    def hops(distance: int) -> int:
        return min(distance, p - distance) if dim.kind == "Ring" else dim.hops

    if reduce:  # partner 2^k away, message full/2^(k+1)
        return tuple(
            (block * p >> (k + 1), 1, hops(1 << k), (block * p >> (k + 2)) if k < n - 1 else None)
            for k in range(n)
        )
    return tuple((block << k, 1, hops(p >> (k + 1)), None) for k in range(n))


def block_elems(full_elems: int, npus: int) -> int:
    """Nominal elements per block when ``full_elems`` are split over ``npus`` NPUs."""
    return -(-full_elems // npus)


def steps(dim: Dim, op: str, full_elems: int, itemsize: int) -> tuple[tuple[int, int], ...]:
    """The algorithm steps of one stage: a tuple of (message bytes, messages at once).

    Args:
        dim: the dim the stage runs on.
        op: RS (reduce-scatter), AG (all-gather), AR (an All-Reduce phase: the RS steps, then
            the AG steps on the same region) or A2A (all-to-all, always direct).
        full_elems: elements before a reduce-scatter, after an all-gather.
        itemsize: bytes per element.
    """
    p = dim.npus
    if p == 1:
        return ()
    block_bytes = block_elems(full_elems, p) * itemsize
    if op == AR:
        return steps(dim, RS, full_elems, itemsize) + steps(dim, AG, full_elems, itemsize)
    if op == A2A or dim.algorithm == "direct":
        return ((block_bytes, p - 1),)
    if dim.algorithm == "ring":
        return ((block_bytes, 1),) * (p - 1)
    masks = [1 << i for i in range(p.bit_length() - 1)]  # 1, 2, ..., P/2
    if op == RS:
        masks.reverse()
    return tuple((m * block_bytes, 1) for m in masks)


class CostModel:
    """Step and stage times of a topology for one element size.

    Args:
        topology: the network.
        itemsize: bytes per element of the collective.
        endpoint_delay_ns: extra delay per algorithm step (ASTRA-sim adds 10 ns).
        compat: "" for this project's model, or "astra-sim-1.0" to time steps as `astra_steps`.
    """

    def __init__(self, topology: Topology, itemsize: int, endpoint_delay_ns: float = 0.0, compat: str = ""):
        self.topology = topology
        self.itemsize = itemsize
        self.endpoint_delay_ns = float(endpoint_delay_ns)
        self.astra = check_compat(compat) == ASTRA_SIM_1_0
        self.step_times_ns = lru_cache(maxsize=None)(self._step_times_ns)
        self.stage_bytes = lru_cache(maxsize=None)(self._stage_bytes)
        self._astra_gaps_ns = lru_cache(maxsize=None)(self._astra_gaps)

    def step_time_ns(self, dim: Dim, msg_bytes: int, n_msgs: int) -> float:
        """Time of one step: n messages of msg_bytes sent at once on dim (to n different peers)."""
        if dim.kind == "FullyConnected":  # one link of B/(P-1) per peer, all in parallel
            transfer_ns = msg_bytes * (dim.npus - 1) / dim.bandwidth_bytes_per_ns
        else:  # one port of B, shared
            transfer_ns = n_msgs * msg_bytes / dim.bandwidth_bytes_per_ns
        return dim.hops * dim.latency_ns + transfer_ns + self.endpoint_delay_ns

    def message_ns(self, dim: Dim, msg_bytes: int, hops: int) -> float:
        """ASTRA-sim 1.0's time of one message: whole ns, one FullyConnected link per peer."""
        link_bytes_per_ns = dim.bandwidth_bytes_per_ns
        if dim.kind == "FullyConnected":
            link_bytes_per_ns /= dim.npus - 1
        return float(math.floor(hops * dim.latency_ns + msg_bytes / link_bytes_per_ns))

    def _astra_gaps(self, dim_index: int, op: str, full_elems: int) -> tuple[tuple[float, ...], ...]:
        """Per step, the delays between ASTRA-sim's events: (send to receipt, endpoint[, reduce]).

        The first step starts with the stage's own endpoint delay (the first packet's bundle).
        """
        dim = self.topology.dims[dim_index]
        e = self.endpoint_delay_ns
        gaps: list[tuple[float, ...]] = []
        for i, (b, _, hops, red) in enumerate(astra_steps(dim, op, full_elems, self.itemsize)):
            step: tuple[float, ...] = (e,) if i == 0 else ()
            step += (self.message_ns(dim, b, hops), e)
            gaps.append(step + (() if red is None else (float(reduction_ns(red)),)))
        return tuple(gaps)

    def finish_order_key(self, dim_index: int, op: str, full_elems: int, end_ns: float) -> tuple:
        """ASTRA-sim's processing order of stages ending at the same instant (smaller first).

        ASTRA-sim runs the events of one instant in the order they were registered (Sys's
        ``event_queue[tick]`` list, the analytical backend's ``EventQueue::add_event``). The key
        is therefore the registration time of the stage's last event, then of the event that
        registered it, and so on back to the stage's start.
        """
        key, t = [], end_ns
        for step in reversed(self._astra_gaps_ns(dim_index, op, full_elems)):
            for gap in reversed(step):
                t -= gap
                key.append(t)
        return tuple(key)

    def _step_times_ns(self, dim_index: int, op: str, full_elems: int) -> tuple[float, ...]:
        dim = self.topology.dims[dim_index]
        if self.astra:
            return tuple(sum(g) for g in self._astra_gaps_ns(dim_index, op, full_elems))
        return tuple(self.step_time_ns(dim, b, n) for b, n in steps(dim, op, full_elems, self.itemsize))

    def stage_end_ns(self, dim_index: int, op: str, full_elems: int, start_ns: float) -> float:
        """End of a stage started at start_ns, summed step by step exactly as the emulator does."""
        t = start_ns
        for step_ns in self.step_times_ns(dim_index, op, full_elems):
            t = t + step_ns
        return t

    def p2p_ns(self, path: tuple[tuple[int, int], ...], n_bytes: int) -> float:
        """A point-to-point message of n_bytes over `path`, a tuple of (dim, hops) in dim order.

        Store and forward, one dim after the other: on each dim it takes ``hops * latency_ns +
        n_bytes / link_bandwidth + endpoint_delay_ns``, where a FullyConnected link is B/(P-1)
        and a Ring or Switch port B; hops are the ring distance on a Ring, 2 on a Switch, 1 on
        a FullyConnected dim.
        """
        t = 0.0
        for d, hops in path:
            dim = self.topology.dims[d]
            link = dim.bandwidth_bytes_per_ns / (dim.npus - 1 if dim.kind == "FullyConnected" else 1)
            t = t + (hops * dim.latency_ns + n_bytes / link + self.endpoint_delay_ns)
        return t

    def _stage_bytes(self, dim_index: int, op: str, full_elems: int) -> int:
        """Bytes one NPU sends during the stage (`stage_bytes`, cached)."""
        dim = self.topology.dims[dim_index]
        if self.astra:
            return sum(b * n for b, n, _, _ in astra_steps(dim, op, full_elems, self.itemsize))
        return sum(b * n for b, n in steps(dim, op, full_elems, self.itemsize))


class CostModels:
    """The cost model of each element size a run uses, made on first use (callable by itemsize)."""

    def __init__(self, topology: Topology, endpoint_delay_ns: float = 0.0, compat: str = ""):
        self.topology, self.endpoint_delay_ns, self.compat = topology, endpoint_delay_ns, compat
        self._models: dict[int, CostModel] = {}

    def __call__(self, itemsize: int) -> CostModel:
        """The cost model for one element size."""
        if itemsize not in self._models:
            self._models[itemsize] = CostModel(self.topology, itemsize, self.endpoint_delay_ns, self.compat)
        return self._models[itemsize]


def ideal_time_us(op: str, size_bytes: int, topology: Topology, dims) -> float:
    """Bandwidth-only lower bound of a collective on the involved dims (THEMIS.md, Metric).

    All-reduce: ``2 S (N-1)/N / sum(B_d)``; reduce-scatter and all-gather: half of that;
    all-to-all: ``S (N-1)/N / sum(B_d)``. S is the per-NPU size in bytes.
    """
    involved = [topology.dims[d] for d in dims if topology.dims[d].npus > 1]
    n = topology.group_npus(dims)
    if n == 1:
        return 0.0
    bandwidth = sum(d.bandwidth_bytes_per_ns for d in involved)
    factor = 2.0 if op == "all_reduce" else 1.0
    return factor * size_bytes * (n - 1) / n / bandwidth / 1e3
