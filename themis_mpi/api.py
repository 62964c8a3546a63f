"""The Python API for notebooks and scripts: sweeps on the model, results as objects or a DataFrame.

    import themis_mpi
    results = themis_mpi.sweep("3D-SW_SW_SW_hetero", size=["1M", "64M"], policy=["baseline", "themis"])
    frame = themis_mpi.to_dataframe(results)     # needs pandas (not a dependency)

Every call runs the same driver, engine and cost model as `themis-mpi model`; no MPI is involved.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from .analysis import CollectiveResult, TrainingResult, flat_row
from .collectives import Collective
from .driver import RunConfig
from .errors import UsageError
from .model import model_collective, model_training
from .topology import parse_topology
from .training import TrainingSpec
from .workload import parse_workload


def _items(value: Any) -> list:
    """A scalar as a one-item list; a list or tuple as itself."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _size_bytes(size: int | str) -> int:
    from .cli import parse_size

    return parse_size(size) if isinstance(size, str) else int(size)


def _intra(policy: str, intra: str) -> str:
    return ("fifo" if policy == "baseline" else "scf") if intra == "auto" else intra


def sweep(
    topology: str | Sequence[str] = "2x2x2",
    size: int | str | Sequence[int | str] = "64M",
    policy: str | Sequence[str] = ("baseline", "themis"),
    chunks: int | Sequence[int] = 64,
    *,
    op: str = "all_reduce",
    dtype: str = "float32",
    intra: str | Sequence[str] = "auto",
    active_per_dim: int = 1,
    endpoint_delay_ns: float = 0.0,
    compat: str = "",
) -> list[CollectiveResult]:
    """Model a collective over every combination of the given values; one result per combination.

    Args:
        topology: preset names, inline specs or ASTRA-sim YAML paths (see `themis-mpi topologies`).
        size: bytes per NPU, as numbers or with K/M/G suffixes ("64M").
        policy: inter-dim policies.
        chunks: chunk counts.
        op: all_reduce, reduce_scatter, all_gather or all_to_all.
        dtype: element type.
        intra: intra-dim policies (auto: fifo for the baseline, scf for Themis).
        active_per_dim: stages each dim runs at once.
        endpoint_delay_ns: delay added to every algorithm step.
        compat: "" or "astra-sim-1.0".

    Returns:
        `CollectiveResult` objects (``to_dict()`` for plain values), in loop order topology, size,
        chunks, policy, intra.
    """
    out = []
    for spec, raw_size, n_chunks in itertools.product(_items(topology), _items(size), _items(chunks)):
        topo = parse_topology(spec)
        itemsize = Collective("all_reduce", 1, dtype, 1, (0,)).itemsize
        count = _size_bytes(raw_size) // itemsize
        coll = Collective(op, count, dtype, int(n_chunks), tuple(range(len(topo.dims))))
        pairs = dict.fromkeys((p, _intra(p, i)) for p, i in itertools.product(_items(policy), _items(intra)))
        for name, queue in pairs:
            config = RunConfig(
                intra=queue, active_per_dim=active_per_dim, endpoint_delay_ns=endpoint_delay_ns, compat=compat
            )
            result, _ = model_collective(topo, coll, name, config)
            out.append(result)
    return out


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
    """Training iterations of an ASTRA-sim 1.0 text workload on the model, one result per policy."""
    wl = parse_workload(workload)
    topo = parse_topology(topology)
    spec = TrainingSpec(chunks, dtype, iterations, compute_scale, comm_scale)
    return [
        model_training(wl, topo, name, spec, RunConfig(intra=_intra(name, intra), compat=compat))
        for name in _items(policy)
    ]


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
