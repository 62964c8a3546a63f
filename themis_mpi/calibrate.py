"""Calibration against real hardware: fit one dim's latency and bandwidth to an nccl-tests log.

`read_nccl_log` reads the table that ``all_reduce_perf``, ``all_gather_perf`` and
``reduce_scatter_perf`` print (size, count, type, redop, root, then time, algbw, busbw and #wrong
out of place and in place). `fit` finds the latency and bandwidth of a dim of the log's NPU
count for which this package's own model gives the measured times: the model's time is linear
in both (``T(S) = latency * A(S) + B(S) / bandwidth`` for one dim, A and B read off the model
itself), so a least-squares fit of time against size gives them. The residuals are absolute
times, so the large sizes, whose times are long, set the bandwidth and the smaller ones the
latency; sizes below ``min_size`` are reported but not fitted (nccl-tests' small sizes run
NCCL's low-latency protocols, which no single latency describes).

nccl-tests' GB/s are 1e9 B/s; this package's are 2^30 B/s. Tables printed "in nccl-tests'
format" (`format_nccl`) use nccl-tests' unit, so they compare column by column.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

import numpy as np

from .collectives import Collective
from .errors import UsageError
from .results import busbw_factor
from .run.collective import model_collective
from .topology import Dim, Topology

NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter")
NCCL_TYPES = {  # nccl-tests' type name -> (bytes, dtype the model runs with)
    "float": (4, "float32"),
    "float32": (4, "float32"),
    "double": (8, "float64"),
    "float64": (8, "float64"),
    "int32": (4, "int32"),
    "int": (4, "int32"),
    "int64": (8, "int64"),
    "uint32": (4, "int32"),
    "uint64": (8, "int64"),
    "half": (2, "float32"),
    "float16": (2, "float32"),
    "bfloat16": (2, "float32"),
    "int8": (1, "float32"),
    "uint8": (1, "float32"),
}
NCCL_TYPE_OF_DTYPE = {"float32": "float", "float64": "double", "int32": "int32", "int64": "int64"}
NCCL_REDOPS = ("sum", "prod", "max", "min", "avg", "none", "mulsum")
_OP_IN_HEADER = re.compile(
    r"\b(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv)_perf\b"
)
_RANK_LINE = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid", re.IGNORECASE)
NCCL_GB = 1e9


@dataclass
class NcclRow:
    """One size of an nccl-tests table (times in us, bandwidths in nccl-tests' 1e9 B/s)."""

    size_bytes: int
    count: int
    type: str
    redop: str
    time_us: float
    algbw: float
    busbw: float
    wrong: str
    time_in_place_us: float | None = None


@dataclass
class NcclLog:
    """An nccl-tests table: the collective, the NPU count and the rows."""

    path: str
    op: str
    npus: int
    rows: list[NcclRow]
    op_source: str = "header"


def _float(text: str, what: str, path: str, line_no: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{path}:{line_no}: bad {what} {text!r} in the nccl-tests table") from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{path}:{line_no}: {what} {text!r} must be a finite number >= 0")
    return value


def read_nccl_log(path: str, op: str | None = None, npus: int | None = None) -> NcclLog:
    """Parse an nccl-tests log; one line (UsageError) for anything that is not one.

    The collective comes from `op`, else from the ``*_perf`` name in the log, else from the
    redop column (``none``: all_gather, else all_reduce). The NPU count comes from `npus`,
    else from the ``#  Rank N Group ...`` lines.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(64 * 2**20 + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > 64 * 2**20:
        raise UsageError(f"{path}: larger than 64 MiB, not an nccl-tests log")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file (an nccl-tests log is text)") from None
    ranks: set[int] = set()
    header_ops: set[str] = set()
    rows: list[NcclRow] = []
    for line_no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#"):
            match = _RANK_LINE.match(stripped)
            if match:
                ranks.add(int(match.group(1)))
            header_ops.update(_OP_IN_HEADER.findall(stripped))
            continue
        header_ops.update(_OP_IN_HEADER.findall(stripped))
        fields = stripped.split()
        if not fields or not fields[0].isdigit():
            continue  # NCCL INFO lines, launcher noise
        if len(fields) not in (9, 13) or fields[2] not in NCCL_TYPES or fields[3] not in NCCL_REDOPS:
            raise UsageError(
                f"{path}:{line_no}: not an nccl-tests row (size count type redop root time algbw busbw "
                f"#wrong [time algbw busbw #wrong]): {stripped[:80]!r}"
            )
        size, count = int(fields[0]), _float(fields[1], "count", path, line_no)
        time_us = _float(fields[5], "time", path, line_no)
        if size <= 0 or time_us <= 0:
            raise UsageError(f"{path}:{line_no}: size and time must be positive")
        rows.append(
            NcclRow(
                size,
                int(count),
                fields[2],
                fields[3],
                time_us,
                _float(fields[6], "algbw", path, line_no),
                _float(fields[7], "busbw", path, line_no),
                fields[8],
                _float(fields[9], "time", path, line_no) if len(fields) == 13 else None,
            )
        )
    if not rows:
        raise UsageError(
            f"{path}: no nccl-tests table found (all_reduce_perf/all_gather_perf/reduce_scatter_perf)"
        )
    sizes = [r.size_bytes for r in rows]
    if sizes != sorted(set(sizes)):
        raise UsageError(f"{path}: the table's sizes must grow from row to row (one table per log)")
    source = "given"
    if op is None:
        found = sorted(header_ops)
        if len(found) > 1:
            raise UsageError(f"{path}: the log names several tests ({', '.join(found)}); give --op")
        if found:
            op, source = found[0], "header"
        else:
            op, source = ("all_gather" if rows[0].redop == "none" else "all_reduce"), "redop column"
    if op not in NCCL_OPS:
        raise UsageError(
            f"{path}: {op}_perf is not supported; use all_reduce, all_gather or reduce_scatter logs"
        )
    if npus is None:
        if not ranks:
            raise UsageError(f"{path}: no '#  Rank N Group ...' lines to count the NPUs; give --npus")
        npus = len(ranks)
    if npus < 2:
        raise UsageError(f"{path}: a collective over {npus} NPU measures no network; need 2 or more")
    return NcclLog(path, op, npus, rows, source)


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
    itemsize = np.dtype(dtype).itemsize
    coll = Collective(op, max(1, size_bytes // itemsize), dtype, chunks, (0,))
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


def format_fit(log: NcclLog, result: Fit) -> str:
    """The fitted topology, the command that predicts the table, and the error per size."""
    last = log.rows[-1].size_bytes
    lines = [
        f"# calibrate {log.path}: {log.op} ({'from the ' + log.op_source}), {log.npus} NPUs, "
        f"{len(log.rows)} sizes, type {log.rows[0].type}",
        f"# fitted on the sizes >= {result.min_size} B by least squares on time (absolute residuals: "
        "large sizes set the bandwidth, smaller ones the latency)",
        f"# latency {result.latency_ns:g} ns/hop, bandwidth {result.bandwidth_gbps:g} GB/s (2^30 B/s) = "
        f"{result.bandwidth_gbps * 2**30 / 1e9:.1f} GB/s (1e9 B/s), {result.chunks} chunk(s)",
        f"topology {result.topology}",
        f"# predict: themis-mpi model -t '{result.topology}' -c {result.chunks} -o {log.op} "
        f"-d {result.dtype} -b {log.rows[0].size_bytes} -e {last} -f 2 -p baseline --format nccl",
        "# busbw in nccl-tests' GB/s (1e9 B/s); measured busbw recomputed from the measured time",
        f"#{'size':>11} {'fit':>3} {'meas_us':>9} {'model_us':>9} {'time_err%':>9} "
        f"{'meas_busbw':>10} {'model_busbw':>11} {'busbw_err%':>10}",
    ]
    for r in result.rows:
        lines.append(
            f" {r['size_bytes']:>11} {'*' if r['fitted'] else '':>3} {r['measured_us']:>9.2f} "
            f"{r['model_us']:>9.2f} {r['time_error_pct']:>9.1f} {r['measured_busbw_exact']:>10.2f} "
            f"{r['model_busbw']:>11.2f} {r['busbw_error_pct']:>10.1f}"
        )
    big = [r for r in result.rows if r["size_bytes"] >= 64 * 2**20]
    if big:
        worst = max(abs(r["busbw_error_pct"]) for r in big)
        lines.append(f"# sizes >= 64 MiB: largest busbw error {worst:.1f} %")
    return "\n".join(lines)


def _nccl_time(us: float) -> str:
    """nccl-tests' time column: 2 decimals below 100 us, 1 below 10 ms, none above."""
    if us < 100:
        return f"{us:.2f}"
    if us < 10000:
        return f"{us:.1f}"
    return f"{us:.0f}"


NCCL_HALF_HEADER = f" {'time':>8} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
NCCL_HALF_UNITS = f" {'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"


def format_nccl(rows, npus: int) -> str:
    """Rows of `run`/`model` as nccl-tests prints them (GB/s of 1e9 B), one block per policy.

    The emulator and the model have no in-place variant: the in-place columns repeat the
    out-of-place ones.
    """
    lines = []
    policies = list(dict.fromkeys(r.policy for r in rows))
    for policy in policies:
        lines += [
            f"# policy {policy}; GB/s are nccl-tests' (1e9 B/s); in-place repeats out-of-place",
            f"#{'out-of-place':>74}{'in-place':>31}",
            f"#{'size':>11} {'count':>13} {'type':>9} {'redop':>7} {'root':>7}" + NCCL_HALF_HEADER * 2,
            (f"#{'(B)':>11} {'(elements)':>13} {'':>9} {'':>7} {'':>7}" + NCCL_HALF_UNITS * 2).rstrip(),
        ]
        for r in rows:
            if r.policy != policy:
                continue
            algbw = r.size_bytes / r.time_us / 1e3 if r.time_us > 0 else 0.0
            busbw = algbw * busbw_factor(r.op, npus)
            redop = r.redop if r.op in ("all_reduce", "reduce_scatter") else "none"
            wrong = "N/A" if r.wrong is None else str(r.wrong)
            half = f"{_nccl_time(r.time_us):>8} {algbw:>7.2f} {busbw:>7.2f} {wrong:>6}"
            lines.append(
                f"{r.size_bytes:>12} {r.count:>13} {NCCL_TYPE_OF_DTYPE.get(r.dtype, r.dtype):>9} {redop:>7} "
                f"{-1:>7} {half} {half}"
            )
    return "\n".join(lines)
