"""The alpha-beta cost model of one stage on one dim (docs/design.md#time-model).

A message on dim d takes ``hops * latency_ns + bytes / link_bandwidth``. A Ring or Switch dim
has one port of the dim's bandwidth B per NPU: messages sent at once share it, so a step of
``n`` messages of ``b`` bytes costs ``hops * latency_ns + n * b / B + endpoint_delay_ns``. A
FullyConnected dim of P NPUs is P-1 links of B/(P-1), one per peer: a message to one peer uses
one link, messages to different peers go at once, so a step costs ``hops * latency_ns +
b * (P-1) / B + endpoint_delay_ns`` whatever n is (halving-doubling moves each message at
B/(P-1); direct and all-to-all drive all P-1 links and reach B). The ring runs both ways round
there, as on a Ring dim (`ring_both_ways`): half of each message to the next NPU, half to the
previous one, on two links at once, so its step costs ``b * (P-1) / (2B)`` (on more than 2 NPUs).

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

In-network aggregation (``ina``, Switch dims, `ina_traffic`): the NPU streams its data up to
the switch, which reduces it and streams the result down. A step costs ``2 * latency_ns +
max(up, down) / (efficiency * B) + endpoint_delay_ns`` (two hops; up and down overlap on the
full-duplex port): an AR stage sends S up and receives S down, an RS stage sends S and receives
S/P, an AG stage sends S/P and receives S (the switch multicasts). All-to-all on an ina dim runs
direct.

The endpoint model (`Endpoint`, off unless ``hbm_gbps`` is set) adds the NPU's memory traffic
(`memory_bytes`): a step costs ``hops * latency_ns + max(network_ns, memory_bytes / M_d) +
endpoint_delay_ns``, network transfer and memory traffic overlapping as in a pipeline. ``M_d``
is dim d's share of the HBM bandwidth H given to collectives, split between the dims in
proportion to their network bandwidth: ``M_d = H * (1 - s) * B_d / sum(B)``, with ``s`` the
compute share when a compute phase was running at the stage's start (`Engine.computing`) and 0
otherwise. With ACE the engine reduces and copies: a chunk reads its input from HBM once (spread
over its first stage's steps) and writes its output once (over its last stage's steps).

Sizes are nominal: a stage on ``full_elems`` elements splits them into P blocks of
``ceil(full_elems / P)`` elements, the size every rank's timing uses even where the real blocks
are a little shorter. Timing therefore never differs between ranks, so every rank makes the same
scheduling decisions (padding in time, as a real implementation pads in memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import wraps

from .errors import UsageError
from .limits import MAX_COMPUTE_SHARE, MAX_HBM_GBPS, MIN_HBM_GBPS, in_range
from .nccl import CALL, chunk_ns, plan_collective
from .topology import Dim, Topology, links_per_npu
from .units import BYTES_PER_GB

RS, AG, A2A, AR = "RS", "AG", "A2A", "AR"
P2P = "P2P"  # a point-to-point message (`CostModel.p2p_ns`), not a collective stage
ASTRA_SIM_1_0 = "astra-sim-1.0"
ASTRA_SIM_2 = "astra-sim-2"
ASTRA_ENDPOINT_DELAY_NS = 10.0  # endpoint-delay of ASTRA-sim 1.0's system configurations
ASTRA_CYCLE_NS = 1.0  # one cycle of ASTRA-sim's clock: every step of its workload loop takes one
COMPATS = ("", ASTRA_SIM_1_0, ASTRA_SIM_2)
ASTRA2_LOCAL_MEM_BYTES_PER_S = 1e9 * 1e9  # local-mem-bw 1e9 GB/s of the 2.x runs (Sys: x 1e9)
ASTRA_MEM_BYTES_PER_NS = 500000  # SimpleMemory(npu_access_bw_GB=500000) in the backend's main.cc
ASTRA_MEM_ACCESSES = 3  # PacketBundle::call: mem_write + mem_read + mem_read, each floored


def is_astra(compat: str) -> bool:
    """Whether the compat is one of ASTRA-sim's (1.0 or 2.x): its system layer's step and tie rules."""
    return compat in (ASTRA_SIM_1_0, ASTRA_SIM_2)


def default_endpoint_delay_ns(compat: str) -> float:
    """The endpoint delay when none is given: ASTRA-sim's 10 ns under its compats, else 0."""
    return ASTRA_ENDPOINT_DELAY_NS if is_astra(compat) else 0.0


def loop_tick_ns(compat: str) -> float:
    """Time of one step of a training loop: one ASTRA-sim cycle under its 1.0 compat, else 0."""
    return ASTRA_CYCLE_NS if compat == ASTRA_SIM_1_0 else 0.0


@dataclass(frozen=True)
class Endpoint:
    """The NPU endpoint: its memory bandwidth, the share kept for compute, and ACE.

    Attributes:
        hbm_gbps: HBM bandwidth per NPU in GB/s (2^30 B); 0 turns the endpoint model off.
        compute_share: share of the HBM bandwidth compute keeps while it runs beside a
            collective (training replay); collectives get the rest then, all of it otherwise.
        ace: an Accelerator Collectives Engine reduces and copies, so a chunk costs the NPU's
            memory one read of its input and one write of its output.
    """

    hbm_gbps: float = 0.0
    compute_share: float = 0.0
    ace: bool = False

    def __post_init__(self) -> None:
        if self.hbm_gbps:
            in_range("HBM bandwidth", self.hbm_gbps, MIN_HBM_GBPS, MAX_HBM_GBPS, "GB/s")
        elif self.ace or self.compute_share:
            raise UsageError("--ace and --compute-share need the endpoint model: set --hbm-gbps")
        in_range("compute share", self.compute_share, 0.0, MAX_COMPUTE_SHARE)

    @property
    def on(self) -> bool:
        """Whether steps pay for memory traffic."""
        return self.hbm_gbps > 0

    @property
    def hbm_bytes_per_ns(self) -> float:
        """H in bytes per ns."""
        return self.hbm_gbps * BYTES_PER_GB / 1e9


NO_ENDPOINT = Endpoint()
REDUCE_MEM, COPY_MEM = 5, 2  # NPU memory bytes per network byte of a reduce / copy step (`memory_bytes`)


def check_compat(compat: str) -> str:
    """The compat name, refused with one line when unknown."""
    if compat not in COMPATS:
        raise UsageError(
            f"unknown compat {compat!r}; use {ASTRA_SIM_1_0!r}, {ASTRA_SIM_2!r} or leave it empty"
        )
    return compat


def reduction_ns(n_bytes: int) -> int:
    """ASTRA-sim 1.0's local reduction of a received message: ``3 * floor(bytes / 500000)`` ns."""
    return ASTRA_MEM_ACCESSES * (int(n_bytes) // ASTRA_MEM_BYTES_PER_NS)


def reduction_2_ns(n_bytes: int) -> int:
    """ASTRA-sim 2.x's local reduction: three accesses of ``trunc(bytes / local_mem_bw)`` ns each.

    ``PacketBundle::call``; with the 2.x runs' 1e9 GB/s it is 0 below 1e9 bytes.
    """
    return ASTRA_MEM_ACCESSES * int(n_bytes / ASTRA2_LOCAL_MEM_BYTES_PER_S * 1e9)


def ring_both_ways(dim: Dim, astra: bool = False) -> bool:
    """Whether the dim's ring runs both ways round (docs/time-model.md).

    Half of each message goes to the next NPU, half to the previous one, at once. On a Ring dim
    it always has (its two directions' links); on a FullyConnected dim of more than 2 NPUs it
    drives the two neighbour links, as a real runtime's ring on a fully connected node drives
    more than one link (NCCL and RCCL run several channels); on 2 NPUs both neighbours are one
    link. A Switch has one up-link, so its ring goes one way. ASTRA-sim's compats (`astra`) keep
    its one-way ring (`astra_steps`).
    """
    if astra or dim.algorithm != "ring":
        return False
    return dim.kind == "Ring" or (dim.kind == "FullyConnected" and dim.npus > 2)


def link_bytes_per_ns(dim: Dim) -> float:
    """One link's rate in one direction: the dim's per-NPU bandwidth over `links_per_npu`."""
    return dim.bandwidth_bytes_per_ns / links_per_npu(dim)


def astra_steps(
    dim: Dim, op: str, full_elems: int, itemsize: int, ring_a2a: bool = False
) -> tuple[tuple[int, int, int, int | None], ...]:
    """ASTRA-sim 1.0's steps of one stage: (message bytes, messages at once, hops, reduced bytes).

    ``reduced bytes`` is None when the received message is not reduced. Which messages are
    reduced follows the ``processed`` flag of ``insert_packet`` in Ring.cc / HalvingDoubling.cc
    / AllToAll.cc: every message received in a reduce-scatter (or the RS half of an All-Reduce
    phase) is, except the last one of halving-doubling (its packet is a "zero latency" one); a
    halving-doubling reduction is charged on the size of the *next* message (``msg_size`` after
    the halving), the ring and direct ones on the received message. An All-Reduce phase (AR) is
    the RS steps then the AG steps on the same data.

    With `ring_a2a` (2.x) an all-to-all on a ring dim runs Ring.cc's all-to-all: P(P-1)/2 messages
    of a block to the next NPU, one after the other (``stream_count``, Normal injection).
    """
    p = dim.npus
    if p == 1:
        return ()
    block = block_elems(full_elems, p) * itemsize
    if op == AR:
        return astra_steps(dim, RS, full_elems, itemsize) + astra_steps(dim, AG, full_elems, itemsize)
    reduce = op == RS
    if op == A2A and ring_a2a and dim.algorithm == "ring":
        return ((block, 1, dim.hops, None),) * (p * (p - 1) // 2)
    if op == A2A or dim.algorithm == "direct":  # on a Ring, the farthest peer is P/2 hops away
        return ((block, p - 1, p // 2 if dim.kind == "Ring" else dim.hops, block if reduce else None),)
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


def ina_traffic(dim: Dim, op: str, full_elems: int, itemsize: int) -> tuple[int, int]:
    """Bytes one NPU sends up to and receives from the switch in an ina stage (one step)."""
    full = block_elems(full_elems, dim.npus) * dim.npus * itemsize
    block = full // dim.npus
    return {RS: (full, block), AG: (block, full), AR: (full, full)}[op]


def memory_bytes(dim: Dim, op: str, full_elems: int, itemsize: int) -> tuple[int, ...]:
    """NPU memory bytes of each step without ACE (docs/hardware.md#the-endpoint-model-and-ace).

    A sent message is read from HBM once; a received message is written once (copy), or
    written, read back with the local operand and the sum written (reduce): ``5 n b`` for a
    reduce-scatter step of n messages of b bytes, ``2 n b`` for an all-gather or all-to-all
    step. An ina step reads what it sends up and writes what comes down.
    """
    if dim.npus == 1:
        return ()
    if dim.algorithm == "ina" and op != A2A:
        return (sum(ina_traffic(dim, op, full_elems, itemsize)),)
    if op == AR:
        return memory_bytes(dim, RS, full_elems, itemsize) + memory_bytes(dim, AG, full_elems, itemsize)
    per_byte = REDUCE_MEM if op == RS else COPY_MEM
    return tuple(per_byte * b * n for b, n in steps(dim, op, full_elems, itemsize))


def io_bytes(op: str, full_elems: int, npus: int, itemsize: int) -> tuple[int, int]:
    """A stage's input and output bytes (an RS leaves a block, an AG starts from one)."""
    full = full_elems * itemsize
    block = block_elems(full_elems, npus) * itemsize
    return (block if op == AG else full), (block if op == RS else full)


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
    if dim.algorithm == "ina" and op != A2A:  # what the NPU sends up (`ina_traffic`)
        return ((ina_traffic(dim, op, full_elems, itemsize)[0], 1),)
    if op == AR:
        return steps(dim, RS, full_elems, itemsize) + steps(dim, AG, full_elems, itemsize)
    if op == A2A or dim.algorithm == "direct":
        return ((block_bytes, p - 1),)
    if dim.algorithm in ("ring", "nccl"):
        return ((block_bytes, 1),) * (p - 1)
    masks = [1 << i for i in range(p.bit_length() - 1)]  # 1, 2, ..., P/2
    if op == RS:
        masks.reverse()
    return tuple((m * block_bytes, 1) for m in masks)


def memo_method(method):
    """Cache a method's results per instance and positional arguments.

    The cache is a dict on the instance, not an ``lru_cache`` of a bound method, which would tie
    the instance into a reference cycle that only the garbage collector frees.
    """
    attr = f"_memo_{method.__name__}"

    @wraps(method)
    def cached(self, *args):
        cache = self.__dict__.get(attr)
        if cache is None:
            cache = self.__dict__[attr] = {}
        if args not in cache:
            cache[args] = method(self, *args)
        return cache[args]

    return cached


class CostModel:
    """Step and stage times of a topology for one element size.

    Args:
        topology: the network.
        itemsize: bytes per element of the collective.
        endpoint_delay_ns: extra delay per algorithm step (ASTRA-sim adds 10 ns).
        compat: "" for this project's model, or "astra-sim-1.0" to time steps as `astra_steps`.
        endpoint: the NPU's memory bandwidth and ACE (off by default).
    """

    def __init__(
        self,
        topology: Topology,
        itemsize: int,
        endpoint_delay_ns: float = 0.0,
        compat: str = "",
        endpoint: Endpoint = NO_ENDPOINT,
    ):
        self.topology = topology
        self.itemsize = itemsize
        self.endpoint_delay_ns = float(endpoint_delay_ns)
        self.astra = is_astra(check_compat(compat))
        self.astra2 = compat == ASTRA_SIM_2
        self.endpoint = endpoint
        if self.astra and (endpoint.on or any(d.algorithm == "ina" for d in topology.dims)):
            raise UsageError("the endpoint model and ina are not part of --compat astra-sim-1.0")
        if self.astra and topology.ports:
            raise UsageError(
                f"shared ports (NIC(...)) are not part of --compat {compat}: its links are per dim; "
                "drop the NIC(...) items or --compat"
            )
        if topology.flat and (self.astra or endpoint.on or self.endpoint_delay_ns):
            raise UsageError("nccl dims take neither --compat, the endpoint model nor an endpoint delay")
        share = sum(d.bandwidth_bytes_per_ns for d in topology.dims if d.npus > 1) or 1.0
        self.memory_bytes_per_ns = [
            endpoint.hbm_bytes_per_ns * d.bandwidth_bytes_per_ns / share for d in topology.dims
        ]

    def step_times_ns(
        self,
        dim_index: int,
        op: str,
        full_elems: int,
        first: bool = False,
        last: bool = False,
        shared: bool = False,
    ) -> tuple[float, ...]:
        """The times of a stage's steps.

        `first` and `last` say whether the stage is its chunk's first and last (ACE reads and
        writes the chunk's data there), `shared` whether a compute phase ran when it started;
        they matter only under the endpoint model.
        """
        if not self.endpoint.on:
            return self._step_times_ns(dim_index, op, full_elems, False, False, False)
        if not self.endpoint.ace:
            first = last = False
        return self._step_times_ns(
            dim_index, op, full_elems, first, last, shared and self.endpoint.compute_share > 0
        )

    def step_time_ns(self, dim: Dim, msg_bytes: int, n_msgs: int, memory_ns: float = 0.0) -> float:
        """Time of one step: n messages of msg_bytes sent at once on dim (to n different peers).

        `memory_ns`, the step's NPU memory time under the endpoint model, overlaps the transfer.
        """
        if dim.kind == "FullyConnected":  # one link of B/(P-1) per peer, all in parallel
            transfer_ns = msg_bytes * (dim.npus - 1) / dim.bandwidth_bytes_per_ns
            if n_msgs == 1 and ring_both_ways(dim, self.astra):  # a ring step: half to each neighbour at once
                transfer_ns /= 2
        else:  # one port of B, shared
            transfer_ns = n_msgs * msg_bytes / dim.bandwidth_bytes_per_ns
        return dim.hops * dim.latency_ns + max(transfer_ns, memory_ns) + self.endpoint_delay_ns

    def ina_step_ns(self, dim: Dim, op: str, full_elems: int, memory_ns: float = 0.0) -> float:
        """Time of an ina stage's one step: two hops, then max(up, down) at efficiency * B."""
        up, down = ina_traffic(dim, op, full_elems, self.itemsize)
        transfer_ns = max(up, down) / (dim.efficiency * dim.bandwidth_bytes_per_ns)
        return dim.hops * dim.latency_ns + max(transfer_ns, memory_ns) + self.endpoint_delay_ns

    def step_memory_bytes(
        self, dim_index: int, op: str, full_elems: int, first: bool, last: bool
    ) -> list[float]:
        """Each step's NPU memory bytes under the endpoint model (module doc); zeros when it is off.

        With ACE, a chunk's first stage reads its input and its last stage writes its output,
        spread evenly over the stage's steps (the engine streams them).
        """
        dim = self.topology.dims[dim_index]
        n = len(steps(dim, op, full_elems, self.itemsize))
        if not self.endpoint.on or n == 0:
            return [0.0] * n
        if not self.endpoint.ace:
            return [float(m) for m in memory_bytes(dim, op, full_elems, self.itemsize)]
        read, write = io_bytes(op, full_elems, dim.npus, self.itemsize)
        return [((read if first else 0) + (write if last else 0)) / n] * n

    def memory_ns(self, dim_index: int, op: str, full_elems: int, first: bool, last: bool, shared: bool):
        """Each step's NPU memory time: its bytes at the dim's share of the HBM (module doc)."""
        mem = self.step_memory_bytes(dim_index, op, full_elems, first, last)
        if not self.endpoint.on:
            return tuple(0.0 for _ in mem)
        rate = self.memory_bytes_per_ns[dim_index] * (1 - self.endpoint.compute_share if shared else 1.0)
        return tuple(m / rate for m in mem)

    def message_ns(self, dim: Dim, msg_bytes: int, hops: int) -> float:
        """ASTRA-sim's time of one message: whole ns, one FullyConnected link per peer.

        Under 2.x every message goes at one link's rate (`link_bytes_per_ns`): a Ring's one way.
        """
        if self.astra2:
            return float(math.floor(hops * dim.latency_ns + msg_bytes / link_bytes_per_ns(dim)))
        rate = dim.bandwidth_bytes_per_ns
        if dim.kind == "FullyConnected":
            rate /= dim.npus - 1
        return float(math.floor(hops * dim.latency_ns + msg_bytes / rate))

    @memo_method
    def astra_gaps(self, dim_index: int, op: str, full_elems: int) -> tuple[tuple[float, ...], ...]:
        """Per step, the delays between ASTRA-sim's events: (send to receipt, endpoint[, reduce]).

        The first step starts with the stage's own endpoint delay (the first packet's bundle).
        """
        dim = self.topology.dims[dim_index]
        e = self.endpoint_delay_ns
        gaps: list[tuple[float, ...]] = []
        for i, (b, _, hops, red) in enumerate(astra_steps(dim, op, full_elems, self.itemsize, self.astra2)):
            step: tuple[float, ...] = (e,) if i == 0 else ()
            step += (self.message_ns(dim, b, hops), e)
            reduce_ns = reduction_2_ns if self.astra2 else reduction_ns
            gaps.append(step + (() if red is None else (float(reduce_ns(red)),)))
        return tuple(gaps)

    def finish_order_key(self, dim_index: int, op: str, full_elems: int, end_ns: float) -> tuple:
        """ASTRA-sim's processing order of stages ending at the same instant (smaller first).

        ASTRA-sim runs the events of one instant in the order they were registered (Sys's
        ``event_queue[tick]`` list, the analytical backend's ``EventQueue::add_event``). The key
        is therefore the registration time of the stage's last event, then of the event that
        registered it, and so on back to the stage's start.
        """
        key, t = [], end_ns
        for step in reversed(self.astra_gaps(dim_index, op, full_elems)):
            for gap in reversed(step):
                t -= gap
                key.append(t)
        return tuple(key)

    @memo_method
    def _step_times_ns(
        self, dim_index: int, op: str, full_elems: int, first: bool, last: bool, shared: bool
    ) -> tuple[float, ...]:
        dim = self.topology.dims[dim_index]
        if self.astra:
            return tuple(sum(g) for g in self.astra_gaps(dim_index, op, full_elems))
        mem = self.memory_ns(dim_index, op, full_elems, first, last, shared)
        if dim.algorithm == "ina" and op != A2A and dim.npus > 1:
            return (self.ina_step_ns(dim, op, full_elems, mem[0]),)
        return tuple(
            self.step_time_ns(dim, b, n, m)
            for (b, n), m in zip(steps(dim, op, full_elems, self.itemsize), mem)
        )

    def stage_end_ns(
        self,
        dim_index: int,
        op: str,
        full_elems: int,
        start_ns: float,
        first: bool = False,
        last: bool = False,
        shared: bool = False,
    ) -> float:
        """End of a stage started at start_ns, summed step by step exactly as the emulator does."""
        t = start_ns
        for step_ns in self.step_times_ns(dim_index, op, full_elems, first, last, shared):
            t = t + step_ns
        return t

    @memo_method
    def flat_steps_ns(self, plan: tuple, index: int) -> tuple[float, ...]:
        """Step times of stage `index` of a chunk's plan under the NCCL-like model (`nccl`).

        The chunk takes its share of its NCCL call's time (`nccl.chunk_ns`: the call's latency goes
        to its first chunk), spread evenly over the steps of its stages on its lowest dim: a flat
        algorithm keeps every dim busy at once, so the chunks of one call follow one another there
        and stages on the other dims take no time of their own. One chunk takes the call's time.
        """
        op, dims, elems, call_elems, first = plan_collective(plan)
        size = self.itemsize
        time_ns = chunk_ns(self.topology, dims, op, call_elems * size, elems * size, first)
        counts = [len(steps(self.topology.dims[d], o, full, size)) for d, o, full in plan if d != CALL]
        on_lowest = [c if d == dims[0] else 0 for c, (d, _, _) in zip(counts, plan)]
        if plan[index][0] != dims[0]:
            return (0.0,) * counts[index]
        return (time_ns / sum(on_lowest),) * counts[index]

    def run_steps_ns(self, run) -> tuple[float, ...]:
        """The step times of a started stage (`engine.StageRun`).

        Its place in its chunk and whether compute shared the memory when it started count.
        """
        s = run.stage
        if self.topology.flat and s.plan:
            return self.flat_steps_ns(s.plan, s.index)
        return self.step_times_ns(
            s.dim, s.op, s.full_elems, s.index == 0, s.index == s.n_stages - 1, run.mem_shared
        )

    def memory_rate(self, run) -> float:
        """Average NPU memory bytes per ns of a started stage (training replay's compute rule)."""
        if not self.endpoint.on:
            return 0.0
        s = run.stage
        ace = self.endpoint.ace
        mem = self.step_memory_bytes(
            s.dim, s.op, s.full_elems, ace and s.index == 0, ace and s.index == s.n_stages - 1
        )
        total_ns = sum(self.run_steps_ns(run))
        return sum(mem) / total_ns if total_ns > 0 else 0.0

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

    @memo_method
    def stage_bytes(self, dim_index: int, op: str, full_elems: int) -> int:
        """Bytes one NPU sends during the stage."""
        dim = self.topology.dims[dim_index]
        if self.astra:
            return sum(b * n for b, n, _, _ in astra_steps(dim, op, full_elems, self.itemsize, self.astra2))
        return sum(b * n for b, n in steps(dim, op, full_elems, self.itemsize))


class CostModels:
    """The cost model of each element size a run uses, made on first use (callable by itemsize)."""

    def __init__(
        self,
        topology: Topology,
        endpoint_delay_ns: float = 0.0,
        compat: str = "",
        endpoint: Endpoint = NO_ENDPOINT,
    ):
        self.topology, self.endpoint_delay_ns, self.compat = topology, endpoint_delay_ns, compat
        self.endpoint = endpoint
        self._models: dict[int, CostModel] = {}

    def __call__(self, itemsize: int) -> CostModel:
        """The cost model for one element size."""
        if itemsize not in self._models:
            self._models[itemsize] = CostModel(
                self.topology, itemsize, self.endpoint_delay_ns, self.compat, self.endpoint
            )
        return self._models[itemsize]
