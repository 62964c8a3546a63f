"""`themis_mpi.api.calibrate` and `themis_mpi.price_gpt` give what `calibrate` and `workload gpt --run` give."""

from __future__ import annotations

import inspect
import json
import re

import pytest
from harness import ROOT, in_process
from test_help import subcommands

import themis_mpi
from themis_mpi import api
from themis_mpi.cli.calibrate import FLAGS
from themis_mpi.errors import UsageError
from themis_mpi.run.priced import DEFAULT_CHUNKS

LOG = ROOT / "tests" / "data" / "nccl-tests" / "h100x8_nvls_dgxc.txt"
RUNS = ("wall_s", "decision_s", "sweep_cell", "sweep_fingerprint")  # what differs between two runs of a cell
GPT = dict(layers=4, hidden=64, heads=4, seq=32, vocab=100, tp=2, pp=2, dp=2)


def test_the_per_dim_fit_is_calibrate_json(tmp_path):
    """``--algorithm ring --kind SW -c 4 --min-size 1M``: the API's fit is what ``--json`` writes, field by field."""
    out = tmp_path / "fit.json"
    argv = ["calibrate", LOG, "--algorithm", "ring", "--kind", "SW", "-c", "4", "--min-size", "1M"]
    proc = in_process([*argv, "--json", out])
    assert proc.returncode == 0, proc.stderr
    written = json.loads(out.read_text())
    fit = api.calibrate(str(LOG), algorithm="ring", kind="SW", chunks=4, min_size="1M").to_dict()
    assert fit["chunks"] == 4 and fit["min_size"] == 2**20 and fit["topology"].startswith("SW(8,")
    assert fit.keys() == written.keys()
    for key, value in fit.items():
        assert value == written[key], key
    assert f"topology {fit['topology']}" in proc.stdout.splitlines()


@pytest.mark.parametrize(
    ("keyword", "value", "flags"),
    [
        ("kind", "Torus", ["--kind", "Torus"]),
        ("chunks", 0, ["-c", "0"]),
        ("chunks", 10**6, ["-c", "1000000"]),
    ],
)
def test_a_bad_kind_or_chunk_count_is_the_commands_line(keyword, value, flags):
    """The API raises the very line the command prints (exit 2) for a bad value."""
    proc = in_process(["calibrate", LOG, "--algorithm", "ring", *flags])
    assert proc.returncode == 2
    with pytest.raises(UsageError) as raised:
        api.calibrate(str(LOG), algorithm="ring", **{keyword: value})
    assert proc.stderr.strip() == f"themis-mpi: error: {raised.value}"


def test_the_commands_defaults_are_the_apis():
    """The calibrate flags give no default of their own; each help states `api.calibrate`'s.

    And `workload gpt`'s ``-c`` default is `run.priced.DEFAULT_CHUNKS`, which `price_gpt` takes.
    """
    actions = {a.dest: a for a in subcommands()["calibrate"]._actions}
    params = inspect.signature(api.calibrate).parameters
    assert set(FLAGS) == {
        d for d in actions if d not in ("help", "log", "json", "quiet")
    }  # (every flag passed on)
    stated = {
        "kind": "(default {})",
        "chunks": "(default {})",
        "min_size": "(default {})",
        "algorithm": "{} (default",
    }
    for dest, form in stated.items():
        assert actions[dest].default is None, dest
        assert form.format(params[dest].default) in str(actions[dest].help), dest
    gpt_chunks = next(a for a in subcommands()["workload"]._actions if a.dest == "chunks")
    assert list(gpt_chunks.default) == [DEFAULT_CHUNKS]
    assert re.search(rf"\(default {DEFAULT_CHUNKS}\b", str(gpt_chunks.help))


def test_price_gpt_returns_the_rows_that_json_stdout_prints():
    """``workload gpt ... -t 2x2x2,4x2 -p baseline,themis --run --json -``: the API's rows, field by field."""
    shape = [a for k, v in GPT.items() for a in (f"--{k}", str(v))]
    proc = in_process(["workload", "gpt", *shape, "-t", "2x2x2,4x2", "-p", "baseline,themis", "--run", "--json", "-", "-q"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    printed = [{k: v for k, v in r.items() if k not in RUNS} for r in json.loads(proc.stdout)]
    results = themis_mpi.price_gpt(["2x2x2", "4x2"], ["baseline", "themis"], **GPT)
    rows = [{k: v for k, v in r.to_dict().items() if k not in RUNS} for r in results]
    assert [(r["policy"], r["chunks"]) for r in rows] == [
        ("baseline", DEFAULT_CHUNKS),
        ("themis", DEFAULT_CHUNKS),
    ] * 2
    assert (
        rows[0]["topology"] == "2x2x2" and rows[2]["topology"] != "2x2x2"
    )  # (4x2, a dim split for the groups)
    assert len(rows) == len(printed)
    for mine, theirs in zip(rows, printed):
        assert mine.keys() == theirs.keys()
        for key, value in mine.items():
            assert value == theirs[key], key
    for r in rows:  # the split adds up (docs/workloads.md, "LLM training")
        assert r["iteration_us"] == pytest.approx(
            r["compute_us"] + r["bubble_us"] + r["exposed_us"], rel=1e-9
        )
