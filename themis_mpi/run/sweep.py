"""What a sweep runs, resolved once: the same cells for `themis-mpi run`/`model` and `api.sweep`.

A sweep is topologies x sizes x chunk counts x inter-dim policies x intra-dim policies, in that
order. Intra ``auto`` is each inter-dim policy's own `InterPolicy.default_intra` (a plugin's
included), and equal pairs are run once. Each policy is one instance for the whole sweep, so
state it keeps between collectives (roundRobin's counter) carries on, as on a real system.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..collectives import DEFAULT_DTYPE, Collective
from ..config import RunConfig
from ..errors import UsageError
from ..output import CELL, FINGERPRINT
from ..policies import InterPolicy, default_partition_mib, inter_class, inter_names, intra_class, make_inter
from ..results import physics_violation
from ..topology import Topology
from ..verify import check_range

if TYPE_CHECKING:  # (`run`'s ranks load no training code)
    from ..workloads.training import TrainingSpec

BOTH = ("baseline", "themis")  # what `-p both` (the default) names
_NUMBER = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|[-+]?(nan|inf|infinity)", re.I)


@dataclass(frozen=True)
class SweepCell:
    """One run of a sweep: a collective on a topology under a policy and its settings."""

    topology: Topology
    collective: Collective
    policy: InterPolicy
    config: RunConfig


def policy_names(policies: str | Sequence[str], compat: str = "") -> list[str]:
    """The inter-dim policies named: ``all`` (every one), ``both`` (baseline, themis) or a list.

    A string is a comma-separated list; every name is checked against the registry. ``all`` leaves
    out a compat's own policies (`InterPolicy.compat_only`) unless that compat is on.
    """
    if isinstance(policies, str):
        if policies == "all":
            return [n for n in inter_names() if inter_class(n).compat_only in ("", compat)]
        names = list(BOTH) if policies == "both" else [p.strip() for p in policies.split(",")]
    else:
        names = list(policies)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise UsageError(f"policies must be names (see `themis-mpi policies`), got {policies!r}")
    for name in names:
        inter_class(name)
    return names


class PolicyConfig(NamedTuple):
    """One policy instance and the settings it runs under (its intra-dim policy among them)."""

    policy: InterPolicy
    config: RunConfig


def policy_configs(
    policies: str | Sequence[str], intras: Sequence[str], base: RunConfig
) -> list[PolicyConfig]:
    """(policy instance, settings) for every inter x intra pair; ``auto`` is the policy's own."""
    for name in intras:
        if name != "auto":
            intra_class(name)
    out = []
    for name in policy_names(policies, base.compat):
        policy = make_inter(name)
        for intra in dict.fromkeys(policy.default_intra if i == "auto" else i for i in intras):
            out.append(PolicyConfig(policy, replace(base, intra=intra)))
    return out


def collectives(
    topology: Topology,
    sizes_bytes: Sequence[int],
    chunks: Sequence[int],
    *,
    op: str,
    dtype: str,
    dims: Sequence[int] | None = None,
    redop: str = "sum",
) -> list[Collective]:
    """The collectives of a sweep on one topology, size by size, then chunk count by chunk count."""
    n_dims = len(topology.dims)
    involved = tuple(range(n_dims)) if dims is None else tuple(dims)
    if (
        not involved
        or any(d is None or not 0 <= d < n_dims for d in involved)
        or len(set(involved)) != len(involved)
    ):
        raise UsageError(f"--dims must list distinct dims between 0 and {n_dims - 1}")
    itemsize = np.dtype(dtype).itemsize  # chunks are checked by Collective
    check_range(dtype, topology.group_npus(involved))
    out = []
    for size in sizes_bytes:
        if size < itemsize:
            raise UsageError(f"size {size} B is smaller than one {dtype} element")
        for n_chunks in chunks:
            out.append(Collective.of_bytes(op, size, dtype, n_chunks, tuple(sorted(involved)), redop))
    return out


def sweep_cells(
    topologies: Sequence[Topology],
    sizes_bytes: Sequence[int],
    chunks: Sequence[int],
    policies: str | Sequence[str],
    intras: Sequence[str],
    base: RunConfig,
    *,
    op: str = "all_reduce",
    dtype: str = DEFAULT_DTYPE,
    dims: Sequence[int] | None = None,
    redop: str = "sum",
) -> list[SweepCell]:
    """Every cell of a sweep, in its order (topology, size, chunks, policy, intra).

    Everything is checked before the first cell runs: names, dims, sizes and settings (each
    topology's, `RunConfig.on`).
    """
    configs = policy_configs(policies, intras, base)
    on = {topo: [(policy, config.on(topo)) for policy, config in configs] for topo in topologies}
    return [
        SweepCell(topo, coll, policy, config)
        for topo in topologies
        for coll in collectives(topo, sizes_bytes, chunks, op=op, dtype=dtype, dims=dims, redop=redop)
        for policy, config in on[topo]
    ]


@dataclass(frozen=True)
class TrainingCell:
    """One run of a training sweep: a workload's iterations on a topology under a policy.

    `given` is the topology as named; `topology` is it fitted to the workload (a model-parallel
    group may split a dim).
    """

    given: Topology
    topology: Topology
    spec: TrainingSpec
    policy: InterPolicy
    config: RunConfig


def training_cells(
    topologies: Sequence[tuple[Topology, Topology]],
    chunks: Sequence[int],
    policies: str | Sequence[str],
    intras: Sequence[str],
    bases: Sequence[RunConfig],
    spec: TrainingSpec,
    partition_mib: float | None = None,
) -> list[TrainingCell]:
    """Every cell of a training sweep, in `sweep_cells`' order, then the settings' (rule, scheduler).

    `topologies` are (given, fitted) pairs; `bases` the shared settings of each rule and
    scheduler asked (their intra-dim policy aside); `partition_mib` None is each scheduler's
    default. Each policy is one instance for the whole sweep, as in `sweep_cells`.
    """
    configs = policy_configs(policies, intras, bases[0])
    out = []
    for given, topo in topologies:
        for n_chunks in chunks:
            for policy, config in configs:
                for base in bases:
                    parts = default_partition_mib(base.comm_scheduler, partition_mib)
                    run_spec = replace(spec, chunks=n_chunks, partition_mib=parts)
                    on = replace(base, intra=config.intra).on(topo)
                    out.append(TrainingCell(given, topo, run_spec, policy, on))
    return out


def baseline_cells(cells: Sequence[TrainingCell]) -> list[int | None]:
    """Each cell's speedup reference: the first baseline cell of its topology, chunks, rule and scheduler."""
    first: dict[tuple, int] = {}
    keys = []
    for i, cell in enumerate(cells):
        key = (id(cell.given), cell.spec.chunks, cell.config.network, cell.config.comm_scheduler)
        keys.append(key)
        if cell.policy.name == "baseline":
            first.setdefault(key, i)
    return [first.get(key) for key in keys]


def check_row(row: dict) -> str | None:
    """Why a sweep's row may not be written or kept, or None: a time, finite numbers >= 0, physics.

    `row` is flat, as CSV holds it (`results.flat_row`; CSV's numbers are text, read as numbers
    here). This is the one check of a row's values: `--resume` drops a row read back that fails
    it (`output.SweepFiles`), so that a kept row is checked as a fresh one is. The cell and the
    sweep's fingerprint are checked by the files themselves.
    """
    numbers = {}
    for key, value in row.items():
        if key in (CELL, FINGERPRINT) or isinstance(value, bool):
            continue
        if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            value = float(value)
        if isinstance(value, (int, float)):
            numbers[key] = value
            if not (math.isfinite(value) and value >= 0):
                return "a negative or non-finite number"
    if "time_us" not in numbers and "iteration_us" not in numbers:
        return "no time_us"
    beyond = row.get("beyond_physics", False)
    return physics_violation({**row, **numbers, "beyond_physics": beyond in (True, "True", "true", 1)})
