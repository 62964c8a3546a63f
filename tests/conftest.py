"""The suite's markers, and Hypothesis profiles: `ci` (default: bounded, derandomized) and `long`.

Markers (registered in pyproject.toml; docs/robustness.md#tests shows how to select them):

- ``mpi``: the test launches mpiexec; ``subprocess``: it starts another process. Both are found
  at collection in the test's code (`process_kinds`), so nobody writes them: the test, one of
  its fixtures, or a function of tests/ or scripts/ that either calls, reaches
  `harness.mpiexec_path` (mpi) or the `subprocess` module or an `os` call that starts a
  process (subprocess). While tests run, an audit hook fails any test that starts a process
  without its marker (`UnmarkedProcess`), so a call the code reading cannot see is not missed.
- ``reference`` (a table of reference rows) and ``docs`` (the docs' examples) are written on
  the tests.
- ``slow``: every mpi, subprocess and docs test, and every test that took over `SLOW_S` in
  `DURATIONS`, a data file that scripts/test_durations.py records (`--record-durations`).
  ``-m "not slow"`` is the quick subset: in-process tests only.
"""

from __future__ import annotations

import builtins
import dis
import inspect
import json
import os
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from functools import cache

import harness
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("THEMIS_HYPOTHESIS_PROFILE", "ci"))

DURATIONS = harness.ROOT / "tests" / "durations.json"
SLOW_S = 1.0  # a test over this (setup, call and teardown) in DURATIONS is slow
HELPERS = tuple(str(harness.ROOT / d) + os.sep for d in ("tests", "scripts"))  # code read for calls
OURS = (*HELPERS, str(harness.ROOT / "themis_mpi") + os.sep)  # code whose process starts count
STDLIB, SITE = os.path.dirname(os.__file__) + os.sep, os.sep + "site-packages" + os.sep
STARTERS = {
    *(getattr(subprocess, n) for n in ("Popen", "run", "call", "check_call", "check_output", "getoutput")),
    *(getattr(os, n) for n in dir(os) if n.startswith(("system", "popen", "posix_spawn", "exec", "spawn"))),
}  # not os.fork: a fork runs this process's own code (`trace.in_child`), nothing else
ARGV_AT = {"subprocess.Popen": 1, "os.posix_spawn": 1, "os.exec": 1, "os.spawn": 2, "os.system": 0}
ARGV_AT["harness.resident"] = 0  # a batch of the resident MPI job (`harness.resident`) starts mpiexec's runs


class UnmarkedProcess(Exception):
    """A test started a process that its markers do not declare."""


@cache
def _in(filename: str, folders: tuple[str, ...]) -> bool:
    return os.path.realpath(filename).startswith(folders)


def _references(code: types.CodeType, scope: dict, cls: type | None) -> Iterator[object]:
    """The objects that `code` and the code nested in it name.

    Globals, and attributes of named modules and classes: ``harness.cli``, ``subprocess.run``,
    ``self.helper``.
    """
    held: object = None
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            held = scope.get(ins.argval, getattr(builtins, ins.argval, None))
        elif ins.opname in ("LOAD_FAST", "LOAD_DEREF") and ins.argval in ("self", "cls"):
            held = cls
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(held, (types.ModuleType, type)):
            held = getattr(held, ins.argval, None)
        else:
            held = None
            continue
        yield held
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _references(const, scope, cls)


def _functions(obj: object) -> list[types.FunctionType]:
    """The functions of tests/ or scripts/ that `obj` is (a function, or a class's methods)."""
    obj = inspect.unwrap(obj) if callable(obj) else obj
    obj = getattr(getattr(obj, "hypothesis", None), "inner_test", None) or obj  # a @given test
    if isinstance(obj, (types.MethodType, staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, types.FunctionType):  # (this file is the reader, not a helper)
        return (
            [obj] if _in(obj.__code__.co_filename, HELPERS) and obj.__code__.co_filename != __file__ else []
        )
    if isinstance(obj, type) and _in(
        getattr(sys.modules.get(obj.__module__), "__file__", None) or "", HELPERS
    ):
        return [f for v in vars(obj).values() for f in _functions(v)]
    return []


def process_kinds(roots: list[object], cls: type | None = None) -> set[str]:
    """What the functions `roots` start, read from their code and that of the helpers they call.

    A function that names `harness.mpiexec_path` is ``mpi`` (the processes it starts are its
    job's); one that names a process call of `subprocess` or `os` is ``subprocess``. Helpers of
    tests/ and scripts/ are followed (functions, classes, modules); library code (themis_mpi,
    third parties) is not: it starts no process of its own.
    """
    kinds: set[str] = set()
    todo = [f for root in roots for f in _functions(root)]
    seen: set[types.FunctionType] = set()
    while todo:
        fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        kind, called = _read(fn, cls)
        kinds.update(kind)
        todo += called
    return kinds


@cache
def _read(fn: types.FunctionType, cls: type | None) -> tuple[tuple[str, ...], list[types.FunctionType]]:
    """What `fn`'s own code starts (``mpi``, ``subprocess`` or nothing) and the helpers it names.

    Read once per function (the items of a parametrized test, and the tests calling one helper,
    share it): collecting the suite read the same code 2,529 times.
    """
    named = list(_references(fn.__code__, fn.__globals__, cls))
    if any(obj is harness.mpiexec_path for obj in named):
        kind: tuple[str, ...] = ("mpi",)
    elif any(_hashable(obj) and obj in STARTERS for obj in named):
        kind = ("subprocess",)
    else:
        kind = ()
    return kind, [f for obj in named for f in _functions(obj)]


def _hashable(obj: object) -> bool:
    return getattr(type(obj), "__hash__", None) is not None


def _recorded() -> dict[str, float]:
    if not DURATIONS.exists():
        return {}
    return json.loads(DURATIONS.read_text())["tests"]


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help="write each test's seconds (setup, call, teardown) to PATH (scripts/test_durations.py)",
    )
    parser.addoption(
        "--record-markers",
        metavar="PATH",
        help="write each collected test's markers to PATH (tests/test_suite.py: one collection)",
    )


def pytest_collection_modifyitems(config, items):
    """Apply mpi and subprocess (from the code), and slow (those, docs, and recorded durations)."""
    durations = _recorded()
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        fixtures = [d[-1].func for d in info.name2fixturedefs.values() if d] if info else []
        for kind in sorted(
            process_kinds([getattr(item, "function", None), *fixtures], getattr(item, "cls", None))
        ):
            item.add_marker(kind)
        marks = {m.name for m in item.iter_markers()}
        shares_costly = any(getattr(f, "costly", False) for f in fixtures)  # (`harness.costly`)
        if marks & {"mpi", "subprocess", "docs"} or shares_costly or durations.get(item.nodeid, 0.0) > SLOW_S:
            item.add_marker("slow")
        else:
            _quick.add(item.nodeid)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """With --record-markers PATH: every collected test id and its marker names, as `-m` sees them."""
    path = session.config.getoption("--record-markers")
    if path:
        from themis_mpi.output import write_json

        write_json(
            path, {item.nodeid: sorted({m.name for m in item.iter_markers()}) for item in session.items}
        )


# While a test runs: the item and its marker names. After each: the processes it started, its seconds.
_running: dict = {"item": None, "marks": set()}
_started: dict[str, set[str]] = {}
_seconds: dict[str, float] = {}
_quick: set[str] = set()
_hooked: list = []


def _origin() -> str:
    """The file of the innermost caller outside the standard library (who starts the process)."""
    frame = sys._getframe(2)
    while (
        frame is not None
        and frame.f_code.co_filename.startswith(STDLIB)
        and SITE not in frame.f_code.co_filename
    ):
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else ""


def _audit(event: str, args: tuple) -> None:
    """Fail a test that starts a process its markers do not declare (see the module's docstring)."""
    if event not in ARGV_AT or _running["item"] is None:
        return
    if not _in(_origin(), OURS):  # a library's own helper (matplotlib's fc-list) is not the test's
        return
    argv = args[ARGV_AT[event]]
    if isinstance(argv, (str, bytes, os.PathLike)):  # a command line (os.system, shell=True)
        argv = os.fsdecode(argv).split()
    name = os.path.basename(os.fsdecode(next(iter(argv), "")))
    kind = "mpi" if name.startswith(("mpiexec", "mpirun")) else "subprocess"
    _started.setdefault(_running["item"].nodeid, set()).add(kind)
    if "mpi" in _running["marks"] or kind in _running["marks"]:
        return
    raise UnmarkedProcess(
        f"{_running['item'].nodeid} starts {name} but is not marked {kind}: start processes "
        f"through tests/harness.py or the subprocess module where the test's code shows it, or "
        f"write @pytest.mark.{kind} on the test"
    )


def pytest_configure(config):
    harness.byte_compile()  # (the processes the suite starts then compile nothing)
    if _audit not in _hooked:  # an audit hook stays for the process's life
        sys.addaudithook(_audit)
        _hooked.append(_audit)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running.update(item=item, marks={m.name for m in item.iter_markers()})
    start = time.perf_counter()
    try:
        yield
    finally:
        _seconds[item.nodeid] = time.perf_counter() - start
        _running.update(item=None, marks=set())


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--record-durations")
    if path and _seconds:
        from themis_mpi.output import write_json

        write_json(
            path,
            {
                "tests": {k: round(v, 3) for k, v in sorted(_seconds.items())},
                "started": {k: sorted(v) for k, v in sorted(_started.items())},
            },
        )


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Name the quick tests that took over SLOW_S here: a hint to re-record, never a failure."""
    over = sorted((s, n) for n, s in _seconds.items() if n in _quick and s > SLOW_S)
    if over:
        names = ", ".join(f"{n} ({s:.1f} s)" for s, n in over[-5:])
        terminalreporter.write_line(
            f"{len(over)} test(s) not slow in {DURATIONS.name} took over {SLOW_S:g} s here, e.g. {names}; "
            "on a quiet machine, python scripts/test_durations.py re-records them"
        )
