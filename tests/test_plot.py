"""Rules of `themis-mpi plot`: a sweep's rows as a picture, one line per run of the grid."""

import json

import pytest
from harness import in_process

from themis_mpi.plots import sweep_lines


def rows(policy, topology, chunks, sizes=(1, 2, 4)):
    return [{"policy": policy, "topology": topology, "requested_chunks": chunks, "size_bytes": s,
             "busbw_gbps": s * 10.0} for s in sizes]  # fmt: skip


def test_one_line_per_policy_and_per_topology_that_varies():
    """Two topologies under one policy are two lines; a column that never varies names no line."""
    lines = sweep_lines(
        rows("baseline", "A", 16) + rows("baseline", "B", 16) + rows("themis", "A", 16),
        "size",
        "busbw",
        "policy",
    )
    assert sorted(lines) == [
        "policy baseline, topology A",
        "policy baseline, topology B",
        "policy themis, topology A",
    ]
    assert lines["policy themis, topology A"] == [(1.0, 10.0), (2.0, 20.0), (4.0, 40.0)]


def test_requested_chunks_split_lines_but_chosen_ones_do_not():
    """-c 16,64 gives a line per requested count; a policy's own chunk choice (chunks) does not."""
    data = rows("themis", "A", 16) + rows("themis", "A", 64)
    data[0]["chunks"], data[1]["chunks"] = 3, 7
    assert sorted(sweep_lines(data, "size", "busbw", "policy")) == [
        "policy themis, requested_chunks 16",
        "policy themis, requested_chunks 64",
    ]


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_plot_writes_a_png_of_a_model_sweep(tmp_path, fmt):
    """`model --csv/--json` then `plot` writes a PNG (its magic bytes) and says so in one line."""
    data = tmp_path / f"sweep.{fmt}"
    proc = in_process(
        [
            "model",
            "-t",
            "2x2x2,4x2",
            "-b",
            "64K",
            "-e",
            "1M",
            "-f",
            "4",
            "-c",
            "4",
            "-q",
            f"--{fmt}",
            str(data),
        ]
    )
    assert proc.returncode == 0, proc.stderr
    proc = in_process(["plot", str(data), "--y", "time", "--hue", "policy"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"# wrote {tmp_path / 'sweep.png'}: time against size by policy"
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--y", "nope"], "has no column 'nope'"),
        (["--out", "{rows}"], "it is an input of this command"),
    ],
)
def test_plot_refuses_bad_columns_and_its_own_input_with_one_line(tmp_path, args, message):
    """A missing column, or an output that is the input, is one line and exit 2; the input stays."""
    data = tmp_path / "rows.json"
    data.write_text(json.dumps(rows("baseline", "A", 4)))
    before = data.read_bytes()
    proc = in_process(["plot", str(data), *[a.format(rows=data) for a in args]])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr
    assert data.read_bytes() == before
