"""nccl-tests and rccl-tests logs: the tables, the collective, the NPU count, read as posted.

`read_nccl_log` reads the table that ``all_reduce_perf``, ``all_gather_perf`` and
``reduce_scatter_perf`` print (size, count, type, redop, root, then time, algbw, busbw and #wrong
out of place and in place). nccl-tests' GB/s are 1e9 B/s; this package's are 2^30 B/s.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..errors import UsageError
from ..limits import MAX_DIM_NPUS, MAX_SIZE_BYTES

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
