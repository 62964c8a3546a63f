"""Run the quick subset (``-m "not slow"``) under coverage; fail if a module of themis_mpi/ is at 0 %.

The modules are found by walking themis_mpi/, so a new or moved module is checked without an
edit here. A module at 0 % has no in-process test in the quick subset: add one (docs/robustness.md#tests).

    python .ci/quick_coverage.py [PYTEST ARGS...]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "themis_mpi"


def modules() -> list[str]:
    """Every module of the package, as a path relative to the checkout (themis_mpi/run/jobs.py)."""
    return sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py"))


def percentages(data_file: str) -> dict[str, float | None]:
    """Per module: its statements run, in %, or None when it has none; absent when never imported."""
    import coverage

    cov = coverage.Coverage(data_file=data_file)
    cov.load()
    out: dict[str, float | None] = {}
    for measured in cov.get_data().measured_files():
        parts = Path(measured).parts
        if "themis_mpi" not in parts:
            continue
        name = str(Path(*parts[len(parts) - 1 - parts[::-1].index("themis_mpi") :]))
        _, statements, _, missing, _ = cov.analysis2(measured)
        out[name] = 100 * (1 - len(missing) / len(statements)) if statements else None
    return out


def main(argv: list[str]) -> int:
    """Run the quick subset under coverage, print each module's share, and return 1 if one is at 0 %."""
    with tempfile.TemporaryDirectory() as tmp:
        data_file = os.path.join(tmp, "coverage")
        cmd = [sys.executable, "-m", "coverage", "run", f"--data-file={data_file}", "--source=themis_mpi"]
        cmd += ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *argv]
        start = time.monotonic()
        code = subprocess.run(cmd, cwd=ROOT).returncode
        took_s = time.monotonic() - start
        if code != 0:
            print(f"quick subset under coverage: pytest exited {code}")
            return 1
        got = percentages(data_file)
    shown = [(got.get(m, 0.0), m) for m in modules()]
    zero = [m for pct, m in shown if pct is not None and pct <= 0]
    for pct, m in sorted(shown, key=lambda s: (s[0] is not None, s[0] or 0.0)):
        print(f"{'-' if pct is None else f'{pct:5.1f}':>6} %  {m}")
    if zero:
        print(f"{len(zero)} module(s) of themis_mpi/ at 0 % in the quick subset:", *zero, sep="\n  ")
        return 1
    print(
        f"every one of {len(shown)} modules of themis_mpi/ is above 0 % in the quick subset ({took_s:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
