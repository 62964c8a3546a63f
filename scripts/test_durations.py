"""Record each test's seconds in tests/durations.json, the data that marks tests over 1 s slow.

Runs the suite with ``--record-durations`` (tests/conftest.py) and writes the file. Run it on a
quiet machine after adding or changing tests; with pytest arguments (files, ``-k``) it runs only
those tests and updates their entries. It then prints what the quick subset (``-m "not slow"``)
holds and took, and the tests whose code looks as if they start a process but that started none
themselves (a module's fixture may have started it for them; otherwise their markers only cost
the quick subset a test).

    python scripts/test_durations.py                      # the whole suite, about 8 minutes
    python scripts/test_durations.py tests/test_model.py  # update one file's tests
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from themis_mpi.output import write_json  # noqa: E402

DURATIONS = ROOT / "tests" / "durations.json"


def pytest(*args: str, capture: bool = True) -> subprocess.CompletedProcess:
    """``python -m pytest -p no:cacheprovider ARGS`` in the checkout."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=capture, text=True)


def collected(*args: str) -> set[str]:
    """The ids of the tests that pytest ARGS selects (``-m MARKS``, or none: every test)."""
    out = pytest("--collect-only", "--assert=plain", "-q", *args).stdout  # (no assert runs: none rewritten)
    return {line for line in out.splitlines() if "::" in line}


def main(argv: list[str]) -> int:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        record = os.path.join(tmp, "durations.json")
        run = pytest("-q", "--durations=15", "--record-durations", record, *argv, capture=False)
        if not os.path.exists(record):
            return run.returncode or 1
        new = json.loads(Path(record).read_text())
    tests = json.loads(DURATIONS.read_text())["tests"] if argv and DURATIONS.exists() else {}
    tests.update(new["tests"])
    every = collected()
    tests = {t: s for t, s in tests.items() if t in every}  # a test renamed or removed since
    about = (
        f"seconds per test (setup, call, teardown), recorded by scripts/test_durations.py "
        f"{datetime.date.today()} on {os.cpu_count()} cores, load average {load_before:.1f} before and "
        f"{os.getloadavg()[0]:.1f} after; a test over 1 s is marked slow (tests/conftest.py)"
    )
    write_json(str(DURATIONS), {"about": about, "tests": dict(sorted(tests.items()))})
    quick = collected("-m", "not slow")
    print(
        f"wrote {DURATIONS.relative_to(ROOT)}: {len(tests)} tests; the quick subset holds {len(quick)}, "
        f"recorded at {sum(s for t, s in tests.items() if t in quick):.0f} s in all"
    )
    idle = sorted((collected("-m", "mpi or subprocess") & set(new["tests"])) - set(new["started"]))
    if idle:  # the code reading took a name for a process call; or a shared fixture started it before
        print(f"{len(idle)} test(s) marked mpi or subprocess started none themselves:", *idle, sep="\n  ")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
