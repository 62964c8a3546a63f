"""A per-dim view of a fitted machine: one dim per level, so that policies can order a chunk's stages.

A fitted topology (``nccl`` dims) times a collective as NCCL's one flat algorithm, whatever the
policy: Themis and the baseline take the same time there. The per-dim view gives each level its
own dim with a per-dim algorithm (ring on an NVSwitch or NIC Switch dim, direct on a full mesh),
the bandwidth the fit gives that level (the Simple share of dim 0's nominal rate, the NICs' share
of theirs: their ratio is the machine's) and the fit's per-step latency (Simple's, per hop). A
per-dim schedule does not overlap the levels the way NCCL's flat ring does (a one-chunk baseline
runs its dim-0 stages, then dim 1's, then dim 0's again), and it pays no per-call base latency, so
the view scales every bandwidth by one factor until the baseline's one-chunk all-reduce of the
size asked takes the flat model's time there: the same machine at one chunk, whose schedules
``-p baseline,themis`` can then compare at more chunks (each chunk paying its steps' latencies).
"""

from __future__ import annotations

from dataclasses import replace

from ..collectives import DEFAULT_DTYPE, Collective
from ..config import RunConfig
from ..nccl import STEP_FACTORS, collective_ns
from ..run.collective import model_collective
from ..topology import Dim, Topology

SCALE_RANGE = (1e-3, 1e3)
SCALE_STEPS = 60  # bisection steps: the view's one-chunk time matches to ~1e-12 of the range

IDEAL = RunConfig(network="ideal")  # one chunk, one stage per dim at a time: the cost model alone


def raw_view(fitted: Topology) -> Topology:
    """Each level of a fitted nccl topology as a per-dim dim, at the rates and latencies of the fit."""
    params = fitted.nccl
    if params is None:
        raise ValueError("a per-dim view needs a fitted (nccl) topology")
    dims = []
    for j, dim in enumerate(fitted.dims):
        if j == 0:
            share = params.efficiency[2]
            step = dim.latency_ns * STEP_FACTORS[params.rccl]["Ring"][2]
        else:
            share, step = params.net_efficiency, dim.latency_ns
        algorithm = "direct" if dim.kind == "FullyConnected" else "ring"
        hops = 2 if dim.kind == "Switch" else 1
        dims.append(Dim(dim.kind, dim.npus, dim.bandwidth_gbps * share, step / hops, algorithm))
    return Topology(tuple(dims), "")


def _scaled(view: Topology, bandwidth: float) -> Topology:
    return view.with_dims(replace(d, bandwidth_gbps=d.bandwidth_gbps * bandwidth) for d in view.dims)


def _baseline_us(view: Topology, size_bytes: int) -> float:
    coll = Collective.of_bytes("all_reduce", size_bytes, DEFAULT_DTYPE, 1, tuple(range(len(view.dims))))
    return model_collective(view, coll, "baseline", IDEAL)[0].time_us  # (as the study runs it)


def _bisect(f, target: float) -> float:
    """The x in `SCALE_RANGE` (geometric bisection) where the decreasing f(x) meets `target`."""
    lo, hi = SCALE_RANGE
    for _ in range(SCALE_STEPS):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if f(mid) > target else (lo, mid)
    return (lo * hi) ** 0.5


def per_dim(fitted: Topology, size_bytes: int) -> Topology:
    """The per-dim view of a fitted topology that agrees with it on a one-chunk all-reduce of this size.

    The fit's per-step latencies stay; one factor on every bandwidth makes the view's one-chunk
    baseline take the flat time under ``ideal``, the cost model alone (module doc; the factor
    stays in `SCALE_RANGE`).
    """
    view = raw_view(fitted)
    flat = collective_ns(fitted, range(len(fitted.dims)), "all_reduce", size_bytes)
    bandwidth = _bisect(lambda x: _baseline_us(_scaled(view, x), size_bytes), flat.time_ns / 1e3)
    return _scaled(view, bandwidth)
