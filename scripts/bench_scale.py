"""Scaling: the emulator's start-up and memory against plain MPI jobs, and the model's CPU per stage.

Usage::

    python scripts/bench_scale.py [--ranks 8,64,128,256] [--repeats N] [--tree DIR] [--before DIR]
        [--pyc env|cached|both] [--memory 8:16,64:16,256:4] [--chunks 64,1024,4096] [--out results]

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
   unless --repeats). Target (issue 18): emulator/plain at most 1.1 at 128 ranks.
2. Imports: the package modules a worker rank of the first start-up job imported, imported again
   in a fresh Python after numpy and mpi4py (MPI not initialised), per tree: CPU ms and added
   peak RSS, --import-runs times, interleaved. This isolates what the package's imports cost each
   rank from MPI's own start-up.
3. Memory, per ``RANKS:MIB`` pair: the emulator job (``run``, one MIB MiB float64 all-reduce,
   8 chunks, checked) with baseline and with Themis, against MPI's own ``Allreduce`` of the same
   buffer (in place), each twice, interleaved; the idle process (mpi4py and numpy, one barrier)
   for scale; and one ``run -p both`` job (both policies one after the other, as `run` does by
   default). Target: emulator/native mean peak RSS per rank at most 1.1; #wrong must be 0.
4. The model's CPU time per stage on the 1024-NPU paper topology 3D-SW_SW_SW_hetero, 1 GiB
   all-reduce, baseline+fifo and themis+scf: the minimum over ``--model-runs`` runs of
   `themis_mpi.model.model_collective` (``time.process_time``) divided by the stage records the
   engine kept (``len(engine.records)``). Target: 5 us per stage, i.e. 1024 chunks under 35 ms.

``--tree DIR`` is the tree whose emulator and model are measured (default this checkout; a
snapshot such as ``git archive HEAD | tar -x -C /tmp/after`` keeps others' uncommitted edits out).
``--pyc`` says how the jobs find the package's bytecode: ``env`` as this environment says (with
PYTHONDONTWRITEBYTECODE=1 and a source tree, every rank of every job compiles the package), or
``cached`` from a bytecode cache (PYTHONPYCACHEPREFIX in --out, filled by untimed one-rank
warm-ups), as after ``pip install .``; ``both`` measures both, interleaved. Prints tables and
writes bench_scale.json into --out (default results/, created).
"""

import json
import os
import resource
import sys
import time

SHAPES = {8: (2, 2, 2), 16: (4, 2, 2), 32: (4, 4, 2), 64: (4, 4, 4), 128: (8, 4, 4), 256: (8, 8, 4)}
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STARTUP_BYTES = 8192  # the start-up jobs' all-reduce: 1024 float64 elements
TIMEOUT_S = "900"  # the emulator's --timeout-s: 256 ranks on 2 shared cores may take a minute in MPI_Init
MEMORY_CHUNKS = 8
STARTUP_TARGET, MEMORY_TARGET, STAGE_TARGET_US = 1.1, 1.1, 5.0
MODEL_TOPOLOGY = "3D-SW_SW_SW_hetero"
MODEL_POLICIES = (("baseline", "fifo"), ("themis", "scf"))
HEAVY = ("h5py", "matplotlib", "yaml", "tqdm")  # what only rank 0 may need: traces, plots, YAML, bars


def topology_for(n: int) -> str:
    """A 3-dim topology of n NPUs: a ring, a fully connected dim and a switch."""
    a, b, c = SHAPES[n]
    return f"Ring({a},100,20)_FC({b},100,700)_SW({c},100,700)"


def run_args(n: int, size_bytes: int, chunks: int, policy: str) -> list[str]:
    """`themis-mpi` arguments of one checked all-reduce, one iteration, on the n-NPU topology."""
    return ["run", "-t", topology_for(n), "-b", str(size_bytes), "-c", str(chunks), "-p", policy,
            "-n", "1", "-w", "0", "-q", "--timeout-s", TIMEOUT_S]  # fmt: skip


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
    mine = (
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss / 1024.0,
        _pss_mib(),
        [m for m in HEAVY if m in sys.modules],
        sorted(sys.modules) if last else None,
    )
    ranks = comm.gather(mine, root=0)
    if comm.Get_rank() == 0:
        cpu, rss, pss, heavy, modules = zip(*ranks)
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

        code = main(argv)
        from mpi4py import MPI

        _report(MPI.COMM_WORLD, {"exit": code})
        return
    import numpy as np
    from mpi4py import MPI

    comm, out = MPI.COMM_WORLD, {}
    if kind == "plain":  # what the emulator's start-up job asks of MPI, without this package
        shape, size_bytes = [int(x) for x in argv[0].split(",")], int(argv[1])
        buf = np.ones(size_bytes // 8)
        cart = comm.Create_cart(shape, periods=[True] * len(shape), reorder=False)
        subs = [cart.Sub([i == d for i in range(len(shape))]) for d in range(len(shape))]
        cart.Ibcast(np.zeros(len(shape), np.int32)).Wait()
        cart.Ibarrier().Wait()
        cart.Iallreduce(np.ones(1), np.empty(1), op=MPI.MAX).Wait()
        for sub in subs:
            sub.Allreduce(MPI.IN_PLACE, buf)
        out["wrong"] = int(np.count_nonzero(buf != comm.Get_size()))
        for c in subs + [cart]:
            c.Free()
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

    def run(self, n: int, kind: str, argv: list[str], pyc: str, tree: str = "") -> dict:
        """Run one job; its result line, with job_s and the job's ranks."""
        import subprocess

        env = dict(
            self.env[pyc], PYTHONPATH=(tree or self.args.tree) + os.pathsep + os.environ.get("PYTHONPATH", "")
        )
        cmd = [self.mpiexec, "-n", str(n), sys.executable, os.path.join(HERE, "bench_scale.py")]
        cmd += ["--worker", kind, *argv]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.args.timeout, env=env)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{kind} job on {n} ranks timed out after {self.args.timeout:g} s") from None
        job_s = time.perf_counter() - t0
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            raise SystemExit(f"{kind} job on {n} ranks failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        result = {"job_s": job_s, "ranks": n, **json.loads(line[len("RESULT ") :])}
        if result.get("exit", 0) != 0:
            raise SystemExit(f"{kind} job on {n} ranks: themis-mpi exited {result['exit']}\n{proc.stdout}")
        return result


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
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def startup(jobs: Jobs, ranks: list[int], modes: list[str], args) -> list[dict]:
    """Every start-up job at every rank count, repeated, every other repeat in reverse order."""
    rows = []
    for n in ranks:
        variants = startup_variants(n, args.tree, args.before, modes)
        repeats = args.repeats or (5 if n <= 64 else 3 if n <= 128 else 2)
        samples: dict[tuple[str, str], list[dict]] = {(name, pyc): [] for name, pyc, *_ in variants}
        for r in range(repeats):
            for name, pyc, kind, argv, tree in variants if r % 2 == 0 else variants[::-1]:
                samples[name, pyc].append(jobs.run(n, kind, argv, pyc, tree))
                print(f"  start-up {n:>4} ranks {name:>8} ({pyc}): {samples[name, pyc][-1]['job_s']:7.2f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
        for pyc in modes:
            row: dict = {"ranks": n, "pyc": pyc, "topology": topology_for(n), "repeats": repeats}
            for (name, mode), runs in samples.items():
                if mode == pyc:
                    row[name] = {
                        "job_s": [x["job_s"] for x in runs],
                        "job_s_median": _median([x["job_s"] for x in runs]),
                        "cpu_s_total_median": _median([x["cpu_s_total"] for x in runs]),
                        "rss_mib_mean": _median([x["rss_mib_mean"] for x in runs]),
                        "wrong": max(x.get("wrong", 0) for x in runs),
                        "heavy_imports": sorted({m for x in runs for m in x["heavy_imports"]}),
                        "worker_package_modules": [
                            m for m in runs[0]["worker_modules"] if m.split(".")[0] == "themis_mpi"
                        ],
                        "worker_modules": len(runs[0]["worker_modules"]),
                    }
            for name in ("emulator", "before"):
                if name in row:
                    plain = row["plain"]
                    row[f"{name}_over_plain"] = row[name]["job_s_median"] / plain["job_s_median"]
                    row[f"{name}_cpu_over_plain"] = (
                        row[name]["cpu_s_total_median"] / plain["cpu_s_total_median"]
                    )
            rows.append(row)
    return rows


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
    row0 = startup_rows[0]
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


def memory(jobs: Jobs, pairs: list[tuple[int, int]], pyc: str, args) -> list[dict]:
    """Per (ranks, MiB): the idle job; native, baseline and themis jobs twice, interleaved; one `-p both`."""
    import tempfile

    rows = []
    for n, mib in pairs:
        size = mib * 2**20
        row: dict = {"ranks": n, "size_mib": mib, "pyc": pyc, "topology": topology_for(n), "wrong": 0}
        samples: dict[str, list[dict]] = {"idle": [], "native": [], "baseline": [], "themis": [], "both": []}
        rounds = [["idle", "native", "baseline", "themis"], ["baseline", "themis", "native", "both"]]
        with tempfile.TemporaryDirectory() as tmp:
            for name in (name for names in rounds for name in names):
                if name in ("idle", "native"):
                    result = jobs.run(n, name, [str(size)], pyc)
                else:  # the emulator: `themis-mpi run` with one policy (or both, one after the other)
                    rows_json = os.path.join(tmp, "rows.json")
                    cli = run_args(n, size, MEMORY_CHUNKS, name) + ["--json", rows_json]
                    result = jobs.run(n, "cli", cli, pyc)
                    with open(rows_json) as f:
                        row["wrong"] += sum(r["wrong"] for r in json.load(f))
                samples[name].append(result)
                print(f"  memory {n:>4} ranks {mib} MiB {name:>8}: {result['rss_mib_mean']:7.1f} MiB/rank",
                      file=sys.stderr, flush=True)  # fmt: skip
        for name, runs in samples.items():  # the mean of the runs
            numbers = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and k != "exit"]
            row[name] = {key: sum(r[key] for r in runs) / len(runs) for key in numbers}
            row[name]["heavy_imports"] = sorted({m for r in runs for m in r["heavy_imports"]})
        emu = max(row["baseline"], row["themis"], key=lambda r: r["rss_mib_mean"])
        row["emulator_over_native"] = emu["rss_mib_mean"] / row["native"]["rss_mib_mean"]
        row["emulator_extra_mib_per_rank"] = emu["rss_mib_mean"] - row["native"]["rss_mib_mean"]
        row["both_over_native"] = row["both"]["rss_mib_mean"] / row["native"]["rss_mib_mean"]
        rows.append(row)
    return rows


def model_stages(chunk_counts: list[int], runs: int) -> list[dict]:
    """CPU time per stage of the model: min over runs of model_collective, per policy and chunk count."""
    from themis_mpi.collectives import Collective
    from themis_mpi.driver import RunConfig
    from themis_mpi.model import model_collective
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
    jobs.run(1, "plain", ["1", str(STARTUP_BYTES)], pyc)
    jobs.run(1, "native", [str(STARTUP_BYTES)], pyc)
    jobs.run(1, "idle", [str(STARTUP_BYTES)], pyc)
    jobs.run(1, "cli", cli, pyc)
    if args.before:
        jobs.run(1, "cli", cli, pyc, os.path.abspath(args.before))


def _heavy(row: dict, names: tuple[str, ...]) -> list[str]:
    """The heavy modules any rank of the named jobs of a row imported."""
    return sorted({m for name in names if name in row for m in row[name]["heavy_imports"]})


def print_tables(doc: dict) -> None:
    """The tables, with each target's verdict."""
    print(
        f"# start-up: whole mpiexec job (s, median of repeats) of an {STARTUP_BYTES} B float64 all-reduce, "
        f"1 chunk, on {doc['cores']} cores; emu/plain target <= {STARTUP_TARGET} at 128 ranks; before = the "
        "--before tree's emulator; cpu = CPU ms per rank (all ranks' user+system / ranks); rss = mean peak "
        "RSS per rank (MiB); heavy = h5py, matplotlib, yaml or tqdm imported on any rank"
    )
    columns = [
        ("pyc", 7, lambda r: r["pyc"]),
        ("ranks", 6, lambda r: r["ranks"]),
        ("rep", 4, lambda r: r["repeats"]),
    ]
    for name, short in (("plain", "plain"), ("emulator", "emu"), ("before", "before")):
        columns.append((f"{short}_s", 9, lambda r, k=name: f"{r[k]['job_s_median']:.2f}"))
        if name != "plain":
            columns.append((f"{short}/plain", 12, lambda r, k=name: f"{r[k + '_over_plain']:.3f}"))
    for name, short in (("plain", "plain"), ("emulator", "emu"), ("before", "before")):
        columns.append(
            (f"{short}_cpu", 10, lambda r, k=name: f"{1e3 * r[k]['cpu_s_total_median'] / r['ranks']:.0f}")
        )
    for name, short in (("plain", "plain"), ("emulator", "emu"), ("before", "before")):
        columns.append((f"{short}_rss", 10, lambda r, k=name: f"{r[k]['rss_mib_mean']:.1f}"))
    columns.append(
        ("#wrong", 7, lambda r: sum(r[k]["wrong"] for k in ("plain", "emulator", "before") if k in r))
    )
    columns.append(("heavy", 6, lambda r: ",".join(_heavy(r, ("emulator", "before"))) or "-"))

    def cell(fn, r) -> str:
        try:
            return str(fn(r))
        except KeyError:  # no --before
            return "-"

    print("#" + " ".join(f"{h:>{w}}" for h, w, _ in columns)[1:])
    for r in doc["startup"]:
        print(" ".join(f"{cell(fn, r):>{w}}" for _, w, fn in columns))
    if doc["imports"]:
        print(
            "\n# the package modules a worker rank of the start-up job imported, imported again in a fresh "
            "Python after numpy and mpi4py (no MPI_Init): CPU ms and added peak RSS (MiB), per tree"
        )
        print(
            f"#{'tree':>9} {'pyc':>7} {'modules':>8} {'cpu_min':>8} {'cpu_med':>8} {'rss_med':>8} {'runs':>5}"
        )
        for m in doc["imports"]:
            print(
                f" {m['tree']:>9} {m['pyc']:>7} {m['modules']:>8} {m['cpu_ms_min']:>8.1f} "
                f"{m['cpu_ms_median']:>8.1f} {m['rss_mib_median']:>8.1f} {m['runs']:>5}"
            )
    print(
        "\n# memory per rank (MiB): mean over ranks of the peak RSS, mean of the runs; emulator = the larger "
        f"of its baseline and themis jobs; emu/native target <= {MEMORY_TARGET}; both = one `run -p both` job"
    )
    print(
        f"#{'pyc':>7} {'ranks':>6} {'MiB':>5} {'idle':>7} {'native':>7} {'baseline':>9} {'themis':>7} "
        f"{'emu/native':>11} {'emu-native':>11} {'both':>7} {'both/native':>12} {'emu_rss_total':>14} "
        f"{'idle_pss_total':>15} {'#wrong':>7}"
    )
    for r in doc["memory"]:
        emu = max(r["baseline"], r["themis"], key=lambda x: x["rss_mib_mean"])
        print(
            f" {r['pyc']:>7} {r['ranks']:>6} {r['size_mib']:>5} {r['idle']['rss_mib_mean']:>7.1f} "
            f"{r['native']['rss_mib_mean']:>7.1f} {r['baseline']['rss_mib_mean']:>9.1f} "
            f"{r['themis']['rss_mib_mean']:>7.1f} {r['emulator_over_native']:>11.3f} "
            f"{r['emulator_extra_mib_per_rank']:>11.1f} {r['both']['rss_mib_mean']:>7.1f} "
            f"{r['both_over_native']:>12.3f} {emu['rss_mib_total']:>14.0f} "
            f"{r['idle']['pss_mib_total']:>15.0f} {r['wrong']:>7}"
        )
    print(
        f"\n# model: {MODEL_TOPOLOGY}, 1 GiB float32 all-reduce; CPU time of model_collective, min of "
        f"runs, per stage record; target <= {STAGE_TARGET_US} us per stage"
    )
    print(
        f"#{'policy':>9} {'intra':>5} {'chunks':>7} {'stages':>7} {'cpu_ms':>9} {'us/stage':>9} {'target':>7}"
    )
    for m in doc["model"]:
        ok = "met" if m["us_per_stage"] <= STAGE_TARGET_US else "missed"
        print(
            f" {m['policy']:>9} {m['intra']:>5} {m['chunks']:>7} {m['stages']:>7} "
            f"{1e3 * m['cpu_s_min']:>9.1f} {m['us_per_stage']:>9.2f} {ok:>7}"
        )


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
    ap.add_argument("--import-runs", type=int, default=10, help="runs of each import probe (10)")
    ap.add_argument("--model-runs", type=int, default=5, help="model runs per row; the minimum counts (5)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per mpiexec job (1800)")
    ap.add_argument("--out", default="results", help="output folder (default results)")
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
        "before": args.before,
        "tree": args.tree,
        "commit": _commit(args.tree),
        "startup": [],
    }
    for pyc in modes:
        warm_up(jobs, args, pyc)
    doc["startup"] = startup(jobs, ranks, modes, args)
    doc["imports"] = import_cost(jobs, doc["startup"], modes, args) if ranks else []
    doc["memory"] = [row for pyc in modes for row in memory(jobs, pairs, pyc, args)]
    doc["model"] = model_stages([int(x) for x in args.chunks.split(",") if x], args.model_runs)
    print_tables(doc)
    from themis_mpi.output import write_json

    write_json(os.path.join(args.out, "bench_scale.json"), doc)


if __name__ == "__main__":
    main()
