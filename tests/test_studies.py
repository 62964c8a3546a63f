"""The studies' shipped data is what their documented commands write, timings aside (issue 26).

Each test runs a quick subset of a study's command (`--quick`, or the whole command where it is
short) into a folder of its own, in a process of the suite (`run_study`; two studies at a time,
`studies`), and compares its rows with the matching rows of the JSON shipped in docs/, wall-clock fields excluded. A difference means the study is not reproducible (a time budget, an
unseeded draw) or the shipped data is stale: re-run the command of docs/studies.md.
"""

import json

import harness
import pytest
from harness import ROOT, costly

import themis_mpi.calibrate

TIMINGS = {"decision_s", "wall_s", "cpu_s"}  # wall-clock fields: the only ones a re-run may change


def untimed(value):
    """The value with every timing field removed, at any depth."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


# The studies of the tests below, run first, two at a time (`studies`): test name -> script, arguments.
# The longest first (policies, network, scheduling: about 10, 8 and 6 s), so both workers end together.
STUDIES = {
    "test_policy_study_quick_rows_are_the_shipped_rows": ("study_policies.py", ["--quick"]),
    "test_network_study_quick_rows_are_the_shipped_rows": ("study_network.py", ["--quick"]),
    "test_scheduling_study_quick_rows_are_the_shipped_rows": ("study_scheduling.py", ["--quick"]),
    "test_hardware_study_regenerates": ("study_hardware.py", []),
    "test_training_study_quick_rows_are_the_shipped_rows": ("study_training.py", ["--quick"]),
}


def run_study(job: tuple):
    """Run scripts/<script> with its arguments and --out its folder, as docs/studies.md documents it.

    The script's ``main(argv)`` in a process of the suite (none of these needs MPI or a process of
    its own), from the checkout as the command runs; its exit code and output.
    """
    script, out, args = job
    return harness.in_process([*args, "--out", out], main=harness.script(script.removesuffix(".py")).main)


@pytest.fixture(scope="module")
@costly
def studies(request, tmp_path_factory) -> dict:
    """The selected tests' studies (`STUDIES`) run two at a time (`harness.on_two_cores`): per test, its folder.

    Each in a fork of this process (`run_study`); the tests then read its files.
    """
    names = [item.name for item in request.session.items if item.module is request.module]
    jobs = {
        n: (script, tmp_path_factory.mktemp(script[:-3]), args)
        for n, (script, args) in STUDIES.items()
        if n in names
    }
    done = dict(zip(jobs, harness.on_two_cores(run_study, list(jobs.values()))))
    return {n: (done[n], job[1]) for n, job in jobs.items()}


def ran(studies: dict, name: str):
    """The folder of test `name`'s study (`studies`), once its run is known to have ended well."""
    done, out = studies[name]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def by_key(rows: list[dict], key: tuple[str, ...]) -> dict[tuple, dict]:
    """Rows indexed by their `key` fields, timings removed; the key must be unique."""
    out = {tuple(r[k] for k in key): untimed(r) for r in rows}
    assert len(out) == len(rows), f"{key} does not identify the rows"
    return out


def assert_subset(new: dict[tuple, dict], shipped: dict[tuple, dict]) -> None:
    """Every new row is the shipped row of the same key, field for field."""
    assert new, "the quick run wrote no rows"
    missing = sorted(set(new) - set(shipped))
    assert not missing, f"rows not in the shipped data: {missing[:3]}"
    differ = [k for k in new if new[k] != shipped[k]]
    assert not differ, (
        f"{len(differ)} rows differ, e.g. {differ[0]}: {new[differ[0]]} != {shipped[differ[0]]}"
    )


def test_policy_study_quick_rows_are_the_shipped_rows(request, studies):
    """study_policies.py --quick gives docs/policies' rows for its cells and workloads, best-found search included."""
    tmp_path = ran(studies, request.node.name)
    new = json.loads((tmp_path / "study.json").read_text())
    shipped = json.loads((ROOT / "docs" / "policies" / "study.json").read_text())
    cell = ("topology", "latency", "size_bytes", "chunks", "policy")
    assert_subset(by_key(new["collectives"], cell), by_key(shipped["collectives"], cell))
    assert_subset(
        by_key(new["workloads"], ("workload", "topology", "policy")),
        by_key(shipped["workloads"], ("workload", "topology", "policy")),
    )


def test_training_study_quick_rows_are_the_shipped_rows(request, studies):
    """study_training.py --quick gives docs/training's rows for its workloads and topologies."""
    tmp_path = ran(studies, request.node.name)
    key = ("workload", "topology", "latency")
    new = json.loads((tmp_path / "training.json").read_text())
    shipped = json.loads((ROOT / "docs" / "training" / "training.json").read_text())
    assert_subset(by_key(new, key), by_key(shipped, key))


def test_hardware_study_regenerates(request, studies):
    """study_hardware.py (the ACE and INA study, a few seconds) rewrites docs/hardware's JSON and tables."""
    tmp_path = ran(studies, request.node.name)
    shipped = ROOT / "docs" / "hardware"
    assert untimed(json.loads((tmp_path / "hardware.json").read_text())) == untimed(
        json.loads((shipped / "hardware.json").read_text())
    )
    assert (tmp_path / "hardware.md").read_text() == (shipped / "hardware.md").read_text()


def test_nccl_fits_regenerate(tmp_path, monkeypatch):
    """study_hardware.py --nccl (the fits of the shipped nccl-tests logs) rewrites docs/hardware's nccl.json and nccl.md.

    Run in this process (its `main`, as the command runs it) with the session's fits of the logs
    (`harness.fit_nccl`, which test_calibrate shares): each log is fitted once for the suite.
    """
    study = harness.script("study_hardware")
    monkeypatch.setattr(themis_mpi.calibrate, "fit_nccl", harness.fit_nccl)
    assert harness.in_process(["--nccl", "--out", tmp_path], main=study.main).returncode == 0
    shipped = ROOT / "docs" / "hardware"
    assert untimed(json.loads((tmp_path / "nccl.json").read_text())) == untimed(
        json.loads((shipped / "nccl.json").read_text())
    )
    assert (tmp_path / "nccl.md").read_text() == (shipped / "nccl.md").read_text()


def test_network_study_quick_rows_are_the_shipped_rows(request, studies):
    """study_network.py --quick gives docs/network's all-reduce, splits and pipeline parts whole and its training rows."""
    tmp_path = ran(studies, request.node.name)
    new = json.loads((tmp_path / "network.json").read_text())
    shipped = json.loads((ROOT / "docs" / "network" / "network.json").read_text())
    assert untimed(new["all_reduce"]) == untimed(shipped["all_reduce"])
    assert untimed(new["splits"]) == untimed(shipped["splits"])
    assert untimed(new["pipeline"]) == untimed(shipped["pipeline"])
    key = ("workload", "machine", "latency", "rule")
    assert_subset(by_key(new["training"], key), by_key(shipped["training"], key))


def test_scheduling_study_quick_rows_are_the_shipped_rows(request, studies):
    """study_scheduling.py --quick gives docs/scheduling's rows for its workloads at ratio 1."""
    tmp_path = ran(studies, request.node.name)
    new = json.loads((tmp_path / "scheduling.json").read_text())
    shipped = json.loads((ROOT / "docs" / "scheduling" / "scheduling.json").read_text())
    key = ("workload", "ratio", "policy")
    assert_subset(by_key(new, key), by_key(shipped, key))
