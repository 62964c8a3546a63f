"""Launch MPI jobs from pytest: `mpiexec -n K` with a timeout, never pytest in MPI.

The environment set here lets the job run as root and with more ranks than cores under either
MPICH (the PyPI wheel, default) or Open MPI, so nothing depends on how the machine was set up.
Runs that end normally go to a resident job per rank count (`cli_jobs`, `run_specs`:
tests/jobs/resident.py), whose ranks stay up for the session, so a module pays no start-up;
runs whose process matters (exit code, standard error, a signal) get a job of their own (`cli`).
Also: the command in one process of its own (`local`) or in the test's (`in_process`), and
reference tables checked row by row with one report (`check_rows`). Which helper a test calls
gives it its markers (tests/conftest.py).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import csv
import gc
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from fnmatch import fnmatch
from pathlib import Path

from themis_mpi.launch import job_env, mpiexec_path
from themis_mpi.output import write_json

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


def byte_compile() -> None:
    """Write the bytecode of the package, the jobs and the scripts (once a session; a no-op when current).

    The processes the suite starts (hundreds, 8 ranks a job) import themis_mpi. Where nothing may
    write bytecode (``PYTHONDONTWRITEBYTECODE``, a fresh clone has none) each of them compiled
    every module again: about 80 ms of CPU a process, 1 s of an 8-rank job on 2 cores.
    """
    import compileall

    for folder, levels in ((ROOT / "themis_mpi", 10), (ROOT / "tests" / "jobs", 0), (ROOT / "scripts", 0)):
        compileall.compile_dir(folder, maxlevels=levels, quiet=2)


def mpi_env(site=None) -> dict:
    """Environment for oversubscribed runs as root, with this checkout first on the path.

    `site`: a folder of plugins on the path after it, instead of this process's PYTHONPATH (for
    jobs that run at once, each with its own plugins: `at_once`).
    """
    after = os.environ.get("PYTHONPATH", "") if site is None else str(site)
    return job_env(PYTHONPATH=str(ROOT) + os.pathsep + after)


def mpirun(
    n: int, args: list[str], timeout_s: float = TIMEOUT_S, cwd=None, site=None
) -> subprocess.CompletedProcess:
    """Run ``mpiexec -n n python args...``; a hang becomes a failed test, not a frozen CI (`site`: `mpi_env`)."""
    cmd = [mpiexec_path(), "-n", str(n), sys.executable, *args]
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=mpi_env(site), cwd=cwd or ROOT
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"MPI job timed out after {timeout_s} s: {' '.join(cmd)}\n{exc.stdout}\n{exc.stderr}"
        ) from None


def local(args, timeout_s: float = 120, site=None, **kw) -> subprocess.CompletedProcess:
    """`themis-mpi ARGS` in one process (the model), without mpiexec (`site`: `mpi_env`)."""
    kw.setdefault("cwd", ROOT)
    return subprocess.run([sys.executable, "-m", "themis_mpi", *args], capture_output=True, text=True,
                          env=mpi_env(site), timeout=timeout_s, **kw)  # fmt: skip


def cli(n: int, args: list[str], **kw) -> subprocess.CompletedProcess:
    """`themis-mpi ARGS` under mpiexec with n ranks."""
    return mpirun(n, ["-m", "themis_mpi", *args], **kw)


def cli_jobs(commands: dict, tmp_path, timeout_s: float = TIMEOUT_S) -> dict:
    """Several `themis-mpi ARGS` runs, in the resident job of each rank count (`resident`).

    `commands` maps a key to ``(ranks, args)``. Each run gives what `cli` gives (exit code,
    output), one after another in the job, without a start-up of its own (about 1.6 s for 8
    ranks on 2 cores). For runs that end normally, each with its own output files: an abort ends
    the job and every run in it. The ranks' output is in rank order.
    """

    def batch(n: int) -> list:
        keys = [k for k, (ranks, _) in commands.items() if ranks == n]
        args = [[str(a) for a in commands[k][1]] for k in keys]
        return list(zip(keys, resident(n, "commands", args, tmp_path / f"done{n}.json", timeout_s)))

    return {
        k: subprocess.CompletedProcess(commands[k][1], d["returncode"], d["stdout"], d["stderr"])
        for rows in each_rank_count({n for n, _ in commands.values()}, batch).values()
        for k, d in rows
    }


def each_rank_count(counts: set[int], batch: Callable[[int], list]) -> dict[int, list]:
    """`batch(n)` for each rank count: the largest in a thread, beside the others in turn.

    A job's ranks sleep while they wait for each other, so one job of 8 on 2 cores leaves them
    partly idle: test_emulator's jobs of 4, 5 and 6 ranks beside its 8 took 25 s, in turn 33 s
    (loaded machine). At most two jobs run at once, the largest and one other (within
    `RESIDENT_RANKS`). A batch that fails raises once both have ended.
    """
    order = sorted(counts)
    if len(order) < 2:
        return {n: batch(n) for n in order}
    with ThreadPoolExecutor(max_workers=1) as pool:
        largest = pool.submit(batch, order[-1])
        done = {n: batch(n) for n in order[:-1]}
        done[order[-1]] = largest.result()
    return done


_RESIDENT: dict[int, tuple[subprocess.Popen, Path, list[int]]] = {}  # rank count -> its job
RESIDENT_RANKS = 16  # the most ranks kept up at once (about 0.2 GB each)
_RESIDENT_LOCK = threading.Lock()
_BUSY: set[int] = set()  # the rank counts whose job runs a batch now


def _job_env() -> tuple[dict, tuple]:
    """`mpi_env`, and what of it a resident job must share (all but pytest's test name, set per test)."""
    env = mpi_env()
    return env, tuple(sorted((k, v) for k, v in env.items() if k != "PYTEST_CURRENT_TEST"))


_SESSION_ENV = _job_env()[1]


def resident(n: int, kind: str, items: list, out: Path, timeout_s: float = TIMEOUT_S) -> list:
    """A batch run by the resident MPI job of `n` ranks (tests/jobs/resident.py); its rows.

    `kind` is ``commands`` (tests/jobs/commands.py) or ``specs`` (tests/jobs/agreements.py). The
    job is started at the first batch of `n` ranks and serves the later ones of the session (of
    every module), so they pay no start-up; it is started anew when a batch ended it (an abort).
    At most `RESIDENT_RANKS` ranks stay up: a new job ends the smallest others first.
    A batch under another environment than the session's (a test's PYTHONPATH) gets a job of its
    own, ended after it. A batch that ends its job or outlives `timeout_s` fails with the job's
    output, as `mpirun` does.
    """
    env, shared = _job_env()
    with _RESIDENT_LOCK:
        if shared != _SESSION_ENV:
            job = _start_resident(n, env)
            try:
                return _batch(n, job, kind, items, out, timeout_s)
            finally:
                _end_resident(job)
        if n not in _RESIDENT or _RESIDENT[n][0].poll() is not None:
            _end_resident(_RESIDENT.pop(n, None))
            idle = sorted(set(_RESIDENT) - _BUSY)  # the smallest first: quick to start
            while idle and sum(_RESIDENT) + n > RESIDENT_RANKS:
                _end_resident(_RESIDENT.pop(idle.pop(0)))
            _RESIDENT[n] = _start_resident(n, env)
        job = _RESIDENT[n]
        _BUSY.add(n)  # (a batch of another rank count may run beside it: `each_rank_count`)
    try:
        return _batch(n, job, kind, items, out, timeout_s)
    except AssertionError:
        with _RESIDENT_LOCK:
            if _RESIDENT.get(n) is job:
                _end_resident(_RESIDENT.pop(n), ask=False)
        raise
    finally:
        _BUSY.discard(n)


def _start_resident(n: int, env: dict) -> tuple[subprocess.Popen, Path, list[int]]:
    """A resident job of `n` ranks: the launcher, its folder, the requests sent so far."""
    folder = Path(tempfile.mkdtemp(prefix=f"themis-mpi-resident{n}-"))
    cmd = [mpiexec_path(), "-n", str(n), sys.executable, "-m", "mpi4py",
           str(ROOT / "tests" / "jobs" / "resident.py"), str(folder), str(os.getpid())]  # fmt: skip
    with open(folder / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    return proc, folder, [0]


def _batch(n: int, job: tuple, kind: str, items: list, out: Path, timeout_s: float) -> list:
    """One request to a resident job and its rows; an AssertionError when it ends the job or times out."""
    proc, folder, sent = job
    sys.audit("harness.resident", proc.args)  # a test served by the job runs MPI (tests/conftest.py)
    sent[0] += 1
    out.unlink(missing_ok=True)
    write_json(str(folder / f"request{sent[0]}.json"), {"kind": kind, "items": items, "out": str(out)})
    deadline = time.monotonic() + timeout_s
    while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    if out.exists():
        return json.loads(out.read_text())
    why = f"timed out after {timeout_s} s" if proc.returncode is None else f"ended with {proc.returncode}"
    log = (folder / "log.txt").read_text()
    raise AssertionError(f"the resident MPI job of {n} ranks {why} in a batch of {kind}:\n{log[-5000:]}")


def _end_resident(job: tuple | None, ask: bool = True) -> None:
    """End a resident job: asked to stop when idle (`ask`), else (or after 10 s) terminated."""
    if job is None:
        return
    proc, folder, sent = job
    if ask and proc.poll() is None:
        write_json(str(folder / f"request{sent[0] + 1}.json"), {"kind": "stop"})
    try:
        proc.wait(timeout=10 if ask else 0.1)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    shutil.rmtree(folder, ignore_errors=True)


@atexit.register
def _end_residents() -> None:
    while _RESIDENT:
        _end_resident(_RESIDENT.popitem()[1])


def at_once(request, scenarios: dict[str, Callable[[], object]]) -> dict[str, Future]:
    """The scenarios of a module's selected tests run at once, one thread each; each outcome by test name.

    For tests that mostly wait (a watchdog's timeout, a frozen rank): their jobs overlap where
    they would each wait in turn. `scenarios` maps a test's name (``request.node.name``, with
    its parameters) to what it runs; only those of the selected tests run, and all of them end
    (each under its own timeouts) before this returns, so no job runs beside another test. A
    test takes its outcome with ``.result()``, which raises what its scenario raised.
    """
    names = {item.name for item in request.session.items if item.module is request.module}
    chosen = {name: run for name, run in scenarios.items() if name in names}
    with ThreadPoolExecutor(max_workers=max(1, len(chosen))) as pool:
        return {name: pool.submit(run) for name, run in chosen.items()}


def in_process(
    args: list[str], cwd=None, fold_stderr: bool = False, main=None
) -> subprocess.CompletedProcess:
    """`themis-mpi ARGS` in this process (`themis_mpi.cli.main`), as `local` gives it: exit code, output.

    For checks that need no process of their own (parsing, help, refused input, a small model
    run): no interpreter start-up, and the code runs under the test's coverage. Runs from `cwd`
    (the checkout by default), as `local` does. `fold_stderr`: standard error written into the
    standard output, in the order of the writes (``2>&1``). `main`: another program's
    ``main(argv)`` (a script's, `script`) instead of the command's.
    """
    if main is None:
        from themis_mpi.cli import main

    out, here = io.StringIO(), os.getcwd()
    err = out if fold_stderr else io.StringIO()
    os.chdir(cwd or ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
                code = code if isinstance(code, int) else 0  # (a script's main may return its rows)
            except SystemExit as exc:  # argparse: --help, or a flag it refuses
                code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(args, code, out.getvalue(), "" if fold_stderr else err.getvalue())


_FITS: dict[str, object] = {}


def fit_nccl(log, **kw):
    """`calibrate.fit_nccl`, the default fit of each log computed once per test session (a copy each call).

    A fit takes seconds and is deterministic (its seed is fixed), so test_calibrate's tables and the
    studies that refit the shipped logs (test_studies, test_calibrate's Themis study, run in this
    process with this patched in) share one fit per log content. A call with options is not cached.
    """
    from themis_mpi.calibrate.ncclfit import fit_nccl as fit  # (not the package's name, which a test patches)

    if kw:
        return fit(log, **kw)
    key = repr(log)  # the log's whole content (a dataclass of its rows and runs)
    if key not in _FITS:
        _FITS[key] = fit(log)
    return copy.deepcopy(_FITS[key])


def _default_fit(log):
    from themis_mpi.calibrate.ncclfit import fit_nccl as fit

    return fit(log)


def costly(fixture_function: Callable) -> Callable:
    """Mark a module fixture whose one computation every test using it shares (put under ``@pytest.fixture``).

    The first of its tests pays it in a full run, so the others are recorded as quick; alone, as
    in the quick subset, each would pay it. `tests/conftest.py` makes every test using it slow.
    """
    fixture_function.costly = True  # type: ignore[attr-defined]
    return fixture_function


def on_two_cores(function: Callable, items: list) -> list:
    """`function` of each item, in order, two at a time in forked workers (in this process without fork).

    For CPU-bound work in the test's process: the suite runs in one thread, so a second core
    would idle. The workers are forks of this process (its modules, caches and patches); what
    `function` returns comes back pickled. `function` must be a module-level function.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if len(items) < 2 or (os.cpu_count() or 1) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [function(item) for item in items]
    gc.freeze()  # (the workers' collections then leave this process's objects, and their pages, alone)
    try:
        with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(function, items))
    finally:
        gc.unfreeze()


def fit_nccl_at_once(logs: list) -> None:
    """The default fits of `logs` not yet computed (`fit_nccl`), two at a time (`on_two_cores`).

    A fit is deterministic, so a worker's is the same, bit for bit, as this process's would be.
    """
    todo = {repr(log): log for log in logs if repr(log) not in _FITS}
    _FITS.update(zip(todo, on_two_cores(_default_fit, list(todo.values()))))


_COMPARED: dict[tuple, dict] = {}
_FOLDERS: dict[str, str] = {}


def _folder_content(folder) -> str:
    """A digest of every file under `folder` (names and bytes), read once per path."""
    import hashlib

    key = str(Path(folder).resolve())
    if key not in _FOLDERS:
        digest = hashlib.sha256()
        for path in sorted(p for p in Path(key).rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(key)).encode() + b"\0" + path.read_bytes())
        _FOLDERS[key] = digest.hexdigest()
    return _FOLDERS[key]


def _compared_key(row: dict, network_dir: str | None) -> tuple:
    """The cache key of a reference row: 1.0's (no `network_dir`) or 2.x's (with its folder's content)."""
    if network_dir is None:
        return ("1.0", repr(sorted(row.items())))
    return ("2", repr(sorted(row.items())), _folder_content(network_dir))


def _compare(job: tuple) -> dict:
    """`astra.compare_row` of a row, or `astra.compare_row_2` with its network folder (not None)."""
    from themis_mpi import astra

    row, network_dir = job
    return astra.compare_row(row) if network_dir is None else astra.compare_row_2(row, network_dir)


def compare_row(row: dict) -> dict:
    """`astra.compare_row`, each ASTRA-sim 1.0 reference row modelled once per test session (a copy each call).

    The model is deterministic, so the reference tests and the agreement script's documented run
    (test_docs runs it in this process with this patched in) share one result per row content.
    """
    key = _compared_key(row, None)
    if key not in _COMPARED:
        _COMPARED[key] = _compare((row, None))
    return copy.deepcopy(_COMPARED[key])


def compare_row_2(row: dict, network_dir: str) -> dict:
    """`astra.compare_row_2`, once per row content and network folder content, as `compare_row`."""
    key = _compared_key(row, network_dir)
    if key not in _COMPARED:
        _COMPARED[key] = _compare((row, network_dir))
    return copy.deepcopy(_COMPARED[key])


def compare_rows_at_once(rows: Iterable[dict], network_dir: str | None = None) -> None:
    """The rows not yet modelled (`compare_row`; `compare_row_2` with `network_dir`), two at a time.

    In forked workers (`on_two_cores`), one row each at a time, so that the costly rows (every
    NPU's engines) spread over both; the model is deterministic, so a worker's result is the
    same, bit for bit, as this process's would be. `compare_row` and `compare_row_2` then find them.
    """
    todo = {_compared_key(row, network_dir): (row, network_dir) for row in rows}
    todo = {key: job for key, job in todo.items() if key not in _COMPARED}
    _COMPARED.update(zip(todo, on_two_cores(_compare, list(todo.values()))))


ROWS_ENV = "THEMIS_MPI_ROWS"


def check_rows(
    rows: Iterable[dict],
    row_id: Callable[[dict], str],
    check: Callable[[dict], str | None],
    before: Callable[[list[dict]], None] | None = None,
) -> None:
    """Check every row of a reference table; one failure lists each failing row: its id and values.

    `check` returns why a row fails, or None. ``THEMIS_MPI_ROWS=PATTERN[,PATTERN...]`` (shell
    patterns on the ids) checks only the matching rows, to debug one. `before` is given the rows
    to check first (to model them at once: `compare_rows_at_once`).
    """
    import pytest

    patterns = [p for p in os.environ.get(ROWS_ENV, "").split(",") if p]
    chosen = [r for r in rows if not patterns or any(fnmatch(row_id(r), p) for p in patterns)]
    if not chosen:
        pytest.skip(f"no row matches {ROWS_ENV}={','.join(patterns)}")
    if before is not None:
        before(chosen)
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
    """scripts/agreement.py's comparison rows of a spec (topology and cases) on n ranks (`run_specs`).

    The rows come back whether or not a case disagrees, so that the tests say which rule broke.
    """
    return run_specs({0: (n, spec["topology"], spec["cases"])}, tmp_path)[0]


def run_specs(specs: dict, tmp_path, timeout_s: float = TIMEOUT_S) -> dict:
    """Agreement specs (`run_cases`) of several tests in the resident job of each rank count; rows per spec.

    `specs` maps a key to ``(ranks, topology, cases)``. The specs of one rank count run in one
    batch of the resident job (`resident`, tests/jobs/agreements.py): no start-up of the ranks
    for them, where each would pay its own (about 1.6 s for 8 ranks on 2 cores). Returns each
    key's rows, as `run_cases` gives them.
    """

    def batch(n: int) -> list:
        keys = [k for k, (ranks, _, _) in specs.items() if ranks == n]
        items = [{"topology": specs[k][1], "cases": specs[k][2]} for k in keys]
        return list(zip(keys, resident(n, "specs", items, tmp_path / f"rows{n}.json", timeout_s)))

    return {
        k: rows
        for done in each_rank_count({n for n, _, _ in specs.values()}, batch).values()
        for k, rows in done
    }


def sweep_rows(path, leave_out: Iterable[str] = ()) -> list[dict]:
    """A sweep file's rows (CSV, JSON or JSON Lines), without the columns `leave_out`."""
    text = open(path).read()
    if str(path).endswith(".csv"):
        rows = list(csv.DictReader(text.splitlines()))
    elif str(path).endswith(".jsonl"):
        rows = [json.loads(line) for line in text.splitlines()]
    else:
        rows = json.loads(text)
    return [{k: v for k, v in r.items() if k not in leave_out} for r in rows]


def killed_sweep(args: list[str], jsonl: Path, rows: int, poll_s: float = 0.005) -> None:
    """`python -m themis_mpi ARGS` SIGKILLed (with its workers) once `jsonl` holds `rows` rows (or 120 s)."""
    proc = subprocess.Popen([sys.executable, "-m", "themis_mpi", *args], cwd=ROOT, env=mpi_env(),
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if jsonl.exists() and jsonl.read_text().count("\n") >= rows:
            break
        time.sleep(poll_s)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
