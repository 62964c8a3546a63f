"""Rules of `themis-mpi plot`: a sweep's rows as a picture, one line per run of the grid.

The figures are checked through matplotlib's artists: colours and line styles of the lines,
the legend's place against the axes and the data, the number of axes and bars.
"""

import json

import pytest
from harness import in_process
from matplotlib.colors import to_hex

from themis_mpi.cli.parser import PLOT_SCALES
from themis_mpi.cli.plot import read_rows, where
from themis_mpi.errors import UsageError
from themis_mpi.plots import (
    SCALES,
    SweepPlot,
    default_axes,
    line_fields,
    palette,
    scales,
    sweep_figure,
    sweep_lines,
)

README_SWEEP = ["model", "-t", "2x2x2,4x2", "-b", "64K", "-e", "64M", "-f", "4", "-p", "all", "-c", "16"]
TRAIN = ["train", "traces/gnmt.txt", "-p", "both"]


def rows(policy, topology, chunks, sizes=(1, 2, 4)):
    return [{"policy": policy, "topology": topology, "requested_chunks": chunks, "size_bytes": s,
             "busbw_gbps": s * 10.0} for s in sizes]  # fmt: skip


def lines(data, hue="policy", x="size_bytes"):
    return sweep_lines(data, x, "busbw_gbps", line_fields(data, hue, given=(x,)))


@pytest.fixture(scope="module")
def readme_rows(tmp_path_factory):
    """The rows of the README's sweep (`model ... -p all -c 16 --csv`)."""
    path = tmp_path_factory.mktemp("readme") / "sweep.csv"
    proc = in_process([*README_SWEEP, "-q", "--csv", path])
    assert proc.returncode == 0, proc.stderr
    return read_rows(str(path))


@pytest.fixture(scope="module")
def train_rows(tmp_path_factory):
    """`train --json` of gnmt on two topologies and two chunk counts, merged as a shell loop would."""
    merged = []
    folder = tmp_path_factory.mktemp("train")
    for topology in ("2x2x2", "4x2"):
        for chunks in ("4", "16"):
            path = folder / f"{topology}-{chunks}.json"
            proc = in_process([*TRAIN, "-t", topology, "-c", chunks, "--json", path])
            assert proc.returncode == 0, proc.stderr
            merged += json.loads(path.read_text())
    (folder / "out.json").write_text(json.dumps(merged))
    return folder / "out.json"


def test_one_line_per_policy_and_per_topology_that_varies():
    """Two topologies under one policy are two lines; a column that never varies names no line."""
    found = lines(rows("baseline", "A", 16) + rows("baseline", "B", 16) + rows("themis", "A", 16))
    assert sorted(found) == ["baseline, A", "baseline, B", "themis, A"]
    assert found["themis, A"] == [(1.0, 10.0), (2.0, 20.0), (4.0, 40.0)]


def test_requested_chunks_split_lines_but_chosen_ones_do_not():
    """-c 16,64 gives a line per requested count; a policy's own chunk choice (chunks) does not."""
    data = rows("themis", "A", 16) + rows("themis", "A", 64)
    data[0]["chunks"], data[1]["chunks"] = 3, 7
    assert sorted(lines(data)) == ["themis, 16", "themis, 64"]


def test_a_column_that_follows_from_the_hue_adds_no_line_style():
    """The intra of each policy (fifo for baseline, scf for themis) is not a field of its own."""
    data = rows("baseline", "A", 16) + rows("themis", "A", 16)
    for r in data:
        r["intra"] = "fifo" if r["policy"] == "baseline" else "scf"
    assert line_fields(data, "policy", given=("size_bytes",)) == ["policy"]
    assert line_fields(data, "topology", given=("size_bytes",)) == ["topology", "policy"]


def test_two_rows_at_one_point_of_a_line_are_refused():
    """Rows alike in every grid column at one x would make a line jump: one line naming --where."""
    with pytest.raises(UsageError, match="--where"):
        lines(rows("themis", "A", 16) * 2)


@pytest.mark.parametrize("n", [3, 10, 15, 20, 40])
def test_the_palette_never_repeats_a_colour(n):
    assert len({to_hex(c) for c in palette(n)}) == n


def test_the_readme_sweep_has_a_colour_and_style_pair_per_line_and_a_legend_off_the_data(readme_rows):
    """Every (policy, topology) line has its own colour/line-style pair; the legend covers no axes."""
    x, y, hue = default_axes(readme_rows)
    assert (x, y, hue) == ("size_bytes", "busbw_gbps", "policy")
    runs = {(r["policy"], r["topology"]) for r in readme_rows}
    fig = sweep_figure(readme_rows, SweepPlot(x, y, hue, logx="log"))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    drawn = [line for line in ax.get_lines() if len(line.get_xdata())]
    assert len(drawn) == len(runs) > 10
    assert len({(to_hex(line.get_color()), line.get_linestyle()) for line in drawn}) == len(runs)
    assert len({to_hex(line.get_color()) for line in drawn}) == len({p for p, _ in runs})  # colour = policy
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    assert len(legend.get_texts()) == len(runs)
    assert not box.overlaps(ax.get_window_extent(renderer))
    for line in drawn:
        for px, py in ax.transData.transform(line.get_xydata()):
            assert not box.contains(px, py)


def test_hue_topology_colours_by_topology_only(readme_rows):
    """--hue topology: one colour per topology; the policies differ by line style, then marker."""
    fig = sweep_figure(readme_rows, SweepPlot("size_bytes", "busbw_gbps", "topology", logx="log"))
    (ax,) = fig.axes
    drawn = ax.get_lines()
    assert len({to_hex(line.get_color()) for line in drawn}) == len({r["topology"] for r in readme_rows})
    looks = {(to_hex(line.get_color()), line.get_linestyle(), line.get_marker()) for line in drawn}
    assert len(looks) == len(drawn) == len({(r["policy"], r["topology"]) for r in readme_rows})


def test_facets_make_an_axes_per_value(readme_rows):
    """--col topology and --row op: topologies x ops axes, each with its own rows only."""
    fig = sweep_figure(readme_rows, SweepPlot("size_bytes", "busbw_gbps", "policy", col="topology", row="op"))
    topologies = {r["topology"] for r in readme_rows}
    assert len(fig.axes) == len(topologies) * len({r["op"] for r in readme_rows})
    assert sorted(ax.get_title().split()[-1] for ax in fig.axes) == sorted(topologies)
    policies = {r["policy"] for r in readme_rows}
    assert all(len(ax.get_lines()) == len(policies) for ax in fig.axes)


def test_where_filters_by_value_number_and_size(readme_rows):
    """Equal text, equal numbers ("16" and 16.0), sizes as 64K; a key twice takes either value."""
    kept = where(readme_rows, ["topology=4x2", "size=64K"], "sweep.csv")
    assert kept and all(r["topology"] == "4x2" and int(r["size_bytes"]) == 65536 for r in kept)
    assert len(where(readme_rows, ["requested_chunks=16.0"], "sweep.csv")) == len(readme_rows)
    both = where(readme_rows, ["policy=themis", "policy=baseline"], "sweep.csv")
    assert {r["policy"] for r in both} == {"themis", "baseline"}
    with pytest.raises(UsageError, match="no row of sweep.csv has it"):
        where(readme_rows, ["topology=9x9"], "sweep.csv")


def test_a_categorical_x_gives_bars(readme_rows):
    """--x policy: a bar per policy and topology, at the policies' ticks, coloured by topology."""
    part = where(readme_rows, ["size=64M"], "sweep.csv")
    x, y, hue = default_axes(part, x="policy")
    assert hue == "topology"
    fig = sweep_figure(part, SweepPlot(x, y, hue))
    (ax,) = fig.axes
    policies = list(dict.fromkeys(r["policy"] for r in part))
    assert [t.get_text() for t in ax.get_xticklabels()] == policies
    assert len(ax.patches) == len(part) and not ax.get_lines()
    assert sorted(p.get_height() for p in ax.patches) == sorted(float(r["busbw_gbps"]) for r in part)


def test_a_train_file_plots_iteration_time_against_what_varies(train_rows, tmp_path):
    """Merged `train --json` rows: x chunks, y iteration time, hue policy, topology as line style."""
    data = read_rows(str(train_rows))
    assert default_axes(data) == ("chunks", "iteration_us", "policy")
    assert line_fields(data, "policy", given=("chunks",)) == ["policy", "topology"]
    out = tmp_path / "out.png"
    proc = in_process(["plot", train_rows, "--out", out])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"# chose from {train_rows}: x chunks, y iteration_us, hue policy; line styles by topology",
        f"# wrote {out}: iteration against chunks by policy",
    ]


@pytest.mark.parametrize("fmt", ["csv", "json", "jsonl"])
def test_plot_writes_a_png_of_a_model_sweep(tmp_path, fmt):
    """`model --csv/--json/--jsonl` then `plot` writes a PNG (its magic bytes) and says so."""
    data = tmp_path / f"sweep.{fmt}"
    grid = ["-t", "2x2x2,4x2", "-b", "64K", "-e", "1M", "-f", "4", "-c", "4", "-q"]
    proc = in_process(["model", *grid, f"--{fmt}", str(data)])
    assert proc.returncode == 0, proc.stderr
    proc = in_process(["plot", str(data), "--x", "size", "--y", "time", "--hue", "policy"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"# wrote {tmp_path / 'sweep.png'}: time against size by policy"
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_auto_scales_fall_back_to_linear_with_a_note_and_log_refuses(tmp_path):
    """A time of 0 (no exposed communication): auto draws y linear and says why; --logy log is one line."""
    data = rows("themis", "A", 16, sizes=(1, 2, 4, 8, 16, 32, 64))
    for r in data:
        r["exposed_us"] = 0.0 if r["size_bytes"] == 1 else r["size_bytes"] * 100.0
    assert scales(data, "size_bytes", "exposed_us", "auto", "auto")[:2] == ("log", "linear")
    assert scales(data[1:], "size_bytes", "exposed_us", "auto", "auto")[:2] == ("log", "log")
    assert scales(data[:3], "size_bytes", "busbw_gbps", "auto", "auto")[:2] == ("linear", "linear")  # 4x
    with pytest.raises(UsageError, match="log axis needs positive numbers"):
        scales(data, "size_bytes", "exposed_us", "auto", "log")
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(data))
    proc = in_process(["plot", path, "--y", "exposed_us"])
    assert proc.returncode == 0, proc.stderr
    assert (
        "# note: y axis linear: exposed_us has the value 0.0 (a log axis needs positive numbers)"
        in proc.stdout
    )
    assert SCALES == PLOT_SCALES


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--y", "nope"], "has no column 'nope'"),
        (["--out", "{rows}"], "it is an input of this command"),
        (["--where", "topology"], "--where takes KEY=VALUE"),
        (["--where", "nope=1"], "has no column 'nope'"),
        (["--where", "size=11"], "no row of"),
        (["--y", "exposed_us", "--logy", "log"], "log axis needs positive numbers"),
        (["--x", "policy", "--logx", "log"], "its values are categories"),
        (["--col", "nope"], "has no column 'nope' (for --col)"),
        (["--col", "size", "--row", "busbw", "--logx", "linear"], "at most 64 axes in one figure"),
    ],
)
def test_plot_refuses_bad_input_with_one_line(tmp_path, args, message):
    """A missing column, a bad filter or scale, an output that is the input: one line, exit 2."""
    data = rows("baseline", "A", 4, sizes=range(1, 10))
    for r in data:
        r["exposed_us"] = r["size_bytes"] * 10.0 - 10.0
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(data))
    before = path.read_bytes()
    proc = in_process(["plot", str(path), *[a.format(rows=path) for a in args]])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert path.read_bytes() == before
