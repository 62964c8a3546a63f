"""Rules for readers with bounds: a hostile file gets one line and exit 2 within seconds, never a hang.

YAML topologies, communicator-group JSON, Chakra ET files (gzip, durations, dependency cycles)
and traces edited and re-checksummed.
"""

import gzip
import shutil

import h5py
import numpy as np
import pytest
from harness import DATA, ROOT, in_process

from themis_mpi.errors import UsageError
from themis_mpi.trace import checksum
from themis_mpi.workloads import et
from themis_mpi.workloads.chakra import _topological

TRACE = ROOT / "docs" / "trace" / "run.h5"


def one_line(proc, *words):
    """Exit 2, one line on stderr naming each word, no traceback."""
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def billion_laughs() -> str:
    lines = ["a0: &a0 [1,1,1,1,1,1,1,1,1,1]"]
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    return (
        "\n".join([*lines, "topology: [Ring]", "npus_count: [4]", "bandwidth: *a8", "latency: [10]"]) + "\n"
    )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (billion_laughs(), ("aliases",)),
        (
            "topology: " + "[" * 3000 + "]" * 3000 + "\nnpus_count: [4]\nbandwidth: [1]\nlatency: [1]\n",
            ("nested",),
        ),
        (
            "topology: [Ring]\nnpus_count: [4]\nbandwidth: [" + "9" * 400 + "]\nlatency: [10]\n",
            ("out of range",),
        ),
    ],
    ids=["aliases", "nested", "huge-number"],
)
def test_a_hostile_yaml_topology_is_one_line(tmp_path, text, words):
    """YAML aliases (a YAML bomb), deep nesting and numbers beyond any float are refused."""
    path = tmp_path / "net.yml"
    path.write_text(text)
    one_line(in_process(["model", "-t", str(path), "-b", "1M", "-q"]), *words)


def test_a_deeply_nested_comm_group_file_is_one_line(tmp_path):
    """--comm-group JSON nested 3,000 deep: one line, not a RecursionError."""
    path = tmp_path / "groups.json"
    path.write_text("[" * 3000 + "]" * 3000)
    proc = in_process(["train", str(DATA / "chakra-pytorch" / "chakra.0.et.gz"), "--comm-group", str(path)])
    one_line(proc, "nested too deep")


def test_a_gzip_bomb_is_refused_once_it_inflates_past_the_limit(tmp_path, monkeypatch):
    """A gzip stream that inflates past MAX_ET_BYTES is refused as it inflates, piece by piece."""
    monkeypatch.setattr(et, "MAX_ET_BYTES", 1 << 20)
    monkeypatch.setattr(et, "GUNZIP_PIECE_BYTES", 1 << 16)
    bomb = tmp_path / "bomb.et.gz"
    bomb.write_bytes(gzip.compress(b"\0" * (8 << 20)))
    with pytest.raises(UsageError, match="inflates past 1048576 bytes"):
        et.load_bytes(str(bomb))
    small = tmp_path / "small.et.gz"
    small.write_bytes(gzip.compress(b"\1" * 1000))
    assert et.load_bytes(str(small)) == b"\1" * 1000


def test_a_truncated_gzip_stream_is_one_line(tmp_path):
    """A gzip stream cut short is named as such."""
    path = tmp_path / "cut.et.gz"
    path.write_bytes(gzip.compress(np.random.default_rng(0).bytes(100_000))[:200])
    with pytest.raises(UsageError, match="truncated or corrupt gzip"):
        et.load_bytes(str(path))


@pytest.mark.parametrize(
    "duration_ns", [float("inf"), 2.0**64, 1e300, float("nan")], ids=["inf", "2^64", "1e300", "nan"]
)
def test_an_absurd_node_duration_is_one_line(tmp_path, duration_ns):
    """A COMP node of inf, NaN or more than a day is refused, naming the node."""
    path = tmp_path / "w.et"
    node = et.Node(1, "c", et.COMP_NODE, attrs=[et.Attr("themis_duration_ns", "double", duration_ns)])
    et.write_et(str(path), et.EtTrace(str(path), "0.0.4", [], [node]))
    one_line(in_process(["train", str(path), "-t", "2x2x2", "-c", "1"]), "duration", "out of range")


def test_control_dependency_cycles_are_broken_one_pass_over_the_graph():
    """20,000 two-node ctrl cycles: every node is ordered and one dep per cycle is dropped."""
    n = 40_000
    ctrl = [{i + 1} if i % 2 == 0 else {i - 1} for i in range(n)]
    data: list[set[int]] = [set() for _ in range(n)]
    order, dropped = _topological(et.EtTrace("x"), ctrl, data)
    assert sorted(order) == list(range(n)) and dropped == n // 2
    assert order[:2] == [0, 1]  # node 0 (first in file order) loses its dep on 1 and goes first


def forged_trace(tmp_path, table: str, column: str, value) -> str:
    """The shipped trace with one value changed and its table's checksum made to fit again."""
    path = tmp_path / "forged.h5"
    shutil.copy(TRACE, path)
    with h5py.File(path, "r+") as f:
        data = f[table][()]
        data[column][0] = value
        del f[table]
        f[table] = data
        f[table].attrs["sha256"] = checksum(np.asarray(data))
    return str(path)


@pytest.mark.parametrize(
    ("table", "column", "value"),
    [
        ("collectives", "size_bytes", -1),
        ("events", "end_us", 1e300),
        ("events", "bytes", 1 << 62),
        ("collectives", "time_us", float("nan")),
        ("summary_dims", "bytes", -5),
    ],
)
def test_a_forged_trace_with_a_value_out_of_range_is_refused(tmp_path, table, column, value):
    """A trace edited and re-checksummed (so the digest matches) is still refused, one line."""
    one_line(in_process(["analyze", forged_trace(tmp_path, table, column, value)]), "damaged trace")


def test_the_forging_helper_leaves_a_readable_trace_when_nothing_is_out_of_range(tmp_path):
    """The same edit with an in-range value reads: the refusals above are about the ranges."""
    proc = in_process(["analyze", forged_trace(tmp_path, "collectives", "time_us", 600.0)])
    assert proc.returncode == 0, proc.stderr


def test_a_topology_string_too_long_is_refused_without_echoing_it():
    """A 120 kB topology string: one short line (its start and length), not the whole string back."""
    proc = in_process(["model", "-t", "SW(8,100,700)_" * 8000 + "SW(8,100,700)"])
    one_line(proc, "too long", "characters")
    assert len(proc.stderr) < 300


def test_convert_refuses_more_iterations_than_an_et_file_holds(tmp_path):
    """`convert --iters 1000000`: refused at once with the largest count that fits, not a minute of work."""
    proc = in_process(["convert", "traces/resnet152.txt", str(tmp_path / "w.et"), "--iters", "1000000"])
    one_line(proc, "at most")
    assert not (tmp_path / "w.et").exists()
