"""The Python API for notebooks and scripts: sweeps on the model, results as objects or a DataFrame.

    import themis_mpi
    results = themis_mpi.sweep("3D-SW_SW_SW_hetero", size=["1M", "64M"], policy=["baseline", "themis"])
    frame = themis_mpi.to_dataframe(results)     # needs pandas (not a dependency)

Every call runs the same driver, engine and cost model as `themis-mpi model`; no MPI is involved.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .config import RunConfig
from .cost import default_endpoint_delay_ns
from .errors import UsageError
from .results import CollectiveResult, TrainingResult, flat_row
from .run.pool import parse_workers, run_cells
from .run.sweep import policy_configs, sweep_cells
from .run.training import model_training
from .topology import parse_topology
from .units import parse_size
from .workloads.text import parse_workload
from .workloads.training import TrainingSpec


def _items(value: Any) -> list:
    """A scalar as a one-item list; a list or tuple as itself."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _size_bytes(size: int | str) -> int:
    return parse_size(size) if isinstance(size, str) else int(size)


def sweep(
    topology: str | Sequence[str] = "2x2x2",
    size: int | str | Sequence[int | str] = "64M",
    policy: str | Sequence[str] = ("baseline", "themis"),
    chunks: int | Sequence[int] = 64,
    *,
    op: str = "all_reduce",
    dtype: str = "float64",
    intra: str | Sequence[str] = "auto",
    active_per_dim: int = 1,
    endpoint_delay_ns: float | None = None,
    compat: str = "",
    workers: int | str = 1,
) -> list[CollectiveResult]:
    """Model a collective over every combination of the given values; one result per combination.

    The same cells, defaults and rows as ``themis-mpi model`` (`run.sweep_cells`).

    Args:
        topology: preset names, inline specs or ASTRA-sim YAML paths (see `themis-mpi topologies`).
        size: bytes per NPU, as numbers or with K/M/G suffixes ("64M").
        policy: inter-dim policies ("all" names every one, "both" baseline and Themis).
        chunks: chunk counts.
        op: all_reduce, reduce_scatter, all_gather or all_to_all.
        dtype: element type.
        intra: intra-dim policies (auto: each inter-dim policy's own, e.g. fifo for the baseline).
        active_per_dim: stages each dim runs at once.
        endpoint_delay_ns: delay added to every algorithm step (default 0, or ASTRA-sim's 10 ns
            with compat "astra-sim-1.0").
        compat: "" or "astra-sim-1.0".
        workers: local processes to run the cells on (1: this process), or "mpi" (an mpi4py.futures
            pool, under ``mpiexec -n K python -m mpi4py.futures SCRIPT``); the same results.

    Returns:
        `CollectiveResult` objects (``to_dict()`` for plain values), in loop order topology, size,
        chunks, policy, intra.
    """
    delay_ns = default_endpoint_delay_ns(compat) if endpoint_delay_ns is None else endpoint_delay_ns
    base = RunConfig(active_per_dim=active_per_dim, endpoint_delay_ns=delay_ns, compat=compat)
    cells = sweep_cells(
        [parse_topology(t) for t in _items(topology)],
        [_size_bytes(s) for s in _items(size)],
        [int(c) for c in _items(chunks)],
        policy,
        _items(intra),
        base,
        op=op,
        dtype=dtype,
    )
    return [result for _, result in run_cells(cells, range(len(cells)), parse_workers(workers))]


def train(
    workload: str,
    topology: str = "2x2x2",
    policy: str | Sequence[str] = ("baseline", "themis"),
    chunks: int = 64,
    iterations: int = 2,
    *,
    intra: str = "auto",
    dtype: str = "float32",
    compute_scale: float = 1.0,
    comm_scale: float = 1.0,
    compat: str = "",
) -> list[TrainingResult]:
    """Training iterations of an ASTRA-sim 1.0 text workload on the model, one result per policy.

    Each policy runs with its own intra-dim policy under ``intra="auto"``, as ``themis-mpi train``.
    """
    wl = parse_workload(workload)
    topo = parse_topology(topology)
    spec = TrainingSpec(chunks, dtype, iterations, compute_scale, comm_scale)
    base = RunConfig(endpoint_delay_ns=default_endpoint_delay_ns(compat), compat=compat)
    return [model_training(wl, topo, p, spec, config) for p, config in policy_configs(policy, [intra], base)]


def to_dataframe(results: Iterable[CollectiveResult | TrainingResult]) -> Any:
    """Results as a pandas DataFrame, one row each, per-dim figures as dim<d>_<field> columns.

    Raises:
        UsageError: pandas is not installed (it is optional: ``pip install pandas``).
    """
    try:
        import pandas as pd  # type: ignore[import-untyped]
    except ImportError:
        raise UsageError("to_dataframe needs pandas: pip install pandas") from None
    return pd.DataFrame([flat_row(r.to_dict()) for r in results])
