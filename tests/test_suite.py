"""Rules of the suite itself: how tests get their markers (tests/conftest.py), and the durations data."""

import importlib
import json
import subprocess
import sys

import conftest
import pytest
from harness import ROOT, cli, in_process, local


def starts_mpi():
    return cli(2, ["info"])


def starts_python():
    return local(["info"])


def stays_in_process():
    return in_process(["info"])


def through_a_helper():
    return [starts_mpi(), stays_in_process()]


def by_the_module():
    return subprocess.check_output(["true"])


def names_the_module_only():
    return subprocess.CompletedProcess(["x"], 0)


class Steps:
    """A test class's helper methods, one calling the other."""

    def first(self):
        """Call the second."""
        return self.second()

    def second(self):
        """Start a process."""
        return starts_python()


def kinds(name: str) -> set[str]:
    """`conftest.process_kinds` of this module's function `name`, or of a class's first method.

    Named by a string, so that the code of the tests here names none of them.
    """
    found = globals()[name]
    if isinstance(found, type):
        return conftest.process_kinds([found.first], found)
    return conftest.process_kinds([found])


def test_process_kinds_follow_helpers_modules_and_methods():
    """Through harness.cli a test is mpi, through local or subprocess.run subprocess; in_process makes it neither."""
    assert kinds("starts_mpi") == {"mpi"}
    assert kinds("starts_python") == {"subprocess"}
    assert kinds("stays_in_process") == set()
    assert kinds("through_a_helper") == {"mpi"}
    assert kinds("by_the_module") == {"subprocess"}
    assert kinds("names_the_module_only") == set()
    assert kinds("Steps") == {"subprocess"}


def test_a_process_started_out_of_sight_fails_the_unmarked_test():
    """A process call the code reading cannot see is stopped by the audit hook before it starts."""
    run = importlib.import_module("sub" + "process").run
    with pytest.raises(conftest.UnmarkedProcess, match="starts true but is not marked subprocess"):
        run(["true"])
    with pytest.raises(conftest.UnmarkedProcess, match="starts mpiexec but is not marked mpi"):
        run(["mpiexec", "-n", "2", "true"])


def test_the_recorded_durations_are_seconds_of_named_tests():
    """tests/durations.json maps test ids (file::name) to seconds >= 0."""
    tests = json.loads(conftest.DURATIONS.read_text())["tests"]
    assert tests and all("::" in t and isinstance(s, (int, float)) and s >= 0 for t, s in tests.items())
    assert all((ROOT / t.split("::")[0]).is_file() for t in tests)


def test_every_recorded_test_exists_and_the_markers_hold_on_the_suite(tmp_path):
    """Every id in tests/durations.json is a test of the suite; the slow ones are slow, a fixture's mpiexec marks its tests."""
    path = tmp_path / "markers.json"
    # (--assert=plain: a collection runs no assert, and rewriting every module's took 3 of its 6 s)
    collect = [sys.executable, "-m", "pytest", "--collect-only", "--assert=plain", "-q"]
    collect += ["-p", "no:cacheprovider"]
    out = subprocess.run(
        [*collect, "--record-markers", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    markers = {t: set(m) for t, m in json.loads(path.read_text()).items()}  # one collection, every marker
    assert {line for line in out.stdout.splitlines() if "::" in line} == set(markers)

    tests = json.loads(conftest.DURATIONS.read_text())["tests"]
    every, slow = set(markers), {t for t, m in markers.items() if "slow" in m}
    assert not set(tests) - every, (
        f"not in the suite (run scripts/test_durations.py): {sorted(set(tests) - every)}"
    )
    assert {t for t, s in tests.items() if s > conftest.SLOW_S} <= slow
    through_a_fixture = (
        "tests/test_trace.py::test_trace_reads_with_plain_h5py"  # its module's fixture runs mpiexec
    )
    assert len([t for t in slow & every if t.split("[")[0] == through_a_fixture and "mpi" in markers[t]]) == 2
