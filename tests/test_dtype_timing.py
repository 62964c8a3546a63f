"""Timing prices a collective's nominal bytes, never its elements: the dtype moves no time.

The data path moves whole elements of the dtype; the time model prices the bytes the run names,
in words of 4 B (`collectives.priced_chunks`). Sizes here are no multiple of 8.
"""

import argparse
import inspect
import json

import numpy as np
import pytest
from harness import cli_jobs, in_process

import themis_mpi
from themis_mpi import api
from themis_mpi.cli.parser import build_parser
from themis_mpi.collectives import (
    DEFAULT_DTYPE,
    DTYPES,
    PRICED_ITEMSIZE,
    Collective,
    element_bounds,
    priced_chunks,
    priced_words,
)
from themis_mpi.config import RunConfig
from themis_mpi.model import ModelTransport
from themis_mpi.policies import inter_names
from themis_mpi.run.coordinator import share_schedules
from themis_mpi.topology import parse_topology

ODD_SIZES_BYTES = (1000003, 4194301)
POLICIES = ("baseline", "themis", "themisFlex")  # (themisFlex sizes its chunks in priced words)
UNTIMED = ("wall_s", "decision_s")  # (wall-clock seconds, not the model's time)


def timed(row: dict, leave_out=()) -> dict:
    """A row's fields but its wall-clock ones (and `leave_out`)."""
    return {k: v for k, v in row.items() if k not in UNTIMED + tuple(leave_out)}


@pytest.fixture(scope="module")
def text_workload(tmp_path_factory) -> str:
    """A data-parallel text workload whose gradients are odd byte counts."""
    path = tmp_path_factory.mktemp("wl") / "odd.txt"
    rows = [
        f"layer{i}\t-1\t2000\tNONE\t0\t1500\tNONE\t0\t1500\tALLREDUCE\t{size}\t100"
        for i, size in enumerate(ODD_SIZES_BYTES * 2)
    ]
    path.write_text("DATA\n" + f"{len(rows)}\n" + "\n".join(rows) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def gpt_graph(tmp_path_factory) -> tuple[str, str]:
    """A written GPT (TP2 x DP4, one byte per element, odd hidden sizes): its prefix and topology."""
    prefix = str(tmp_path_factory.mktemp("gpt") / "odd")
    _, topo = api.gpt(
        "2x2x2", prefix, layers=2, hidden=1006, heads=2, seq=131, vocab=1001, tp=2, dp=4, bytes_per_element=1
    )
    return prefix, topo.spec()


@pytest.mark.parametrize(
    "settings",
    [{}, {"bucket_mib": 1.0}, {"comm_scheduler": "p3", "partition_mib": 1.0}, {"network": "ideal"}],
    ids=["plain", "buckets", "partitions", "ideal"],
)
def test_training_rows_of_a_text_workload_do_not_depend_on_the_dtype(text_workload, settings):
    """Gradients of 1000003 and 4194301 B: float32 and float64 rows are equal, field by field, exactly."""
    rows = {
        dtype: [
            r.to_dict()
            for r in themis_mpi.train(text_workload, "2x2x2", POLICIES, 16, dtype=dtype, **settings)
        ]
        for dtype in ("float32", "float64")
    }
    assert [r["policy"] for r in rows["float64"]] == list(POLICIES)
    assert rows["float64"][0]["iteration_us"] > 0
    assert [timed(r) for r in rows["float32"]] == [timed(r) for r in rows["float64"]]


def test_training_rows_of_a_written_gpt_do_not_depend_on_the_dtype(gpt_graph):
    """A GPT graph replayed by train: float32 and float64 rows are equal, field by field, exactly."""
    prefix, topology = gpt_graph
    rows = {
        dtype: [r.to_dict() for r in themis_mpi.train(prefix, topology, chunks=4, dtype=dtype)]
        for dtype in ("float32", "float64")
    }
    assert rows["float64"][0]["exposed_comm_us"] > 0
    assert [timed(r) for r in rows["float32"]] == [timed(r) for r in rows["float64"]]


def test_model_of_an_odd_size_gives_the_same_times_under_every_dtype(tmp_path):
    """1000003 B: every element type moves its whole elements, and every policy's times are equal."""
    policies = ",".join(inter_names())
    rows = {}
    for dtype in DTYPES:
        out = tmp_path / f"{dtype}.json"
        args = [
            "model",
            "-t",
            "2x2x2",
            "-b",
            str(ODD_SIZES_BYTES[0]),
            "-c",
            "16",
            "-p",
            policies,
            "-d",
            dtype,
        ]
        proc = in_process([*args, "-q", "--json", str(out)])
        assert proc.returncode == 0, proc.stderr
        rows[dtype] = json.loads(out.read_text())
    for dtype, got in rows.items():
        assert {r["size_bytes"] for r in got} == {ODD_SIZES_BYTES[0]}
        assert {r["count"] for r in got} == {ODD_SIZES_BYTES[0] // np.dtype(dtype).itemsize}
        inputs = ("count", "dtype", "sweep_fingerprint")  # (what the runs were asked differs)
        assert len(got) == len(inter_names())
        assert [timed(r, inputs) for r in got] == [timed(r, inputs) for r in rows[DEFAULT_DTYPE]], dtype


@pytest.mark.parametrize("size_bytes", [44, 260, ODD_SIZES_BYTES[1]])
def test_themisflex_sizes_words_that_map_onto_whole_elements(size_bytes):
    """The bounds themisFlex cuts are words, alike under every dtype; each element moves in one chunk.

    An element goes to the chunk whose words hold its last byte, so bounds are monotone from 0 to
    the count; at 44 and 260 B a 1-word float64 chunk holds no element's last byte (it is timed
    at its word and moves no data).
    """
    transport = ModelTransport(parse_topology("2x2x2"), RunConfig(intra="scf"))
    words = {}
    for dtype in DTYPES:
        coll = Collective.of_bytes("all_reduce", size_bytes, dtype, 16, (0, 1, 2))
        (schedule,), _ = share_schedules(transport, "themisFlex", [coll])
        words[dtype] = schedule.bounds.tolist()
        unit, sizes, whole = priced_chunks(coll, schedule.bounds)
        assert (unit, sum(sizes), whole) == (PRICED_ITEMSIZE, priced_words(coll), priced_words(coll))
        elems = element_bounds(coll, schedule.bounds)
        assert elems[0] == 0 and elems[-1] == coll.count and np.all(np.diff(elems) >= 0)
        last_byte = np.arange(1, coll.count + 1) * coll.itemsize - 1
        chunk_of = np.searchsorted(schedule.bounds * PRICED_ITEMSIZE, last_byte, side="right") - 1
        assert np.array_equal(np.repeat(np.arange(len(elems) - 1), np.diff(elems)), chunk_of)
    assert all(w == words["float32"] for w in words.values())
    f64 = Collective.of_bytes("all_reduce", size_bytes, "float64", 16, (0, 1, 2))
    empty = np.any(np.diff(element_bounds(f64, words["float64"])) == 0)
    assert empty == (size_bytes < 1000)


@pytest.mark.parametrize("size_bytes", [44, ODD_SIZES_BYTES[0]])
def test_a_float64_themisflex_trace_replays_unchanged(tmp_path, size_bytes):
    """The trace keeps the broadcast word bounds, so replay times themisFlex's chunks as the run did."""
    trace, out = tmp_path / "t.h5", tmp_path / "r.json"
    args = ["-t", "2x2x2", "-b", str(size_bytes), "-c", "16", "-p", "themisFlex", "-d", "float64", "-q"]
    model = in_process(["model", *args, "--trace", str(trace)])
    assert model.returncode == 0, model.stderr
    replay = in_process(["replay", str(trace), "-q", "--json", str(out)])
    assert replay.returncode == 0, replay.stderr
    got = json.loads(out.read_text())
    assert got["unchanged"] and got["max_event_diff_us"] == 0.0


ODD_TOPOLOGIES = ["2x2x2", "SW(2,100,700)_FC(4,100,700,ring)"]


def odd_args(topology: str) -> list[str]:
    """Every policy on `topology`, float64, a size of no whole elements."""
    policies = ",".join(POLICIES)
    return ["-t", topology, "-b", str(ODD_SIZES_BYTES[1]), "-c", "16", "-p", policies, "-d", "float64", "-q"]


@pytest.fixture(scope="module")
def odd_runs(tmp_path_factory) -> dict:
    """The emulator's runs of `ODD_TOPOLOGIES` in one mpiexec (`harness.cli_jobs`): per topology, job and rows."""
    tmp = tmp_path_factory.mktemp("odd")
    runs = {t: (8, ["run", *odd_args(t), "-n", "1", "-w", "0", "--json", str(tmp / f"e{i}.json")])
            for i, t in enumerate(ODD_TOPOLOGIES)}  # fmt: skip
    done = cli_jobs(runs, tmp)
    return {t: (done[t], tmp / f"e{i}.json") for i, t in enumerate(ODD_TOPOLOGIES)}


@pytest.mark.parametrize("topology", ODD_TOPOLOGIES)
def test_the_emulator_equals_the_model_for_a_size_of_no_whole_elements(tmp_path, odd_runs, topology):
    """8 ranks, float64, 4194301 B (not a multiple of 8): the model's times to the ns, #wrong 0.

    themisFlex's word bounds map onto whole elements (`collectives.element_bounds`).
    """
    args = odd_args(topology)
    emu, e_json = odd_runs[topology]
    assert emu.returncode == 0, emu.stderr[-2000:]
    model = in_process(["model", *args, "--json", str(tmp_path / "m.json")])
    assert model.returncode == 0, model.stderr
    e, m = json.loads(e_json.read_text()), json.loads((tmp_path / "m.json").read_text())
    assert [r["policy"] for r in e] == [r["policy"] for r in m] == list(POLICIES)
    for er, mr in zip(e, m):
        assert er["wrong"] == 0 and er["size_bytes"] == ODD_SIZES_BYTES[1]
        assert er["time_us"] == mr["time_us"]
        assert [d["busy_us"] for d in er["dims"]] == [d["busy_us"] for d in mr["dims"]]
        assert [d["bytes"] for d in er["dims"]] == [d["bytes"] for d in mr["dims"]]


def test_every_command_and_the_api_default_to_one_dtype():
    """run, model and train spell -d alike with DEFAULT_DTYPE; the API's sweep and train take it too."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    defaults = {}
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if "--dtype" in action.option_strings:
                defaults[name] = (action.option_strings, action.default, tuple(action.choices or ()))
    assert {"run", "model", "train"} <= set(defaults)
    assert all(v == (["-d", "--dtype"], DEFAULT_DTYPE, DTYPES) for v in defaults.values()), defaults
    for function in (themis_mpi.sweep, themis_mpi.train):
        assert inspect.signature(function).parameters["dtype"].default == DEFAULT_DTYPE
