"""Launch MPI jobs from pytest: one `mpiexec -n K` per case, with a timeout, never pytest in MPI.

The environment set here lets the job run as root and with more ranks than cores under either
MPICH (the PyPI wheel, default) or Open MPI, so nothing depends on how the machine was set up.
Also: the command in one process of its own (`local`) or in the test's (`in_process`), and
reference tables checked row by row with one report (`check_rows`). Which helper a test calls
gives it its markers (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from fnmatch import fnmatch
from pathlib import Path

from themis_mpi.launch import job_env, mpiexec_path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SHARED = ROOT.parent / "shared"
TIMEOUT_S = 180


def script(name: str):
    """``scripts/NAME.py`` as a module (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shared(relative: str) -> Path:
    """A path in the ../shared folder beside the checkout; skip the test when it is absent.

    ``THEMIS_MPI_REQUIRE_SHARED=1`` (CI sets it) turns that skip into a failure, so data that
    should be there cannot silently go missing.
    """
    import pytest

    path = SHARED / relative
    if not path.exists():
        reason = f"{path} is absent (it comes with the CI checkout, not with a clone)"
        if os.environ.get("THEMIS_MPI_REQUIRE_SHARED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def mpi_env() -> dict:
    """Environment for oversubscribed runs as root, with this checkout first on the path."""
    return job_env(PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def mpirun(n: int, args: list[str], timeout_s: float = TIMEOUT_S, cwd=None) -> subprocess.CompletedProcess:
    """Run ``mpiexec -n n python args...``; a hang becomes a failed test, not a frozen CI."""
    cmd = [mpiexec_path(), "-n", str(n), sys.executable, *args]
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=mpi_env(), cwd=cwd or ROOT
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"MPI job timed out after {timeout_s} s: {' '.join(cmd)}\n{exc.stdout}\n{exc.stderr}"
        ) from None


def local(args, timeout_s: float = 120, **kw) -> subprocess.CompletedProcess:
    """`themis-mpi ARGS` in one process (the model), without mpiexec."""
    kw.setdefault("cwd", ROOT)
    return subprocess.run([sys.executable, "-m", "themis_mpi", *args], capture_output=True, text=True,
                          env=mpi_env(), timeout=timeout_s, **kw)  # fmt: skip


def cli(n: int, args: list[str], **kw) -> subprocess.CompletedProcess:
    """`themis-mpi ARGS` under mpiexec with n ranks."""
    return mpirun(n, ["-m", "themis_mpi", *args], **kw)


def in_process(args: list[str], cwd=None) -> subprocess.CompletedProcess:
    """`themis-mpi ARGS` in this process (`themis_mpi.cli.main`), as `local` gives it: exit code, output.

    For checks that need no process of their own (parsing, help, refused input, a small model
    run): no interpreter start-up, and the code runs under the test's coverage. Runs from `cwd`
    (the checkout by default), as `local` does.
    """
    from themis_mpi.cli import main

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd or ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as exc:  # argparse: --help, or a flag it refuses
                code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


ROWS_ENV = "THEMIS_MPI_ROWS"


def check_rows(
    rows: Iterable[dict], row_id: Callable[[dict], str], check: Callable[[dict], str | None]
) -> None:
    """Check every row of a reference table; one failure lists each failing row: its id and values.

    `check` returns why a row fails, or None. ``THEMIS_MPI_ROWS=PATTERN[,PATTERN...]`` (shell
    patterns on the ids) checks only the matching rows, to debug one.
    """
    import pytest

    patterns = [p for p in os.environ.get(ROWS_ENV, "").split(",") if p]
    chosen = [r for r in rows if not patterns or any(fnmatch(row_id(r), p) for p in patterns)]
    if not chosen:
        pytest.skip(f"no row matches {ROWS_ENV}={','.join(patterns)}")
    failed = []
    for row in chosen:
        try:
            why = check(row)
        except Exception as exc:  # one row that raises hides no other
            why = f"raised {type(exc).__name__}: {exc}"
        if why:
            failed.append(f"{row_id(row)}: {why}")
    assert not failed, f"{len(failed)} of {len(chosen)} rows fail:\n" + "\n".join(failed)


def run_cases(n: int, spec: dict, tmp_path) -> list[dict]:
    """Run scripts/agreement.py on n ranks with a JSON spec; return its comparison rows.

    The script exits 1 when a case disagrees; the rows are returned anyway so that the tests
    say which rule broke.
    """
    spec_path, out_path = tmp_path / "spec.json", tmp_path / "out.json"
    spec_path.write_text(json.dumps(spec))
    proc = mpirun(
        n,
        [
            "-m",
            "mpi4py",
            str(ROOT / "scripts" / "agreement.py"),
            "--spec",
            str(spec_path),
            "--json",
            str(out_path),
            "--quiet",
        ],
    )
    assert proc.returncode in (0, 1) and out_path.exists(), proc.stderr[-3000:]
    return json.loads(out_path.read_text())
