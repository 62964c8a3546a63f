"""One dim's latency and bandwidth fitted to a log (``calibrate --algorithm ring`` and the like).

`fit` finds the latency and bandwidth of a dim of the log's NPU count for which this package's
own model gives the measured times: the model's time is linear in both (``T(S) = latency * A(S)
+ B(S) / bandwidth`` for one dim, A and B read off the model itself), so a least-squares fit of
time against size gives them. The residuals are absolute times, so the large sizes, whose times
are long, set the bandwidth and the smaller ones the latency; sizes below ``min_size`` are
reported but not fitted (nccl-tests' small sizes run NCCL's low-latency protocols, which no
single latency describes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..collectives import Collective
from ..errors import UsageError
from ..results import busbw_factor
from ..run.collective import model_collective
from ..topology import Dim, Topology
from .logs import NCCL_TYPES, NcclLog

MAX_ENGINE_FIT_NPUS = 4096
MAX_ENGINE_FIT_CHUNKS = 4096  # 2 engine runs per size: 4096 chunks take ~10 s, 65536 minutes


@dataclass
class Fit:
    """The fitted dim and how well the model then reproduces every size of the log."""

    topology: str
    chunks: int
    op: str
    dtype: str
    npus: int
    latency_ns: float
    bandwidth_gbps: float
    min_size: int
    rows: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Plain values for JSON."""
        return asdict(self)


def _model_time_us(topology: Topology, op: str, size_bytes: int, dtype: str, chunks: int) -> float:
    coll = Collective.of_bytes(op, size_bytes, dtype, chunks, (0,))
    result, _ = model_collective(topology, coll, "baseline")
    return result.time_us


def fit(
    log: NcclLog, kind: str = "Switch", algorithm: str = "ring", chunks: int = 1, min_size: int = 2**20
) -> Fit:
    """Least-squares latency and bandwidth of one dim of ``log.npus`` NPUs (module doc).

    The model's time is ``latency * A(S) + B(S) / bandwidth``; A and B are read off the model
    (at 1 ns and 0 ns latency, a reference bandwidth), then ``min sum (T_model - T_measured)^2``
    over the sizes from `min_size` gives latency >= 0 and bandwidth > 0. Both are rounded to 5
    significant digits, so the printed topology string reproduces the table exactly.
    """
    if log.npus > MAX_ENGINE_FIT_NPUS:
        raise UsageError(
            f"the per-dim fit runs the engine per size: at most {MAX_ENGINE_FIT_NPUS} NPUs, got {log.npus} "
            "(the default --algorithm nccl has no such limit)"
        )
    if chunks > MAX_ENGINE_FIT_CHUNKS:
        raise UsageError(
            f"the per-dim fit runs the engine twice per size: at most {MAX_ENGINE_FIT_CHUNKS} chunks, "
            f"got {chunks}; fit with fewer (the fitted dim then runs any -c under model)"
        )
    type_name = log.rows[0].type
    dtype = NCCL_TYPES[type_name][1]
    fitted = [r for r in log.rows if r.size_bytes >= min_size]
    if len(fitted) < 2:
        raise UsageError(
            f"{log.path}: fewer than 2 sizes >= {min_size} B to fit; lower --min-size (the log has "
            f"{log.rows[0].size_bytes} to {log.rows[-1].size_bytes} B)"
        )
    ref_gbps = 100.0
    a, b, t = [], [], []
    for r in fitted:
        with_lat = Topology((Dim(kind, log.npus, ref_gbps, 1.0, algorithm),))
        no_lat = Topology((Dim(kind, log.npus, ref_gbps, 0.0, algorithm),))
        t0 = _model_time_us(no_lat, log.op, r.size_bytes, dtype, chunks)
        a.append(_model_time_us(with_lat, log.op, r.size_bytes, dtype, chunks) - t0)  # us per ns of latency
        b.append(t0 * ref_gbps)  # us * GB/s: time at 1 GB/s
        t.append(r.time_us)
    design, times = np.array([a, b]).T, np.array(t)
    (latency, inv_bw), *_ = np.linalg.lstsq(design, times, rcond=None)
    if latency < 0:  # no positive latency fits: bandwidth alone
        latency = 0.0
        inv_bw = float(np.dot(design[:, 1], times) / np.dot(design[:, 1], design[:, 1]))
    if not inv_bw > 0:
        raise UsageError(f"{log.path}: the times do not grow with the size; nothing to fit")
    latency_ns = float(f"{latency:.5g}")
    bandwidth_gbps = float(f"{1.0 / inv_bw:.5g}")
    topo = Topology((Dim(kind, log.npus, bandwidth_gbps, latency_ns, algorithm),))
    factor = busbw_factor(log.op, log.npus)
    rows = []
    for r in log.rows:
        model_us = _model_time_us(topo, log.op, r.size_bytes, dtype, chunks)
        model_busbw = factor * r.size_bytes / model_us / 1e3
        measured_busbw = factor * r.size_bytes / r.time_us / 1e3
        rows.append(
            {
                "size_bytes": r.size_bytes,
                "count": r.count,
                "fitted": r.size_bytes >= min_size,
                "measured_us": r.time_us,
                "model_us": model_us,
                "time_error_pct": 100 * (model_us - r.time_us) / r.time_us,
                "measured_busbw": r.busbw,
                "measured_busbw_exact": measured_busbw,
                "model_busbw": model_busbw,
                "busbw_error_pct": 100 * (model_busbw - measured_busbw) / measured_busbw,
            }
        )
    return Fit(topo.spec(), chunks, log.op, dtype, log.npus, latency_ns, bandwidth_gbps, min_size, rows)
