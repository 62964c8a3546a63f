"""ASTRA-sim 1.0's inter-dim policies, and `themis-lat`, which measures Themis's loads in time.

Each returns one permutation of all dims per chunk, the order of the collective's first phase: the
reduce-scatter order of an all-reduce or reduce-scatter (the all-gather of an all-reduce runs it
backwards), the all-gather order of an all-gather. Dims that are not involved or have one NPU stay
in the permutation and are skipped when stages are built, as in ASTRA-sim.

- `baseline` (ASTRA-sim's ``baseline``/Ascending with localBWAware): dims ascending, the last
  dim of an all-reduce as one All-Reduce stage.
- `astra2-baseline` (ASTRA-sim 2.x's ``baseline`` optimization): dims ascending, a full
  All-Reduce of the chunk on each (2.x's ``localBWAware`` is `baseline`).
- `themis` (``themis``/OfflineGreedy): the load tracker of docs/design.md#themis.
- `themisFlex` (OfflineGreedyFlex): the same tracker, but each chunk is sized to close the gap
  between the least and the most loaded dim (at least the nominal chunk size).
- `roundRobin` (RoundRobin): the ascending order rotated by one more dim for every chunk; the
  rotation counter lives as long as the policy and is not reset between collectives.
- `themis-lat` (ours): Themis's greedy rule with every dim's load measured in time by the cost
  model (latency, endpoint delays and link rules included).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..algorithms import custom_stage
from ..collectives import AR_EVERY_DIM, PRICED_ITEMSIZE, Collective, chunk_stages
from ..cost import AG, ASTRA_SIM_2, RS
from ..topology import Topology
from .base import Chunk, InterPolicy, PolicyContext, baseline_order

MIB = 2**20


def _involved_active(topology: Topology, involved, d: int) -> bool:
    return d in involved and topology.dims[d].npus > 1


@dataclass
class ThemisTracker:
    """Themis's load tracker: one load per dim in MiB at dim 0's bandwidth.

    A dim whose stages a custom algorithm runs adds its built-in load times how much longer the
    file keeps the dim's busiest link busy than those bytes say (`PolicyContext.custom_scale`).

    Attributes:
        topology: the network.
        involved: dims the collective runs on.
        context: where a custom dim's stage time comes from (None: built-in algorithms only).
        loads: accumulated load per dim, reset for each collective.
        fallbacks: chunks that kept the baseline order because the loads were balanced.
    """

    topology: Topology
    involved: tuple[int, ...]
    context: PolicyContext | None = None
    loads: list[float] = field(init=False)
    fallbacks: int = field(init=False, default=0)

    def __post_init__(self):
        dims = self.topology.dims
        self.loads = [0.0] * len(dims)
        self._sorted = list(range(len(dims)))
        # per-dim constants, looked up once per chunk and dim
        self._is_active = [_involved_active(self.topology, self.involved, d) for d in range(len(dims))]
        self._ratios = [d.bandwidth_gbps / dims[0].bandwidth_gbps for d in dims]
        self._custom = [self.context is not None and custom_stage(d) is not None for d in dims]
        self._scales: dict[tuple[int, str, int], float] = {}

    def _scale(self, d: int, op: str, stage_bytes: int) -> float:
        """A custom dim's busiest-link time over the bytes counted (`PolicyContext.custom_scale`)."""
        if not self._custom[d] or self.context is None:
            return 1.0
        key = (d, op, stage_bytes)
        if key not in self._scales:
            self._scales[key] = self.context.custom_scale(d, op, stage_bytes // PRICED_ITEMSIZE)
        return self._scales[key]

    def _active(self, d: int) -> bool:
        return self._is_active[d]

    def _ratio(self, d: int) -> float:
        return self._ratios[d]

    def sort(self) -> int | None:
        """Stable-sort the dims by load (ties keep the last arrangement); the least-loaded active dim."""
        self._sorted.sort(key=self.loads.__getitem__)
        for d in self._sorted:
            if self._is_active[d]:
                return d
        return None

    def gap_bytes(self, first: int, op: str) -> float:
        """The load gap between the most loaded dim and `first`, as bytes of `first`'s largest stage.

        Reduce-scatter (and all-reduce): the bytes an RS stage on `first` may start with; a
        standalone all-gather: the output of an AG stage ending on `first`.
        """
        p = self.topology.dims[first].npus
        gap = (self.loads[self._sorted[-1]] - self.loads[first]) * self._ratio(first) * MIB
        if op == "all_gather":
            return (
                gap / (p - 1) * p
                if self.topology.dims[first].algorithm != "ina"
                else gap / self._rs_share(first)
            )
        return gap / self._rs_share(first)

    def _rs_share(self, d: int) -> float:
        """Bytes dim d's port carries per byte reduce-scattered on it (same for its all-gather).

        (P-1)/P for ring, direct and halving-doubling; 1/efficiency for ina, whose NPU sends all
        it holds up (RS) or receives all of it down (AG) through the switch (`cost.ina_traffic`).
        """
        dim = self.topology.dims[d]
        if dim.algorithm == "ina":
            return 1.0 / dim.efficiency
        return (dim.npus - 1) / dim.npus

    def fall_back(self) -> list[int]:
        """Keep the baseline order (and put the persisted list back into index order)."""
        self.fallbacks += 1
        self._sorted = list(range(len(self.loads)))
        return list(range(len(self.loads)))

    def next_order(self, op: str, chunk_bytes: int) -> list[int]:
        """Choose one chunk's order (rules 1 to 4 of docs/design.md#themis) and add its load."""
        first = self.sort()
        if first is None:
            return baseline_order(op, len(self.loads))
        rs_order = self.fall_back() if self.gap_bytes(first, "rs") < chunk_bytes / 16 else list(self._sorted)
        return self.add(op, rs_order, chunk_bytes)

    def add(self, op: str, rs_order: list[int], chunk_bytes: int) -> list[int]:
        """Add a chunk's load along its reduce-scatter order; returns the chunk's order for `op`."""
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
                        self.loads[d] += m / MIB * (p_d - 1) / self._ratio(d) * self._scale(d, AG, m * p_d)
                    m *= p_d
            return order
        m = chunk_bytes
        active = [d for d in rs_order if self._is_active[d]]
        dims, loads, ratios = self.topology.dims, self.loads, self._ratios
        for d in active:
            p_d = dims[d].npus
            if dims[d].algorithm == "ina":  # the last one is one AR pass: half of RS + AG
                fused = 0.5 if d == active[-1] else 1.0
                loads[d] += fused * m / MIB * self._rs_share(d) / ratios[d]
            else:
                loads[d] += m / MIB * (p_d - 1) / p_d / ratios[d] * self._scale(d, RS, m)
            m //= p_d
        return rs_order


class Baseline(InterPolicy):
    """Hierarchical: reduce-scatter up the dims, all-reduce on the last, all-gather back."""

    name = "baseline"
    description = "ASTRA-sim baseline: dims ascending, the last dim of an all-reduce as one AR stage"
    fuses_last_dim = True
    default_intra = "fifo"

    def order(self, chunk: Chunk) -> Sequence[int]:
        """Ascending dims (descending for a standalone all-gather)."""
        return baseline_order(chunk.op, len(self._dims))

    def begin(self, context: PolicyContext, collective: Collective) -> None:
        """Remember the dims."""
        self._dims = context.topology.dims


class AllReducePerDim(InterPolicy):
    """ASTRA-sim 2.x's ``baseline`` optimization: a full all-reduce on each dim in turn."""

    name = "astra2-baseline"
    description = "ASTRA-sim 2.x baseline: a full all-reduce of the chunk on every dim, ascending"
    fuses_last_dim = AR_EVERY_DIM
    default_intra = "fifo"
    compat_only = ASTRA_SIM_2

    def order(self, chunk: Chunk) -> Sequence[int]:
        """Ascending dims (descending for a standalone all-gather)."""
        return baseline_order(chunk.op, self.n_dims)

    def begin(self, context: PolicyContext, collective: Collective) -> None:
        """Remember the dim count."""
        self.n_dims = len(context.topology.dims)


class Themis(InterPolicy):
    """Themis (ISCA 2022): the RS starts on the least-loaded dim; loads in bytes (docs/design.md#themis)."""

    name = "themis"
    description = "Themis: greedy on per-dim byte loads, largest stage on the least-loaded dim"

    def begin(self, context: PolicyContext, collective: Collective) -> None:
        """Fresh loads; the nominal chunk size sets the balance threshold."""
        self.tracker = ThemisTracker(context.topology, tuple(collective.dims), context)
        self.nominal_bytes = collective.size_bytes // collective.n_chunks
        self.n_dims = len(context.topology.dims)

    def order(self, chunk: Chunk) -> Sequence[int]:
        """Rules 1 to 5 of docs/design.md#themis."""
        if chunk.op == "all_to_all":
            return baseline_order(chunk.op, self.n_dims)
        return self.tracker.next_order(chunk.op, self.nominal_bytes)


class ThemisFlex(Themis):
    """ASTRA-sim's OfflineGreedyFlex: Themis's orders, each chunk sized to close the load gap."""

    name = "themisFlex"
    description = "Themis with variable chunks: each chunk fills the gap to the most loaded dim"
    sizes_chunks = True

    def size(self, chunk: Chunk) -> int:
        """The gap to the most loaded dim in priced words, or the nominal size when that is smaller.

        Sizes are words (`InterPolicy.sizes_chunks`), so they do not depend on the dtype. A chunk
        below the nominal size keeps the baseline order (ASTRA-sim's fallback).
        """
        self._rs_order: list[int] | None = None
        if chunk.op == "all_to_all":
            return chunk.elems
        first = self.tracker.sort()
        if first is None:
            return chunk.elems
        gap_words = int(self.tracker.gap_bytes(first, chunk.op)) // PRICED_ITEMSIZE
        if gap_words < chunk.elems:
            self._rs_order = self.tracker.fall_back()
            return chunk.elems
        self._rs_order = list(self.tracker._sorted)
        return min(gap_words, chunk.remaining)

    def order(self, chunk: Chunk) -> Sequence[int]:
        """The order chosen with the size; the chunk's load is added at its real size."""
        if self._rs_order is None:
            return baseline_order(chunk.op, self.n_dims)
        return self.tracker.add(chunk.op, self._rs_order, chunk.bytes)


class RoundRobin(InterPolicy):
    """ASTRA-sim's RoundRobin: the ascending order rotated by one dim per chunk."""

    name = "roundRobin"
    description = "ASTRA-sim roundRobin: ascending order rotated per chunk, counter kept across collectives"
    fuses_last_dim = True
    default_intra = "fifo"

    def __init__(self) -> None:
        self.counter = 0

    def begin(self, context: PolicyContext, collective: Collective) -> None:
        """Only the dims; the counter carries on."""
        self.n_dims = len(context.topology.dims)

    def order(self, chunk: Chunk) -> Sequence[int]:
        """Rotate the baseline order left by the counter, then advance it."""
        base = baseline_order(chunk.op, self.n_dims)
        k, self.counter = self.counter, (self.counter + 1) % self.n_dims
        return base[k:] + base[:k]


class ThemisLat(InterPolicy):
    """Themis's greedy rule with loads in ns from the cost model, over every order of the active dims.

    For each chunk, every order of the active dims (the baseline first, then all permutations up
    to 4 active dims) is priced with the cost model's stage times, latency and per-step overheads
    included. The chunk takes the order that leaves the per-dim loads (in ns) smallest when
    sorted from the most loaded down (the most loaded dim's time lowest, then the next one's,
    ...); ties go to the order whose own stages take the least time (the chunk's critical path),
    then to the baseline order. A small chunk thus stops landing on a high-latency dim whenever
    its latency would make that dim the bottleneck.
    """

    name = "themis-lat"
    description = "ours: Themis's greedy rule with per-dim loads in time (latency and overheads included)"

    def begin(self, context: PolicyContext, collective: Collective) -> None:
        """Fresh time loads and the candidate orders of this collective's active dims."""
        topo = context.topology
        self.context, self.collective = context, collective
        self.n_dims = len(topo.dims)
        self.loads_ns = [0.0] * self.n_dims
        active = [d for d in range(self.n_dims) if _involved_active(topo, collective.dims, d)]
        rest = [d for d in range(self.n_dims) if d not in active]
        if len(active) <= 4:
            perms = [list(p) for p in itertools.permutations(active)]
        else:
            perms = [active]
        base = baseline_order(collective.op, self.n_dims)
        self.candidates = [base] + [p + rest for p in perms if p + rest != base]
        self._added: dict[tuple[int, int], list[float]] = {}

    def _added_ns(self, chunk_bytes: int, c: int) -> list[float]:
        key = (chunk_bytes // PRICED_ITEMSIZE, c)
        if key not in self._added:
            added = [0.0] * self.n_dims
            for s in chunk_stages(self.context.topology, self.collective, 0, 0, key[0], self.candidates[c]):
                added[s.dim] += self.context.stage_ns(s.dim, s.op, s.full_elems)
            self._added[key] = added
        return self._added[key]

    def order(self, chunk: Chunk) -> Sequence[int]:
        """The candidate with the smallest loads sorted from the most loaded, then the lowest own time."""
        if chunk.op == "all_to_all":
            return self.candidates[0]
        best, best_key = 0, None
        for c in range(len(self.candidates)):
            added = self._added_ns(chunk.bytes, c)
            key = (sorted((a + b for a, b in zip(self.loads_ns, added)), reverse=True), sum(added))
            if best_key is None or key < best_key:
                best, best_key = c, key
        for d, a in enumerate(self._added_ns(chunk.bytes, best)):
            self.loads_ns[d] += a
        return self.candidates[best]
