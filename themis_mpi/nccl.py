"""An NCCL-like collective cost model: algorithms and protocols, the fastest pair per size.

NCCL (``src/graph/tuning.cc``) times a collective of S bytes with algorithm a and protocol p as
``latency(a, p) + S / bandwidth(a, p)`` and runs the fastest pair. This model has the same
structure, with few parameters, each with a physical meaning (`topology.NcclParams`, the dims):

- a base latency per protocol (LL, LL128, Simple) and one for NVLS, plus a per-step latency per
  level (the dim's ``latency_ns``: a step whose message crosses level j pays ``L_j``);
- a bandwidth efficiency per protocol (Simple 1, LL and LL128 a share of it), and NVLS's algbw
  as a share of dim 0's bandwidth (the in-switch reduction: busbw above the link rate);
- the bandwidth of each level: ``B_j`` per NPU (the dim's ``bandwidth_gbps``).

The algorithms span all dims of the group at once (the levels: dim 0 inside the node, the next
ones across). With ``P_j`` NPUs per level, ``N = prod P_j`` and ``G_j = prod_{i<j} P_i`` NPUs
below level j:

- Ring (LL, LL128, Simple): one flat ring over the N NPUs. An all-reduce takes ``2(N-1)`` steps,
  a reduce-scatter or all-gather ``N-1``; of each ``N-1``, ``H_j - H_{j+1}`` cross level j
  (``H_j = prod_{i>=j} P_i``). Each group of ``G_j`` NPUs sends the ring's data out through its
  ``G_j`` ports of level j, so the ring's bus bandwidth is ``eff_p * min_j G_j B_j``; it moves
  ``2(N-1)/N S`` (all-reduce) or ``(N-1)/N S`` per NPU.
- Tree (all-reduce, two or more levels): a chain inside the node and a binary tree across, up
  and down: ``2((P_0 - 1) L_0 + sum_{j>=1} ceil(log2 P_j) L_j)``, moving ``2 S`` (NCCL's tree
  reaches half its bus bandwidth as algbw) at ``eff_p * min(B_0, T)``, where the tree's share
  of the across-node ports is ``T = tree_eff * min_{j>=1} G_j B_j``.
- NVLS (all-reduce, one Switch level, Simple): the switch reduces, ``S / (nvls_eff * B_0)``
  after two hops.
- NVLS-Tree (all-reduce, a Switch dim 0 and more levels, Simple): NVLS inside, a tree across;
  its bandwidth is the lesser of NVLS's and T.

The collective's time is the least over the allowed pairs (`NcclParams.algos`). The engine
moves data dim by dim as usual (so results stay exact); `cost.CostModel` spreads this flat
time over the chunk's steps, so the emulator and the model inject the same time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .topology import PROTOCOLS, NcclParams, Topology
from .units import BYTES_PER_GB

ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER = "all_reduce", "reduce_scatter", "all_gather"


@dataclass(frozen=True)
class Level:
    """One level of a flat algorithm: NPUs, bandwidth in bytes per ns, per-step latency in ns."""

    npus: int
    bytes_per_ns: float
    latency_ns: float
    switch: bool


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


def choices(params: NcclParams, lv: list[Level], op: str, size_bytes: float) -> list[tuple[float, str, str]]:
    """Every allowed (time in ns, algorithm, protocol) of the collective (module doc)."""
    if not lv:
        return [(0.0, "none", "none")]
    n = math.prod(level.npus for level in lv)
    below = [math.prod(x.npus for x in lv[:j]) for j in range(len(lv))]
    above = [math.prod(x.npus for x in lv[j:]) for j in range(len(lv))] + [1]
    port_bw = min(g * level.bytes_per_ns for g, level in zip(below, lv))
    twice = 2 if op == ALL_REDUCE else 1
    out = []
    if "Ring" in params.algos:
        ring_lat = sum(twice * (above[j] - above[j + 1]) * level.latency_ns for j, level in enumerate(lv))
        ring_bytes = twice * (n - 1) / n * size_bytes
        for p, proto in enumerate(PROTOCOLS):
            t = params.base_ns[p] + ring_lat + ring_bytes / (params.efficiency[p] * port_bw)
            out.append((t, "Ring", proto))
    if op != ALL_REDUCE:
        return out
    across = sum(math.ceil(math.log2(level.npus)) * level.latency_ns for level in lv[1:])
    if len(lv) > 1:
        inter_bw = params.tree_efficiency * min(g * level.bytes_per_ns for g, level in zip(below[1:], lv[1:]))
    if "Tree" in params.algos and len(lv) > 1:
        tree_lat = 2 * ((lv[0].npus - 1) * lv[0].latency_ns + across)
        tree_bw = min(lv[0].bytes_per_ns, inter_bw)
        for p, proto in enumerate(PROTOCOLS):
            t = params.base_ns[p] + tree_lat + 2 * size_bytes / (params.efficiency[p] * tree_bw)
            out.append((t, "Tree", proto))
    if lv[0].switch:
        nvls_bw = params.nvls_efficiency * lv[0].bytes_per_ns
        if "NVLS" in params.algos and len(lv) == 1:
            t = params.nvls_base_ns + 2 * lv[0].latency_ns + size_bytes / nvls_bw
            out.append((t, "NVLS", "Simple"))
        if "NVLSTree" in params.algos and len(lv) > 1:
            t = params.nvls_base_ns + 2 * (lv[0].latency_ns + across) + size_bytes / min(nvls_bw, inter_bw)
            out.append((t, "NVLSTree", "Simple"))
    return out


def best(params: NcclParams, lv: list[Level], op: str, size_bytes: float) -> tuple[float, str, str]:
    """The fastest allowed (time in ns, algorithm, protocol), as NCCL picks it."""
    found = choices(params, lv, op, size_bytes)
    if not found:
        raise ValueError(f"no NCCL algorithm allowed for {op} on {len(lv)} levels")
    return min(found)


def collective_ns(topology: Topology, dims, op: str, size_bytes: float) -> tuple[float, str, str]:
    """The NCCL-like time, algorithm and protocol of a collective of size_bytes per NPU on dims."""
    params = topology.nccl if topology.nccl is not None else NcclParams()
    return best(params, levels(topology, dims), op, size_bytes)


def plan_collective(plan) -> tuple[str, tuple[int, ...], int]:
    """The collective of a chunk's stage plan ``((dim, op, full_elems), ...)``: op, dims, elements.

    RS stages then AG stages (or one AR stage) make an all-reduce; RS alone a reduce-scatter;
    AG alone an all-gather. The elements are the chunk's (the largest stage's).
    """
    ops = {op for _, op, _ in plan}
    if "AR" in ops or ops == {"RS", "AG"}:
        op = ALL_REDUCE
    elif ops == {"RS"}:
        op = REDUCE_SCATTER
    elif ops == {"AG"}:
        op = ALL_GATHER
    else:
        raise ValueError(
            f"the NCCL-like model times all_reduce, reduce_scatter and all_gather, not {sorted(ops)}"
        )
    return op, tuple(sorted({d for d, _, _ in plan})), max(full for _, _, full in plan)
