"""Inter-dim policies: the order in which each chunk visits the dims (THEMIS.md).

`chunk_orders` returns one permutation of all dims per chunk, the order of the collective's first
phase: the reduce-scatter order of an all-reduce or reduce-scatter (the all-gather of an
all-reduce runs it backwards), the all-gather order of an all-gather. Dims that are not involved
or have one NPU stay in the permutation and are skipped when stages are built, as in ASTRA-sim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import UsageError
from .topology import Topology

POLICIES = ("baseline", "themis")
MIB = 2**20


def fuses_last_dim(policy: str) -> bool:
    """The baseline runs an all-reduce's last dim as one All-Reduce phase (ASTRA-sim's localBWAware).

    Themis splits every dim into a reduce-scatter and an all-gather stage, so that the all-gather
    half can be scheduled on its own.
    """
    return policy == "baseline"


def baseline_order(op: str, n_dims: int) -> list[int]:
    """Hierarchical order: ascending dims, except a standalone all-gather, which descends."""
    order = list(range(n_dims))
    return order[::-1] if op == "all_gather" else order


@dataclass
class ThemisTracker:
    """Themis's load tracker: one load per dim in MiB at dim 0's bandwidth.

    Attributes:
        topology: the network.
        involved: dims the collective runs on.
        loads: accumulated load per dim, reset for each collective.
        fallbacks: chunks that kept the baseline order because the loads were balanced.
    """

    topology: Topology
    involved: tuple[int, ...]
    loads: list[float] = field(init=False)
    fallbacks: int = field(init=False, default=0)

    def __post_init__(self):
        self.loads = [0.0] * len(self.topology.dims)
        self._sorted = list(range(len(self.topology.dims)))

    def _active(self, d: int) -> bool:
        return d in self.involved and self.topology.dims[d].npus > 1

    def _ratio(self, d: int) -> float:
        return self.topology.dims[d].bandwidth_gbps / self.topology.dims[0].bandwidth_gbps

    def _rs_share(self, d: int) -> float:
        """Bytes dim d's port carries per byte reduce-scattered on it (same for its all-gather).

        (P-1)/P for ring, direct and halving-doubling; 1/efficiency for ina, whose NPU sends all
        it holds up (RS) or receives all of it down (AG) through the switch (`cost.ina_traffic`).
        """
        dim = self.topology.dims[d]
        if dim.algorithm == "ina":
            return 1.0 / dim.efficiency
        return (dim.npus - 1) / dim.npus

    def next_order(self, op: str, chunk_bytes: int) -> list[int]:
        """Choose one chunk's order (rules 1 to 4 of THEMIS.md) and add its load."""
        n = len(self.loads)
        self._sorted.sort(key=lambda d: self.loads[d])  # stable: ties keep the last arrangement
        first = next((d for d in self._sorted if self._active(d)), None)
        if first is None:
            return baseline_order(op, n)
        last = self._sorted[-1]
        gap = (self.loads[last] - self.loads[first]) * self._ratio(first)
        gap_bytes = gap / self._rs_share(first) * MIB
        if gap_bytes < chunk_bytes / 16:
            self.fallbacks += 1
            self._sorted = list(range(n))
            rs_order = list(range(n))
        else:
            rs_order = list(self._sorted)
        if op == "all_gather":
            order = rs_order[::-1]
            m = chunk_bytes
            for d in order:
                if self._active(d):
                    m //= self.topology.dims[d].npus
            for d in order:
                if self._active(d):
                    p_d = self.topology.dims[d].npus
                    if self.topology.dims[d].algorithm == "ina":
                        self.loads[d] += m * p_d / MIB * self._rs_share(d) / self._ratio(d)
                    else:
                        self.loads[d] += m / MIB * (p_d - 1) / self._ratio(d)
                    m *= p_d
            return order
        m = chunk_bytes
        last_active = [d for d in rs_order if self._active(d)][-1]
        for d in rs_order:
            if self._active(d):
                p_d = self.topology.dims[d].npus
                if self.topology.dims[d].algorithm == "ina":  # the last one is one AR pass: half of RS + AG
                    fused = 0.5 if d == last_active else 1.0
                    self.loads[d] += fused * m / MIB * self._rs_share(d) / self._ratio(d)
                else:
                    self.loads[d] += m / MIB * (p_d - 1) / p_d / self._ratio(d)
                m //= p_d
        return rs_order


def chunk_orders(
    policy: str, topology: Topology, op: str, size_bytes: int, chunks: int, involved
) -> np.ndarray:
    """Every chunk's dim order as an int32 array of shape (chunks, n_dims).

    Themis tracks the reduce-scatter half of an all-reduce (its all-gather mirrors it), with the
    nominal chunk size ``size_bytes // chunks``; all-to-all is never reordered.
    """
    if policy not in POLICIES:
        raise UsageError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    n = len(topology.dims)
    orders = np.empty((chunks, n), dtype=np.int32)
    if policy == "baseline" or op == "all_to_all":
        orders[:] = baseline_order(op, n)
        return orders
    tracker = ThemisTracker(topology, tuple(involved))
    for k in range(chunks):
        orders[k] = tracker.next_order(op, size_bytes // chunks)
    return orders
