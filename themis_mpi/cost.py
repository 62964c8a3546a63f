"""The alpha-beta cost model of one stage on one dim (DESIGN.md section 4).

A message on dim d takes ``hops * latency_ns + bytes / link_bandwidth``; messages sent at once
share the dim's bandwidth (a FullyConnected dim gives each of its P-1 peers bandwidth/(P-1), a
Switch port serialises them), so a step of ``n`` messages of ``b`` bytes costs
``hops * latency_ns + n * b / bandwidth + endpoint_delay_ns``.

Sizes are nominal: a stage on ``full_elems`` elements splits them into P blocks of
``ceil(full_elems / P)`` elements, the size every rank's timing uses even where the real blocks
are a little shorter. Timing therefore never differs between ranks, so every rank makes the same
scheduling decisions (padding in time, as a real implementation pads in memory).
"""

from __future__ import annotations

from functools import lru_cache

from .topology import Dim, Topology

RS, AG, A2A = "RS", "AG", "A2A"


def block_elems(full_elems: int, npus: int) -> int:
    """Nominal elements per block when ``full_elems`` are split over ``npus`` NPUs."""
    return -(-full_elems // npus)


def steps(dim: Dim, op: str, full_elems: int, itemsize: int) -> tuple[tuple[int, int], ...]:
    """The algorithm steps of one stage: a tuple of (message bytes, messages at once).

    Args:
        dim: the dim the stage runs on.
        op: RS (reduce-scatter), AG (all-gather) or A2A (all-to-all, always direct).
        full_elems: elements before a reduce-scatter, after an all-gather.
        itemsize: bytes per element.
    """
    p = dim.npus
    if p == 1:
        return ()
    block_bytes = block_elems(full_elems, p) * itemsize
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
    """

    def __init__(self, topology: Topology, itemsize: int, endpoint_delay_ns: float = 0.0):
        self.topology = topology
        self.itemsize = itemsize
        self.endpoint_delay_ns = float(endpoint_delay_ns)
        self.step_times_ns = lru_cache(maxsize=None)(self._step_times_ns)

    def step_time_ns(self, dim: Dim, msg_bytes: int, n_msgs: int) -> float:
        """Time of one step: n messages of msg_bytes sent at once on dim."""
        return (
            dim.hops * dim.latency_ns
            + n_msgs * msg_bytes / dim.bandwidth_bytes_per_ns
            + self.endpoint_delay_ns
        )

    def _step_times_ns(self, dim_index: int, op: str, full_elems: int) -> tuple[float, ...]:
        dim = self.topology.dims[dim_index]
        return tuple(self.step_time_ns(dim, b, n) for b, n in steps(dim, op, full_elems, self.itemsize))

    def stage_end_ns(self, dim_index: int, op: str, full_elems: int, start_ns: float) -> float:
        """End of a stage started at start_ns, summed step by step exactly as the emulator does."""
        t = start_ns
        for step_ns in self.step_times_ns(dim_index, op, full_elems):
            t = t + step_ns
        return t

    def stage_bytes(self, dim_index: int, op: str, full_elems: int) -> int:
        """Bytes one NPU sends during the stage."""
        dim = self.topology.dims[dim_index]
        return sum(b * n for b, n in steps(dim, op, full_elems, self.itemsize))


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
