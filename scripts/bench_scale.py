"""Scaling: the emulator's start-up and memory against plain MPI jobs, and the model's CPU per stage.

Usage::

    python scripts/bench_scale.py [--ranks 8,64,128,256] [--repeats N] [--tree DIR] [--before DIR]
        [--pyc env|cached|both] [--memory 8:16,64:16,256:4] [--chunks 64,1024,4096] [--out results]
        [--resume results/bench_scale.json]

Every MPI job is one ``mpiexec -n K`` of ``python scripts/bench_scale.py --worker KIND`` (as root
and oversubscribed, as the tests run it: `themis_mpi.launch.job_env`), timed from launch to exit
(``job_s``). After its work each rank reports its CPU time (user + system), its peak resident set
(ru_maxrss), its proportional set size at exit (PSS: shared pages split among the processes that
map them, so the sum over ranks is what the job held) and which of h5py, matplotlib, yaml and tqdm
it imported; the last rank also reports every module it imported.

1. Start-up, per rank count: the emulator job, ``themis-mpi run`` exactly as a user runs it, with
   the smallest collective (an 8 KiB float64 all-reduce, one chunk, baseline, one iteration,
   checked) on a 3-dim topology of that many NPUs; against the plain job, mpi4py and numpy without
   this package doing the same communicator set-up (the Cartesian communicator, one
   sub-communicator per dim, the control collectives the emulator uses) and the same all-reduce
   (MPI's Allreduce over each dim in turn). With ``--before DIR`` (a tree of an earlier commit,
   e.g. ``git archive HEAD~1 | tar -x -C /tmp/before``) that tree's emulator job runs too. The
   jobs of a repeat run back to back, every other repeat in reverse order, so machine noise hits
   all alike; ratios are of the medians over repeats (5 repeats up to 64 ranks, 3 at 128, 2 above,
   unless --repeats). Each rank also marks its CPU time where its phases end (PHASES: before MPI,
   MPI_Init, the grid, the rest), the emulator's by wrapping `run`'s start-up guard and `CartGrid`
   in the worker, so `run` itself is unchanged: a second table says where each job's CPU went.
   Where `run` refuses itself on some ranks (its memory pre-check, see 3),
   the same all-reduce runs through the library instead (column ``via``). Target (issue 18):
   emulator/plain at most 1.1 at 128 ranks.
2. Imports: the package modules a worker rank of the first start-up job imported, imported again
   in a fresh Python after numpy and mpi4py (MPI not initialised), per tree: CPU ms and added
   peak RSS, --import-runs times, interleaved. This isolates what the package's imports cost each
   rank from MPI's own start-up.
3. Memory, per ``RANKS:MIB`` pair: the emulator (a MIB MiB float64 all-reduce, 8 chunks,
   checked) with baseline and with Themis, one policy per job, against MPI's own ``Allreduce``
   of the same buffer (in place), each twice, interleaved, with the idle process (mpi4py and
   numpy, one barrier) for scale. The emulator runs through the library (`run.backend.open_backend`
   and `run_collective`, as `run` does, without its option parsing and its memory pre-check:
   that check asks 64 MiB per rank beyond the buffers, 16 GiB at 256 ranks, and each rank reads
   the free memory at its own moment, so on a shared 24 GiB machine some ranks of a 256-rank
   `run` refuse and the others wait in MPI_Init until the start-up deadline). Target:
   emulator/native mean peak RSS per rank at most 1.1; #wrong must be 0.
4. The model's CPU time per stage on the 1024-NPU paper topology 3D-SW_SW_SW_hetero, 1 GiB
   all-reduce, baseline+fifo and themis+scf: the minimum over ``--model-runs`` runs of
   `themis_mpi.model.model_collective` (``time.process_time``) divided by the stage records the
   engine kept (``len(engine.records)``). Target: 5 us per stage, i.e. 1024 chunks under 35 ms.

``--tree DIR`` is the tree whose emulator and model are measured (default this checkout; a
snapshot such as ``git archive HEAD | tar -x -C /tmp/after`` keeps others' uncommitted edits out).
``--pyc`` says how the jobs find the package's bytecode: ``env`` as this environment says (with
PYTHONDONTWRITEBYTECODE=1 and a source tree, every rank of every job compiles the package), or
``cached`` from a bytecode cache (PYTHONPYCACHEPREFIX in --out, filled by untimed one-rank
warm-ups), as after ``pip install .``; ``both`` measures both, interleaved. A failed emulator
job is tried again (RETRIES) and every failure is listed. Prints tables and writes
bench_scale.json into --out (default results/, created), rewritten after every job; ``--resume``
with that file (same options) takes the jobs it holds from there, so a run stopped halfway (this
machine's long processes get SIGTERM now and then) goes on where it stopped.
"""

import json
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SHAPES = {8: (2, 2, 2), 16: (4, 2, 2), 32: (4, 4, 2), 64: (4, 4, 4), 128: (8, 4, 4), 256: (8, 8, 4)}
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STARTUP_BYTES = 8192  # the start-up jobs' all-reduce: 1024 float64 elements
TIMEOUT_S = 300.0  # the emulator's --timeout-s: 256 ranks on 2 shared cores may take a minute in MPI_Init
RETRIES = 2  # more attempts of a failed emulator job (see `Jobs.run`)
REFUSED = "BENCH-REFUSED"  # a rank's line: `run` ended on it before MPI started
MEMORY_CHUNKS = 8
STARTUP_TARGET, MEMORY_TARGET, STAGE_TARGET_US = 1.1, 1.1, 5.0
MODEL_TOPOLOGY = "3D-SW_SW_SW_hetero"
MODEL_POLICIES = (("baseline", "fifo"), ("themis", "scf"))
HEAVY = ("h5py", "matplotlib", "yaml", "tqdm")  # what only rank 0 may need: traces, plots, YAML, bars
PHASES = ("before_mpi", "mpi_init", "grid", "rest")  # a start-up job's CPU per rank, phase by phase
_MARKS: list[float] = []  # a worker's CPU time (time.process_time) at the end of each phase but the last


def topology_for(n: int) -> str:
    """A 3-dim topology of n NPUs: a ring, a fully connected dim and a switch."""
    a, b, c = SHAPES[n]
    return f"Ring({a},100,20)_FC({b},100,700)_SW({c},100,700)"


def run_args(n: int, size_bytes: int, chunks: int, policy: str) -> list[str]:
    """`themis-mpi` arguments of one checked all-reduce, one iteration, on the n-NPU topology."""
    return ["run", "-t", topology_for(n), "-b", str(size_bytes), "-c", str(chunks), "-p", policy,
            "-n", "1", "-w", "0", "-q", "--timeout-s", str(TIMEOUT_S)]  # fmt: skip


# --- inside mpiexec ------------------------------------------------------------------------------


def _pss_mib() -> float:
    """This process's proportional set size now, in MiB (0 where /proc has no smaps_rollup)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _report(comm, out: dict) -> None:
    """Gather every rank's CPU time, memory and heavy imports; rank 0 prints them as one JSON line.

    The last rank (a worker, not the coordinator) also sends the names of the modules it imported.
    """
    usage = resource.getrusage(resource.RUSAGE_SELF)
    last = comm.Get_rank() == comm.Get_size() - 1
    marks = [0.0, *_MARKS, time.process_time()] if len(_MARKS) == len(PHASES) - 1 else None
    mine = (
        [b - a for a, b in zip(marks, marks[1:])] if marks else None,
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss / 1024.0,
        _pss_mib(),
        [m for m in HEAVY if m in sys.modules],
        sorted(sys.modules) if last else None,
    )
    ranks = comm.gather(mine, root=0)
    if comm.Get_rank() == 0:
        phases, cpu, rss, pss, heavy, modules = zip(*ranks)
        if all(phases):
            out["phase_cpu_ms"] = {
                p: 1e3 * sum(r[i] for r in phases) / len(phases) for i, p in enumerate(PHASES)
            }
        out.update(
            cpu_s_total=sum(cpu),
            rss_mib_mean=sum(rss) / len(rss),
            rss_mib_max=max(rss),
            rss_mib_total=sum(rss),
            pss_mib_total=sum(pss),
            heavy_imports=sorted({m for names in heavy for m in names}),
            worker_modules=modules[-1],
        )
        print("RESULT " + json.dumps(out), flush=True)


def worker(kind: str, argv: list[str]) -> None:
    """One rank of a job: `cli` runs `themis-mpi ARGV`; the others are plain mpi4py jobs."""
    if kind == "cli":
        from themis_mpi.cli import main
        from themis_mpi.run import backend

        _mark_phases(backend)
        code = main(argv)
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is None or not mpi.Is_initialized():  # refused before MPI: the CLI tells rank 0's reason only
            from themis_mpi.limits import available_memory_bytes

            free_gib = (available_memory_bytes() or 0) / 2**30
            print(f"{REFUSED} rank {os.environ.get('PMI_RANK')}: themis-mpi exited {code} before MPI started "
                  f"(MemAvailable now {free_gib:.1f} GiB)", file=sys.stderr, flush=True)  # fmt: skip
            sys.exit(code or 1)
        _report(mpi.COMM_WORLD, {"exit": code})
        return
    import numpy as np

    out: dict = {}
    if kind != "lib":
        _MARKS.append(time.process_time())
        from mpi4py import MPI

        _MARKS.append(time.process_time())
        comm = MPI.COMM_WORLD
    if kind == "plain":  # what the emulator's start-up job asks of MPI, without this package
        shape, size_bytes = [int(x) for x in argv[0].split(",")], int(argv[1])
        buf = np.ones(size_bytes // 8)
        cart = comm.Create_cart(shape, periods=[True] * len(shape), reorder=False)
        subs = [cart.Sub([i == d for i in range(len(shape))]) for d in range(len(shape))]
        _MARKS.append(time.process_time())
        cart.Ibcast(np.zeros(len(shape), np.int32)).Wait()
        cart.Ibarrier().Wait()
        cart.Iallreduce(np.ones(1), np.empty(1), op=MPI.MAX).Wait()
        for sub in subs:
            sub.Allreduce(MPI.IN_PLACE, buf)
        out["wrong"] = int(np.count_nonzero(buf != comm.Get_size()))
        for c in subs + [cart]:
            c.Free()
    elif kind == "lib":  # the emulator through the library: `run` without option parsing and memory pre-check
        _library_run(argv[0], int(argv[1]), int(argv[2]), argv[3], out)
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    elif kind == "native":  # MPI's own all-reduce of the buffer
        buf = np.ones(int(argv[0]) // 8)
        comm.Barrier()
        comm.Allreduce(MPI.IN_PLACE, buf)
        out["wrong"] = int(np.count_nonzero(buf != comm.Get_size()))
    elif kind == "idle":  # the process with mpi4py and numpy, one barrier
        comm.Barrier()
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")
    _report(comm, out)


def _mark_phases(backend) -> None:
    """Mark the phases of `run`, unchanged: on entering and leaving its MPI start-up, after the grid."""
    start_up = backend._start_up_deadline

    @contextmanager
    def marked(timeout_s: float):
        _MARKS.append(time.process_time())
        with start_up(timeout_s):
            yield
        _MARKS.append(time.process_time())
        from themis_mpi.mpi.grid import CartGrid  # (imports mpi4py.MPI: only once MPI is up)

        init = CartGrid.__init__

        def marked_init(self, *args, **kwargs) -> None:
            init(self, *args, **kwargs)
            _MARKS.append(time.process_time())

        CartGrid.__init__ = marked_init

    backend._start_up_deadline = marked


def _library_run(topology: str, size_bytes: int, chunks: int, policy: str, out: dict) -> None:
    """One checked float64 all-reduce through `open_backend` and `run_collective`, as `run` does."""
    from themis_mpi.collectives import Collective
    from themis_mpi.config import RunConfig
    from themis_mpi.policies import make_inter
    from themis_mpi.run.backend import open_backend
    from themis_mpi.run.collective import run_collective
    from themis_mpi.topology import parse_topology

    topo = parse_topology(topology)
    coll = Collective("all_reduce", size_bytes // 8, "float64", chunks, tuple(range(len(topo.dims))))
    inter = make_inter(policy)
    config = RunConfig(intra=inter.default_intra, timeout_s=TIMEOUT_S)
    with open_backend(topo, True, TIMEOUT_S) as backend:
        result, _ = run_collective(backend.transport(config), coll, inter, check=True)
    out.update(wrong=int(result.wrong), time_us=result.time_us, wall_s=result.wall_s)


# --- the parent ----------------------------------------------------------------------------------


class Jobs:
    """Starts mpiexec jobs of this script with one environment per bytecode mode."""

    def __init__(self, args):
        from themis_mpi.launch import job_env, mpiexec_path

        self.args, self.mpiexec = args, mpiexec_path()
        self.env = {"env": job_env()}
        cache = job_env(PYTHONPYCACHEPREFIX=os.path.abspath(os.path.join(args.out, "pycache")))
        cache.pop("PYTHONDONTWRITEBYTECODE", None)
        self.env["cached"] = cache
        self.failures: list[dict] = []
        self.jobs: list[dict] = []  # every finished job, as it finishes (with its argv)
        self.previous: list[dict] = []  # --resume: the finished jobs of an earlier run
        self.previous_failures: list[dict] = []
        if args.resume and os.path.exists(args.resume):
            with open(args.resume) as f:
                earlier = json.load(f)
            self.previous, self.previous_failures = earlier.get("jobs", []), earlier.get("failures", [])
        self.saved: Callable[[], None] = lambda: None  # called after every job

    def run(self, n: int, kind: str, argv: list[str], pyc: str, tree: str = "", reuse: bool = True) -> dict:
        """Run one job; its result line, with job_s and the job's ranks.

        A failed emulator job is tried again, up to RETRIES times, and every failure is kept in
        `failures` (the report shows them): `run` refuses a job whose ranks would not fit in the
        machine's free memory, and on a shared machine that answer can change from one try to the
        next. `JobFailed` when every attempt failed. With --resume, a job the earlier run finished
        (or failed every time) is taken from there instead of being run again.
        """
        tree = tree or self.args.tree
        key = {"kind": kind, "tree": tree, "pyc": pyc, "argv": argv, "ranks": n}
        same = [j for j in self.previous if reuse and all(j.get(k) == v for k, v in key.items())]
        done = same[0] if same else None
        if done is not None:
            self.previous.remove(done)
            self.jobs.append(done)
            return done
        failed = [f for f in self.previous_failures if all(f.get(k) == v for k, v in key.items())]
        if len(failed) >= 1 + RETRIES:
            for f in failed[: 1 + RETRIES]:
                self.previous_failures.remove(f)
                self.failures.append(f)
            raise JobFailed(f"{kind} job on {n} ranks failed every time in the resumed run")
        env = dict(self.env[pyc], PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
        rows_json = os.path.abspath(os.path.join(self.args.out, f".rows-{os.getpid()}.json"))
        cmd = [self.mpiexec, "-n", str(n), sys.executable, os.path.join(HERE, "bench_scale.py")]
        cmd += ["--worker", kind, *argv] + (["--json", rows_json] if kind == "cli" else [])  # rows: #wrong
        for attempt in range(1 + (RETRIES if kind in ("cli", "lib") else 0)):
            t0 = time.perf_counter()
            code, stdout, stderr = _launch(cmd, env, self.args.timeout)
            job_s = time.perf_counter() - t0
            line = next((ln for ln in stdout.splitlines() if ln.startswith("RESULT ")), None)
            result = json.loads(line[len("RESULT ") :]) if line else {}
            if code == 0 and line is not None and result.get("exit", 0) == 0:
                if kind == "cli":
                    with open(rows_json) as f:
                        result["wrong"] = sum(row["wrong"] for row in json.load(f))
                    os.remove(rows_json)
                modules = result.pop("worker_modules")
                result["worker_package_modules"] = [m for m in modules if m.split(".")[0] == "themis_mpi"]
                result["worker_module_count"] = len(modules)
                record = {**key, "job_s": job_s, "attempts": attempt + 1, **result}
                self.jobs.append(record)
                self.saved()
                return record
            lines = stderr.splitlines()
            why = next(
                (ln for ln in lines if ln.startswith(REFUSED) or "error" in ln.lower()), stderr.strip()[-300:]
            )
            self.failures.append(
                {**key, "attempt": attempt + 1, "exit": code, "job_s": job_s, "why": why[:600]}
            )
            self.saved()
            print(f"  FAILED {kind} on {n} ranks (attempt {attempt + 1}, exit {code}): {why[:300]}",
                  file=sys.stderr, flush=True)  # fmt: skip
        raise JobFailed(f"{kind} job on {n} ranks failed {attempt + 1} time(s): {why[:300]}")


class JobFailed(Exception):
    """Every attempt of a job failed."""


def _launch(cmd: list[str], env: dict, timeout_s: float) -> tuple[int | str, str, str]:
    """Run a job in its own process group: (exit code or why it was stopped, stdout, stderr).

    The job is stopped (its whole group) after `timeout_s`, or as soon as a rank says it left
    before MPI started (REFUSED): the other ranks would wait for it until the start-up deadline.
    """
    import signal
    import subprocess
    import threading

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    out: dict[str, list[str]] = {"stdout": [], "stderr": []}
    refused = threading.Event()

    def read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)
            if line.startswith(REFUSED):
                refused.set()

    readers = [threading.Thread(target=read, args=(proc.stdout, out["stdout"])),
               threading.Thread(target=read, args=(proc.stderr, out["stderr"]))]  # fmt: skip
    for t in readers:
        t.start()

    def stop() -> None:
        for sig, grace_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 60.0)):
            try:
                os.killpg(proc.pid, sig)  # the group this call started, by its id
            except ProcessLookupError:
                return
            try:
                proc.wait(grace_s)
                return
            except subprocess.TimeoutExpired:
                continue

    deadline, code = time.monotonic() + timeout_s, None
    try:
        while code is None:
            code = proc.poll()
            if code is None and (refused.is_set() or time.monotonic() > deadline):
                code = "refused" if refused.is_set() else "timeout"
                stop()
            time.sleep(0.1)
    except BaseException:  # this script is stopping: take the job down with it
        stop()
        raise
    for t in readers:
        t.join(30)
    return code, "".join(out["stdout"]), "".join(out["stderr"])


def startup_variants(
    n: int, tree: str, before: str | None, modes: list[str]
) -> list[tuple[str, str, str, list, str]]:
    """(name, bytecode mode, worker kind, argv, tree) of each start-up job at n ranks."""
    cli = run_args(n, STARTUP_BYTES, 1, "baseline")
    out = []
    for pyc in modes:
        out.append(("plain", pyc, "plain", [",".join(map(str, SHAPES[n])), str(STARTUP_BYTES)], tree))
        out.append(("emulator", pyc, "cli", cli, tree))
        if before:
            out.append(("before", pyc, "cli", cli, os.path.abspath(before)))
    return out


def _median(values: list[float]) -> float:
    from themis_mpi.results import median  # not at the top: the plain jobs never import the package

    return median(values)


def startup(jobs: Jobs, ranks: list[int], modes: list[str], args) -> Iterator[dict]:
    """Every start-up job at every rank count, repeated, every other repeat in reverse order; rows."""
    for n in ranks:
        variants = startup_variants(n, args.tree, args.before, modes)
        repeats = args.repeats or (5 if n <= 64 else 3 if n <= 128 else 2)
        samples: dict[tuple[str, str], list[dict]] = {(name, pyc): [] for name, pyc, *_ in variants}
        for r in range(repeats):
            for name, pyc, kind, argv, tree in variants if r % 2 == 0 else variants[::-1]:
                try:
                    samples[name, pyc].append(dict(jobs.run(n, kind, argv, pyc, tree), via="run"))
                except JobFailed:  # kept in jobs.failures
                    if kind != "cli" or jobs.failures[-1]["exit"] != "refused":
                        continue  # the variant has one sample fewer
                    try:  # `run` refused itself (memory pre-check): the same all-reduce through the library
                        lib = [topology_for(n), str(STARTUP_BYTES), "1", "baseline"]
                        samples[name, pyc].append(dict(jobs.run(n, "lib", lib, pyc, tree), via="lib"))
                    except JobFailed:
                        continue
                print(f"  start-up {n:>4} ranks {name:>8} ({pyc}): {samples[name, pyc][-1]['job_s']:7.2f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
        for pyc in modes:
            row: dict = {"ranks": n, "pyc": pyc, "topology": topology_for(n), "repeats": repeats}
            for (name, mode), runs in samples.items():
                if mode == pyc and runs:
                    row[name] = {
                        "runs": len(runs),
                        "via": "+".join(sorted({x["via"] for x in runs})),
                        "job_s": [x["job_s"] for x in runs],
                        "job_s_median": _median([x["job_s"] for x in runs]),
                        "cpu_s_total_median": _median([x["cpu_s_total"] for x in runs]),
                        "rss_mib_mean": _median([x["rss_mib_mean"] for x in runs]),
                        "wrong": max(x.get("wrong", 0) for x in runs),
                        "heavy_imports": sorted({m for x in runs for m in x["heavy_imports"]}),
                        "worker_package_modules": runs[0]["worker_package_modules"],
                        "worker_module_count": runs[0]["worker_module_count"],
                    }
                    marked = [x["phase_cpu_ms"] for x in runs if "phase_cpu_ms" in x]
                    if marked:
                        row[name]["phase_cpu_ms"] = {p: _median([m[p] for m in marked]) for p in PHASES}
            for name in ("emulator", "before"):
                if name in row and "plain" in row:
                    plain = row["plain"]
                    row[f"{name}_over_plain"] = row[name]["job_s_median"] / plain["job_s_median"]
                    row[f"{name}_cpu_over_plain"] = (
                        row[name]["cpu_s_total_median"] / plain["cpu_s_total_median"]
                    )
            yield row


IMPORT_PROBE = """
import json, resource, sys, time
import mpi4py
mpi4py.rc.initialize = False  # the modules' cost without MPI_Init's
import numpy, mpi4py.MPI
t0, rss0 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for name in sys.argv[1:]:
    __import__(name)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"cpu_ms": 1e3 * (time.process_time() - t0), "rss_mib": (rss - rss0) / 1024}))
"""


def import_cost(jobs: Jobs, startup_rows: list[dict], modes: list[str], args) -> list[dict]:
    """What the package's imports cost a worker rank, per tree and bytecode mode.

    The package modules a worker rank of the first start-up job imported, imported again in a fresh
    Python after numpy and mpi4py (MPI not initialised): CPU time and added peak RSS, --import-runs
    times, interleaved.
    """
    import subprocess

    trees = {"emulator": args.tree, "before": os.path.abspath(args.before) if args.before else None}
    row0 = {name: row[name] for row in reversed(startup_rows) for name in trees if name in row}
    variants = [(name, pyc) for pyc in modes for name in trees if trees[name] and name in row0]
    samples: dict[tuple[str, str], list[dict]] = {v: [] for v in variants}
    for r in range(args.import_runs):
        for name, pyc in variants if r % 2 == 0 else variants[::-1]:
            env = dict(jobs.env[pyc], PYTHONPATH=str(trees[name]))
            modules = row0[name]["worker_package_modules"]
            proc = subprocess.run(
                [sys.executable, "-c", IMPORT_PROBE, *modules],
                capture_output=True,
                text=True,
                env=env,
                timeout=300,
            )
            if proc.returncode != 0:
                raise SystemExit(f"import probe of {name} failed:\n{proc.stderr[-2000:]}")
            samples[name, pyc].append(json.loads(proc.stdout))
    rows = []
    for (name, pyc), runs in samples.items():
        cpu = [x["cpu_ms"] for x in runs]
        rows.append(
            {
                "tree": name,
                "pyc": pyc,
                "modules": len(row0[name]["worker_package_modules"]),
                "cpu_ms_min": min(cpu),
                "cpu_ms_median": _median(cpu),
                "rss_mib_median": _median([x["rss_mib"] for x in runs]),
                "runs": len(runs),
            }
        )
    return rows


def memory(jobs: Jobs, pairs: list[tuple[int, int]], pyc: str) -> Iterator[dict]:
    """Per (ranks, MiB): the idle job, then native, baseline and themis jobs twice, interleaved; rows."""
    for n, mib in pairs:
        size = mib * 2**20
        row: dict = {"ranks": n, "size_mib": mib, "pyc": pyc, "topology": topology_for(n), "wrong": 0}
        samples: dict[str, list[dict]] = {"idle": [], "native": [], "baseline": [], "themis": []}
        rounds = [["idle", "native", "baseline", "themis"], ["baseline", "themis", "native"]]
        for name in (name for names in rounds for name in names):
            if name in ("idle", "native"):
                argv, kind = [str(size)], name
            else:  # the emulator, one policy
                argv, kind = [topology_for(n), str(size), str(MEMORY_CHUNKS), name], "lib"
            try:
                result = jobs.run(n, kind, argv, pyc)
            except JobFailed:
                continue
            row["wrong"] += result.get("wrong", 0)
            samples[name].append(result)
            mean = result["rss_mib_mean"]
            print(f"  memory {n:>4} ranks {mib} MiB {name:>8} ({pyc}): {mean:7.1f} MiB/rank", file=sys.stderr)
        for name, runs in samples.items():  # the mean of the runs
            if runs:
                numbers = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
                row[name] = {key: sum(r[key] for r in runs) / len(runs) for key in numbers}
                row[name]["heavy_imports"] = sorted({m for r in runs for m in r["heavy_imports"]})
        if all(name in row for name in ("native", "baseline", "themis")):
            emu = max(row["baseline"], row["themis"], key=lambda r: r["rss_mib_mean"])
            row["emulator"] = emu
            row["emulator_over_native"] = emu["rss_mib_mean"] / row["native"]["rss_mib_mean"]
            row["emulator_extra_mib_per_rank"] = emu["rss_mib_mean"] - row["native"]["rss_mib_mean"]
        yield row


def model_stages(chunk_counts: list[int], runs: int) -> list[dict]:
    """CPU time per stage of the model: min over runs of model_collective, per policy and chunk count."""
    from themis_mpi.collectives import Collective
    from themis_mpi.config import RunConfig
    from themis_mpi.run.collective import model_collective
    from themis_mpi.topology import parse_topology

    topo = parse_topology(MODEL_TOPOLOGY)
    rows = []
    for chunks in chunk_counts:
        coll = Collective("all_reduce", 2**30 // 4, "float32", chunks, tuple(range(len(topo.dims))))
        for policy, intra in MODEL_POLICIES:
            config = RunConfig(intra=intra)
            cpu, stages = [], 0
            for _ in range(runs):
                t0 = time.process_time()
                _, engine = model_collective(topo, coll, policy, config)
                cpu.append(time.process_time() - t0)
                stages = len(engine.records)
            best = min(cpu)
            rows.append(
                {
                    "policy": policy,
                    "intra": intra,
                    "chunks": chunks,
                    "stages": stages,
                    "cpu_s_min": best,
                    "cpu_s_median": _median(cpu),
                    "us_per_stage": 1e6 * best / stages,
                }
            )
            print(
                f"  model {policy}+{intra} {chunks:>5} chunks: {1e3 * best:8.1f} ms",
                file=sys.stderr,
                flush=True,
            )
    return rows


def warm_up(jobs: Jobs, args, pyc: str) -> None:
    """Untimed one-rank runs of every job kind: they fill the bytecode cache of `cached`."""
    cli = ["run", "-t", "Ring(1,100,20)", "-b", "8K", "-c", "1", "-p", "both", "-n", "1", "-w", "0", "-q"]
    jobs.run(1, "plain", ["1", str(STARTUP_BYTES)], pyc, reuse=False)
    jobs.run(1, "native", [str(STARTUP_BYTES)], pyc, reuse=False)
    jobs.run(1, "idle", [str(STARTUP_BYTES)], pyc, reuse=False)
    jobs.run(1, "cli", cli, pyc, reuse=False)
    if args.before:
        jobs.run(1, "cli", cli, pyc, os.path.abspath(args.before), reuse=False)


def _heavy(row: dict, names: tuple[str, ...]) -> str:
    """The heavy modules any rank of the named jobs of a row imported ("-": none)."""
    return ",".join(sorted({m for name in names if name in row for m in row[name]["heavy_imports"]})) or "-"


def _table(rows: list[dict], columns: list[tuple[str, int, Callable[[dict], object]]]) -> None:
    """Print rows under right-aligned headers; a cell whose job failed every time shows "-"."""
    print("#" + " ".join(f"{h:>{w}}" for h, w, _ in columns)[1:])
    for r in rows:
        cells = []
        for _, width, fn in columns:
            try:
                cells.append(f"{fn(r):>{width}}")
            except KeyError:  # no --before, or a job that failed every time
                cells.append(f"{'-':>{width}}")
        print(" ".join(cells))


def print_tables(doc: dict) -> None:
    """The tables, with each target's verdict, and the failed jobs."""
    names = (("plain", "plain"), ("emulator", "emu"), ("before", "before"))
    print(
        f"# start-up: whole mpiexec job (s, median of repeats) of an {STARTUP_BYTES} B float64 all-reduce, "
        f"1 chunk, on {doc['cores']} cores; emu/plain target <= {STARTUP_TARGET} at 128 ranks; before = the "
        "--before tree's emulator; cpu = CPU ms per rank (all ranks' user+system / ranks); rss = mean peak "
        "RSS per rank (MiB); heavy = h5py, matplotlib, yaml or tqdm imported on any rank; via = run (the "
        "CLI), or lib (the library, where `run` refused itself on some ranks: its memory pre-check)"
    )
    columns: list[tuple[str, int, Callable[[dict], object]]] = [
        ("pyc", 7, lambda r: r["pyc"]),
        ("ranks", 6, lambda r: r["ranks"]),
        ("rep", 4, lambda r: r["repeats"]),
    ]
    for name, short in names:
        columns.append((f"{short}_s", 9, lambda r, k=name: f"{r[k]['job_s_median']:.2f}"))
        if name != "plain":
            columns.append((f"{short}/plain", 12, lambda r, k=name: f"{r[k + '_over_plain']:.3f}"))
    for name, short in names:
        columns.append(
            (f"{short}_cpu", 10, lambda r, k=name: f"{1e3 * r[k]['cpu_s_total_median'] / r['ranks']:.0f}")
        )
    for name, short in names:
        columns.append((f"{short}_rss", 10, lambda r, k=name: f"{r[k]['rss_mib_mean']:.1f}"))
    columns.append(
        ("#wrong", 7, lambda r: sum(r[k]["wrong"] for k in ("plain", "emulator", "before") if k in r))
    )
    columns.append(("heavy", 6, lambda r: _heavy(r, ("emulator", "before"))))
    columns.append(("via", 8, lambda r: "/".join(r[k]["via"] for k in ("emulator", "before") if k in r)))
    _table(doc["startup"], columns)
    phased = [
        {"pyc": r["pyc"], "ranks": r["ranks"], "job": k, **r[k]["phase_cpu_ms"]}
        for r in doc["startup"]
        for k, _ in names
        if "phase_cpu_ms" in r.get(k, {})
    ]
    if phased:
        print(
            "\n# start-up CPU per rank by phase (ms, mean over ranks, median of repeats): before_mpi = "
            "interpreter, imports and (emulator) option parsing and checks; mpi_init = importing mpi4py.MPI "
            "(MPI_Init; the emulator's inside its start-up guard); grid = the Cartesian communicator and one "
            "per dim; rest = the all-reduce, freeing and exit work up to the report"
        )
        _table(
            phased,
            [
                ("pyc", 7, lambda m: m["pyc"]),
                ("ranks", 6, lambda m: m["ranks"]),
                ("job", 9, lambda m: m["job"]),
                *[(p, 11, lambda m, p=p: f"{m[p]:.1f}") for p in PHASES],
                ("total", 8, lambda m: f"{sum(m[p] for p in PHASES):.1f}"),
            ],
        )
    if doc["imports"]:
        print(
            "\n# the package modules a worker rank of the start-up job imported, imported again in a fresh "
            "Python after numpy and mpi4py (no MPI_Init): CPU ms and added peak RSS (MiB), per tree"
        )
        _table(
            doc["imports"],
            [
                ("tree", 9, lambda m: m["tree"]),
                ("pyc", 7, lambda m: m["pyc"]),
                ("modules", 8, lambda m: m["modules"]),
                ("cpu_min", 8, lambda m: f"{m['cpu_ms_min']:.1f}"),
                ("cpu_med", 8, lambda m: f"{m['cpu_ms_median']:.1f}"),
                ("rss_med", 8, lambda m: f"{m['rss_mib_median']:.1f}"),
                ("runs", 5, lambda m: m["runs"]),
            ],
        )
    if doc["memory"]:
        print(
            "\n# memory per rank (MiB): mean over ranks of the peak RSS (ru_maxrss), mean of the runs; the "
            "emulator through the library (`run` without option parsing and memory pre-check), the larger of "
            f"its baseline and themis jobs; emu/native target <= {MEMORY_TARGET}; totals over all ranks: "
            "the sum of peak RSS (counts shared pages once per rank) and PSS at exit (splits them)"
        )
        _table(
            doc["memory"],
            [
                ("pyc", 7, lambda r: r["pyc"]),
                ("ranks", 6, lambda r: r["ranks"]),
                ("MiB", 5, lambda r: r["size_mib"]),
                ("idle", 7, lambda r: f"{r['idle']['rss_mib_mean']:.1f}"),
                ("native", 7, lambda r: f"{r['native']['rss_mib_mean']:.1f}"),
                ("baseline", 9, lambda r: f"{r['baseline']['rss_mib_mean']:.1f}"),
                ("themis", 7, lambda r: f"{r['themis']['rss_mib_mean']:.1f}"),
                ("emu/native", 11, lambda r: f"{r['emulator_over_native']:.3f}"),
                ("emu-native", 11, lambda r: f"{r['emulator_extra_mib_per_rank']:.1f}"),
                ("emu_rss_total", 14, lambda r: f"{r['emulator']['rss_mib_total']:.0f}"),
                ("native_rss_total", 17, lambda r: f"{r['native']['rss_mib_total']:.0f}"),
                ("emu_pss_exit", 13, lambda r: f"{r['emulator']['pss_mib_total']:.0f}"),
                ("#wrong", 7, lambda r: r["wrong"]),
            ],
        )
    if doc["model"]:
        print(
            f"\n# model: {MODEL_TOPOLOGY}, 1 GiB float32 all-reduce; CPU time of model_collective, min of "
            f"runs, per stage record; target <= {STAGE_TARGET_US} us per stage (1024 chunks: under 35 ms)"
        )
        _table(
            doc["model"],
            [
                ("policy", 9, lambda m: m["policy"]),
                ("intra", 5, lambda m: m["intra"]),
                ("chunks", 7, lambda m: m["chunks"]),
                ("stages", 7, lambda m: m["stages"]),
                ("cpu_ms", 9, lambda m: f"{1e3 * m['cpu_s_min']:.1f}"),
                ("us/stage", 9, lambda m: f"{m['us_per_stage']:.2f}"),
                ("target", 7, lambda m: "met" if m["us_per_stage"] <= STAGE_TARGET_US else "missed"),
            ],
        )
    if doc["failures"]:
        print(f"\n# failed attempts ({len(doc['failures'])}; an emulator job is tried {RETRIES} more times)")
        for f in doc["failures"]:
            print(f"  {f['kind']} {f['ranks']} ranks ({f['pyc']}, {f['tree']}) attempt {f['attempt']}: "
                  f"exit {f['exit']} after {f['job_s']:.0f} s: {f['why'][:200]}")  # fmt: skip


def _commit(tree: str) -> str:
    """The tree's commit, with ``+changes`` when its tracked files differ from it ("" outside git)."""
    import subprocess

    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], capture_output=True, text=True, cwd=tree).stdout.strip()

    if not os.path.isdir(os.path.join(tree, ".git")):
        return ""
    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "-uno") else "")


def main() -> None:
    """Run the chosen parts; print the tables; write bench_scale.json."""
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3:])
        return
    import argparse
    import signal

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="8,64,128,256", help="start-up rank counts ('' skips)")
    ap.add_argument(
        "--repeats", type=int, default=0, help="start-up repeats (default 5 to 64 ranks, 3 at 128, 2 above)"
    )
    ap.add_argument(
        "--tree", default=ROOT, help="the tree whose emulator and model run (default this checkout)"
    )
    ap.add_argument("--before", metavar="DIR", help="a tree of an earlier commit: its emulator job too")
    ap.add_argument("--pyc", default="env", choices=("env", "cached", "both"), help="bytecode (default env)")
    ap.add_argument(
        "--memory", default="8:16,64:16,256:4", help="RANKS:MIB pairs of the memory jobs ('' skips)"
    )
    ap.add_argument("--chunks", default="64,1024,4096", help="model chunk counts ('' skips)")
    ap.add_argument("--import-runs", type=int, default=20, help="runs of each import probe (20)")
    ap.add_argument("--model-runs", type=int, default=5, help="model runs per row; the minimum counts (5)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per mpiexec job (1800)")
    ap.add_argument("--out", default="results", help="output folder (default results)")
    ap.add_argument(
        "--resume",
        metavar="JSON",
        help="an earlier run's bench_scale.json: its finished jobs are not run again",
    )
    args = ap.parse_args()
    args.tree = os.path.abspath(args.tree)
    sys.path.insert(0, args.tree)  # the model and the helpers of this process come from that tree too
    ranks = [int(x) for x in args.ranks.split(",") if x]
    pairs = [(int(a), int(b)) for a, b in (p.split(":") for p in args.memory.split(",") if p)]
    unknown = sorted({n for n in ranks + [n for n, _ in pairs] if n not in SHAPES})
    if unknown:
        ap.error(f"rank counts {unknown}: use {sorted(SHAPES)}")
    os.makedirs(args.out, exist_ok=True)
    jobs = Jobs(args)
    modes = ["env", "cached"] if args.pyc == "both" else [args.pyc]
    doc: dict = {
        "cores": os.cpu_count(),
        "tree": args.tree,
        "commit": _commit(args.tree),
        "before": args.before,
    }
    doc.update(startup=[], imports=[], memory=[], model=[], failures=jobs.failures, jobs=jobs.jobs)
    from themis_mpi.output import write_json

    def save() -> None:  # after every job and row: a long run that dies keeps what it measured
        write_json(os.path.join(args.out, "bench_scale.json"), doc)

    jobs.saved = save

    def terminated(signum, frame) -> None:
        raise SystemExit(f"bench_scale.py: stopped by signal {signum}; what it measured is in {args.out}")

    signal.signal(signal.SIGTERM, terminated)

    for pyc in modes if ranks or pairs else []:
        warm_up(jobs, args, pyc)
    for row in startup(jobs, ranks, modes, args):
        doc["startup"].append(row)
        save()
    if doc["startup"]:
        doc["imports"] = import_cost(jobs, doc["startup"], modes, args)
        save()
    for pyc in modes:
        for row in memory(jobs, pairs, pyc):
            doc["memory"].append(row)
            save()
    doc["model"] = model_stages([int(x) for x in args.chunks.split(",") if x], args.model_runs)
    save()
    print_tables(doc)


if __name__ == "__main__":
    main()
