"""PNG pictures with matplotlib: a trace's timelines, per-dim utilization, queue depth; a sweep's rows.

Every picture has labelled axes with units. Times are virtual microseconds since the collective
was issued.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .analysis import queue_levels
from .errors import UsageError
from .output import atomic_path
from .units import format_size


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def timeline(trace, collective: int, path: str, ranks: Sequence[int] = (0,), max_ranks: int = 8) -> str:
    """One row per dim (and per rank when several are asked for), one bar per stage, colored by chunk."""
    plt = _pyplot()
    ev = trace.events[trace.events["collective"] == collective]
    ranks = list(ranks)[:max_ranks]
    single = len(ranks) == 1
    n_dims = len(trace.topology_table)
    row = trace.collective_row(collective)
    chunks = max(1, row["chunks"])
    cmap = plt.get_cmap("viridis")
    rows = [(r, d) for r in ranks for d in range(n_dims)]
    fig, ax = plt.subplots(figsize=(12, 0.5 + 0.45 * len(rows)))
    for y, (r, d) in enumerate(rows):
        sel = ev[(ev["rank"] == r) & (ev["dim"] == d)]
        ax.broken_barh(
            list(zip(sel["start_us"], sel["end_us"] - sel["start_us"])),
            (y - 0.4, 0.8),
            facecolors=[cmap(c / max(1, chunks - 1)) for c in sel["chunk"]],
            edgecolor="white",
            linewidth=0.3,
        )
    ax.set_yticks(range(len(rows)), [f"dim {d}" if single else f"rank {r} dim {d}" for r, d in rows])
    ax.invert_yaxis()
    ax.set_xlabel("virtual time since issue (us)")
    who = f"rank {ranks[0]}" if single else f"ranks {', '.join(map(str, ranks))}"
    ax.set_title(
        f"{row['op']} {format_size(row['size_bytes'])}, {row['policy']}/{row['intra']}, {chunks} chunks "
        f"({who}); color = chunk index"
    )
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, chunks - 1))
    fig.colorbar(sm, ax=ax, label="chunk", pad=0.01)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def utilization_bars(rows: list[dict], path: str) -> str:
    """Per-dim utilization (busy / collective time) for each analyzed collective, side by side."""
    plt = _pyplot()
    n_dims = max(len(r["dims"]) for r in rows)
    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(3 + 1.8 * n_dims, 4.5 + 0.2 * len(rows)))
    for i, r in enumerate(rows):
        ax.bar(
            [d + (i - (len(rows) - 1) / 2) * width for d in range(len(r["dims"]))],
            [100 * d["utilization"] for d in r["dims"]],
            width,
            label=f"{os.path.basename(r['trace'])}#{r['collective']} {format_size(r['size_bytes'])} "
            f"{r['policy']}/{r['intra']} ({100 * r['utilization']:.1f} % overall)",
        )
    ax.set_xticks(range(n_dims), [f"dim {d}" for d in range(n_dims)])
    ax.set_ylabel("dim busy time / collective time (%)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def queue_depth(trace, collective: int, path: str, rank: int = 0) -> str:
    """Stages waiting in each dim's queue over time (queued, not yet started)."""
    plt = _pyplot()
    ev = trace.events[(trace.events["collective"] == collective) & (trace.events["rank"] == rank)]
    fig, ax = plt.subplots(figsize=(12, 3.5))
    for d in range(len(trace.topology_table)):
        sel = ev[ev["dim"] == d]
        times, levels = queue_levels(sel["queued_us"], sel["start_us"])
        ax.step(np.concatenate([[0.0], times]), np.concatenate([[0], levels]), where="post", label=f"dim {d}")
    row = trace.collective_row(collective)
    ax.set_xlabel("virtual time since issue (us)")
    ax.set_ylabel("stages waiting")
    ax.set_title(
        f"queue depth per dim: {row['op']} {format_size(row['size_bytes'])}, {row['policy']}/{row['intra']}, "
        f"{row['chunks']} chunks, rank {rank}"
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


# Short names of a sweep's columns, with their axis labels (`sweep_figure`).
SWEEP_COLUMNS = {
    "size": ("size_bytes", "size per NPU (bytes)"),
    "time": ("time_us", "time (us)"),
    "ideal": ("ideal_us", "ideal time (us)"),
    "busbw": ("busbw_gbps", "busbw (GB/s, 2^30 B)"),
    "algbw": ("algbw_gbps", "algbw (GB/s, 2^30 B)"),
    "util": ("utilization", "utilization (ideal / actual)"),
    "chunks": ("chunks", "chunks"),
    "iteration": ("iteration_us", "iteration time (us)"),
}
LABELS = dict(SWEEP_COLUMNS.values()) | {"requested_chunks": "chunks (requested)"}
# Columns that say which run a row is (the grid of a sweep), in the order they split lines.
GRID_COLUMNS = ("policy", "intra", "topology", "op", "size_bytes", "requested_chunks", "chunks", "dtype",
                "network", "scheduler", "workload", "npus")  # fmt: skip
SCALES = ("auto", "log", "linear")  # --logx, --logy
MAX_LINES = 200  # lines in one figure; more are refused (no palette keeps them apart)
MAX_FACETS = 64  # axes in one figure (--col times --row values)
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">")
HATCHES = ("", "//", "..", "xx", "\\\\", "++", "oo", "--", "||", "**")


def sweep_column(name: str) -> tuple[str, str]:
    """(column, axis label) of a short name (`SWEEP_COLUMNS`) or of a column named as it is."""
    column = SWEEP_COLUMNS.get(name, (name, name))[0]
    return column, LABELS.get(column, column)


def is_number(value: object) -> bool:
    """Whether a cell reads as a finite number ("16" of a CSV as well as 16 of a JSON file)."""
    try:
        return math.isfinite(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def values_of(rows: Sequence[dict], column: str) -> list[str]:
    """A column's distinct values as text: numbers in increasing order, others as the rows first give them."""
    values = list(dict.fromkeys(str(r.get(column)) for r in rows))
    return sorted(values, key=float) if all(is_number(v) for v in values) else values


def grid_columns(rows: Sequence[dict]) -> tuple[str, ...]:
    """The columns that name a row's run: `GRID_COLUMNS`, less a policy's own chunk choice.

    A row of `model` or `run` has `requested_chunks` (the grid) and `chunks` (what the policy
    took); a row of `train` has `chunks` only, its grid's.
    """
    chosen = "requested_chunks" in rows[0]
    return tuple(c for c in GRID_COLUMNS if not (c == "chunks" and chosen))


def line_fields(rows: Sequence[dict], hue: str | None, given: Sequence[str | None] = ()) -> list[str]:
    """The columns that tell a figure's lines apart: `hue` first, then the grid columns that vary.

    A grid column counts when it still varies among rows alike in the columns before it and in
    `given` (the x axis and the facets): one that follows from them, such as a policy's intra,
    adds nothing. So no line joins points of different runs.
    """
    fields = [hue] if hue else []
    known = [c for c in given if c]
    for column in grid_columns(rows):
        if column in fields or column in known:
            continue
        groups: dict[tuple, set[str]] = {}
        for r in rows:
            groups.setdefault(tuple(str(r.get(f)) for f in (*known, *fields)), set()).add(str(r.get(column)))
        if any(len(seen) > 1 for seen in groups.values()):
            fields.append(column)
    return fields


@dataclass(frozen=True)
class SweepPlot:
    """What `sweep_figure` draws: columns (not short names) of the rows, and the axis scales.

    Attributes:
        x, y: the axes' columns; an x that is not a number everywhere gives bars.
        hue: the column whose values get a colour each (None: the first that varies).
        col, row: facet columns (one axes per value), or None.
        logx, logy: ``log`` or ``linear`` (`scales` turns ``auto`` into one of them).
        title: the figure's title, or None.
    """

    x: str
    y: str
    hue: str | None = None
    col: str | None = None
    row: str | None = None
    logx: str = "linear"
    logy: str = "linear"
    title: str | None = None

    def to_dict(self) -> dict:
        """Plain values, e.g. for a log line."""
        return asdict(self)


def is_categorical(rows: Sequence[dict], column: str) -> bool:
    """Whether a column is drawn as categories (bars on x): some value does not read as a number.

    NaN and inf read as numbers here: a numeric column with such a value is refused, not drawn
    as categories.
    """
    for r in rows:
        try:
            float(r.get(column))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return True
    return False


LOG_SPAN = 10  # ``auto`` draws a log axis when the values span this factor or more
LOG_COLUMNS = ("size_bytes", "requested_chunks", "chunks")  # and every time (``*_us``)


def auto_log(rows: Sequence[dict], column: str) -> bool:
    """Whether ``auto`` draws a column on a log axis: sizes, chunk counts and times spanning 10x."""
    if column not in LOG_COLUMNS and not column.endswith("_us"):
        return False
    values = [float(r[column]) for r in rows if is_number(r.get(column)) and float(r[column]) > 0]
    return bool(values) and max(values) >= LOG_SPAN * min(values)


def scales(rows: Sequence[dict], x: str, y: str, logx: str, logy: str) -> tuple[str, str, list[str]]:
    """The x and y scales (``log`` or ``linear``) of --logx/--logy and notes on what ``auto`` chose.

    ``auto`` takes a log axis for sizes, chunk counts and times that span a factor of 10 or
    more (`auto_log`), and a linear one (with a note) when a value is not positive; an asked-for
    ``log`` axis with such a value, or on categories, is a `UsageError`.
    """
    chosen, notes = [], []
    for axis, column, mode in (("x", x, logx), ("y", y, logy)):
        if mode not in SCALES:
            raise UsageError(f"--log{axis} takes one of {', '.join(SCALES)}, got {mode!r}")
        categorical = axis == "x" and is_categorical(rows, column)
        bad = next((r.get(column) for r in rows if is_number(r.get(column)) and float(r[column]) <= 0), None)
        if mode == "log" and (categorical or bad is not None):
            why = "its values are categories" if categorical else f"{column} has the value {bad}"
            raise UsageError(f"--log{axis} log: {why}, and a log axis needs positive numbers")
        log = mode == "log" or (mode == "auto" and not categorical and auto_log(rows, column))
        if log and bad is not None:
            notes.append(
                f"{axis} axis linear: {column} has the value {bad} (a log axis needs positive numbers)"
            )
            log = False
        chosen.append("log" if log else "linear")
    return chosen[0], chosen[1], notes


@dataclass
class Line:
    """One line (or one set of bars) of a sweep figure: its values of the line fields and points."""

    key: tuple[str, ...]
    label: str
    points: list[tuple[object, float]]


def sweep_lines(rows: Sequence[dict], x: str, y: str, fields: Sequence[str]) -> dict[str, list[tuple]]:
    """The lines of one axes: label -> (x, y) points in x order (numeric x) or in file order.

    Rows alike in every field are one line; two rows of one line at the same x would make it
    jump, so they are a `UsageError` naming what to filter or split by.
    """
    return {line.label: line.points for line in _lines(rows, x, y, fields)}


def _lines(rows: Sequence[dict], x: str, y: str, fields: Sequence[str]) -> list[Line]:
    numeric = not is_categorical(rows, x)
    lines: dict[tuple[str, ...], Line] = {}
    seen: dict[tuple, int] = {}
    for i, r in enumerate(rows, start=1):
        key = tuple(str(r.get(f)) for f in fields)
        label = ", ".join(key) or y  # (the legend's title names the fields)
        at = float(r[x]) if numeric else str(r[x])
        if (key, at) in seen:
            raise UsageError(
                f"rows {seen[key, at]} and {i} are one point of the line {label!r} at {x} {r[x]} (they "
                "differ in no grid column): keep one with --where KEY=VALUE, or split with --hue/--col/--row"
            )
        seen[key, at] = i
        lines.setdefault(key, Line(key, label, [])).points.append((at, float(r[y])))
    for line in lines.values():
        if numeric:
            line.points.sort(key=lambda p: float(p[0]))  # type: ignore[arg-type]
    return list(lines.values())


def palette(n: int) -> list:
    """`n` colours, no two alike: tab10, tab20, or n evenly spaced steps of turbo."""
    plt = _pyplot()
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [plt.get_cmap("turbo")(v) for v in np.linspace(0.05, 0.95, n)]


def line_styles(rows: Sequence[dict], fields: Sequence[str]) -> dict[tuple[str, ...], tuple]:
    """(colour, line style, marker, hatch) of each line key, in legend order.

    The colour follows the first field (the hue; `palette`: no colour twice), the line style the
    second, the marker the rest (and the line style's wraps past four values); bars take a
    hatch instead. No two keys look alike while one colour holds at most 40 lines (10 bars).
    """
    order = [values_of(rows, f) for f in fields]
    colours = palette(len(order[0]) if order else 1)
    keys = sorted(
        dict.fromkeys(tuple(str(r.get(f)) for f in fields) for r in rows),
        key=lambda k: [values.index(v) for values, v in zip(order, k)],
    )  # (grouped by hue, then by the next field: the legend's order)
    rest = list(dict.fromkeys(k[2:] for k in keys))
    wraps = math.ceil(len(order[1]) / len(LINE_STYLES)) if len(order) > 1 else 1
    styles = {}
    for key in keys:
        colour = colours[order[0].index(key[0])] if order else colours[0]
        a = order[1].index(key[1]) if len(key) > 1 else 0
        b = rest.index(key[2:]) * wraps + a // len(LINE_STYLES)
        style = (colour, LINE_STYLES[a % len(LINE_STYLES)], MARKERS[b % len(MARKERS)])
        hatch = HATCHES[(a + b * len(LINE_STYLES)) % len(HATCHES)]
        styles[key] = (*style, hatch)
    return styles


def _facet_values(rows: Sequence[dict], column: str | None) -> list[str]:
    """The values of a facet column, or one blank facet without one."""
    return values_of(rows, column) if column else [""]


def sweep_figure(rows: Sequence[dict], spec: SweepPlot) -> Any:
    """The figure of a sweep: y against x, one line per run of the grid, an axes per facet.

    Colours follow `spec.hue` (never repeated in a figure), line styles and markers the other
    grid columns that vary (`line_fields`); the legend sits outside the axes, at the right. A
    categorical x gives grouped bars. Returns the matplotlib Figure (the caller saves or closes it).
    """
    plt = _pyplot()
    fields = line_fields(rows, spec.hue, given=(spec.x, spec.col, spec.row))
    styles = line_styles(rows, fields)
    if len(styles) > MAX_LINES:
        raise UsageError(
            f"{len(styles)} lines in one figure (by {', '.join(fields)}); at most {MAX_LINES}: "
            "keep fewer with --where KEY=VALUE, or spread them with --col and --row"
        )
    row_values, col_values = _facet_values(rows, spec.row), _facet_values(rows, spec.col)
    if len(row_values) * len(col_values) > MAX_FACETS:
        raise UsageError(
            f"{len(row_values)} x {len(col_values)} facets (--row {spec.row}, --col {spec.col}); at most "
            f"{MAX_FACETS} axes in one figure: keep fewer with --where KEY=VALUE"
        )
    categorical = is_categorical(rows, spec.x)
    categories = values_of(rows, spec.x) if categorical else []
    fig, axes = plt.subplots(
        len(row_values),
        len(col_values),
        figsize=(2.0 + 5.0 * len(col_values), 1.0 + 3.6 * len(row_values)),
        squeeze=False,
        sharex=True,
        sharey=True,
        layout="constrained",
    )
    handles: dict[tuple[str, ...], Any] = {}
    labels: dict[tuple[str, ...], str] = {}
    for (i, rv), (j, cv) in itertools.product(enumerate(row_values), enumerate(col_values)):
        ax = axes[i][j]
        part = [r for r in rows if (not spec.row or str(r.get(spec.row)) == rv)
                and (not spec.col or str(r.get(spec.col)) == cv)]  # fmt: skip
        lines = _lines(part, spec.x, spec.y, fields) if part else []
        width = 0.8 / max(1, len(styles))
        for line in lines:
            colour, linestyle, marker, hatch = styles[line.key]
            if categorical:
                k = list(styles).index(line.key)
                at = [categories.index(str(a)) + (k - (len(styles) - 1) / 2) * width for a, _ in line.points]
                artist = ax.bar(at, [b for _, b in line.points], width, color=colour, hatch=hatch,
                                edgecolor="black", linewidth=0.4, label=line.label)  # fmt: skip
            else:
                (artist,) = ax.plot([float(a) for a, _ in line.points], [b for _, b in line.points],  # type: ignore[arg-type]
                                    color=colour, linestyle=linestyle, marker=marker, markersize=4,
                                    label=line.label)  # fmt: skip
            handles.setdefault(line.key, artist)
            labels[line.key] = line.label
        facet = ", ".join(f"{c} {v}" for c, v in ((spec.row, rv), (spec.col, cv)) if c)
        if facet:
            ax.set_title(facet, fontsize=9)
        _axes_look(ax, rows, spec, categories, last_row=i == len(row_values) - 1, first_col=j == 0)
    if spec.title:
        fig.suptitle(spec.title)
    keys = [k for k in styles if k in handles]
    if len(keys) > 1 or (keys and fields):
        fig.legend([handles[k] for k in keys], [labels[k] for k in keys], loc="outside right upper",
                   fontsize=7, handlelength=3.5, ncols=math.ceil(len(keys) / 40),
                   title=", ".join(fields) or None, title_fontsize=7)  # fmt: skip
    return fig


def _axes_look(ax: Any, rows: Sequence[dict], spec: SweepPlot, categories: list[str], last_row: bool,
               first_col: bool) -> None:  # fmt: skip
    """Scales, ticks, labels and grid of one axes."""
    if categories:
        ax.set_xticks(range(len(categories)), categories, rotation=30, fontsize=7, ha="right")
    elif spec.logx == "log":
        ax.set_xscale("log", base=2 if spec.x in LOG_COLUMNS else 10)
    if spec.logy == "log":
        ax.set_yscale("log")
    if spec.x == "size_bytes" and not categories:
        ticks = sorted({float(r[spec.x]) for r in rows})
        ax.set_xticks(ticks, [format_size(int(t)) for t in ticks], rotation=45, fontsize=7)
    elif spec.x in LOG_COLUMNS and not categories:
        ticks = sorted({float(r[spec.x]) for r in rows})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    if last_row:
        ax.set_xlabel(LABELS.get(spec.x, spec.x))
    if first_col:
        ax.set_ylabel(LABELS.get(spec.y, spec.y))
    ax.grid(alpha=0.3)


def sweep_plot(rows: Sequence[dict], spec: SweepPlot, path: str) -> str:
    """`sweep_figure` saved as a PNG at `path` (atomically)."""
    plt = _pyplot()
    fig = sweep_figure(rows, spec)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path


Y_DEFAULTS = ("busbw_gbps", "iteration_us", "time_us")  # the first a file has is its default y


def default_axes(
    rows: Sequence[dict],
    x: str | None = None,
    y: str | None = None,
    hue: str | None = None,
    facets: Sequence[str | None] = (),
) -> tuple[str, str, str | None]:
    """The axes not given (None), chosen from the rows: what a reader of the file would plot.

    y: busbw of collective rows, else iteration time (a `train` file), else time. x: the size
    when sizes vary, else the first grid column that varies (numbers before names: chunk counts
    before topologies), else the policy (bars). hue: the first grid column that varies for one
    x (and one facet, `facets` being the --col and --row columns).
    """
    first = rows[0]
    if y is None:
        y = next((c for c in Y_DEFAULTS if c in first), None)
        if y is None:
            raise UsageError(f"the rows have none of {', '.join(Y_DEFAULTS)}: name the y axis with --y")
    varying = [c for c in grid_columns(rows) if c in first and c != y and len(values_of(rows, c)) > 1]
    if x is None:
        numeric = [c for c in varying if not is_categorical(rows, c)]
        x = next(iter(numeric + varying + [c for c in ("policy",) if c in first]), None)
        if x is None:
            raise UsageError("no grid column of the rows varies: name the x axis with --x")
    if hue is None:
        hue = next(iter(line_fields(rows, None, given=(x, *facets))), None)
    return x, y, hue
