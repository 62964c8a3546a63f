"""The HDF5 trace of a run: every stage event, the broadcast schedule, summaries and metadata.

One file per run, written by rank 0 after the ranks' event tables are gathered (PyPI h5py has no
parallel HDF5). It is written under a temporary name and renamed once complete, so a crash
never leaves a file at the trace path that looks whole. Plain h5py or h5dump read it; units are
in the column names.

Layout (format version 2)::

    /                  attrs: format, format_version, complete, transport, topology, topology_label,
                              npus, clock, time_scale, active_per_dim, endpoint_delay_ns, compat,
                              network, mtu_bytes (the packet rule's packet; 0 under another rule, absent
                              in traces that predate it), command_line, start_time, versions (JSON)
    /topology          dim, kind, npus, bandwidth_gbps, latency_ns, algorithm
    /collectives       collective, op, policy, intra, dtype, redop, size_bytes, count, chunks,
                       dims_mask, issued_us, time_us, ideal_us, utilization, algbw_gbps, busbw_gbps,
                       wrong (-1: not checked), wall_s
    /schedule          collective, chunk, order[n_dims], lo, hi, fused  (the schedule as broadcast:
                       orders, bounds of each chunk (elements; priced words for a policy that
                       sizes its chunks, `collectives.element_bounds`), and 1 where an
                       all-reduce's last dim ran as one AR stage)
    /summary_dims      collective, dim, busy_us, idle_us, bytes, stages, utilization
    /summary_links     collective, link, dim (-1: a shared port), bytes, busy_us, busy_pct: one NPU's
                       physical links under a sharing rule (`network`); empty under ideal, absent in
                       traces that predate it
    /events            rank, collective, chunk, stage, n_stages, op, dim, full_elems, bytes, slot, dim_seq,
                       queued_us, start_us, end_us, wall_start_s, wall_end_s

Every dataset carries a ``sha256`` attribute, the digest of its bytes; a reader verifies it and
the ranges of what it reads, so a damaged or forged file is refused with one line.

Event times are virtual microseconds since the collective was issued; wall times are seconds
since the rank's transport started. The model writes one NPU's events (rank 0), which stand for
every NPU of a symmetric collective. A trace without a ``network`` attribute ran under ``ideal``.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import platform
import sys
from collections.abc import Callable

import numpy as np

from .child import in_child
from .collectives import PRICED_ITEMSIZE
from .cost import CostModel
from .engine import Engine
from .errors import UsageError
from .limits import MAX_MTU_BYTES, MAX_SIZE_BYTES, MAX_TIME_NS
from .output import atomic_path
from .results import CollectiveResult
from .timing.links import physical_links
from .timing.rules import IDEAL, rule_names
from .topology import parse_inline
from .version import __version__

FORMAT = "themis-mpi-trace"
FORMAT_VERSION = 2  # 2: a sha256 attribute on every dataset

EVENT_DTYPE = np.dtype(
    [
        ("rank", "<i4"),
        ("collective", "<i4"),
        ("chunk", "<i4"),
        ("stage", "<i4"),
        ("n_stages", "<i4"),
        ("op", "S3"),
        ("dim", "<i4"),
        ("full_elems", "<i8"),
        ("bytes", "<i8"),
        ("slot", "<i4"),
        ("dim_seq", "<i8"),
        ("queued_us", "<f8"),
        ("start_us", "<f8"),
        ("end_us", "<f8"),
        ("wall_start_s", "<f8"),
        ("wall_end_s", "<f8"),
    ]
)


def printable(text: str) -> str:
    """Text that encodes as UTF-8: undecodable bytes of a command line become backslash escapes."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def versions() -> dict:
    """Versions of the package, Python, numpy, mpi4py, h5py and the MPI library."""
    out = {"themis-mpi": __version__, "python": platform.python_version(), "numpy": np.__version__}
    try:
        import mpi4py

        out["mpi4py"] = mpi4py.__version__
        from mpi4py import MPI

        out["MPI"] = MPI.Get_library_version().splitlines()[0].strip()
        out["MPI std"] = "{}.{}".format(*MPI.Get_version())
    except ImportError as exc:  # pragma: no cover - mpi4py is a dependency
        out["mpi4py"] = f"unavailable ({exc})"
    try:
        import h5py

        out["h5py"] = h5py.__version__
        out["HDF5"] = h5py.version.hdf5_version
    except ImportError as exc:  # pragma: no cover - h5py is a dependency
        out["h5py"] = f"unavailable ({exc})"
    return out


def event_table(engine, cost, rank: int, coll_index: int, t0_wall_s: float = 0.0) -> np.ndarray:
    """This rank's stage events of one engine run as a structured array."""
    runs = engine.records
    out = np.zeros(len(runs), dtype=EVENT_DTYPE)
    for i, r in enumerate(runs):
        s = r.stage
        issued = engine.collectives[s.coll].issued_ns
        out[i] = (
            rank,
            coll_index + s.coll,
            s.chunk,
            s.index,
            s.n_stages,
            s.op.encode(),
            s.dim,
            s.full_elems,
            cost.stage_bytes(s.dim, s.op, s.full_elems),
            r.slot,
            r.dim_seq,
            (r.queued_ns - issued) / 1e3,
            (r.start_ns - issued) / 1e3,
            (r.end_ns - issued) / 1e3,
            r.wall_start_s - t0_wall_s,
            r.wall_end_s - t0_wall_s,
        )
    return out


class TraceRecorder:
    """Collects what a run did, collective by collective, and writes it as one HDF5 file.

    Args:
        topology: the network.
        transport: "mpi" or "model".
        settings: run-wide attributes (clock, time_scale, active_per_dim, endpoint_delay_ns).
    """

    def __init__(self, topology, transport: str, **settings):
        self.topology = topology
        self.transport = transport
        self.settings = settings
        self.rows: list[CollectiveResult] = []
        self.orders: list[np.ndarray] = []
        self.bounds: list[np.ndarray] = []
        self.fused: list[int] = []
        self.events: list[np.ndarray] = []
        self.start_time = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    def add(
        self,
        result: CollectiveResult,
        orders: np.ndarray,
        events: np.ndarray,
        bounds: np.ndarray | None = None,
        fused: int = False,
    ) -> None:
        """Record one collective: its result, schedule (orders, bounds, fused) and this rank's events."""
        self.rows.append(result)
        self.orders.append(np.asarray(orders, dtype=np.int32))
        self.bounds.append(
            np.linspace(0, result.count, len(orders) + 1).astype(np.int64) if bounds is None else bounds
        )
        self.fused.append(fused)
        self.events.append(events)

    def add_run(self, result: CollectiveResult, engine: Engine, rank: int = 0) -> None:
        """Record the collective an engine just ran, with this rank's events."""
        run = engine.collectives[0]
        cost = CostModel(
            self.topology,
            PRICED_ITEMSIZE,
            self.settings.get("endpoint_delay_ns", 0.0),
            self.settings.get("compat", ""),
        )
        events = event_table(engine, cost, rank, self.n_collectives, engine.t0_wall_s)
        bounds = run.bounds if run.schedule_bounds is None else run.schedule_bounds
        self.add(result, run.orders, events, bounds, run.fuse_last)

    @property
    def n_collectives(self) -> int:
        """Collectives recorded so far (the next one's index)."""
        return len(self.rows)

    def my_events(self) -> np.ndarray:
        """This rank's events of every recorded collective, as one table."""
        return np.concatenate(self.events) if self.events else np.zeros(0, EVENT_DTYPE)

    def write(self, path: str, events: np.ndarray, service: Callable[[], None] | None = None) -> None:
        """Write the trace to a temporary name, in a child process, and rename it to `path` once complete.

        `service` is called while the child writes (an MPI rank answers liveness pings meanwhile).
        """
        with atomic_path(path) as tmp:
            in_child(
                lambda: self._write_file(tmp, events), f"cannot write trace {path}", WRITE_TIMEOUT_S, service
            )

    def _write_file(self, path: str, events: np.ndarray) -> None:
        import h5py

        with h5py.File(path, "w") as f:
            self._write(f, events)
            for name in (*DATASETS, *OPTIONAL_DATASETS):
                f[name].attrs["sha256"] = checksum(f[name][()])
            f.attrs["complete"] = 1

    def _write(self, f, events: np.ndarray) -> None:
        topo = self.topology
        n = len(topo.dims)
        f.attrs.update(
            {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "complete": 0,
                "transport": self.transport,
                "topology": topo.spec(),
                "topology_label": topo.label(),
                "npus": topo.npus,
                "command_line": printable(" ".join(sys.argv)),
                "start_time": self.start_time,
                "versions": json.dumps(versions()),
                **self.settings,
            }
        )
        dims = np.array(
            [
                (d, dim.kind, dim.npus, dim.bandwidth_gbps, dim.latency_ns, dim.algorithm)
                for d, dim in enumerate(topo.dims)
            ],
            dtype=[
                ("dim", "<i4"),
                ("kind", "S16"),
                ("npus", "<i4"),
                ("bandwidth_gbps", "<f8"),
                ("latency_ns", "<f8"),
                ("algorithm", "S16"),
            ],
        )
        f.create_dataset("topology", data=dims)
        colls = np.zeros(len(self.rows), dtype=COLLECTIVE_DTYPE)
        summary = np.zeros(len(self.rows) * n, dtype=SUMMARY_DTYPE)
        for i, r in enumerate(self.rows):
            mask = sum(1 << d for d in r.involved)
            colls[i] = (
                i,
                r.op,
                r.policy,
                r.intra,
                r.dtype,
                r.redop,
                r.size_bytes,
                r.count,
                r.chunks,
                mask,
                r.issued_us,
                r.time_us,
                r.ideal_us,
                r.utilization,
                r.algbw_gbps,
                r.busbw_gbps,
                -1 if r.wrong is None else r.wrong,
                r.wall_s,
            )
            for d, dim in enumerate(r.dims):
                summary[i * n + d] = (
                    i,
                    d,
                    dim.busy_us,
                    r.time_us - dim.busy_us,
                    dim.bytes,
                    dim.stages,
                    dim.utilization,
                )
        f.create_dataset("collectives", data=colls)
        f.create_dataset("summary_dims", data=summary)
        dim_of = {link.name: link.dim for link in physical_links(topo)}
        links = [
            (i, x.name, dim_of.get(x.name, -1), x.bytes, x.busy_pct * r.time_us / 100, x.busy_pct)
            for i, r in enumerate(self.rows)
            for x in r.links
        ]
        f.create_dataset("summary_links", data=np.array(links, dtype=LINK_DTYPE))
        sched_dtype = np.dtype(
            [
                ("collective", "<i4"),
                ("chunk", "<i4"),
                ("order", "<i4", (n,)),
                ("lo", "<i8"),
                ("hi", "<i8"),
                ("fused", "<i1"),
            ]
        )
        sched = np.zeros(sum(len(o) for o in self.orders), dtype=sched_dtype)
        k = 0
        for i, (orders, bounds) in enumerate(zip(self.orders, self.bounds)):
            for c, order in enumerate(orders):
                sched[k] = (i, c, order, bounds[c], bounds[c + 1], self.fused[i])
                k += 1
        f.create_dataset("schedule", data=sched)
        f.create_dataset("events", data=events, compression="gzip" if len(events) > 4096 else None)


COLLECTIVE_DTYPE = np.dtype(
    [
        ("collective", "<i4"),
        ("op", "S16"),
        ("policy", "S16"),
        ("intra", "S8"),
        ("dtype", "S8"),
        ("redop", "S4"),
        ("size_bytes", "<i8"),
        ("count", "<i8"),
        ("chunks", "<i4"),
        ("dims_mask", "<i8"),
        ("issued_us", "<f8"),
        ("time_us", "<f8"),
        ("ideal_us", "<f8"),
        ("utilization", "<f8"),
        ("algbw_gbps", "<f8"),
        ("busbw_gbps", "<f8"),
        ("wrong", "<i8"),
        ("wall_s", "<f8"),
    ]
)
SUMMARY_DTYPE = np.dtype(
    [
        ("collective", "<i4"),
        ("dim", "<i4"),
        ("busy_us", "<f8"),
        ("idle_us", "<f8"),
        ("bytes", "<i8"),
        ("stages", "<i4"),
        ("utilization", "<f8"),
    ]
)


LINK_DTYPE = np.dtype(
    [
        ("collective", "<i4"),
        ("link", "S24"),
        ("dim", "<i4"),
        ("bytes", "<f8"),
        ("busy_us", "<f8"),
        ("busy_pct", "<f8"),
    ]
)


class Trace:
    """A trace file read back: attributes and tables as numpy arrays."""

    def __init__(self, path: str):
        self.path = path
        (
            self.attrs,
            self.topology_table,
            self.collectives,
            self.schedule,
            self.summary,
            self.events,
            self.links,
        ) = _read(path)

    @property
    def network(self) -> str:
        """The sharing rule the run used (``ideal`` in traces that predate the attribute)."""
        return str(self.attrs.get("network", IDEAL))

    @property
    def mtu_bytes(self) -> int:
        """The packet the run used under the packet rule (0: another rule, or a trace that predates it)."""
        return int(self.attrs.get("mtu_bytes", 0))

    def topology(self):
        """The recorded topology."""
        topo = parse_inline(self.attrs["topology"])
        label = self.attrs.get("topology_label", "")
        return dataclasses.replace(topo, name=label if label != topo.spec() else "")  # (ports and all)

    def orders(self, collective: int) -> np.ndarray:
        """The chunk orders of one collective as broadcast, shape (chunks, n_dims)."""
        sel = self.schedule[self.schedule["collective"] == collective]
        return sel["order"][np.argsort(sel["chunk"])]

    def bounds_and_fused(self, collective: int) -> tuple[np.ndarray, int] | None:
        """The chunk bounds and fused flag of one collective (None in traces that predate them)."""
        names = self.schedule.dtype.names or ()
        if "lo" not in names:
            return None
        sel = self.schedule[self.schedule["collective"] == collective]
        sel = sel[np.argsort(sel["chunk"])]
        return np.append(sel["lo"], sel["hi"][-1:]).astype(np.int64), int(sel["fused"].max())

    def collective_row(self, collective: int) -> dict:
        """One row of /collectives as a dict of Python values."""
        row = self.collectives[self.collectives["collective"] == collective][0]
        return {k: (row[k].decode() if isinstance(row[k], bytes) else row[k].item()) for k in row.dtype.names}


READ_TIMEOUT_S = 60.0
WRITE_TIMEOUT_S = 3600.0
DATASETS = ("topology", "collectives", "schedule", "summary_dims", "events")  # every trace has them
OPTIONAL_DATASETS = ("summary_links",)  # newer traces have them


def checksum(table: np.ndarray) -> str:
    """SHA-256 of a table's bytes, stored with each dataset and verified on reading."""
    return hashlib.sha256(np.ascontiguousarray(table).tobytes()).hexdigest()


def _read(path: str):
    """Attributes and tables of a trace, read in a forked child (see `in_child`).

    Fuzzing showed that on some damaged files the HDF5 library aborts the process, or corrupts
    its state so that it aborts at exit. The child takes those blows; this process never opens
    the file with HDF5, and a crash or hang becomes a one-line error.
    """
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such trace file")
    return in_child(lambda: _read_file(path), f"{path}: damaged trace", READ_TIMEOUT_S)


def _read_file(path: str):
    import h5py

    try:
        f = h5py.File(path, "r")
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{path}: not a readable HDF5 file ({str(exc).splitlines()[0]}); truncated or not a trace"
        ) from None
    with f:
        return _read_open(path, f)


MAX_TIME_US = MAX_TIME_NS / 1e3  # a day: every time a trace holds


def _within(values: np.ndarray, lo: float, hi: float) -> bool:
    """Whether every value is a finite number in [lo, hi] (an empty column is)."""
    values = np.asarray(values, dtype=np.float64)
    return bool(np.isfinite(values).all() and (values >= lo).all() and (values <= hi).all())


def _check_ranges(path: str, attrs: dict, topology, collectives, schedule, summary, events) -> None:
    """Refuse a trace whose attributes or tables are out of their ranges (forged or damaged)."""

    def bad(what: str) -> UsageError:
        return UsageError(f"{path}: damaged trace ({what})")

    for key in ("topology", "npus", "transport", "active_per_dim", "endpoint_delay_ns"):
        if key not in attrs:
            raise bad(f"no {key!r} attribute")
    try:
        topo = parse_inline(str(attrs["topology"]))
    except UsageError as exc:
        raise bad(f"its topology: {exc}") from None
    n_dims, npus = len(topo.dims), topo.npus
    if int(attrs["npus"]) != npus or len(topology) != n_dims or not len(collectives):
        raise bad("its topology, NPU count or collectives do not agree")
    ids = collectives["collective"]
    if (
        (ids != np.arange(len(ids))).any()
        or (collectives["chunks"] < 1).any()
        or (collectives["count"] < 1).any()
    ):
        raise bad("collective ids, chunk counts or sizes out of range")
    if (collectives["dims_mask"] < 1).any() or (collectives["dims_mask"] >= 1 << n_dims).any():
        raise bad("involved dims out of range")
    if not _within(collectives["size_bytes"], 1, MAX_SIZE_BYTES) or not _within(
        collectives["count"], 1, MAX_SIZE_BYTES
    ):
        raise bad("collective sizes out of range")
    for column in ("issued_us", "time_us", "ideal_us", "algbw_gbps", "busbw_gbps", "utilization", "wall_s"):
        if not _within(collectives[column], 0, MAX_TIME_US):
            raise bad(f"collective {column} out of range")
    for column in ("busy_us", "idle_us", "utilization"):
        if not _within(summary[column], -MAX_TIME_US, MAX_TIME_US):
            raise bad(f"per-dim {column} out of range")
    if not _within(summary["bytes"], 0, MAX_SIZE_BYTES):
        raise bad("per-dim bytes out of range")
    orders = schedule["order"]
    if orders.ndim != 2 or orders.shape[1] != n_dims or (orders < 0).any() or (orders >= n_dims).any():
        raise bad("chunk orders out of range")
    times = (
        np.stack([events["queued_us"], events["start_us"], events["end_us"]])
        if len(events)
        else np.zeros((3, 0))
    )
    if (
        (events["rank"] < 0).any()
        or (events["rank"] >= npus).any()
        or (events["dim"] < 0).any()
        or (events["dim"] >= n_dims).any()
        or (events["collective"] < 0).any()
        or (events["collective"] >= len(ids)).any()
        or not _within(events["bytes"], 0, MAX_SIZE_BYTES)
        or not _within(times, 0, MAX_TIME_US)
        or (times[0] > times[1]).any()
        or (times[1] > times[2]).any()
    ):
        raise bad("events out of range")


def _read_open(path: str, f):
    """Validate an open trace file and read its attributes and tables."""
    if f.attrs.get("format") != FORMAT:
        raise UsageError(f"{path}: not a themis-mpi trace (no format={FORMAT!r} attribute)")
    if int(f.attrs.get("format_version", -1)) != FORMAT_VERSION:
        raise UsageError(
            f"{path}: trace format version {f.attrs.get('format_version')} is not "
            f"supported (this themis-mpi reads version {FORMAT_VERSION})"
        )
    if int(f.attrs.get("complete", 0)) != 1:
        raise UsageError(f"{path}: trace is marked incomplete (the run did not finish)")
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    missing = [name for name in DATASETS if name not in f]
    if missing:
        raise UsageError(f"{path}: damaged trace (no {', '.join(missing)} table)")
    names = [name for name in (*DATASETS, *OPTIONAL_DATASETS) if name in f]
    tables = [f[name][()] for name in names]
    for name, table in zip(names, tables):
        if f[name].attrs.get("sha256") != checksum(table):
            raise UsageError(f"{path}: damaged trace (the {name} table does not match its checksum)")
    for name, table, columns in (
        ("events", tables[4], EVENT_DTYPE.names),
        ("collectives", tables[1], COLLECTIVE_DTYPE.names),
    ):
        if table.dtype.names is None or set(columns or ()) - set(table.dtype.names):
            raise UsageError(f"{path}: damaged trace (the {name} table lacks columns)")
    links = tables[5] if len(tables) > 5 else np.zeros(0, LINK_DTYPE)
    if links.dtype.names is None or set(LINK_DTYPE.names or ()) - set(links.dtype.names):
        raise UsageError(f"{path}: damaged trace (the summary_links table lacks columns)")
    _check_ranges(path, attrs, *tables[:5])
    if str(attrs.get("network", IDEAL)) not in rule_names():
        raise UsageError(f"{path}: damaged trace (unknown network {attrs['network']!r})")
    if not 0 <= int(attrs.get("mtu_bytes", 0)) <= MAX_MTU_BYTES:
        raise UsageError(f"{path}: damaged trace (mtu_bytes out of range)")
    if (
        (links["collective"] < 0).any()
        or (links["collective"] >= len(tables[1])).any()
        or not _within(links["bytes"], 0, MAX_SIZE_BYTES)
        or not _within(links["busy_us"], 0, MAX_TIME_US)
        or not _within(links["busy_pct"], 0, 1e6)
    ):
        raise UsageError(f"{path}: damaged trace (per-link figures out of range)")
    return (attrs, *tables[:5], links)
