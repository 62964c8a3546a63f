"""Training iterations of a workload as one engine process: compute as delays, collectives overlapping.

Per iteration, as in ASTRA-sim 1.0's layer loop:

- Forward, layer by layer: a layer starts once the previous layer is done and its own weights are
  updated (its previous weight-gradient collective finished, plus the update time). Compute, then
  the forward collective, which the next layer waits for. (DLRM: the embedding layer's all-to-all
  overlaps the bottom MLP and is waited for after the last bottom layer.)
- Backward, last layer first: weight-gradient compute, then its collective is issued and runs in
  the background; then input-gradient compute and its collective, which the next (earlier) layer
  waits for. Layer 0 has no input gradient. With activation checkpointing, a layer that initiates
  a recompute first runs the forward again from the nearest checkpoint at or before it.
- The next iteration's forward starts right after the backward of layer 0.

Several collectives are in flight at once and share the dims' queues. Every collective's chunk
orders are chosen up front by the coordinator (the Themis loads reset per collective, so this is
what choosing them at issue gives) and broadcast once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .collectives import DTYPES, Collective
from .engine import CollectiveRun, Engine, Event, ProcessGenerator
from .errors import UsageError
from .topology import Topology
from .workload import PHASES, Layer, Workload


@dataclass(frozen=True)
class TrainingSpec:
    """How a workload is run: chunks and dtype of its collectives, iterations, what-if scales.

    Attributes:
        chunks: chunks per collective.
        dtype: element type of the collectives (sizes in the file are bytes).
        iterations: training iterations.
        compute_scale: factor on every compute and update time (accelerator speed).
        comm_scale: factor on every collective's size (ASTRA-sim's comm-scale).
    """

    chunks: int = 64
    dtype: str = "float32"
    iterations: int = 2
    compute_scale: float = 1.0
    comm_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.chunks < 1:
            raise UsageError(f"chunks must be >= 1, got {self.chunks}")
        if self.dtype not in DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}; use one of {', '.join(DTYPES)}")
        if self.iterations < 1:
            raise UsageError(f"iterations must be >= 1, got {self.iterations}")
        if not (math.isfinite(self.compute_scale) and self.compute_scale >= 0):
            raise UsageError(f"compute scale must be a finite number >= 0, got {self.compute_scale}")
        if not (math.isfinite(self.comm_scale) and self.comm_scale > 0):
            raise UsageError(f"comm scale must be a finite number > 0, got {self.comm_scale}")


def collective_of(
    workload: Workload, layer: Layer, phase: str, topology: Topology, spec: TrainingSpec
) -> Collective | None:
    """The Collective a layer's phase issues, or None (no collective, no size, or no dims)."""
    p = layer.phase(phase)
    dims = tuple(d for d in workload.dims(layer, phase, topology) if topology.dims[d].npus > 1)
    if p.op is None or p.size_bytes <= 0 or not dims:
        return None
    itemsize = np.dtype(spec.dtype).itemsize
    count = max(1, int(p.size_bytes * spec.comm_scale) // itemsize)
    return Collective(p.op, count, spec.dtype, spec.chunks, dims)


def distinct_collectives(workload: Workload, topology: Topology, spec: TrainingSpec) -> list[Collective]:
    """Every distinct collective the workload issues, in file order.

    Every rank computes this before the first collective, so a workload that does not fit the
    topology is refused on every rank at once.
    """
    out: dict[Collective, None] = {}
    for layer in workload.layers:
        for phase in PHASES:
            coll = collective_of(workload, layer, phase, topology, spec)
            if coll is not None:
                out.setdefault(coll)
    return list(out)


class TrainingLoop:
    """The layer loop of one NPU, as an engine process (`process`).

    Args:
        workload: the parsed workload.
        topology: the network.
        spec: chunks, dtype, iterations and scales.
        orders: chunk orders of every distinct collective (see `distinct_collectives`).
    """

    def __init__(
        self, workload: Workload, topology: Topology, spec: TrainingSpec, orders: dict[Collective, np.ndarray]
    ):
        self.wl, self.topology, self.spec, self.orders = workload, topology, spec, orders
        self.iteration_starts: list[float] = []
        self.compute_ns = 0.0
        self.collectives_issued = 0
        self.updates: list[Event | None] = [None] * len(workload.layers)  # value: weights-ready time

    def _compute(self, engine: Engine, compute_ns: float) -> Event:
        delay_ns = compute_ns * self.spec.compute_scale
        self.compute_ns += delay_ns
        return engine.timeout(delay_ns)

    def _issue(self, engine: Engine, layer: Layer, phase: str) -> CollectiveRun | None:
        coll = collective_of(self.wl, layer, phase, self.topology, self.spec)
        if coll is None:
            return None
        self.collectives_issued += 1
        return engine.issue(coll, self.orders[coll])

    def _update(self, engine: Engine, layer: Layer, run: CollectiveRun | None) -> ProcessGenerator:
        """Wait for a weight-gradient collective; the weights are ready after the update time."""
        if run is not None:
            yield run
        return engine.now_ns + layer.update_ns * self.spec.compute_scale

    def process(self, engine: Engine) -> ProcessGenerator:
        """Every iteration, forward then backward."""
        layers = self.wl.layers
        for _ in range(self.spec.iterations):
            self.iteration_starts.append(engine.now_ns)
            yield from self._forward(engine, 0, len(layers) - 1, recompute=False)
            for i in reversed(range(len(layers))):
                if i in self.wl.checkpoint_initiates:
                    start = max([c for c in self.wl.checkpoints if c <= i], default=0)
                    yield from self._forward(engine, start, i, recompute=True)
                layer = layers[i]
                yield self._compute(engine, layer.wg.compute_ns)
                self.updates[i] = engine.process(
                    self._update(engine, layer, self._issue(engine, layer, "wg"))
                )
                if i == 0:
                    break
                yield self._compute(engine, layer.ig.compute_ns)
                ig = self._issue(engine, layer, "ig")
                if ig is not None:
                    yield ig

    def _forward(self, engine: Engine, first: int, last: int, recompute: bool) -> ProcessGenerator:
        """Layers first..last; a recompute neither waits for weights nor overlaps DLRM's all-to-all."""
        dlrm = None if recompute else self.wl.dlrm_last_bottom_layer
        embedding = None
        for i in range(first, last + 1):
            layer = self.wl.layers[i]
            update = self.updates[i]
            if not recompute and update is not None:
                yield update
                if update.value > engine.now_ns:
                    yield engine.at(update.value)
            yield self._compute(engine, layer.fwd.compute_ns)
            run = self._issue(engine, layer, "fwd")
            if dlrm is not None and i == 0:
                embedding = run  # the embedding all-to-all overlaps the bottom MLP
            elif run is not None:
                yield run
            if dlrm is not None and i == dlrm and embedding is not None:
                yield embedding
