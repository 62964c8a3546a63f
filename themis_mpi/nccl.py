"""An NCCL-like collective cost model: NCCL's and RCCL's algorithms and protocols, one chosen per size.

NCCL's tuner (``src/graph/tuning.cc``; RCCL's of the same name) times a collective of S bytes
with algorithm a and protocol p as ``latency(a, p) + S / bandwidth(a, p)`` and runs the fastest
pair. This model has that structure, with physical parameters: the dims' nominal rates (a
datasheet's), the shares of them each protocol reaches, and latencies (`topology.NcclParams`).
With ``P_j`` NPUs per level (dims with more than one NPU, lowest first), ``N = prod P_j``,
``G_j = prod_{i<j} P_i`` NPUs below level j, and ``M = N / P_0`` nodes:

- Ring (LL, LL128, Simple): one flat ring over the N NPUs. An all-reduce takes ``2(N-1)``
  steps (a reduce-scatter or all-gather ``N-1``), ``2(H_j - H_{j+1})`` of them across level j
  (``H_j = prod_{i>=j} P_i``, NCCL's ``nInterSteps``). A step across level 0 costs dim 0's latency
  times NCCL's per-protocol factor (NVLink: LL 0.6, LL128 1.9, Simple 3.4 us; RCCL's xGMI table
  on AMD), one across a higher level that level's latency. Of the ring's N hops, ``N/G_j -
  N/G_{j+1}`` cross level j, each NPU's share of them through its own port: the ring's bus
  bandwidth is ``eff_p * min_j (B_j e_j N / hops_j)``, e_0 = 1 and e_j = net / eff_Simple above
  (Simple reaches the NICs' share ``net`` of their rate, other protocols their part of that),
  which is why a 2-node ring outruns a 1-node one by N/(N-M) where the NVLinks limit it.
- Tree (all-reduce, two or more levels): a chain inside the node, a binary tree across, up and
  down: ``2((P_0 - 1) L_0 f + sum_{j>=1} ceil(log2 P_j) L_j)``; it moves S through every NPU's
  links both ways (algbw at most ``B_0 / 2``) and S through the node's NICs together (at most
  ``e_j G_j B_j``): twice a ring's rate across nodes, busbw above the NICs' rate. On NVIDIA
  NCCL's ``treeCorrectionFactor`` scales its bandwidth at medium sizes, as NCCL's tuner does.
- NVLS (all-reduce, one Switch level, Simple): the switch reduces; algbw ``nvls_eff * B_0``.
  NCCL pipelines it in waves of ``channels x heads`` chunks (16 channels on Hopper, 32 on
  Blackwell; a head per GPU), the chunk 128 KiB and halved at NCCL's thresholds below 64, 8 and
  2 waves (enqueue.cc): each chunk costs its channel ``nvls_chunk`` besides its bytes, and the
  scatter, reduce and gather stages hold two more waves in flight: ``base + (S + 2 min(S, W)) *
  (1/algbw + nvls_chunk / (channels * chunk))``. The jumps of a log's busbw at those thresholds
  (GB200: 128 MiB and 2 GiB) and NVLS's apparent 100-200 us latency come from there.
- NVLS-Tree (all-reduce, a Switch dim 0 and more levels, Simple): NVLS inside, a tree across
  (on two nodes twice the NICs' rate, as NCCL's tuner has it); NVLS-Tree's own chunk thresholds,
  and a fourth stage (the tree across nodes): three waves in flight.
- MSCCL (RCCL, all-reduce on one full-mesh node, LL): the one-shot algorithm RCCL runs for small
  all-reduces on MI300-class nodes: one step, each GPU sending S to every peer over that peer's link.
- All-to-all: every NPU sends ``S/N`` to each peer at once, Simple's share of each level's rate.
- Broadcast (Ring only, as NCCL runs it): the root's S pipelined along the ring, ``N-1`` steps,
  each NPU's port moving S once: algbw = busbw = the ring's bus bandwidth.

Channels: NCCL spreads a collective over ``ch`` channels, but uses fewer while a channel would get
less than its threads' share (``nBytes < nc * nThreads * threadThreshold`` in ``enqueue.cc``: 32
KiB for Simple, 5 KiB for LL128, 4 KiB times N for Ring LL), so below ``ch`` shares the time
stays near the one-share time: ``lat + S ch / (nc(S) bw)``, ``nc = clamp(S / share, 1, ch)``.

The pair is the fastest one the parameters allow (NCCL's rule), unless `NcclParams.uses` records
the pairs a log showed the library running, each over a range of sizes (calibrate fits them: its
tuner, with its own constants, may run a pair this model finds slower): then `uses_index`. The
engine moves data dim by dim as usual; `cost.CostModel` gives a chunk its share of the call's time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache, partial

import numpy as np

from .errors import UsageError
from .topology import PROTOCOLS, Dim, NcclParams, Topology
from .units import BYTES_PER_GB

ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER = "all_reduce", "reduce_scatter", "all_gather"
ALL_TO_ALL, BROADCAST = "all_to_all", "broadcast"
# Per-step latency of a step across level 0, as a factor of dim 0's latency (its LL step): NCCL's
# hwLatencies[NVLINK] (LL 0.6, LL128 1.9 / 1.25, Simple 3.4 / 4.0 us for Ring / Tree) and RCCL's
# tuning model for xGMI (LL 0.8, Simple 2.1 / 2.3 us; no LL128 on gfx94x).
STEP_FACTORS = {
    False: {"Ring": (1.0, 1.9 / 0.6, 3.4 / 0.6), "Tree": (1.0, 1.25 / 0.6, 4.0 / 0.6)},
    True: {"Ring": (1.0, 1.0, 2.1 / 0.8), "Tree": (1.0, 1.0, 2.3 / 0.8)},
}
# NCCL's treeCorrectionFactor (tuning.cc), per protocol, indexed by log2(S / 64), applied below 512 MiB.
TREE_CORRECTION = {
    "LL": (1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1),
    "LL128": (1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}  # fmt: skip
# Bytes a channel needs before NCCL adds the next one: nThreads * threadThreshold (comm.h, device.h).
CHANNEL_SHARE_BYTES = {"LL": 512 * 8, "LL128": 640 * 8, "Simple": 512 * 64}
# NVLS (enqueue.cc, nvls.cc): NCCL_NVLS_CHUNKSIZE, the (waves, smaller chunk) steps of
# calcCollChunking for NVLS on one node and NVLS-Tree across nodes, NCCL_MAX_NVLS_ARITY, and the
# waves a call's pipeline holds besides its own: NVLS's scatter, reduce and gather warps are three
# stages (two more waves), NVLS-Tree's tree across nodes a fourth (all_reduce.h).
NVLS_CHUNK_BYTES = 128 * 1024
NVLS_CHUNK_STEPS = ((64, 65536.0), (8, 32768.0), (2, 16384.0))
NVLS_TREE_CHUNK_STEPS = ((32, 262144.0), (16, 131072.0), (4, 65536.0), (1, 32768.0))
NVLS_MAX_ARITY = 32
NVLS_FILL_WAVES = {False: 2, True: 3}


@dataclass(frozen=True)
class Level:
    """One level of a flat algorithm: NPUs, bandwidth in bytes per ns, per-step latency in ns."""

    npus: int
    bytes_per_ns: float
    latency_ns: float
    switch: bool


@dataclass(frozen=True)
class Choice:
    """One algorithm and protocol of a collective: its time, the latency part of it, the names."""

    time_ns: float
    latency_ns: float
    algorithm: str
    protocol: str


def levels(topology: Topology, dims) -> list[Level]:
    """The group's levels: its dims with more than one NPU, lowest first."""
    out = []
    for d in sorted(dims):
        dim = topology.dims[d]
        if dim.npus > 1:
            out.append(
                Level(dim.npus, dim.bandwidth_gbps * BYTES_PER_GB / 1e9, dim.latency_ns, dim.kind == "Switch")
            )
    return out


def tree_correction(protocol: str, sizes) -> np.ndarray:
    """NCCL's tree bandwidth factor at these sizes (1 from 512 MiB)."""
    index = np.floor(np.log2(np.maximum(np.asarray(sizes, float) / 64, 1.0))).astype(int)
    table = np.array(TREE_CORRECTION[protocol] + (1.0,))
    return table[np.minimum(index, len(table) - 1)]


_BY_SIZES: dict[tuple, np.ndarray] = {}  # `_sized`'s arrays (a fit asks for the same sizes many times)


def _sized(key: tuple, sizes: np.ndarray, make) -> np.ndarray:
    """``make()``, an array that depends only on `key` and `sizes`, computed once per both (read-only)."""
    full = (*key, sizes.tobytes())
    found = _BY_SIZES.get(full)
    if found is None:
        if len(_BY_SIZES) > 4096:
            _BY_SIZES.clear()
        found = _BY_SIZES[full] = make()
        found.flags.writeable = False
    return found


def _size_rows(protocols: tuple[str, ...], n: int, sizes: np.ndarray) -> np.ndarray:
    """Per protocol, rows of: a ring's channel shares ``S / share`` (at least 1), a tree's, its correction.

    A ring or tree runs ``ch / min(shares, ch)`` slower than its full rate (``ch / nc(S)``, module
    doc); Ring LL's share grows with the N NPUs.
    """
    rows = [np.maximum(sizes / (CHANNEL_SHARE_BYTES[p] * (n if p == "LL" else 1)), 1.0) for p in protocols]
    rows += [np.maximum(sizes / CHANNEL_SHARE_BYTES[p], 1.0) for p in protocols]
    rows += [tree_correction(p, sizes) for p in protocols]
    return np.array(rows)


@dataclass(frozen=True)
class RingStep:
    """One protocol's price of a ring step (`ring_steps`).

    Attributes:
        base_ns: the call's base latency.
        efficiency: the share of a level's rate the protocol's data reaches.
        latency_factors: per level, the factor of its latency a step across it pays.
        rate_shares: per level, the share of its rate a step across it reaches (times `efficiency`).
    """

    base_ns: float
    efficiency: float
    latency_factors: list[float]
    rate_shares: list[float]


def level_shares(params: NcclParams, n_levels: int) -> list[float]:
    """Per level, the share of its rate reached before the protocol's efficiency.

    All of level 0; across a higher level the NICs' ``net_efficiency / eff_Simple``.
    """
    return [1.0] + [params.net_efficiency / params.efficiency[2]] * (n_levels - 1)


def ring_steps(params: NcclParams, n_levels: int, protocol: str) -> RingStep:
    """A protocol's price of a ring's steps over `n_levels` levels.

    A step across level 0 pays dim 0's latency times the protocol's factor (`STEP_FACTORS`), one
    across a higher level that level's latency; it moves bytes at the protocol's efficiency of
    the level's rate (above level 0 of the NICs' share, ``net_efficiency / eff_Simple``). The
    ring (`pairs`) and a custom algorithm (`custom_topology`) are priced by it alike.
    """
    if protocol not in params.protocols:
        raise UsageError(
            f"protocol {protocol} is not one of the topology's NCCL protocols ({'+'.join(params.protocols)})"
        )
    k = PROTOCOLS.index(protocol)
    factor = STEP_FACTORS[params.rccl]["Ring"][k]
    return RingStep(
        params.base_ns[k],
        params.efficiency[k],
        [factor] + [1.0] * (n_levels - 1),
        level_shares(params, n_levels),
    )


def custom_topology(topology: Topology, protocol: str) -> tuple[Topology, float]:
    """The per-dim network a custom algorithm's steps take under a protocol, and the call's base latency.

    Each dim of more than one NPU is its level as one ring step sees it (`ring_steps`): its links
    at the protocol's share of the rate, a message paying the step's latency per hop (a Switch's
    up and down are one step, half each); the call pays the protocol's base latency once.
    """
    params = topology.nccl if topology.nccl is not None else NcclParams()
    lv = levels(topology, range(len(topology.dims)))
    ring = ring_steps(params, len(lv), protocol)
    priced = iter(zip(lv, ring.latency_factors, ring.rate_shares))
    dims = []
    for dim in topology.dims:
        if dim.npus == 1:
            dims.append(Dim(dim.kind, 1, dim.bandwidth_gbps, dim.latency_ns))
            continue
        level, factor, share = next(priced)
        gbps = ring.efficiency * share * level.bytes_per_ns * 1e9 / BYTES_PER_GB
        hops = 2 if dim.kind == "Switch" else 1
        dims.append(Dim(dim.kind, dim.npus, gbps, level.latency_ns * factor / hops))
    return Topology(tuple(dims), "", topology.ports, None, topology.mtu_bytes), ring.base_ns


@dataclass(frozen=True)
class Pair:
    """One algorithm and protocol: its latency (ns) and its time at each size asked (ns)."""

    algorithm: str
    protocol: str
    latency_ns: float
    times_ns: np.ndarray


@dataclass(frozen=True)
class _Shape:
    """The integers of a ring over levels of these NPU counts (`pairs`; module doc's names).

    Attributes:
        n: NPUs in all.
        below: per level, ``G_j``: the NPUs below it.
        above: per level, ``H_j``, and 1 past the last.
        hops: per level, the ring's hops that cross it.
    """

    n: int
    below: tuple[int, ...]
    above: tuple[int, ...]
    hops: tuple[int, ...]


@lru_cache(maxsize=256)
def _shape(npus: tuple[int, ...]) -> _Shape:
    """`_Shape` of levels of `npus` NPUs, computed once per machine (a fit times it many times)."""
    n = math.prod(npus)
    below = [math.prod(npus[:j]) for j in range(len(npus))]
    above = [math.prod(npus[j:]) for j in range(len(npus))] + [1]
    crossing = [n // g if n // g > 1 else 0 for g in below] + [0]
    hops = [crossing[j] - crossing[j + 1] for j in range(len(npus))]
    return _Shape(n, tuple(below), tuple(above), tuple(hops))


def pairs(params: NcclParams, lv: list[Level], op: str, sizes) -> list[Pair]:
    """Every algorithm and protocol the library has here, timed at each size (module doc)."""
    sizes = np.asarray(sizes, dtype=float)
    if not lv:
        return [Pair("none", "none", 0.0, np.zeros_like(sizes))]
    shape = _shape(tuple(level.npus for level in lv))
    n, below, above = shape.n, shape.below, shape.above
    share = level_shares(params, len(lv))
    factors = STEP_FACTORS[params.rccl]
    protocols = [p for p in PROTOCOLS if p in params.protocols]
    out: list[Pair] = []

    def add(algorithm: str, protocol: str, latency_ns: float, algbw, slower=1.0):
        out.append(Pair(algorithm, protocol, latency_ns, latency_ns + sizes * slower / algbw))

    if op == ALL_TO_ALL:  # S / N to every peer at once; a peer whose lowest differing level is j uses level j
        k = PROTOCOLS.index(protocols[-1])
        upper = below[1:] + (n,)
        per_byte = max((upper[j] - below[j]) / n / (share[j] * lv[j].bytes_per_ns) for j in range(len(lv)))
        add(
            "Direct",
            protocols[-1],
            params.base_ns[k] + sum(x.latency_ns for x in lv),
            params.efficiency[k] / per_byte,
        )
        return out
    twice = 2 if op == ALL_REDUCE else 1
    across = sum(math.ceil(math.log2(level.npus)) * level.latency_ns for level in lv[1:])
    inter = min((share[j] * lv[j].bytes_per_ns * below[j] for j in range(1, len(lv))), default=0.0)
    on_ring = "Ring" in params.algos or op == BROADCAST  # NCCL broadcasts on rings only
    on_tree = op == ALL_REDUCE and len(lv) > 1 and "Tree" in params.algos
    if on_ring:
        cap = min(s * level.bytes_per_ns * n / h for s, level, h in zip(share, lv, shape.hops) if h)
        steps = [twice * (above[j] - above[j + 1]) for j in range(len(lv))]
    if on_tree:
        tree_rate = min(lv[0].bytes_per_ns / 2, inter)
    ks = [PROTOCOLS.index(p) for p in protocols]
    m = len(ks)
    rows = _sized(("pairs", tuple(protocols), n), sizes, partial(_size_rows, tuple(protocols), n, sizes))
    ch = params.channels
    # every protocol's times in one array each (row k a protocol's): the same arithmetic per element
    if on_ring:
        ring_latency, algbw = [], []
        for k in ks:
            eff, base = params.efficiency[k], params.base_ns[k]
            step_factors = ring_steps(params, len(lv), PROTOCOLS[k]).latency_factors
            stepping = sum(st * x.latency_ns * f for st, x, f in zip(steps, lv, step_factors))
            ring_latency.append(base + stepping)
            # a broadcast pipelines S from the root along the ring: each NPU's port moves S once
            algbw.append(eff * cap if op == BROADCAST else eff * cap * n / (twice * (n - 1)))
        slower = ch / np.minimum(rows[:m], ch)
        ring_times = np.array(ring_latency)[:, None] + sizes * slower / np.array(algbw)[:, None]
    if on_tree:
        chain = (lv[0].npus - 1) * lv[0].latency_ns
        tree_latency = [params.base_ns[k] + 2 * (chain * factors["Tree"][k] + across) for k in ks]
        tree_bw = np.array([params.efficiency[k] * params.tree_efficiency * tree_rate for k in ks])[:, None]
        if not params.rccl:
            tree_bw = tree_bw * rows[2 * m :]
        slower = ch / np.minimum(rows[m : 2 * m], ch)
        tree_times = np.array(tree_latency)[:, None] + sizes * slower / tree_bw
    for i, p in enumerate(protocols):
        if on_ring:
            out.append(Pair("Ring", p, ring_latency[i], ring_times[i]))
        if on_tree:
            out.append(Pair("Tree", p, tree_latency[i], tree_times[i]))
    if op == ALL_REDUCE and params.rccl and len(lv) == 1 and not lv[0].switch and "MSCCL" in params.algos:
        # RCCL's MSCCL one-shot all-reduce on a full mesh (LL): each GPU writes its buffer to every
        # peer over that peer's link, then reduces locally: one step, (N-1) S through its links
        add(
            "MSCCL",
            "LL",
            params.base_ns[0] + lv[0].latency_ns,
            params.efficiency[0] * lv[0].bytes_per_ns / (n - 1),
        )
    if op == ALL_REDUCE and lv[0].switch and "Simple" in protocols:
        nvls = params.nvls_efficiency * lv[0].bytes_per_ns
        nodes = n // lv[0].npus
        if "NVLS" in params.algos and len(lv) == 1:
            latency = params.nvls_base_ns + 2 * lv[0].latency_ns
            out.append(
                Pair("NVLS", "Simple", latency, latency + nvls_transfer_ns(params, lv[0], nodes, nvls, sizes))
            )
        if "NVLSTree" in params.algos and len(lv) > 1:
            tree = inter * params.efficiency[2] * params.tree_efficiency * (2 if nodes == 2 else 1)
            latency = params.nvls_base_ns + 2 * (lv[0].latency_ns + across)
            transfer = nvls_transfer_ns(params, lv[0], nodes, min(nvls, tree), sizes)
            out.append(Pair("NVLSTree", "Simple", latency, latency + transfer))
    return out


def nvls_chunk_bytes(nodes: int, heads: int, channels: int, sizes) -> np.ndarray:
    """The chunk NCCL's NVLS (one node) or NVLS-Tree (more) moves per head and channel at these sizes.

    enqueue.cc ``calcCollChunking``: ``NCCL_NVLS_CHUNKSIZE`` (128 KiB), halved while the call is
    smaller than a few waves of ``channels x heads`` chunks (NVLS: 64, 8 and 2 waves for 64, 32 and
    16 KiB; NVLS-Tree: 4 and 1 waves for 64 and 32 KiB, 64 KiB at most from four nodes).
    """
    sizes = np.asarray(sizes, dtype=float)
    ops = channels * heads
    chunk = np.full(sizes.shape, float(NVLS_CHUNK_BYTES))
    if nodes >= 4:
        chunk = np.minimum(chunk, 65536.0)
    steps = NVLS_CHUNK_STEPS if nodes == 1 else NVLS_TREE_CHUNK_STEPS
    for waves, smaller in steps:
        chunk = np.where((sizes < waves * ops * chunk) & (chunk > smaller), smaller, chunk)
    return chunk


def nvls_transfer_ns(params: NcclParams, level: Level, nodes: int, algbw: float, sizes) -> np.ndarray:
    """NVLS's or NVLS-Tree's time besides its latency: a pipeline of waves of chunks (module doc).

    A wave is ``channels x heads`` chunks (one loop of every channel); each chunk costs its channel
    `NcclParams.nvls_chunk_ns` besides its bytes, and the pipeline's stages (scatter, reduce,
    gather; NVLS-Tree adds the tree across nodes) hold `NVLS_FILL_WAVES` more waves in flight.
    """
    sizes = np.asarray(sizes, dtype=float)
    heads = min(level.npus, NVLS_MAX_ARITY)
    channels = params.nvls_channels

    def moved_and_per_chunk() -> np.ndarray:
        """Bytes moved with the fill waves, and the chunks' bytes per channel: rows of one array."""
        chunk = nvls_chunk_bytes(nodes, heads, channels, sizes)
        wave = channels * heads * chunk
        fill = NVLS_FILL_WAVES[nodes > 1] * np.minimum(sizes, wave)
        return np.array([sizes + fill, channels * chunk])

    moved, per_chunk = _sized(("nvls", nodes, heads, channels), sizes, moved_and_per_chunk)
    return moved * (1.0 / algbw + params.nvls_chunk_ns / per_chunk)


def choose(params: NcclParams, lv: list[Level], op: str, sizes) -> tuple[list[Pair], np.ndarray]:
    """The pairs and, per size, the index of the one the library runs (`uses_index`)."""
    found = pairs(params, lv, op, sizes)
    if not found:
        raise UsageError(
            f"NCCL(algos={'+'.join(params.algos)},protos={'+'.join(params.protocols)}) leaves no algorithm "
            f"for {op} on {len(lv)} level(s) of nccl dims (NCCL runs Tree and NVLSTree only across "
            "nodes, NVLS only on a switch, broadcast only on rings); add Ring to algos"
        )
    return found, uses_index(params.uses, found, sizes)


def uses_index(uses, found: list[Pair], sizes) -> np.ndarray:
    """Per size, the index in `found` of the pair NCCL runs, given the pairs a log showed it running.

    NCCL's tuner times each pair as latency + size / bandwidth and runs the fastest, so a pair
    wins over one range of sizes. Inside a range of `uses` its pair runs; between two ranges the
    faster of their pairs; below the first range and above the last, the fastest pair that no
    range further in claims. With no `uses`, the fastest pair.
    """
    sizes = np.asarray(sizes, dtype=float)
    times = np.array([p.times_ns for p in found])
    index = {(p.algorithm, p.protocol): k for k, p in enumerate(found)}
    ranges = [(index[(a, p)], lo, hi) for a, p, lo, hi in uses if (a, p) in index]
    if not ranges:
        return times.argmin(axis=0)
    allowed = np.ones(times.shape, dtype=bool)
    for i, (k, lo, hi) in enumerate(ranges):
        inside = (sizes >= lo) & (sizes <= hi)
        allowed[:, inside] = False
        allowed[k, inside] = True
        if i + 1 < len(ranges):
            gap = (sizes > hi) & (sizes < ranges[i + 1][1])
            allowed[:, gap] = False
            allowed[k, gap] = allowed[ranges[i + 1][0], gap] = True
    below, above = sizes < ranges[0][1], sizes > ranges[-1][2]
    for k in {k for k, _, _ in ranges[1:]} - {ranges[0][0]}:
        allowed[k, below] = False
    for k in {k for k, _, _ in ranges[:-1]} - {ranges[-1][0]}:
        allowed[k, above] = False
    return np.where(allowed, times, np.inf).argmin(axis=0)


def best(params: NcclParams, lv: list[Level], op: str, size_bytes: float) -> Choice:
    """The pair NCCL runs at this size (`uses_index`)."""
    found, index = choose(params, lv, op, [size_bytes])
    pair = found[int(index[0])]
    return Choice(float(pair.times_ns[0]), pair.latency_ns, pair.algorithm, pair.protocol)


def collective_ns(topology: Topology, dims, op: str, size_bytes: float) -> Choice:
    """The NCCL-like time, algorithm and protocol of a collective of size_bytes per NPU on dims."""
    params = topology.nccl if topology.nccl is not None else NcclParams()
    return best(params, levels(topology, dims), op, size_bytes)


def chunk_ns(topology: Topology, dims, op: str, call_bytes: float, chunk_bytes: float, first: bool) -> float:
    """A chunk's share of its NCCL call: one call of ``call_bytes``, its latency paid by the first chunk.

    The call runs the pair chosen for its whole size; NCCL pipelines its own chunks, so C chunks
    of one collective take the call's time together (C calls would pay the latency C times).
    """
    whole = collective_ns(topology, dims, op, call_bytes)
    transfer = (whole.time_ns - whole.latency_ns) * chunk_bytes / call_bytes if call_bytes else 0.0
    return transfer + (whole.latency_ns if first else 0.0)


CALL = "call"  # a flat topology's plan ends with ("call", call elements, first chunk) [, ("call", op, 0)]


def plan_collective(plan) -> tuple[str, tuple[int, ...], int, int, bool]:
    """The collective of a chunk's stage plan ``((dim, op, full_elems), ..., [("call", elems, first)])``.

    Returns the op, its dims, the chunk's elements (the largest stage's), the whole call's
    elements and whether this is the call's first chunk (a plan without the marker is a whole
    call). A ``("call", op, 0)`` item names the collective (a broadcast's stages are an
    all-gather's); without one, RS stages then AG stages (or one AR stage) make an all-reduce; RS alone a
    reduce-scatter; AG alone an all-gather; A2A stages an all-to-all.
    """
    named = [item[1] for item in plan if item[0] == CALL and isinstance(item[1], str)]
    call = [item for item in plan if item[0] == CALL and not isinstance(item[1], str)]
    stages = [item for item in plan if item[0] != CALL]
    ops = {op for _, op, _ in stages}
    if named:
        op = named[0]
    elif "AR" in ops or ops == {"RS", "AG"}:
        op = ALL_REDUCE
    elif ops == {"RS"}:
        op = REDUCE_SCATTER
    elif ops == {"AG"}:
        op = ALL_GATHER
    elif ops == {"A2A"}:
        op = ALL_TO_ALL
    else:
        raise ValueError(f"the NCCL-like model times one collective per chunk, not {sorted(ops)}")
    elems = max(full for _, _, full in stages)
    whole, first = (call[0][1], call[0][2]) if call else (elems, True)
    return op, tuple(sorted({d for d, _, _ in stages})), elems, whole, first
