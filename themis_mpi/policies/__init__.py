"""Scheduling policies as a platform: the interface, the built-in policies and the registry.

- `base`: `InterPolicy` and `IntraPolicy` (what a policy gets and returns), `Schedule`.
- `inter`: ASTRA-sim 1.0's inter-dim policies (baseline, themis, themisFlex, roundRobin) and
  themis-lat.
- `ports`: themis-ports, Themis's greedy rule with loads per physical resource (shared ports).
- `intra`: ASTRA-sim 1.0's intra-dim policies (fifo, scf, rg, lrpf).
- `predictive`: the model-predictive policy and the best-found search.
- `scheduler`: the communication scheduler between collectives (fifo, lifo, p3, bytescheduler,
  tictac).
- `registry`: names to classes, plugins through the ``themis_mpi.policies`` and
  ``themis_mpi.schedulers`` entry-point groups.
"""

from __future__ import annotations

import numpy as np

from ..collectives import DEFAULT_DTYPE, Collective
from ..config import RunConfig
from ..cost import CostModels
from ..topology import Topology
from .base import (
    Chunk,
    InterPolicy,
    IntraPolicy,
    PolicyContext,
    PolicyError,
    QueueView,
    Schedule,
    baseline_order,
    fixed_schedule,
)
from .inter import ThemisTracker
from .registry import (
    ENTRY_POINT_GROUP,
    SCHEDULER_GROUP,
    broken_plugins,
    default_partition_mib,
    inter_class,
    inter_names,
    intra_class,
    intra_names,
    is_inter,
    is_intra,
    make_inter,
    make_intra,
    make_scheduler,
    origin,
    scheduler_class,
    scheduler_names,
    scheduler_origin,
)
from .scheduler import BLOCKING, UNKNOWN, CommScheduler, Need, default_scheduler

__all__ = [
    "BLOCKING",
    "ENTRY_POINT_GROUP",
    "SCHEDULER_GROUP",
    "UNKNOWN",
    "CommScheduler",
    "broken_plugins",
    "Chunk",
    "InterPolicy",
    "IntraPolicy",
    "PolicyContext",
    "PolicyError",
    "QueueView",
    "Schedule",
    "ThemisTracker",
    "baseline_order",
    "chunk_orders",
    "default_scheduler",
    "fixed_schedule",
    "inter_class",
    "inter_names",
    "intra_class",
    "intra_names",
    "is_inter",
    "is_intra",
    "make_inter",
    "make_intra",
    "make_scheduler",
    "Need",
    "origin",
    "policy_context",
    "default_partition_mib",
    "scheduler_class",
    "scheduler_names",
    "scheduler_origin",
]


def policy_context(topology: Topology, config: RunConfig | None = None) -> PolicyContext:
    """A context for calling a policy outside a run (the default settings, no oracle)."""
    config = config or RunConfig()
    return PolicyContext(topology, config, CostModels(topology, config.endpoint_delay_ns, config.compat))


def chunk_orders(
    policy: str, topology: Topology, op: str, size_bytes: int, chunks: int, involved
) -> np.ndarray:
    """Every chunk's dim order under a fixed-chunk policy, int32 of shape (chunks, n_dims).

    A collective of ``size_bytes`` (at least one element per chunk) on the involved dims.
    """
    coll = Collective.of_bytes(op, size_bytes, DEFAULT_DTYPE, chunks, tuple(sorted(involved)))
    return make_inter(policy).schedule(policy_context(topology), coll).orders
