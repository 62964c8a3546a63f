"""nccl-tests and rccl-tests logs, read as posted: the tables, the collective, the NPUs, the machine.

`read_nccl_log` reads the tables ``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``,
``alltoall_perf`` and ``broadcast_perf`` print: size, count, type, [redop], [root], then time,
algbw, busbw and #wrong out of place and in place (nccl-tests since 2.13 and rccl-tests: 13
columns; older nccl-tests: no root column, an error value instead of #wrong, no redop for
all_gather; newer: per-iteration columns). Besides the rows it takes what the log says about the
machine: the GPU model, host names and device indices of the "Using devices" lines, NCCL INFO
lines (``rank R nranks N cudaDev D``), ``N-node`` section titles, ``-g N``,
``NCCL_ALGO``/``NCCL_PROTO`` settings and the library (RCCL or NCCL). nccl-tests' GB/s are 1e9
B/s; this package's are 2^30 B/s.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

from ..errors import UsageError
from ..limits import MAX_DIM_NPUS, MAX_SIZE_BYTES
from .hardware import VENDOR_MARKS

NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
PERF_NAMES = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter"}
PERF_NAMES |= {"alltoall": "all_to_all", "broadcast": "broadcast"}
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
    "fp8_e4m3": (1, "float32"),
    "fp8_e5m2": (1, "float32"),
}
NCCL_REDOPS = ("sum", "prod", "max", "min", "avg", "none", "mulsum")
_OP_IN_HEADER = re.compile(
    r"\b(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv|gather|scatter|hypercube)"
    r"_perf\b"
)
_RANK_LINE = re.compile(
    r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s*(?:\[[^\]]*\])?\s*(.*)$",
    re.IGNORECASE | re.ASCII,
)
_RANK_START = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\b", re.IGNORECASE | re.ASCII)
_INFO_RANK = re.compile(
    r"^([\w.\-]+):\d+:\d+\s+\[\d+\]\s+NCCL INFO\b.*?\brank\s+(\d+)\s+nranks\s+(\d+)\s+cudaDev\s+(\d+)",
    re.ASCII,
)
_NODES_TITLE = re.compile(r"\b(\d{1,5})[- ]nodes?\b", re.IGNORECASE | re.ASCII)
_NGPUS = re.compile(r"\bnGpus\s+(\d+)", re.ASCII)
_ENV = re.compile(r"\b(NCCL_ALGO|NCCL_PROTO)\s*=\s*([A-Za-z0-9_,^;:]+)", re.ASCII)
_PREFIX = re.compile(
    r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\s*\d+:(?=\s))", re.ASCII
)  # mpirun --tag-output; srun -l
_DIGITS = re.compile(r"[0-9]{1,20}", re.ASCII)
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?", re.ASCII)
_INT = re.compile(r"-?[0-9]{1,20}", re.ASCII)
MAX_LOG_BYTES = 64 * 2**20
PARTIAL_SIZES = 6  # a run with fewer sizes is fitted on all of them


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
    """One nccl-tests table and what the log says about the machine that ran it.

    Attributes:
        op, npus, rows: the collective, the NPUs (ranks) and the sizes measured.
        op_source, npus_source: where the op and the NPU count came from.
        table, tables: this table's number (1-based) and how many the log has.
        notes: what the reader inferred or skipped, one line each (printed by calibrate).
        device: the GPU model the log names ("" when it names none).
        vendor: nvidia or amd: the library that ran it ("" when the log does not say).
        gpus_per_node, node_source: GPUs per server (host) and where that came from (0: unknown).
        nccl_algo, nccl_proto: ``NCCL_ALGO`` and ``NCCL_PROTO`` as the log sets them ("" if not).
        runs: every table of the log (this one included), for a fit of them all together.
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
    device: str = ""
    vendor: str = ""
    gpus_per_node: int = 0
    node_source: str = ""
    nccl_algo: str = ""
    nccl_proto: str = ""
    runs: list[NcclLog] = field(default_factory=list, repr=False)

    @property
    def partial(self) -> bool:
        """Fewer than `PARTIAL_SIZES` sizes: fitted on all of them, no held-out half."""
        return len(self.rows) < PARTIAL_SIZES

    @property
    def label(self) -> str:
        """How a report names the run: its table and shape."""
        nodes = f", {self.npus // self.gpus_per_node} x {self.gpus_per_node}" if self.gpus_per_node else ""
        return f"table {self.table}: {self.op}, {self.npus} NPUs{nodes}"


@dataclass
class _Table:
    rows: list[NcclRow] = field(default_factory=list)
    ops: set[str] = field(default_factory=set)
    ranks: dict[int, tuple[str, int, str]] = field(default_factory=dict)  # rank -> host, device, name
    info: dict[int, tuple[str, int, int]] = field(default_factory=dict)  # rank -> host, nranks, cudaDev
    nodes: int = 0
    ngpus: int = 0
    in_place_only: bool = False
    notes: list[str] = field(default_factory=list)


class _Truncated(Exception):
    def __init__(self, line_no: int):
        self.line_no = line_no


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


def _row(fields: list[str], path: str, line_no: int) -> NcclRow | None:
    """An nccl-tests row of any version, None for a line that is not one (launcher noise).

    After size, count and type come an optional redop and an optional root, then groups of four
    (time, algbw, busbw, #wrong), or of eight with per-iteration columns: a root is there when the
    fields after the redop are one more than a multiple of four.
    """
    if len(fields) < 5 or not _DIGITS.fullmatch(fields[0]) or fields[2] not in NCCL_TYPES:
        if fields and fields[0][:1].isdigit() and not _DIGITS.fullmatch(fields[0]) and len(fields) >= 9:
            if fields[2:3] and fields[2] in NCCL_TYPES:
                raise UsageError(
                    f"{path}:{line_no}: bad size {fields[0][:40]!r} (ASCII digits, at most 2^50 B)"
                )
        return None
    if not _DIGITS.fullmatch(fields[1]):
        return None
    size, count = int(fields[0]), int(fields[1])
    if not 0 < size <= MAX_SIZE_BYTES:
        raise UsageError(f"{path}:{line_no}: size {fields[0]} B is not between 1 B and 2^50 B")
    rest = fields[3:]
    redop = "none"
    if rest and rest[0] in NCCL_REDOPS:
        redop, rest = rest[0], rest[1:]
    numbers = [f for f in rest if _NUMBER.fullmatch(f.lstrip("-")) or f == "N/A"]
    if len(numbers) % 4 == 1 and _INT.fullmatch(numbers[0]):
        rest = rest[1:]  # the root column
    rest = [f for f in rest if _NUMBER.fullmatch(f) or f == "N/A"]  # a trailing timestamp is dropped
    if len(rest) < 4:
        raise _Truncated(line_no)
    if len(rest) not in (4, 8, 16):
        raise UsageError(
            f"{path}:{line_no}: {len(fields)} columns; an nccl-tests row is size count type [redop] [root] "
            "then time algbw busbw #wrong, out of place and in place"
        )
    group = 8 if len(rest) == 16 else 4
    first, second = rest[:4], rest[group : group + 4] if len(rest) > group else None
    time_us = _number(first[0], "time", path, line_no)
    if time_us <= 0:
        raise UsageError(f"{path}:{line_no}: time {first[0]!r} must be positive")
    in_place = _number(second[0], "in-place time", path, line_no) if second else None
    return NcclRow(
        size,
        count,
        fields[2],
        redop,
        time_us,
        _number(first[1], "algbw", path, line_no),
        _number(first[2], "busbw", path, line_no),
        first[3],
        in_place,
        line_no,
    )


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_LOG_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_LOG_BYTES:
        raise UsageError(f"{path}: larger than 64 MiB, not an nccl-tests log")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file (an nccl-tests log is text)") from None


def read_tables(path: str, text: str | None = None) -> list[_Table]:
    """Every nccl-tests table of a log (a table ends where its sizes stop growing or text intervenes)."""
    text = _read_text(path) if text is None else text
    tables: list[_Table] = []
    current = _Table()
    pending: int | None = None  # a truncated row's line: fine only as a table's last

    def close(carry: bool) -> _Table:
        tables.append(current)
        if not carry:
            return _Table()
        return _Table(ranks=dict(current.ranks), info=dict(current.info), ops=set(current.ops))

    for line_no, line in _clean_lines(text):
        start = _RANK_START.match(line)
        if start:
            if current.rows:
                current = close(False)
            full = _RANK_LINE.match(line)
            host, device, name = (
                (full.group(2), int(full.group(3)), full.group(4).strip()) if full else ("", -1, "")
            )
            current.ranks[int(start.group(1))] = (host, device, name)
            continue
        info = _INFO_RANK.match(line)
        if info:
            current.info[int(info.group(2))] = (info.group(1), int(info.group(3)), int(info.group(4)))
            continue
        ops = _OP_IN_HEADER.findall(line)
        if ops and current.rows:
            current = close(False)
        current.ops.update(ops)
        nodes = _NODES_TITLE.search(line) if not line[:1].isdigit() else None
        if nodes and "=" * 3 in line or (nodes and line.lower().startswith(("#", "=", "-"))):
            if current.rows:
                current = close(False)
            current.nodes = int(nodes.group(1))
        ngpus = _NGPUS.search(line)
        if ngpus:
            current.ngpus = int(ngpus.group(1))
        fields = line.lstrip("#").split()
        if fields and set(fields) <= {"out-of-place", "in-place"}:
            current.in_place_only = fields == ["in-place"]
        try:
            row = _row(line.split(), path, line_no) if not line.startswith("#") else None
        except _Truncated as cut:
            pending = cut.line_no
            continue
        if row is None:
            if line.startswith("#") and current.rows and not ops and "Rank" not in line:
                current = close(True)  # '# Out of bounds values', '# Avg bus bandwidth': the table ended
            continue
        if pending is not None:
            raise UsageError(
                f"{path}:{pending}: a row with fewer than 9 columns inside the table (cut short?)"
            )
        if current.rows and row.size_bytes <= current.rows[-1].size_bytes:
            current = close(True)
        current.rows.append(row)
    if pending is not None:
        current.notes.append(f"line {pending}: the last row is cut short; ignored")
    tables.append(current)
    found = [t for t in tables if t.rows]
    # Rank lines, NCCL INFO lines and test names printed before a table belong to it; carry them forward.
    ranks: dict = {}
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


def _vendor(text: str) -> str:
    low = text.lower()
    for vendor, marks in VENDOR_MARKS.items():
        if any(m in low for m in marks):
            return vendor
    return ""


def _per_node(t: _Table, npus: int) -> tuple[int, str]:
    """GPUs per node from host names, device indices, a ``-g`` count or an ``N-node`` title (0: unknown)."""
    hosts = {r: host for r, (host, _, _) in t.ranks.items() if host}
    hosts.update({r: host for r, (host, _, _) in t.info.items()})
    if len(hosts) == npus:
        counts = Counter(hosts.values())
        if len(set(counts.values())) == 1:
            return next(iter(counts.values())), "host names"
    if t.nodes and npus % t.nodes == 0:
        return npus // t.nodes, "the node count in the log"
    devices = [d for _, d, _ in t.ranks.values() if d >= 0] + [d for _, _, d in t.info.values()]
    if devices:
        per = max(devices) + 1
        if npus % per == 0:
            return per, "device indices"
    if t.ngpus > 1 and npus % t.ngpus == 0:
        return t.ngpus, "-g (GPUs per process)"
    return 0, ""


def read_nccl_log(
    path: str, op: str | None = None, npus: int | None = None, table: int | None = None
) -> NcclLog:
    """Parse an nccl-tests log; one line (UsageError) for anything that is not one.

    Launcher prefixes (``[1,0]<stdout>:``, Slurm's ``0:``), launcher noise, CRLF, a missing
    header or missing ``#`` are accepted. A log with several tables is read whole: the result is
    the table with the most NPUs (`table`, 1-based, picks one), with every table in ``runs``. The
    collective comes from `op`, else from the ``*_perf`` name in the log, else from the redop
    column (``none``: all_gather, else all_reduce). The NPU count comes from `npus`, else from
    NCCL INFO ``nranks``, the ``Rank N`` lines or busbw / algbw (`infer_npus`), whichever is larger
    (a cut "Using devices" list leaves fewer Rank lines than ranks).
    """
    text = _read_text(path)
    tables = read_tables(path, text)
    if not tables:
        raise UsageError(
            f"{path}: no nccl-tests table found (all_reduce_perf/all_gather_perf/reduce_scatter_perf)"
        )
    if table is not None and not 1 <= table <= len(tables):
        raise UsageError(f"{path}: --table {table} but the log has {len(tables)} table(s)")
    vendor = _vendor(text)
    envs = dict(_ENV.findall(text))
    runs = [
        _run(path, t, k, len(tables), op, npus, vendor, envs)
        for k, t in enumerate(tables, 1)
        if not table or k == table
    ]
    main = max(runs, key=lambda r: r.npus)  # the first of the largest
    main.runs = runs
    return main


def _run(path: str, t: _Table, k: int, tables: int, op, npus, vendor: str, envs: dict) -> NcclLog:
    rows, notes = t.rows, list(t.notes)
    if t.in_place_only:
        notes.append("only in-place columns: their times are fitted")
    source = "given"
    if op is None:
        found = sorted({PERF_NAMES.get(o, o) for o in t.ops})
        if len(found) > 1:
            raise UsageError(f"{path}: table {k} names several tests ({', '.join(found)}); give --op")
        if found:
            op, source = found[0], "header"
        else:
            op, source = ("all_gather" if rows[0].redop == "none" else "all_reduce"), "redop column"
    if op not in NCCL_OPS:
        raise UsageError(
            f"{path}: {op}_perf has no collective of that name in the model; "
            "use all_reduce, all_gather, reduce_scatter, alltoall or broadcast logs"
        )
    npus_source = "given"
    if npus is None:
        inferred = infer_npus(op, rows)
        listed = max(t.ranks) + 1 if t.ranks else 0
        nranks = max((n for _, n, _ in t.info.values()), default=0)
        if nranks >= 2:
            npus, npus_source = nranks, "NCCL INFO nranks"
        elif listed >= 2 and (inferred is None or inferred <= listed):
            npus, npus_source = listed, "Rank lines"
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
    names = Counter(name for _, _, name in t.ranks.values() if name)
    per_node, node_source = _per_node(t, npus)
    return NcclLog(
        path,
        op,
        npus,
        rows,
        source,
        npus_source,
        k,
        tables,
        notes,
        names.most_common(1)[0][0] if names else "",
        vendor,
        per_node,
        node_source,
        envs.get("NCCL_ALGO", ""),
        envs.get("NCCL_PROTO", ""),
    )
