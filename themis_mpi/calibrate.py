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
format" (`report.format_nccl`) use nccl-tests' unit, so they compare column by column.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from .collectives import Collective
from .errors import UsageError
from .limits import MAX_BANDWIDTH_GBPS, MAX_DIM_NPUS, MAX_SIZE_BYTES, MIN_BANDWIDTH_GBPS
from .nccl import best, levels
from .results import busbw_factor
from .run.collective import model_collective
from .topology import NCCL_ALGOS, Dim, NcclParams, Topology, parse_topology
from .units import BYTES_PER_GB

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
NCCL_REDOPS = ("sum", "prod", "max", "min", "avg", "none", "mulsum")
_OP_IN_HEADER = re.compile(
    r"\b(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv)_perf\b"
)
_RANK_LINE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\b", re.IGNORECASE | re.ASCII)
_PREFIX = re.compile(
    r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\s*\d+:(?=\s))", re.ASCII
)  # mpirun --tag-output; srun -l
_DIGITS = re.compile(r"[0-9]{1,20}", re.ASCII)
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?", re.ASCII)
_INT = re.compile(r"-?[0-9]{1,20}", re.ASCII)
NCCL_GB = 1e9
MAX_ENGINE_FIT_NPUS = 4096
MAX_LOG_BYTES = 64 * 2**20


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
    line_no: int = 0


@dataclass
class NcclLog:
    """An nccl-tests table: the collective, the NPU count and the rows.

    Attributes:
        notes: what the reader inferred or skipped, one line each (printed by calibrate).
    """

    path: str
    op: str
    npus: int
    rows: list[NcclRow]
    op_source: str = "header"
    npus_source: str = "Rank lines"
    table: int = 1
    tables: int = 1
    notes: list[str] = field(default_factory=list)


@dataclass
class _Table:
    rows: list[NcclRow] = field(default_factory=list)
    ops: set[str] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    in_place_only: bool = False
    notes: list[str] = field(default_factory=list)


def _number(text: str, what: str, path: str, line_no: int) -> float:
    if not _NUMBER.fullmatch(text):
        raise UsageError(f"{path}:{line_no}: bad {what} {text[:40]!r} in the nccl-tests table (not a number)")
    value = float(text)
    if not math.isfinite(value):
        raise UsageError(f"{path}:{line_no}: {what} {text[:40]!r} must be a finite number")
    return value


def _clean_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) with launcher prefixes and line-end characters removed."""
    out = []
    for line_no, line in enumerate(text.splitlines(), 1):
        match = _PREFIX.match(line)
        out.append((line_no, (line[match.end() :] if match else line).strip()))
    return out


def _row(fields: list[str], table: _Table, path: str, line_no: int) -> NcclRow | None:
    """An nccl-tests row, None for a line that is not one (launcher noise)."""
    if len(fields) < 5 or not _DIGITS.fullmatch(fields[0]) or fields[2] not in NCCL_TYPES:
        if fields and fields[0][:1].isdigit() and not _DIGITS.fullmatch(fields[0]) and len(fields) >= 9:
            if fields[2:3] and fields[2] in NCCL_TYPES:
                raise UsageError(
                    f"{path}:{line_no}: bad size {fields[0][:40]!r} (ASCII digits, at most 2^50 B)"
                )
        return None
    if fields[3] not in NCCL_REDOPS or not _INT.fullmatch(fields[4]) or not _DIGITS.fullmatch(fields[1]):
        return None
    size, count = int(fields[0]), int(fields[1])
    if not 0 < size <= MAX_SIZE_BYTES:
        raise UsageError(f"{path}:{line_no}: size {fields[0]} B is not between 1 B and 2^50 B")
    if len(fields) < 9:
        raise _Truncated(line_no)
    half = fields[5:9]
    second = fields[9:13] if len(fields) >= 13 else None
    if len(fields) not in (9, 13):
        raise UsageError(
            f"{path}:{line_no}: {len(fields)} columns; an nccl-tests row has 9 or 13 (size count type redop "
            f"root time algbw busbw #wrong [time algbw busbw #wrong])"
        )
    time_us = _number(half[0], "time", path, line_no)
    if time_us <= 0:
        raise UsageError(f"{path}:{line_no}: time {half[0]!r} must be positive")
    in_place = _number(second[0], "in-place time", path, line_no) if second else None
    return NcclRow(
        size,
        count,
        fields[2],
        fields[3],
        time_us,
        _number(half[1], "algbw", path, line_no),
        _number(half[2], "busbw", path, line_no),
        half[3],
        in_place,
        line_no,
    )


class _Truncated(Exception):
    def __init__(self, line_no: int):
        self.line_no = line_no


def read_tables(path: str) -> list[_Table]:
    """Every nccl-tests table of a log (a table ends where its sizes stop growing or text intervenes)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_LOG_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_LOG_BYTES:
        raise UsageError(f"{path}: larger than 64 MiB, not an nccl-tests log")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file (an nccl-tests log is text)") from None
    tables: list[_Table] = []
    current = _Table()
    pending: int | None = None  # a truncated row's line: fine only as a table's last
    for line_no, line in _clean_lines(text):
        fields = line.lstrip("#").split()
        if _RANK_LINE.match(line):
            if current.rows:
                tables.append(current)
                current = _Table()
            current.ranks.add(int(_RANK_LINE.match(line).group(1)))  # type: ignore[union-attr]
            continue
        ops = _OP_IN_HEADER.findall(line)
        if ops and current.rows:
            tables.append(current)
            current = _Table()
        current.ops.update(ops)
        if fields and set(fields) <= {"out-of-place", "in-place"}:
            current.in_place_only = fields == ["in-place"]
        try:
            row = _row(line.split(), current, path, line_no) if not line.startswith("#") else None
        except _Truncated as cut:
            pending = cut.line_no
            continue
        if row is None:
            if line.startswith("#") and current.rows and not ops and "Rank" not in line:
                tables.append(current)  # '# Out of bounds values', '# Avg bus bandwidth': the table ended
                current = _Table(ranks=set(current.ranks))
            continue
        if pending is not None:
            raise UsageError(
                f"{path}:{pending}: a row with fewer than 9 columns inside the table (cut short?)"
            )
        if current.rows and row.size_bytes <= current.rows[-1].size_bytes:
            tables.append(current)
            current = _Table(ranks=set(current.ranks), ops=set(current.ops))
        current.rows.append(row)
    if pending is not None:
        current.notes.append(f"line {pending}: the last row is cut short; ignored")
    tables.append(current)
    found = [t for t in tables if t.rows]
    # Rank lines and test names printed before a table belong to it; carry them forward.
    ranks: set[int] = set()
    for t in tables:
        if t.ranks and not t.rows:
            ranks = t.ranks
        elif t.rows and not t.ranks:
            t.ranks = ranks
        elif t.ranks:
            ranks = t.ranks
    return found


def infer_npus(op: str, rows: list[NcclRow]) -> int | None:
    """The NPU count from busbw / algbw (2(n-1)/n for all-reduce, (n-1)/n otherwise), or None."""
    usable = [r for r in rows if r.algbw >= 1.0 and r.busbw > 0]
    if not usable:
        return None
    ratio = sorted(r.busbw / r.algbw for r in usable)[len(usable) // 2]
    room = 2.0 if op == "all_reduce" else 1.0
    if not 0 < ratio < room:
        return None
    n = room / (room - ratio)
    if not 2 <= round(n) <= MAX_DIM_NPUS or abs(n - round(n)) > 0.2 * round(n) ** 2 / 100 + 0.05:
        return None
    return round(n)


def read_nccl_log(
    path: str, op: str | None = None, npus: int | None = None, table: int | None = None
) -> NcclLog:
    """Parse an nccl-tests log; one line (UsageError) for anything that is not one.

    Launcher prefixes (``[1,0]<stdout>:``, Slurm's ``0:``), launcher noise, CRLF, a missing
    header or missing ``#`` are accepted. Several tables: `table` (1-based) picks one. The
    collective comes from `op`, else from the ``*_perf`` name in the log, else from the redop
    column (``none``: all_gather, else all_reduce). The NPU count comes from `npus`, else from
    the ``Rank N`` lines, else from busbw / algbw (`infer_npus`).
    """
    tables = read_tables(path)
    if not tables:
        raise UsageError(
            f"{path}: no nccl-tests table found (all_reduce_perf/all_gather_perf/reduce_scatter_perf)"
        )
    if table is None and len(tables) > 1:
        listing = "; ".join(
            f"{k}: {'/'.join(sorted(t.ops)) or 'test ?'} lines {t.rows[0].line_no}-{t.rows[-1].line_no}, "
            f"{t.rows[0].size_bytes}-{t.rows[-1].size_bytes} B"
            for k, t in enumerate(tables, 1)
        )
        raise UsageError(f"{path}: {len(tables)} tables ({listing}); pick one with --table K")
    k = 1 if table is None else table
    if not 1 <= k <= len(tables):
        raise UsageError(f"{path}: --table {k} but the log has {len(tables)} table(s)")
    chosen = tables[k - 1]
    rows, notes = chosen.rows, list(chosen.notes)
    if chosen.in_place_only:
        notes.append("only in-place columns: their times are fitted")
    source = "given"
    if op is None:
        found = sorted(chosen.ops)
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
    npus_source = "given"
    if npus is None:
        inferred = infer_npus(op, rows)
        if len(chosen.ranks) >= 2:
            npus, npus_source = len(chosen.ranks), "Rank lines"
        elif inferred is not None:
            npus, npus_source = inferred, "busbw/algbw"
            what = "2(n-1)/n" if op == "all_reduce" else "(n-1)/n"
            notes.append(f"no Rank lines for all NPUs: {npus} NPUs inferred from busbw/algbw = {what}")
        else:
            raise UsageError(
                f"{path}: no '#  Rank N Group ...' lines and busbw/algbw does not give the NPU count; "
                "give --npus"
            )
    if npus < 2:
        raise UsageError(f"{path}: a collective over {npus} NPU measures no network; need 2 or more")
    return NcclLog(path, op, npus, rows, source, npus_source, k, len(tables), notes)


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
    if log.npus > MAX_ENGINE_FIT_NPUS:
        raise UsageError(
            f"the per-dim fit runs the engine per size: at most {MAX_ENGINE_FIT_NPUS} NPUs, got {log.npus} "
            "(the default --algorithm nccl has no such limit)"
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


# --- the NCCL-like fit --------------------------------------------------------------------------

NVLINK_STEP_NS = 600.0  # NCCL's NVLink hop latency of LL (tuning.cc hwLatencies): dim 0's step, not fitted
NIC_STEP_NS = 2700.0  # NCCL's network hop latency of Ring LL: the nominal across-node step
NIC_GBPS = 400e9 / 8 / BYTES_PER_GB  # one 400 Gb/s NIC per GPU, in GB/s of 2^30 B
NVLINK4_GBPS = 450e9 / BYTES_PER_GB  # H100 NVLink 4: 450e9 B/s per direction (419.1 GB/s of 2^30 B)
ROBUST_PCTS = (3.0, 1000.0)  # soft-L1 scales: a robust pass, then least squares without the outliers
# Errors past 10 % from 64 KiB, and past 4 % from 64 MiB, cost extra (hinge residuals of this weight).
BANDS = ((64 * 2**10, 10.0), (64 * 2**20, 4.0))
HINGE_WEIGHT = 10.0
OUTLIER_PCT = 30.0  # a fitted size this far off after the robust pass is left out of the wider one
_POSITIVE = ("B0", "B1", "L1", "base_LL", "base_LL128", "base_Simple", "nvls_base")
_SHARE = ("eff_LL", "eff_LL128", "eff_tree")
PARAM_DOC = {
    "B0": "dim 0 bandwidth per NPU, GB/s (2^30 B)",
    "B1": "dim 1 bandwidth per NPU, GB/s (2^30 B)",
    "L1": "dim 1 per-step latency, ns",
    "base_LL": "LL base latency, ns",
    "base_LL128": "LL128 base latency, ns",
    "base_Simple": "Simple base latency, ns",
    "eff_LL": "LL share of the bandwidth",
    "eff_LL128": "LL128 share of the bandwidth",
    "nvls_base": "NVLS base latency, ns",
    "nvls_eff": "NVLS algbw / dim 0 bandwidth",
    "eff_tree": "share of the across-node bandwidth a tree reaches",
}


def busbw_of(op: str, npus: int) -> float:
    """nccl-tests' bus-bandwidth factor: 2(n-1)/n for all-reduce, (n-1)/n otherwise."""
    return 2.0 * (npus - 1) / npus if op == "all_reduce" else (npus - 1) / npus


@dataclass
class NcclFit:
    """The fitted NCCL-like machine and how well it reproduces every size of the log.

    Attributes:
        topology: what ``-t`` takes (dims and ``NCCL(...)``).
        args: the further options `model` needs (none: the topology carries everything).
        fitted: the names of the fitted parameters (`PARAM_DOC`), with their values.
        rows: per size: measured and model time, error, the predicted algorithm and protocol.
        prediction: for a multi-node log with a base fit, the base plus the NIC's nominal rate.
    """

    topology: str
    chunks: int
    args: list[str]
    op: str
    dtype: str
    npus: int
    fitted: dict[str, float]
    rows: list[dict] = field(default_factory=list)
    prediction: dict | None = None

    def to_dict(self) -> dict:
        """Plain values for JSON."""
        return asdict(self)


def _machine(values: dict[str, float], npus: int, base: Topology | None, kind: str, algos) -> Topology:
    """The topology of a parameter set: one dim, or the base's dim 0 plus a dim across nodes."""
    ref = base.nccl if base is not None and base.nccl is not None else NcclParams()
    params = NcclParams(
        (
            values.get("base_LL", ref.base_ns[0]),
            values.get("base_LL128", ref.base_ns[1]),
            values.get("base_Simple", ref.base_ns[2]),
        ),
        (values.get("eff_LL", ref.efficiency[0]), values.get("eff_LL128", ref.efficiency[1]), 1.0),
        values.get("nvls_base", ref.nvls_base_ns),
        values.get("nvls_eff", ref.nvls_efficiency),
        tuple(algos),
        values.get("eff_tree", ref.tree_efficiency),
    )
    if base is None:
        dims: tuple[Dim, ...] = (Dim(kind, npus, values["B0"], NVLINK_STEP_NS, "nccl"),)
    else:
        d0 = base.dims[0]
        dims = (d0, Dim("Switch", npus // d0.npus, values["B1"], values["L1"], "nccl"))
    return Topology(dims, "", nccl=params)


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {k: float(f"{v:.5g}") for k, v in values.items()}


def _encode(names, values) -> np.ndarray:
    """Unconstrained coordinates: logs of positive values, logits of shares.

    LL is kept the low-latency, low-bandwidth protocol: ``eff_LL`` is coded as a share of
    ``eff_LL128`` and ``base_LL128`` as ``base_LL`` plus a positive amount.
    """
    values = dict(values)
    if "eff_LL" in names:
        values["eff_LL"] = min(max(values["eff_LL"] / values["eff_LL128"], 1e-6), 1 - 1e-6)
    if "base_LL128" in names and "base_LL" in names:
        values["base_LL128"] = max(values["base_LL128"] - values["base_LL"], 1.0)
    out = []
    for n in names:
        v = values[n]
        if n in _SHARE:
            out.append(math.log(v / (1 - v)))
        elif n == "nvls_eff":
            out.append(math.log(v / (2 - v)))
        else:
            out.append(math.log(v))
    return np.array(out)


def _decode(names, u) -> dict[str, float]:
    out = {}
    for n, x in zip(names, u):
        x = float(np.clip(x, -40, 40))
        if n in _SHARE:
            out[n] = min(max(1 / (1 + math.exp(-x)), 0.011), 1.0)
        elif n == "nvls_eff":
            out[n] = min(max(2 / (1 + math.exp(-x)), 0.011), 2.0)
        else:
            out[n] = math.exp(min(x, 18.0))  # at most 6.6e7 (ns, GB/s)
    if "eff_LL" in out:
        out["eff_LL"] = max(out["eff_LL"] * out["eff_LL128"], 0.011)
    if "base_LL128" in out and "base_LL" in out:
        out["base_LL128"] += out["base_LL"]
    return out


def _times_ns(topo: Topology, op: str, sizes) -> list[tuple[float, str, str]]:
    lv = levels(topo, range(len(topo.dims)))
    params = topo.nccl
    assert params is not None
    return [best(params, lv, op, s) for s in sizes]


def _solve(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """The x with a x = b, by Gaussian elimination with partial pivoting (None if a is singular).

    Plain Python arithmetic on a few unknowns, so the result is the same on every CPU (LAPACK's
    depends on the BLAS kernel the machine picks).
    """
    n = len(b)
    m = [[float(a[i, j]) for j in range(n)] + [float(b[i])] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda i: abs(m[i][col]))
        if m[pivot][col] == 0.0 or not math.isfinite(m[pivot][col]):
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for i in range(col + 1, n):
            f = m[i][col] / m[col][col]
            m[i] = [x - f * y for x, y in zip(m[i], m[col])]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (m[i][n] - sum(m[i][j] * x[j] for j in range(i + 1, n))) / m[i][i]
    return np.array(x)


def _lm(residual, u0: np.ndarray, delta: float, iters: int = 200) -> tuple[np.ndarray, float]:
    """Levenberg-Marquardt on soft-L1-weighted residuals (IRLS, scale delta), numeric Jacobian."""

    def cost(r):
        return float(np.sum(2 * delta**2 * (np.sqrt(1 + (r / delta) ** 2) - 1)))

    u, r = u0.copy(), residual(u0)
    best, lam = cost(r), 1e-2
    for _ in range(iters):
        h = 1e-6
        jac = np.empty((len(r), len(u)))
        for j in range(len(u)):
            du = u.copy()
            du[j] += h
            jac[:, j] = (residual(du) - r) / h
        w = 1 / np.sqrt(1 + (r / delta) ** 2)
        # sums in a fixed order, not BLAS: its kernels differ per CPU in their last bits, and this
        # fit's valleys are flat enough for that to move the fitted values (issue 26)
        a = (jac[:, :, None] * (w[:, None] * jac)[:, None, :]).sum(axis=0)
        g = (jac * (w * r)[:, None]).sum(axis=0)
        improved = False
        for _ in range(8):
            step = _solve(a + lam * (np.diag(np.diag(a)) + 1e-9 * np.eye(len(u))), -g)
            if step is None:
                lam *= 10
                continue
            trial = u + step
            rt = residual(trial)
            ct = cost(rt)
            if ct < best:
                gain = best - ct
                u, r, best, lam = trial, rt, ct, max(lam / 3, 1e-9)
                improved = True
                break
            lam *= 4
        if not improved or gain < 1e-12 * max(best, 1e-30):
            break
    return u, best


def _nelder_mead(f, x0: np.ndarray, iters: int = 3000, step: float = 0.1) -> np.ndarray:
    """Derivative-free polish of f from x0 (the hinge terms make the objective non-smooth)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < 1e-12 * (abs(values[0]) + 1e-20):
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex]
                values = [f(x) for x in simplex]
    return simplex[int(np.argmin(values))]


def _check_fittable(log: NcclLog, rows: list[NcclRow]) -> None:
    times = [r.time_us for r in rows]
    sizes = [r.size_bytes for r in rows]
    if len(rows) < 4:
        raise UsageError(f"{log.path}: {len(rows)} sizes: the log cannot be fitted (need 4 or more)")
    if times[-1] < 1.5 * times[0] or sizes[-1] < 16 * sizes[0]:
        raise UsageError(
            f"{log.path}: the times do not grow with the size ({times[0]:g} us at {sizes[0]} B, "
            f"{times[-1]:g} us "
            f"at {sizes[-1]} B): the log cannot be fitted"
        )
    gbps = sizes[-1] / (times[-1] * 1e-6) / BYTES_PER_GB
    if gbps > MAX_BANDWIDTH_GBPS / 10 or times[0] < 1e-3:
        raise UsageError(
            f"{log.path}: {times[-1]:g} us for {sizes[-1]} B is {gbps:.3g} GB/s: not a network; "
            "the log cannot be fitted"
        )


def fit_nccl(
    log: NcclLog,
    base: Topology | None = None,
    kind: str = "Switch",
    algos=None,
    holdout: bool = True,
    link_gbps: float = NVLINK4_GBPS,
) -> NcclFit:
    """Fit the NCCL-like model (`nccl`) to the log's out-of-place times over the whole size range.

    Without `base`, one dim of ``log.npus`` NPUs at the link's nominal rate `link_gbps` (GB/s of
    2^30 B; one node's bandwidth is not identifiable where NVLS carries the large sizes): each
    protocol's base latency, LL and LL128's efficiencies, and NVLS's base latency and efficiency
    (when NVLS can run): 7 parameters. With `base` (a single-node fit), dim 0 is the base's and
    the fit finds dim 1's bandwidth and step latency, the base latencies, LL and LL128's
    efficiencies, NVLS's base latency and the tree's share of dim 1 (9 parameters; 7 for Ring).
    Residuals are relative (log of model / measured): a robust soft-L1 pass finds the outliers
    (single sizes off by more than `OUTLIER_PCT`), a least-squares pass without them, with
    hinge terms past `BANDS`, gives the fit; a Nelder-Mead pass polishes it. With `holdout`,
    only the even-indexed sizes are fitted; the odd ones judge the fit.
    """
    algos = tuple(algos or NCCL_ALGOS)
    rows = log.rows
    _check_fittable(log, rows)
    fitted_rows = [r for i, r in enumerate(rows) if i % 2 == 0] if holdout else list(rows)
    sizes = [r.size_bytes for r in fitted_rows]
    measured = np.array([r.time_us * 1e3 for r in fitted_rows])
    nvls = log.op == "all_reduce" and kind == "Switch" and any(a in algos for a in ("NVLS", "NVLSTree"))
    t_min_ns = min(r.time_us for r in rows) * 1e3
    big = rows[-1]
    if base is None:
        names = ["base_LL", "base_LL128", "base_Simple", "eff_LL", "eff_LL128"]
        start = {"B0": link_gbps, "eff_LL": 0.3, "eff_LL128": 0.8}
        if nvls:
            names += ["nvls_base", "nvls_eff"]
            start.update(nvls_eff=0.6)
    else:
        if log.npus % base.dims[0].npus or log.npus == base.dims[0].npus:
            raise UsageError(
                f"{log.path}: {log.npus} NPUs is not a multiple (> 1) of the base's "
                f"{base.dims[0].npus} per node"
            )
        nodes = log.npus // base.dims[0].npus
        b1 = (
            busbw_of(log.op, log.npus)
            * big.size_bytes
            / (big.time_us * 1e-6)
            / BYTES_PER_GB
            / base.dims[0].npus
        )
        names = ["B1", "L1", "base_LL", "base_LL128", "base_Simple", "eff_LL", "eff_LL128"]
        tree = log.op == "all_reduce" and any(a in algos for a in ("Tree", "NVLSTree"))
        names += (["nvls_base"] if nvls else []) + (["eff_tree"] if tree else [])
        assert base.nccl is not None
        start = {"B1": b1, "L1": NIC_STEP_NS, "eff_LL128": base.nccl.efficiency[1], "eff_tree": 0.7}
        del nodes
    fixed = {"B0": link_gbps} if base is None else {}
    best_u, best_cost = None, math.inf
    keep = np.ones(len(sizes), dtype=bool)
    best_keep = keep.copy()

    bands = [(np.array([s >= lo for s in sizes]) & keep, math.log1p(pct / 100)) for lo, pct in BANDS]
    hinge = [False]

    def residual(u):
        topo = _machine({**fixed, **_decode(names, u)}, log.npus, base, kind, algos)
        model = np.array([t for t, _, _ in _times_ns(topo, log.op, sizes)])
        r = np.log(model / measured)
        if not hinge[0]:
            return r[keep]
        over = [HINGE_WEIGHT * np.maximum(np.abs(r[band & keep]) - edge, 0.0) for band, edge in bands]
        return np.concatenate([r[keep], *over])

    for scale, eff, tree_eff, bw in itertools.product(
        (0.25, 0.6, 1.0, 1.5), (0.05, 0.3), (0.5, 0.9), (0.8, 1.1)
    ):
        if tree_eff != 0.5 and "eff_tree" not in names:
            continue
        if True:
            values = dict(start)
            values["eff_tree"] = tree_eff
            if "eff_LL" in names:
                values["eff_LL"] = eff
            for n in ("base_LL", "base_LL128", "base_Simple", "nvls_base"):
                values.setdefault(n, scale * t_min_ns * {"base_LL": 0.5, "base_LL128": 1.0}.get(n, 2.0))
            for n in ("B0", "B1"):
                if n in values:
                    values[n] = start[n] * bw
            keep[:], hinge[0] = True, False
            u, _ = _lm(residual, _encode(names, values), ROBUST_PCTS[0] / 100)
            keep[:] = np.abs(residual(u)) < math.log1p(OUTLIER_PCT / 100)
            hinge[0] = True
            u, c = _lm(residual, u, ROBUST_PCTS[1] / 100)
            c += 1e3 * int(np.sum(~keep))  # fewer outliers first
            if c < best_cost:
                best_u, best_cost, best_keep = u, c, keep.copy()
    assert best_u is not None
    hinge[0] = True
    keep[:] = best_keep
    best_u = _nelder_mead(lambda u: float(np.sum(residual(u) ** 2)), best_u)
    values = _rounded(_decode(names, best_u))
    for n in ("B0", "B1"):
        if n in values and not MIN_BANDWIDTH_GBPS <= values[n] <= MAX_BANDWIDTH_GBPS:
            raise UsageError(f"{log.path}: the fit needs {values[n]:.3g} GB/s: the log cannot be fitted")
    topo = parse_topology(_machine({**fixed, **values}, log.npus, base, kind, algos).spec())
    result = NcclFit(topo.spec(), 1, [], log.op, NCCL_TYPES[rows[0].type][1], log.npus, values)
    result.rows = nccl_rows(log, topo, {r.size_bytes for r in fitted_rows})
    if base is not None:
        nominal = base.with_dims(
            (base.dims[0], Dim("Switch", log.npus // base.dims[0].npus, NIC_GBPS, NIC_STEP_NS, "nccl"))
        )
        nominal = Topology(nominal.dims, "", nccl=replace(base.nccl, algos=algos) if base.nccl else None)
        result.prediction = {"topology": nominal.spec(), "rows": nccl_rows(log, nominal, set())}
    return result


def nccl_rows(log: NcclLog, topo: Topology, fitted: set[int]) -> list[dict]:
    """Measured vs model per size, with the algorithm and protocol the model picks."""
    factor = busbw_of(log.op, log.npus)
    itemsize = NCCL_TYPES[log.rows[0].type][0]
    del itemsize
    out = []
    for r, (t_ns, algo, proto) in zip(log.rows, _times_ns(topo, log.op, [r.size_bytes for r in log.rows])):
        model_us = t_ns / 1e3
        out.append(
            {
                "size_bytes": r.size_bytes,
                "fitted": r.size_bytes in fitted,
                "measured_us": r.time_us,
                "model_us": model_us,
                "time_error_pct": 100 * (model_us - r.time_us) / r.time_us,
                "measured_busbw": factor * r.size_bytes / r.time_us / 1e3,
                "model_busbw": factor * r.size_bytes / model_us / 1e3,
                "algorithm": algo,
                "protocol": proto,
            }
        )
    return out


def summary(rows: list[dict]) -> dict[str, float]:
    """Worst |error| from 64 MiB and from 64 KiB, median |error| below 64 KiB, on all and held-out rows."""
    out: dict[str, float] = {}
    for label, subset in (("all", rows), ("held_out", [r for r in rows if not r["fitted"]])):
        big = [abs(r["time_error_pct"]) for r in subset if r["size_bytes"] >= 64 * 2**20]
        mid = [abs(r["time_error_pct"]) for r in subset if r["size_bytes"] >= 64 * 2**10]
        small = [abs(r["time_error_pct"]) for r in subset if r["size_bytes"] < 64 * 2**10]
        out[f"{label}_worst_from_64MiB_pct"] = max(big) if big else math.nan
        out[f"{label}_worst_from_64KiB_pct"] = max(mid) if mid else math.nan
        out[f"{label}_median_below_64KiB_pct"] = float(np.median(small)) if small else math.nan
    return out


def format_nccl_fit(log: NcclLog, result: NcclFit) -> str:
    """The fitted machine, the command that predicts the table, and per size: error, algorithm, protocol."""
    lines = [
        f"# calibrate {log.path}: table {log.table} of {log.tables}, {log.op} (from the {log.op_source}), "
        f"{log.npus} NPUs (from the {log.npus_source}), {len(log.rows)} sizes, type {log.rows[0].type}",
        *(f"# note: {n}" for n in log.notes),
        f"# NCCL-like model fitted on the even-indexed sizes (*), judged on the others; {len(result.fitted)} "
        "parameters:",
        *(f"#   {k:<12} {v:>12g}  {PARAM_DOC[k]}" for k, v in result.fitted.items()),
        f"topology {result.topology}",
        f"# predict: themis-mpi model -t '{result.topology}' -c {result.chunks} -o {log.op} "
        f"-d {result.dtype} "
        f"-b SIZE -p baseline",
        "# busbw in nccl-tests' GB/s (1e9 B/s), measured busbw recomputed from the measured time",
        f"#{'size':>11} {'fit':>3} {'meas_us':>9} {'model_us':>9} {'time_err%':>9} {'meas_busbw':>10} "
        f"{'model_busbw':>11} {'algorithm':>9} {'protocol':>8}",
    ]
    for r in result.rows:
        lines.append(
            f" {r['size_bytes']:>11} {'*' if r['fitted'] else '':>3} {r['measured_us']:>9.2f} "
            f"{r['model_us']:>9.2f} "
            f"{r['time_error_pct']:>9.1f} {r['measured_busbw']:>10.2f} {r['model_busbw']:>11.2f} "
            f"{r['algorithm']:>9} {r['protocol']:>8}"
        )
    s = {k: (f"{v:.1f}" if math.isfinite(v) else "n/a") for k, v in summary(result.rows).items()}
    lines.append(
        f"# |time error|: worst {s['all_worst_from_64MiB_pct']} % from 64 MiB, worst "
        f"{s['all_worst_from_64KiB_pct']} % from 64 KiB, median {s['all_median_below_64KiB_pct']} % "
        "below "
        f"64 KiB (held-out sizes only: {s['held_out_worst_from_64MiB_pct']}, "
        f"{s['held_out_worst_from_64KiB_pct']}, {s['held_out_median_below_64KiB_pct']} %)"
    )
    if result.prediction:
        lines.append(
            f"# predicted from the base fit and the NIC's nominal rate: {result.prediction['topology']}"
        )
        lines.append(
            f"#{'size':>11} {'meas_us':>9} {'pred_us':>9} {'time_err%':>9} {'algorithm':>9} {'protocol':>8}"
        )
        for r in result.prediction["rows"]:
            lines.append(
                f"# {r['size_bytes']:>10} {r['measured_us']:>9.2f} {r['model_us']:>9.2f} "
                f"{r['time_error_pct']:>9.1f} {r['algorithm']:>9} {r['protocol']:>8}"
            )
    return "\n".join(lines)


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


def parse_algos(text: str | None) -> tuple[str, ...] | None:
    """``--nccl-algo Ring,Tree`` (NCCL_ALGO's names, any case) as `NCCL_ALGOS` names; None for all."""
    if text is None:
        return None
    names = {a.lower(): a for a in NCCL_ALGOS} | {"nvls_tree": "NVLSTree", "nvlstree": "NVLSTree"}
    out = []
    for item in filter(None, (t.strip().lower() for t in text.split(","))):
        if item not in names:
            raise UsageError(f"unknown --nccl-algo {item!r}; use {', '.join(NCCL_ALGOS)} (comma-separated)")
        out.append(names[item])
    if not out:
        raise UsageError("--nccl-algo needs at least one algorithm")
    return tuple(dict.fromkeys(out))


def read_base(text: str) -> Topology:
    """``--base``: a single-node fit, as its topology string or the file `calibrate --json` wrote."""
    if text.endswith(".json") or (os.path.isfile(text) and "(" not in text):
        try:
            with open(text) as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read --base {text}: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("topology"), str):
            raise UsageError(f"--base {text}: not a calibrate --json file (no 'topology')")
        text = doc["topology"]
    base = parse_topology(text)
    if len(base.dims) != 1 or not base.flat:
        raise UsageError("--base must be a single-node NCCL-like fit: one nccl dim and NCCL(...)")
    return base
