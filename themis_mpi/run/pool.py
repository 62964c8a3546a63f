"""A sweep's cells on a pool: local processes or an mpi4py.futures pool, rows back in grid order.

Rows are the serial run's rows (wall-clock columns aside) whatever the worker count. A policy
instance serves all its cells in a serial sweep, so a policy whose state carries from one
collective to the next (roundRobin's counter) must meet its earlier cells before a later one:
a worker keeps one instance per policy and, before a cell, replays the decisions (the schedules
alone, no engine run) of that policy's earlier cells it has not seen. Policies known to start
afresh at every collective (`begin` resets all they keep) skip the replay. Cells go out in grid
order, so each worker meets a policy's cells in order and replays each earlier cell at most once.
A resumed sweep replays the same way the cells it skips.

Local workers end with their parent: a killed parent (SIGKILL included) would otherwise leave them
blocked on the pool's pipes for ever. Each worker asks Linux for SIGKILL when its parent dies
(``prctl(PR_SET_PDEATHSIG)``), or elsewhere watches its parent's pid; and while the pool runs,
SIGTERM or SIGHUP in the parent ends the workers before the parent.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import hashlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from ..config import DEFAULT_TIMEOUT_S
from ..errors import UsageError
from ..launch import under_mpiexec
from ..model import ModelTransport
from ..policies import InterPolicy
from ..policies.inter import Baseline, Themis, ThemisFlex, ThemisLat
from ..policies.predictive import Predictive
from ..results import CollectiveResult
from ..version import __version__
from .collective import run_collective
from .coordinator import share_schedules
from .sweep import SweepCell, TrainingCell

MPI = "mpi"  # `--workers mpi`
WORKERS_HELP = (
    "worker processes (default 1: this process), or mpi: an mpi4py.futures pool "
    "(mpiexec -n K python -m mpi4py.futures SCRIPT ...: K - 1 workers)"
)
FRESH_EACH_COLLECTIVE = (Baseline, Themis, ThemisFlex, ThemisLat, Predictive)  # `begin` resets all they keep


def parse_workers(text: str | int) -> int | str:
    """``--workers``: a count of local processes (1: this process) or ``mpi``."""
    if text == MPI:
        return MPI
    try:
        workers = int(text)
    except (TypeError, ValueError):
        workers = 0
    if workers < 1 or workers > 1024:
        raise UsageError(f"--workers takes a count between 1 and 1024 or 'mpi', got {text!r}")
    return workers


def carries_state(policy: InterPolicy) -> bool:
    """Whether a policy's state may carry from one collective to the next.

    A policy class may say so with a ``carries_state`` attribute; otherwise only the built-in
    policies that start afresh at every collective are taken not to.
    """
    declared = getattr(policy, "carries_state", None)
    if declared is not None:
        return bool(declared)
    return type(policy) not in FRESH_EACH_COLLECTIVE


def fingerprint(cells: Sequence[SweepCell], *extra: object) -> str:
    """A short hash of what a sweep runs: every cell, the package version and `extra` options."""
    runs = [(c.topology, c.collective, c.policy.name, replace(c.config, timeout_s=DEFAULT_TIMEOUT_S))
            for c in cells]  # fmt: skip
    return _digest(runs, extra)


def training_fingerprint(cells: Sequence[TrainingCell], *extra: object) -> str:
    """`fingerprint` of a training sweep: every cell (its topologies, spec, policy, settings) and `extra`."""
    runs = [(c.given, c.topology, c.spec, c.policy.name, replace(c.config, timeout_s=DEFAULT_TIMEOUT_S))
            for c in cells]  # fmt: skip
    return _digest(runs, extra)


def _digest(runs: list, extra: tuple) -> str:
    text = repr([*runs, __version__, *extra])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def chain_tasks(policies: Sequence[InterPolicy], todo: Sequence[int]) -> list[list[tuple[int, bool]]]:
    """The runs of a sweep's cells `todo` as tasks of (cell, keep), each task's runs in grid order.

    A policy instance whose state may carry on (`carries_state`) runs its cells in one task, its
    cells already done before its last one to do included (run again and not kept, so that its
    state is the serial sweep's); any other policy's cells are a task each. `policies` is each
    cell's instance; tasks come in the order of their first cell kept.
    """
    wanted = set(todo)
    chains: dict[int, list[int]] = {}
    for i, policy in enumerate(policies):
        chains.setdefault(id(policy), []).append(i)
    tasks = []
    for chain in chains.values():
        if carries_state(policies[chain[0]]):
            last = max((i for i in chain if i in wanted), default=-1)
            if last >= 0:
                tasks.append([(i, i in wanted) for i in chain if i <= last])
        else:
            tasks.extend([(i, True)] for i in chain if i in wanted)
    return sorted(tasks, key=lambda task: min(i for i, keep in task if keep))


def train_text(workload: Any, transport: Any, policy: Any, spec: Any, progress: Any = None) -> Any:
    """One cell of a text workload's training sweep (`functools.partial` of it is the sweep's `run`)."""
    from .training import run_training  # (training code: `run`'s ranks never load it)

    return run_training(transport, workload, policy, spec, progress)


def train_graph(graph: Any, ranks: Any, transport: Any, policy: Any, spec: Any, progress: Any = None) -> Any:
    """One cell of a Chakra graph's training sweep; `ranks` as `run.training.run_graph` takes them."""
    from .training import run_graph

    return run_graph(transport, graph, policy, spec, ranks, progress)


def _training_task(task: tuple) -> list[tuple[int, Any]]:
    """One task of `run_training_cells` on a worker: its cells on the model, the kept results."""
    run, runs = task
    out = []
    for i, cell, keep in runs:
        result = run(ModelTransport(cell.topology, cell.config), cell.policy, cell.spec, None)
        if keep:
            out.append((i, result))
    return out


def run_training_cells(
    run: Callable[..., Any], cells: Sequence[TrainingCell], todo: Sequence[int], workers: int | str
) -> Iterator[tuple[int, Any]]:
    """(cell, result) of every cell in `todo` on a pool (`chain_tasks`), as each task ends.

    `run(transport, policy, spec, progress)` runs one cell (a module-level function or a
    `functools.partial` of one, as any pool takes). The results come task by task, not in grid order.
    """
    tasks = chain_tasks([c.policy for c in cells], todo)
    items = [(run, [(i, cells[i], keep) for i, keep in task]) for task in tasks]
    for done in ordered_map(_training_task, items, workers):
        yield from done


class Cells:
    """The cells of a sweep as a worker holds them: each cell's policy chain and place in it."""

    def __init__(self, cells: Sequence[SweepCell]):
        self.cells = list(cells)
        chains: dict[int, int] = {}  # id(policy instance) -> chain
        self.chain: list[int] = []
        self.place: list[int] = []
        seen: dict[int, int] = {}
        for cell in self.cells:
            k = chains.setdefault(id(cell.policy), len(chains))
            self.chain.append(k)
            self.place.append(seen.get(k, 0))
            seen[k] = seen.get(k, 0) + 1
        self.members: dict[int, list[int]] = {}
        for i, k in enumerate(self.chain):
            self.members.setdefault(k, []).append(i)
        self.policies: dict[int, tuple[InterPolicy, int]] = {}  # chain -> (instance, next place)

    def run(self, i: int) -> CollectiveResult:
        """Cell `i` on the model, its policy brought to the state the serial sweep gives it."""
        cell, k = self.cells[i], self.chain[i]
        policy, next_place = self.policies.get(k, (None, 0))
        if policy is None or (next_place > self.place[i] and carries_state(policy)):
            policy, next_place = copy.deepcopy(cell.policy), 0
        if carries_state(policy):
            for j in self.members[k][next_place : self.place[i]]:  # decisions only: the state moves on
                old = self.cells[j]
                share_schedules(ModelTransport(old.topology, old.config), policy, [old.collective])
        result, _ = run_collective(ModelTransport(cell.topology, cell.config), cell.collective, policy)
        self.policies[k] = (policy, self.place[i] + 1)
        return result


_WORKER: Cells | None = None  # a pool worker's cells (set once by `_start`)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_S = 0.5  # how often a worker without prctl looks for its parent


def _watch_parent(parent_pid: int) -> None:
    """Leave once this process's parent is gone (it is then another process's child)."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def die_with_parent(parent_pid: int) -> None:
    """End this process when `parent_pid`, its parent, ends, however it ends.

    On Linux the kernel sends SIGKILL (``prctl(PR_SET_PDEATHSIG)``); elsewhere a daemon thread
    polls the parent's pid. A parent already gone before the call ends this process at once.
    """
    armed = False
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            armed = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0
    if os.getppid() != parent_pid:
        os._exit(1)
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()


def _worker_init(parent_pid: int | None = None) -> None:
    """A pool worker: quiet at Ctrl-C (the command says it once); a local one ends with its parent."""
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))
    if parent_pid is not None:
        die_with_parent(parent_pid)


def _start(cells: Sequence[SweepCell], parent_pid: int | None = None) -> None:
    global _WORKER
    _worker_init(parent_pid)
    _WORKER = Cells(cells)


@contextlib.contextmanager
def _ended_on_hangup(executor: Any) -> Iterator[None]:
    """While the pool runs, SIGTERM or SIGHUP here end its workers first, then this process as before.

    Signals this process ignores (``nohup``) stay ignored; off the main thread nothing is changed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def end(signum: int, frame: Any) -> None:
        for process in list(getattr(executor, "_processes", None) or ()):
            with contextlib.suppress(OSError):
                os.kill(process, signal.SIGKILL)
        signal.signal(signum, previous[signum])
        os.kill(os.getpid(), signum)  # the handler this process had (by default: it ends)

    for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if signum is not None and signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, end)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _local_executor(workers: int, initializer: Callable[..., None], *initargs: Any) -> Any:
    """A ProcessPoolExecutor of `workers` processes that end with this one."""
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(workers, initializer=initializer, initargs=(*initargs, os.getpid()))


def _run(batch: Sequence[int]) -> list[tuple[int, CollectiveResult]]:
    assert _WORKER is not None
    return [(i, _WORKER.run(i)) for i in batch]


def batches(todo: Sequence[int], workers: int) -> list[list[int]]:
    """Consecutive cells in tasks of a few, about 8 tasks per worker (fewer round trips for small cells)."""
    size = max(1, min(32, len(todo) // (8 * workers)))
    return [list(todo[k : k + size]) for k in range(0, len(todo), size)]


def _mpi_executor(cells: Sequence[SweepCell]) -> Any:
    """The mpi4py.futures pool of ``mpiexec -n K python -m mpi4py.futures -m themis_mpi ...``."""
    core = sys.modules.get("mpi4py.futures._core")
    if not under_mpiexec() or core is None or getattr(core, "SharedPool", None) is None:
        raise UsageError(
            "--workers mpi runs under mpiexec -n K python -m mpi4py.futures -m themis_mpi ... "
            "(K - 1 workers); use --workers N for local processes"
        )
    from mpi4py import MPI
    from mpi4py.futures import MPIPoolExecutor

    if MPI.COMM_WORLD.Get_size() < 2:
        raise UsageError("--workers mpi needs mpiexec -n K with K >= 2 (rank 0 leads, K - 1 workers)")
    return MPIPoolExecutor(initializer=_start, initargs=(list(cells),))


def run_cells(
    cells: Sequence[SweepCell], todo: Sequence[int], workers: int | str = 1
) -> Iterator[tuple[int, CollectiveResult]]:
    """(cell, result) of every cell in `todo`, in the order given, on `workers` processes or ``mpi``.

    With one worker the cells run in this process. The pool is shut down when the caller stops
    reading (a finished or failed sweep).
    """
    if workers == 1:
        local = Cells(cells)
        for i in todo:
            yield i, local.run(i)
        return
    if workers == MPI:
        executor = _mpi_executor(cells)
        count = executor.num_workers
    else:
        executor = _local_executor(int(workers), _start, list(cells))
        count = int(workers)
    try:
        with _ended_on_hangup(executor):
            futures = [executor.submit(_run, batch) for batch in batches(todo, count)]
            for future in futures:
                yield from future.result()
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def ordered_map(
    function: Callable[[Any], Any], items: Sequence[Any], workers: int | str = 1
) -> Iterator[Any]:
    """`function` of every item, in the items' order, on `workers` local processes or ``mpi``.

    For scripts whose runs are independent (the studies); `function` must be a module-level
    function, as for any process pool.
    """
    if workers == 1:
        yield from map(function, items)
        return
    if workers == MPI:
        core = sys.modules.get("mpi4py.futures._core")
        if core is None or getattr(core, "SharedPool", None) is None:
            raise UsageError("--workers mpi runs under mpiexec -n K python -m mpi4py.futures SCRIPT ...")
        from mpi4py.futures import MPIPoolExecutor

        executor: Any = MPIPoolExecutor()
    else:
        executor = _local_executor(int(workers), _worker_init)
    try:
        with _ended_on_hangup(executor):
            yield from executor.map(function, items)
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


class Eta:
    """Cells done, cells left and the time left at the rate of this run so far."""

    def __init__(self, total: int, done: int = 0):
        self.total, self.done, self.start_done = total, done, done
        self.t0_s = time.perf_counter()

    def step(self) -> None:
        """One more cell done."""
        self.done += 1

    def line(self) -> str:
        """E.g. ``12/40 cells done, 28 left, ETA 35 s``."""
        ran = self.done - self.start_done
        left = self.total - self.done
        eta = f"{(time.perf_counter() - self.t0_s) / ran * left:.0f} s" if ran else "?"
        return f"{self.done}/{self.total} cells done, {left} left, ETA {eta}"
