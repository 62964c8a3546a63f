"""Run every bad input we know of and write what each one gets: docs/bad-inputs.md.

Usage::

    python scripts/bad_inputs.py [--out docs/bad-inputs.md] [--only TEXT]

Each case runs for real (under mpiexec where the input reaches the ranks), and the table records
its exit status, whether a Python traceback appeared, and the first line of what it printed.
"""

import argparse
import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

from themis_mpi.launch import mpiexec_path
from themis_mpi.output import atomic_path
from themis_mpi.trace import checksum

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ASTRA-sim 1.0's text workloads: the copies in tests/data, else the shared reference ones, if present
REF_DIRS = (
    os.path.join(ROOT, "tests", "data", "astra-sim-1.0-text"),
    os.path.join(os.path.dirname(ROOT), "shared", "reference-workloads", "astra-sim-1.0-text"),
)
REF = next((d for d in REF_DIRS if os.path.isdir(d)), None)
PROBE_TIMEOUT_S = 120  # a probe still running then is ended and its row says so


RUNTIME = [
    (
        "a rank killed (SIGKILL) mid-collective",
        "MPICH's launcher ends the job at once (exit 9). With `mpiexec -disable-auto-cleanup`, each rank "
        "that waited on it prints `themis-mpi: error: rank R: a message failed (...) waiting for rank(s) K "
        "in collective C (...), chunk k, RS on dim d; a peer died; aborting the job` and the job aborts",
    ),
    (
        "a rank frozen (SIGSTOP) or hung mid-run",
        "after `--timeout-s` (default 60 s) without progress: `themis-mpi: error: rank R: no progress "
        "for T s waiting for rank(s) K in collective C (...), chunk k, RS on dim d; a peer died or stopped "
        "responding; aborting the job`, then MPI_Abort ends every rank (exit 3)",
    ),
    (
        "a rank frozen before MPI_Init",
        "the others wait in MPI_Init; a guard process ends each after `--timeout-s`: `themis-mpi: error: MPI "
        "did not start within T s (--timeout-s): a rank died or stopped before MPI_Init, or start-up is "
        "slower than that on this machine; aborting` (no rank can be named without MPI)",
    ),
    (
        "a rank frozen after MPI_Init, before the grid is built",
        "the start-up barrier is waited on quietly: `rank R: no progress for T s in the start-up barrier; "
        "rank(s) K did not answer (died or stopped); aborting the job`",
    ),
    (
        "a rank frozen while the others set up on their own (the grid's constructors, the model of "
        "every NPU's links before a straggler run)",
        "each rank's vigil thread hears the previous rank's heartbeats; a rank busy on its own that hears "
        "none for `--timeout-s`: `rank R: no heartbeat from rank K for T s while busy on its own (set-up, "
        "a model run); rank(s) K did not answer (died or stopped); aborting the job`, exit 3",
    ),
    (
        "rank 0 frozen while writing the trace",
        "the others wait at the final barrier as long as rank 0 answers pings (a long write is fine); "
        "once it stops answering: `rank R: waited T s in the final barrier; rank(s) 0 did not answer`; "
        "no trace is left",
    ),
    (
        "a wall-clock step longer than `--timeout-s`",
        "not a stall: silence is measured from the step's deadline, not from its start",
    ),
    (
        "a Python exception on one rank (a bug)",
        "the traceback is printed once and MPI_Abort ends every rank (exit 1)",
    ),
    (
        "a user mistake seen on one rank only",
        "one line from that rank and MPI_Abort ends every rank (exit 2)",
    ),
    (
        "Ctrl-C at any moment after the package starts",
        "`themis-mpi: interrupted` once (rank 0), exit 130, every rank gone at once, no temporary file left; "
        "the handler is installed before numpy, mpi4py and MPI load (tests/test_job.py)",
    ),
    (
        "a disk that fills, a read-only file system or EIO while writing any output",
        "`cannot write PATH: No space left on device; the previous file, if any, is intact`, exit 2 "
        "(tests/test_writers.py injects them into every writer); a `--jsonl` file appended to keeps its "
        "whole rows and cuts the torn one off: `its N rows so far are whole (the torn last one was cut "
        "off); --resume runs the rest` (tests/test_hardening_readers.py, on a 16 KiB tmpfs)",
    ),
    (
        "a plugin that calls sys.exit (on import, in its constructor, while choosing)",
        "one line naming the plugin, exit 2 (was a quiet exit 0; tests/test_hostile_plugins.py)",
    ),
    (
        "an intra-dim plugin that changes the queue it is shown",
        "`intra-dim policy 'NAME' changed the queue it was shown; it may only read it`, exit 2",
    ),
    (
        "rank 0 deciding longer than --timeout-s (a slow policy)",
        "not taken for dead: a thread answers pings while it decides, the others wait patiently",
    ),
    (
        "a frozen rank: many survivors see the silence at once",
        "one line for the job: survivors report in rank order and the first abort ends the others",
    ),
    (
        "a one-process command (model, calibrate, policies...) under mpiexec -n K",
        "rank 0 runs it once; the other ranks leave at once (tests/test_job.py)",
    ),
    ("output piped into `head`", "the command stops quietly (exit 141), no BrokenPipeError"),
    (
        "int32 sums that would overflow (over 46340 NPUs)",
        "`int32 cannot hold the sums of N NPUs' inputs (...); use int64 or a float type`",
    ),
    (
        "a run that dies, or a disk that fills, while writing an output",
        "no file at the path: every output is written beside it as `.NAME.partial-PID.EXT`, flushed to "
        "disk and renamed only when complete; traces are written in a child process, so an HDF5 crash is "
        "one line",
    ),
]


SIMAI_HEAD = (
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 ep: 1 pp: 1 vpp: 1 ga: {ga} all_gpus: 4 "
    "checkpoints: 0 checkpoint_initiates: 0\n{count}\n"
)
SIMAI_LAYER = "l{i} -1 {fwd} ALLREDUCE {size} 1000 NONE 0 1000 ALLREDUCE 1048576 100\n"
PLUGINS = {  # module -> (entry-point group, entry line, source)
    "odd_orders": (
        "themis_mpi.policies",
        "floats = odd_orders:Floats\ntext = odd_orders:Text",
        "from themis_mpi.policies import InterPolicy\n\n\n"
        "class Floats(InterPolicy):\n    name = 'floats'\n    description = 'orders of floats'\n\n"
        "    def order(self, chunk):\n        return [0.9, 1.9, 2.9]\n\n\n"
        "class Text(InterPolicy):\n    name = 'text'\n    description = 'an order as a string'\n\n"
        "    def order(self, chunk):\n        return '210'\n",
    ),
    "broken_sched": ("themis_mpi.schedulers", "bad = broken_sched:X", "raise ImportError('no such thing')\n"),
    "hostile_sched": (
        "themis_mpi.schedulers",
        "huge = hostile_sched:Huge\nstuck_sched = hostile_sched:Stuck\nper_rank = hostile_sched:PerRank",
        "import os\nimport time\nfrom themis_mpi.policies import CommScheduler\n\n\n"
        "class Huge(CommScheduler):\n    name = 'huge'\n    description = 'a priority of 10**400'\n\n"
        "    def priority(self, coll_id, need, collective):\n        return 10**400\n\n\n"
        "class Stuck(CommScheduler):\n    name = 'stuck_sched'\n    description = 'hangs'\n\n"
        "    calls = 0\n\n    def priority(self, coll_id, need, collective):\n        Stuck.calls += 1\n"
        "        if Stuck.calls == 3:\n            time.sleep(3600)\n        return coll_id\n\n\n"
        "class PerRank(CommScheduler):\n    name = 'per_rank'\n    description = 'odd ranks reversed'\n\n"
        "    def priority(self, coll_id, need, collective):\n"
        "        return -coll_id if int(os.environ.get('PMI_RANK', '0')) % 2 else coll_id\n",
    ),
    "float_intra": (
        "themis_mpi.policies",
        "float-position = float_intra:FloatPosition",
        "from themis_mpi.policies import IntraPolicy\n\n\n"
        "class FloatPosition(IntraPolicy):\n    name = 'float-position'\n    description = 'returns 0.0'\n\n"
        "    def position(self, queue, stage):\n        return 0.0\n",
    ),
}


def plugin_site(folder: str) -> dict:
    """The probes' plugins laid out as pip does (module, dist-info), and the environment that finds them."""
    os.makedirs(folder)
    for module, (group, entry, source) in PLUGINS.items():
        with open(os.path.join(folder, f"{module}.py"), "w") as f:
            f.write(source)
        info = os.path.join(folder, f"{module}-0.1.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
        with open(os.path.join(info, "entry_points.txt"), "w") as f:
            f.write(f"[{group}]\n{entry}\n")
    return {"PYTHONPATH": os.pathsep.join([folder, os.environ.get("PYTHONPATH", "")])}


def tmpfs(tmp: str, name: str, options: str, mounts: list[str]) -> str | None:
    """A tmpfs mounted at `tmp/name` (root only), or None where mounting is not allowed."""
    where = os.path.join(tmp, name)
    os.makedirs(where)
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", where], capture_output=True
    ).returncode:
        return None
    mounts.append(where)
    return where


def round4_cases(
    tmp: str, py: list[str], write, pytorch: str, micro_txt: str, mounts: list[str]
) -> list[tuple]:
    """Round 4 (issue 46, part 1): readers, streams, resume, workload gpt, flags and plugins."""

    def simai(name: str, count="2", ga="1", fwd="1000", size="1048576", lines=2) -> str:
        body = "".join(
            SIMAI_LAYER.format(i=i, fwd=fwd if i == 0 else 1000, size=size if i == 0 else 1)
            for i in range(lines)
        )
        return write(name, SIMAI_HEAD.format(ga=ga, count=count) + body)

    big = os.path.join(tmp, "simai_1e6.txt")
    with open(big, "w") as f:
        f.write(SIMAI_HEAD.format(ga=1, count=1_000_000))
        f.writelines(SIMAI_LAYER.format(i=i, fwd=1000, size=1) for i in range(1_000_000))
    binary = os.path.join(tmp, "simai_binary.txt")
    with open(binary, "wb") as f:
        f.write(b"HYBRID_TRANSFORMER_FWD_IN_BCKWD \xff\xfe\x00\x8c\n" + bytes(range(256)) * 8)
    zeros = {}
    for mib in (16, 32):
        zeros[mib] = os.path.join(tmp, f"zeros{mib}.et.gz")
        with gzip.open(zeros[mib], "wb", compresslevel=1) as f:
            for _ in range(mib):
                f.write(bytes(1 << 20))
    bool_groups = write("bool_groups.json", '{"7": [true, false]}')
    dup = write(
        "dup.yml", "topology: [Ring]\nnpus_count: [4]\nbandwidth: [50]\nlatency: [500]\nnpus_count: [8]\n"
    )
    kind = write(
        "kind.yml", "topology: [" + "R" * 1_000_000 + "]\nnpus_count: [4]\nbandwidth: [50]\nlatency: [500]\n"
    )
    grid = ["model", "-t", "2x2x2,4x2", "-b", "1K", "-e", "1M", "-f", "4", "-c", "4", "-p", "all", "-q"]
    sweep = {ext: os.path.join(tmp, f"sweep.{ext}") for ext in ("json", "jsonl")}
    subprocess.run([*py, *grid, "--json", sweep["json"], "--jsonl", sweep["jsonl"]], check=True, cwd=ROOT)
    rows = json.load(open(sweep["json"]))
    rows[0]["time_us"], rows[1]["time_us"], rows[2]["busbw_gbps"] = -5.0, float("nan"), float("inf")
    forged = rows[:66] + [dict(r) for r in rows[10:13]] + [{**rows[20], "sweep_cell": 500}]
    forged_rows = write("forged.jsonl", "".join(json.dumps(r) + "\n" for r in forged))  # 70 rows for 66 cells
    deep = write("deep100k.json", "[" * 100_000 + "]" * 100_000)
    rows = json.load(open(sweep["json"]))
    rows[0]["size_bytes"] = 0
    size0 = write("size0.json", json.dumps(rows))
    gpt = "workload gpt --layers 8 --hidden 64 --heads 4 --seq 32 --vocab 10 -t SW(1,100,1)".split()
    micro = os.path.join(ROOT, "tests", "data", "simai", "microAllReduce.txt")
    site = plugin_site(os.path.join(tmp, "site"))
    trace = os.path.join(tmp, "r4.h5")
    subprocess.run([*py, "model", "-b", "1M", "-c", "4", "-q", "--trace", trace], check=True, cwd=ROOT)
    limit = ["prlimit", f"--as={6 << 30}"]
    cases: list[tuple] = [
        ("SimAI: a negative layer size", [*py, "workload", "simai", simai("s_neg.txt", size="-1048576")]),
        ("SimAI: a compute time of nan", [*py, "workload", "simai", simai("s_nan.txt", fwd="nan")]),
        ("SimAI: a compute time of -5", [*py, "workload", "simai", simai("s_m5.txt", fwd="-5")]),
        ("SimAI: a binary file", [*py, "workload", "simai", binary]),
        ("SimAI: ga 0", [*py, "workload", "simai", simai("s_ga0.txt", ga="0")]),
        (
            "SimAI: a 5,000-digit layer count",
            [*py, "workload", "simai", simai("s_5000.txt", count="9" * 5000)],
        ),
        (
            "SimAI: a 4,000-digit layer count",
            [*py, "workload", "simai", simai("s_4000.txt", count="9" * 4000)],
        ),
        ("SimAI: 10^6 layers (past the documented cap)", [*py, "workload", "simai", big]),
        ('--comm-group {"7": [true, false]}', [*py, "train", pytorch, "--comm-group", bool_groups]),
        ("ET: 16 MiB of zeros gzipped, 6 GB address limit", [*limit, *py, "train", zeros[16]]),
        ("ET: 32 MiB of zeros gzipped, 6 GB address limit", [*limit, *py, "train", zeros[32]]),
        ("--resume: a JSON file nested 100,000 deep", [*py, *grid, "--json", deep, "--resume"]),
        (
            "--resume: forged rows (NaN, negative, inf, repeated, outside: 70 rows, 66 cells)",
            [*py, *grid, "--jsonl", forged_rows, "--resume"],
        ),
        ("plot: a size of 0 on a log scale", [*py, "plot", size0]),
        ("plot: a --jsonl file", [*py, "plot", sweep["jsonl"]]),
        ("plot: a --jsonl file, a column not there", [*py, "plot", sweep["jsonl"], "--y", "nope"]),
        ("YAML topology: a key given twice", [*py, "model", "-t", dup]),
        ("YAML topology: a 1 MB kind", [*py, "model", "-t", kind]),
        ("workload gpt --layers 1000000000", [*py, *gpt, "--layers", "1000000000"]),
        ("workload gpt --layers 1000000 (past the graph cap)", [*py, *gpt, "--layers", "1000000"]),
        ("workload gpt --global-batch 1000000000", [*py, *gpt, "--global-batch", "1000000000"]),
        ("workload gpt --bytes-per-element 0", [*py, *gpt, "--bytes-per-element", "0"]),
        ("workload gpt --vocab 0", [*py, *gpt, "--vocab", "0"]),
        ("workload gpt --ffn 0", [*py, *gpt, "--ffn", "0"]),
        ("workload gpt --dp 0", [*py, *gpt, "--dp", "0"]),
        ("workload gpt --out ''", [*py, *gpt, "--out", ""]),
        ("workload simai --nic-gbps nan", [*py, "workload", "simai", micro, "--nic-gbps", "nan"]),
        ("workload simai --nic-gbps -1", [*py, "workload", "simai", micro, "--nic-gbps", "-1"]),
        ("--json ''", [*py, "model", "-b", "1M", "--json", ""]),
        (
            "--npu-delay-us 1=5 --npu-delay-us 2=7 (both kept)",
            [*py, "model", "-b", "1M", "-c", "4", "-q", "--npu-delay-us", "1=5", "--npu-delay-us", "2=7"],
        ),
        (
            "--bandwidth -,-,- (every default kept)",
            [*py, "model", "-b", "1M", "-c", "4", "-q", "--bandwidth", "-,-,-"],
        ),
        ("--npu-delay-us -1=5", [*py, "model", "--npu-delay-us", "-1=5"]),
        ("--compat-scheduling FIFO without --compat", [*py, "model", "--compat-scheduling", "FIFO"]),
        (
            "--compat astra-sim-2 --hbm-gbps 100",
            [*py, "model", "--compat", "astra-sim-2", "--hbm-gbps", "100"],
        ),
        ("a plugin's order [0.9, 1.9, 2.9]", [*py, "model", "-b", "1M", "-c", "4", "-p", "floats"], site),
        ("a plugin's order '210'", [*py, "model", "-b", "1M", "-c", "4", "-p", "text"], site),
        (
            "a missing scheduler beside a broken scheduler plugin",
            [*py, "train", micro_txt, "--comm-scheduler", "nope"],
            site,
        ),
        ("themis-mpi policies with a broken scheduler plugin", [*py, "policies"], site),
    ]
    for workers in ("1", "2"):  # a 16 KiB file system each, which the sweep's rows fill
        full = tmpfs(tmp, f"full16k-{workers}", "size=16k", mounts)
        if full:
            jsonl = os.path.join(full, "rows.jsonl")
            cases.append(
                (
                    f"--jsonl on a full 16 KiB tmpfs, --workers {workers}",
                    [*py, *grid, "--workers", workers, "--jsonl", jsonl],
                )
            )
    read_only = tmpfs(tmp, "readonly", "size=1m,ro", mounts)
    if read_only:
        cases.append(
            ("analyze --plot on a read-only file system", [*py, "analyze", trace, "--plot", read_only])
        )
    return cases


def round4_part2_cases(tmp: str, py: list[str], write, micro_txt: str) -> list[tuple]:
    """Round 4 (issue 46, part 2): flags a path could not honour, tracebacks, plugins under MPI."""
    nccl_log = os.path.join(ROOT, "tests", "data", "nccl-tests", "h100x8_nvls_dgxc.txt")
    two_node = os.path.join(ROOT, "tests", "data", "nccl-tests", "h100x16_2node_ib_issue309_qoofyk.txt")
    deep = write("deep100k_fit.json", '{"a":' * 100_000 + "1" + "}" * 100_000)
    site = plugin_site(os.path.join(tmp, "site2"))
    mpi = [mpiexec_path(), "-n", "4", *py]
    train = ["train", micro_txt, "-t", "2x2", "-n", "2", "-c", "4", "--active-chunks-per-dim", "2"]
    ports = "SW(2,100,0)_SW(2,100,0)_NIC(0+1,10)"
    return [
        (
            "NCCL(...) with a key twice",
            [*py, "model", "-t", "SW(8,100,0,nccl)_NCCL(ll=100:0.5,ll=9999999:0.01)"],
        ),
        ("NCCL(ll=100): no efficiency", [*py, "model", "-t", "SW(8,100,0,nccl)_NCCL(ll=100)"]),
        ("NCCL(algos=tree) on one level", [*py, "model", "-t", "SW(8,100,0,nccl)_NCCL(algos=tree)"]),
        ("calibrate --nccl-algo Tree on a one-node log", [*py, "calibrate", nccl_log, "--nccl-algo", "Tree"]),
        (
            "an nccl dim with --active-chunks-per-dim 8",
            [*py, "model", "-t", "SW(8,100,0,nccl)", "-c", "8", "--active-chunks-per-dim", "8"],
        ),
        (
            "--compat astra-sim-1.0 with --npu-compute-scale 3=1.5",
            [
                *py,
                "train",
                micro_txt,
                "-t",
                "2x2x2",
                "--compat",
                "astra-sim-1.0",
                "--npu-compute-scale",
                "3=1.5",
            ],
        ),
        (
            "--compat astra-sim-2 with --compute-jitter lognormal:0.3",
            [
                *py,
                "train",
                micro_txt,
                "-t",
                "2x2x2",
                "--compat",
                "astra-sim-2",
                "--compute-jitter",
                "lognormal:0.3",
            ],
        ),
        ("a shared port under --compat astra-sim-2", [*py, "model", "-t", ports, "--compat", "astra-sim-2"]),
        (
            "--network fair --active-chunks-per-dim 1024 -c 1024 (valid, heavy)",
            [
                *py,
                "model",
                "-t",
                "SW(8,100,700)_SW(4,50,500)",
                "--network",
                "fair",
                "-b",
                "64M",
                "-c",
                "1024",
                "--active-chunks-per-dim",
                "1024",
                "-p",
                "baseline",
                "-q",
            ],
        ),  # fmt: skip
        ("calibrate --base: JSON nested 100,000 deep", [*py, "calibrate", two_node, "--base", deep]),
        ("-t FIT.json nested 100,000 deep", [*py, "model", "-t", deep]),
        (
            "calibrate --algorithm ring -c 65536",
            [*py, "calibrate", nccl_log, "--algorithm", "ring", "-c", "65536"],
        ),
        ("a scheduler priority of 10**400", [*py, *train, "--comm-scheduler", "huge"], site),
        ("an intra-dim position of 0.0", [*py, *train, "--intra", "float-position"], site),
        (
            "a scheduler plugin that never returns, mpiexec -n 4, --timeout-s 5",
            [*mpi, *train, "--comm-scheduler", "stuck_sched", "--timeout-s", "5"],
            site,
        ),
        (
            "scheduler priorities that differ between ranks, mpiexec -n 4",
            [*mpi, *train, "--comm-scheduler", "per_rank"],
            site,
        ),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out",
        default=os.path.join("results", "bad-inputs.md"),
        help="docs/bad-inputs.md is the shipped copy",
    )
    ap.add_argument(
        "--only",
        metavar="TEXT",
        help="run only the probes whose label contains TEXT and replace (or add) their rows in --out, "
        "keeping its other rows",
    )
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    mounts: list[str] = []  # tmpfs folders of the round-4 probes, unmounted at the end
    try:
        probe(args, tmp, mounts)
    finally:
        for where in mounts:
            subprocess.run(["umount", where], capture_output=True)


def probe(args: argparse.Namespace, tmp: str, mounts: list[str]) -> None:
    """Write the probes' inputs into `tmp`, run every probe and write the table."""
    py = [sys.executable, "-m", "themis_mpi"]
    files = {}

    def write(name, text):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(text)
        files[name] = path
        return path

    write("missing_keys.yml", "topology: [ Ring ]\n")
    write("broken.yml", "topology: [Ring\nnpus_count: ]]\n")
    write("bad_type.txt", "DATA\n1\nconv1 -1 5 NONE 0 5 NONE 0 5 ALLREDUCES 1048576 5\n")
    write("short.txt", "DATA\n2\nconv1 -1 5 NONE 0 5 NONE 0 5 ALLREDUCE 1048576 5\n")
    write("micro.txt", "MICRO\n1\nconv1 -1 5 NONE 0 5 NONE 0 5 ALLREDUCE 1048576 5\n")
    write(
        "group.txt",
        "HYBRID_TRANSFORMER model_parallel_NPU_group: 3\n1\nl -1 5 ALLREDUCE 64 5 NONE 0 5 NONE 0 5\n",
    )
    write("text.h5", "not hdf5\n")
    good = os.path.join(tmp, "good.h5")
    subprocess.run(
        [*py, "model", "-b", "1M", "-c", "4", "--trace", good], capture_output=True, check=True, cwd=ROOT
    )
    data = open(good, "rb").read()
    open(os.path.join(tmp, "truncated.h5"), "wb").write(data[: len(data) // 2])
    with h5py.File(os.path.join(tmp, "foreign.h5"), "w") as f:
        f["x"] = np.arange(3)
    incomplete = os.path.join(tmp, "incomplete.h5")
    open(incomplete, "wb").write(data)
    with h5py.File(incomplete, "a") as f:
        f.attrs["complete"] = 0
    files["bad_utf8.yml"] = os.path.join(tmp, "bad_utf8.yml")
    with open(files["bad_utf8.yml"], "wb") as f:
        f.write(b"topology: [Ring]\nnpus_count: [2]\nbandwidth: [\xff\xfe]\nlatency: [1]\n")
    write("huge_npus.yml", f"topology: [Ring]\nnpus_count: [{2**70}]\nbandwidth: [100]\nlatency: [1]\n")
    write("huge_layer.txt", f"DATA\n1\nconv1 -1 5 NONE 0 5 NONE 0 5 ALLREDUCE {2**70} 5\n")
    flipped = os.path.join(tmp, "flipped.h5")
    with h5py.File(good, "r") as f:
        offset = f["events"].id.get_offset()
    flipped_data = bytearray(data)
    flipped_data[offset + 40] ^= 0x10
    open(flipped, "wb").write(bytes(flipped_data))
    forged = os.path.join(tmp, "forged.h5")
    open(forged, "wb").write(data)
    with h5py.File(forged, "a") as f:
        del f.attrs["topology"]
    mpi_trace = os.path.join(tmp, "model-for-mpi.h5")
    subprocess.run(
        [*py, "model", "-t", "2x2x2", "-b", "1M", "-c", "4", "--trace", mpi_trace], check=True, cwd=ROOT
    )
    # round 3: hostile readers and outputs that are inputs
    laughs = ["a0: &a0 [1,1,1,1,1,1,1,1,1,1]"]
    laughs += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    write(
        "laughs.yml",
        "\n".join([*laughs, "topology: [Ring]", "npus_count: *a8", "bandwidth: [1]", "latency: [1]"]),
    )
    write(
        "deep.yml",
        "topology: " + "[" * 3000 + "]" * 3000 + "\nnpus_count: [4]\nbandwidth: [1]\nlatency: [1]\n",
    )
    write("bigint.yml", "topology: [Ring]\nnpus_count: [4]\nbandwidth: [" + "9" * 400 + "]\nlatency: [10]\n")
    write("deep.json", "[" * 3000 + "]" * 3000)
    write("groups.json", '{"1": [0, 1]}')
    from themis_mpi.workloads import et

    def et_file(name, nodes):
        path = os.path.join(tmp, name)
        et.write_et(path, et.EtTrace(path, "0.0.4", [], nodes))
        files[name] = path

    cpu = [et.Attr("is_cpu_op", "bool", False)]
    for name, count in (("cycles.et", 100_000), ("cycles200k.et", 200_000)):
        et_file(
            name,
            [et.Node(i, f"c{i}", et.COMP_NODE, [i ^ 1], attrs=cpu, duration_micros=1) for i in range(count)],
        )
    for label, ns in (("inf", float("inf")), ("2e64", 2.0**64), ("1e300", 1e300)):
        et_file(
            f"dur_{label}.et",
            [et.Node(1, "c", et.COMP_NODE, attrs=[et.Attr("themis_duration_ns", "double", ns)])],
        )
    files["bomb.et.gz"] = os.path.join(tmp, "bomb.et.gz")
    with gzip.open(files["bomb.et.gz"], "wb", compresslevel=1) as f:
        for _ in range(1100):
            f.write(bytes(1 << 20))  # 1.07 GiB of zeros inflated, 1 MB on disk
    log = open(os.path.join(ROOT, "tests", "data", "nccl-tests", "h100x8_nvls_dgxc.txt")).read()
    write("superscript.log", log.replace("     1048576", "     10485⁷6", 1))
    write("digits.log", log.replace("     1048576", "9" * 5000, 1))
    for label, column, value in (
        ("negative-size", "size_bytes", -1),
        ("end-1e300", "end_us", 1e300),
        ("bytes-2e62", "bytes", 1 << 62),
    ):
        path = os.path.join(tmp, f"forged-{label}.h5")
        open(path, "wb").write(data)
        table = "collectives" if column == "size_bytes" else "events"
        with h5py.File(path, "r+") as f:
            rows = f[table][()]
            rows[column][0] = value
            del f[table]
            f[table] = rows
            f[table].attrs["sha256"] = checksum(np.asarray(rows))
        files[f"forged-{label}.h5"] = path
    write("net.yml", "topology: [Ring]\nnpus_count: [4]\nbandwidth: [50]\nlatency: [500]\n")
    workload_copy = write("w.txt", open(os.path.join(ROOT, "traces", "gnmt.txt")).read())
    seventy = "_".join(["Ring(1,1,1)"] * 70)
    link_dir = os.path.join(tmp, "a-directory")
    os.makedirs(link_dir)
    mpi = [mpiexec_path(), "-n"]
    cases = [
        ("rank count does not match the topology", [*mpi, "4", *py, "run", "-t", "2x2x2"]),
        ("unknown preset", [*mpi, "2", *py, "run", "-t", "no-such-preset"]),
        ("malformed inline topology", [*mpi, "2", *py, "run", "-t", "SW(2,100"]),
        ("inline dim without bandwidth and latency", [*mpi, "2", *py, "run", "-t", "Ring(2)"]),
        ("an option without its value", [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "--check"]),
        ("unknown dim kind", [*mpi, "2", *py, "run", "-t", "Torus(2,100,700)"]),
        ("negative bandwidth", [*mpi, "2", *py, "run", "-t", "Ring(2,-5,700)"]),
        ("halving-doubling on 6 NPUs", [*mpi, "6", *py, "run", "-t", "SW(6,100,700,hd)"]),
        ("topology YAML without its keys", [*mpi, "2", *py, "run", "-t", files["missing_keys.yml"]]),
        ("topology YAML that is not YAML", [*mpi, "2", *py, "run", "-t", files["broken.yml"]]),
        ("zero chunks", [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "-c", "0"]),
        ("zero size", [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "-b", "0"]),
        ("negative size", [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "--minbytes=-4M"]),
        ("size below one element", [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "-b", "2"]),
        ("last size below the first", [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "-b", "8M", "-e", "1M"]),
        ("unknown policy", [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "--policy", "greedy"]),
        ("involved dim out of range", [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "--dims", "3"]),
        ("zero timeout", [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "--timeout-s", "0"]),
        ("override list of the wrong length", [*mpi, "8", *py, "run", "--bandwidth", "1,2"]),
        ("workload: unknown collective type", [*py, "train", files["bad_type.txt"]]),
        ("workload: fewer layers than declared", [*py, "train", files["short.txt"]]),
        ("workload: model-parallel group not made of leading dims", [*py, "train", files["group.txt"]]),
        ("workload: missing file", [*py, "train", os.path.join(tmp, "nope.txt")]),
        ("training: zero iterations", [*py, "train", files["micro.txt"], "--iters", "0"]),
        ("training: a flag only model and run take (-q)", [*py, "train", files["micro.txt"], "-q"]),
        ("training: wall clock without mpiexec", [*py, "train", files["micro.txt"], "--clock", "wall"]),
        ("trace: missing file", [*py, "analyze", os.path.join(tmp, "nope.h5")]),
        ("trace: truncated", [*py, "analyze", os.path.join(tmp, "truncated.h5")]),
        ("trace: HDF5 but not ours", [*py, "analyze", os.path.join(tmp, "foreign.h5")]),
        ("trace: not HDF5 at all", [*py, "analyze", files["text.h5"]]),
        ("trace: marked incomplete", [*py, "analyze", incomplete]),
        ("replay on other dim sizes", [*py, "replay", good, "-t", "4x2"]),
        ("replay without a trace", [*py, "replay"]),
        ("calibrate: missing log", [*py, "calibrate", os.path.join(tmp, "nope.log")]),
        ("calibrate: a log with no nccl-tests table", [*py, "calibrate", files["micro.txt"]]),
        ("buckets: negative size", [*py, "train", files["micro.txt"], "--bucket-mib", "-1"]),
        ("buckets: nan", [*py, "train", files["micro.txt"], "--bucket-mib", "nan"]),
        (
            "buckets on a Chakra trace",
            [
                *py,
                "train",
                os.path.join(
                    ROOT, "tests", "data", "astra-sim-chakra-et", "all_reduce", "8npus_1MB", "all_reduce.0.et"
                ),
                "--bucket-mib",
                "25",
            ],
        ),
        ("endpoint model: negative memory bandwidth", [*py, "model", "--hbm-gbps", "-5"]),
        ("endpoint model with --compat", [*py, "model", "--hbm-gbps", "1000", "--compat", "astra-sim-1.0"]),
        ("ina on a Ring dim", [*py, "model", "-t", "Ring(4,100,20,ina)"]),
        ("a plugin policy that is not installed", [*py, "model", "-p", "no-such-policy"]),
        # issue 13: numbers out of any meaningful range, under mpiexec where they reach the ranks
        ("a size sweep that never grows by whole bytes", [*py, "model", "-b", "8", "-e", "16", "-f", "1.01"]),
        ("size factor nan", [*py, "model", "-b", "1M", "-e", "4M", "-f", "nan"]),
        ("size factor inf", [*py, "model", "-b", "1M", "-e", "4M", "-f", "inf"]),
        ("size factor 1e308", [*py, "model", "-b", "1M", "-e", "4M", "-f", "1e308"]),
        ("a 2^70-byte size", [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "-b", "1180591620717411303424"]),
        ("99999999999999G", [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "-b", "99999999999999G"]),
        ("a 5,000-digit size", [*py, "model", "-b", "9" * 5000]),
        ("a size this machine cannot hold", [*mpi, "8", *py, "run", "-b", "16G"]),
        ("endpoint delay nan", [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "--endpoint-delay-ns", "nan"]),
        ("negative endpoint delay", [*py, "model", "--endpoint-delay-ns", "-5"]),
        ("1e30 NPUs in a dim", [*py, "model", "-t", "Ring(1e30,100,20)"]),
        ("two dims of 1e10 NPUs", [*py, "model", "-t", "Ring(10000000000,1,1)_Ring(10000000000,1,1)"]),
        ("YAML npus_count 2^70", [*py, "model", "-t", files["huge_npus.yml"]]),
        ("YAML with invalid UTF-8", [*py, "model", "-t", files["bad_utf8.yml"]]),
        ("bandwidths 1e300 and 1e-300", [*py, "model", "-t", "Ring(2,1e300,20)_Ring(2,1e-300,20)"]),
        ("bandwidth 1e-320", [*py, "model", "-t", "Ring(2,1e-320,20)"]),
        ("infinite latency", [*py, "model", "-t", "Ring(2,100,inf)"]),
        ("latency override 1e308", [*py, "model", "--latency", "1e308,1,1"]),
        (
            "a 70-dim topology with --trace",
            [*py, "model", "-t", seventy, "--trace", os.path.join(tmp, "70.h5")],
        ),
        (
            "active chunks per dim 2^62",
            [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "--active-chunks-per-dim", "4611686018427387904"],
        ),
        ("a billion chunks", [*py, "model", "-c", "1000000000"]),
        (
            "a non-UTF-8 argument with --trace",
            [
                *py,
                "model",
                "-b",
                "1M",
                "--trace",
                os.path.join(tmp, "u.h5"),
                "--json",
                os.fsdecode(os.fsencode(tmp) + b"/\xff.json"),
            ],
        ),
        ("more chunks than elements", [*py, "model", "-b", "64", "-c", "64"]),
        ("workload: a 2^70-byte layer", [*py, "train", files["huge_layer.txt"]]),
        ("comm scale nan", [*py, "train", files["micro.txt"], "--comm-scale", "nan"]),
        ("comm scale inf", [*py, "train", files["micro.txt"], "--comm-scale", "inf"]),
        ("comm scale 1e30", [*py, "train", files["micro.txt"], "--comm-scale", "1e30"]),
        ("compute scale inf", [*py, "train", files["micro.txt"], "--compute-scale", "inf"]),
        (
            "straggler: a late rank beyond the topology",
            [*py, "model", "-t", "2x2x2", "--npu-delay-us", "8=10"],
        ),
        ("straggler: a negative delay", [*py, "model", "-t", "2x2x2", "--npu-delay-us", "3=-5"]),
        ("straggler: a delay without its rank", [*py, "model", "-t", "2x2x2", "--npu-delay-us", "50"]),
        ("straggler: a link scale of 0", [*py, "model", "-t", "2x2x2", "--link-scale", "0:3=0"]),
        (
            "straggler: a link scale on a dim not there",
            [*py, "model", "-t", "2x2x2", "--link-scale", "5:3=0.5"],
        ),
        (
            "straggler: a late NPU with two active chunks per dim",
            [*py, "model", "-t", "2x2x2", "--npu-delay-us", "3=5", "--active-chunks-per-dim", "2"],
        ),
        ("straggler: compute scale nan", [*py, "train", files["micro.txt"], "--npu-compute-scale", "1=nan"]),
        (
            "straggler: jitter of another law",
            [*py, "train", files["micro.txt"], "--compute-jitter", "normal:0.1"],
        ),
        (
            "straggler: on every rank under mpiexec",
            [*mpi, "4", *py, "run", "-t", "2x2", "-b", "64K", "--npu-delay-us", "9=1"],
        ),
        (
            "astra-sim-2: training on an uneven dim (halving-doubling on a Ring, every NPU)",
            [*py, "train", files["micro.txt"], "-t", "Ring(8,100,500,hd)", "--compat", "astra-sim-2"],
        ),
        (
            "jobs: a job on a dim not there",
            [*py, "train", "--job", files["micro.txt"] + "@dims=7", "-t", "2x2x2"],
        ),
        (
            "jobs: an unknown placement key",
            [*py, "train", "--job", files["micro.txt"] + "@where=1", "-t", "2x2x2"],
        ),
        ("trace: one flipped bit in its events", [*py, "analyze", flipped]),
        ("trace: forged, without its topology attribute", [*py, "analyze", forged]),
        ("a model trace replayed under mpiexec", [*mpi, "8", *py, "replay", mpi_trace]),
        ("output: missing directory", [*py, "model", "--json", os.path.join(tmp, "no", "such", "x.json")]),
        ("output: a directory as --json", [*py, "model", "--json", link_dir]),
        ("output: under /proc", [*py, "model", "--json", "/proc/self/x.json"]),
        ("output: a device (/dev/null)", [*py, "model", "--json", "/dev/null"]),
        ("output: a name too long for its temporary", [*py, "model", "--json", os.path.join(tmp, "x" * 250)]),
        ("output: export over its own input", [*py, "export", good, "--perfetto", good]),
        (
            "output: a bad --json path under mpiexec",
            [*mpi, "2", *py, "run", "-t", "Ring(2,1,1)", "--json", os.path.join(tmp, "no", "x.json")],
        ),
    ]
    pytorch = os.path.join(ROOT, "tests", "data", "chakra-pytorch", "chakra.0.et.gz")
    cases += [
        # round 3 (issue 32): readers with bounds, outputs that are inputs, daily use
        ("YAML topology: a billion-laughs bomb of aliases", [*py, "model", "-t", files["laughs.yml"]]),
        ("YAML topology: nested 3,000 deep", [*py, "model", "-t", files["deep.yml"]]),
        ("YAML topology: a 400-digit integer", [*py, "model", "-t", files["bigint.yml"]]),
        ("--comm-group JSON nested 3,000 deep", [*py, "train", pytorch, "--comm-group", files["deep.json"]]),
        (
            "ET: 50,000 control-dependency cycles (100,000 nodes)",
            [*py, "train", files["cycles.et"], "-p", "baseline", "-c", "1"],
        ),
        (
            "ET: 100,000 control-dependency cycles (200,000 nodes)",
            [*py, "train", files["cycles200k.et"], "-p", "baseline", "-c", "1"],
        ),
        (
            "ET: 100,000 control-dependency cycles (200,000 nodes), mpiexec -n 8",
            [*mpi, "8", *py, "train", files["cycles200k.et"], "-p", "baseline", "-c", "1"],
        ),
        ("ET: a node of inf ns", [*py, "train", files["dur_inf.et"]]),
        ("ET: a node of 2^64 ns", [*py, "train", files["dur_2e64.et"]]),
        ("ET: a node of 1e300 ns", [*py, "train", files["dur_1e300.et"]]),
        ("ET: a gzip bomb (1.07 GiB of zeros)", [*py, "train", files["bomb.et.gz"]]),
        (
            "calibrate: 1,048,576 NPUs",
            [
                *py,
                "calibrate",
                os.path.join(ROOT, "tests", "data", "nccl-tests", "h100x8_nvls_dgxc.txt"),
                "--npus",
                "1048576",
            ],
        ),
        ("calibrate: a superscript digit in the size column", [*py, "calibrate", files["superscript.log"]]),
        ("calibrate: a 5,000-digit size", [*py, "calibrate", files["digits.log"]]),
        (
            "trace: forged (re-checksummed), a negative size",
            [*py, "analyze", files["forged-negative-size.h5"]],
        ),
        ("trace: forged, an event ending at 1e300 us", [*py, "analyze", files["forged-end-1e300.h5"]]),
        ("trace: forged, 2^62 bytes in an event", [*py, "analyze", files["forged-bytes-2e62.h5"]]),
        ("output: train W --json W", [*py, "train", workload_copy, "--json", workload_copy]),
        (
            "output: model -t T.yml --json T.yml",
            [*py, "model", "-t", files["net.yml"], "--json", files["net.yml"]],
        ),
        (
            "output: --comm-group G --json G",
            [*py, "train", pytorch, "--comm-group", files["groups.json"], "--json", files["groups.json"]],
        ),
        (
            "output: --json P --csv P",
            [*py, "model", "-b", "1M", "--json", os.path.join(tmp, "p"), "--csv", os.path.join(tmp, "p")],
        ),
        (
            "output: --json P --trace P",
            [*py, "model", "-b", "1M", "--json", os.path.join(tmp, "q"), "--trace", os.path.join(tmp, "q")],
        ),
        (
            "output: replay --json P --trace P",
            [*py, "replay", good, "--json", os.path.join(tmp, "r"), "--trace", os.path.join(tmp, "r")],
        ),
        ("a 120 kB topology string", [*py, "model", "-t", "SW(8,100,700)_" * 8500 + "SW(8,100,700)"]),
        (
            "convert --iters 1000000",
            [*py, "convert", workload_copy, os.path.join(tmp, "w.et"), "--iters", "1000000"],
        ),
        ("a shape that is not a preset (8x8x8)", [*py, "model", "-t", "8x8x8", "-b", "1M", "-q"]),
        ("--network fair with nccl dims", [*py, "model", "-t", "SW(8,400,600,nccl)", "--network", "fair"]),
        (
            "--network fair with --compat astra-sim-1.0",
            [*py, "model", "--network", "fair", "--compat", "astra-sim-1.0"],
        ),
    ]
    cases += round4_cases(tmp, py, write, pytorch, files["micro.txt"], mounts)
    cases += round4_part2_cases(tmp, py, write, files["micro.txt"])
    if REF:
        transformer = os.path.join(REF, "Transformer_HybridParallel.txt")
        cases.append(
            (
                "ASTRA-sim's Transformer workload (model-parallel group 4) on 2 NPUs",
                [*py, "train", transformer, "-t", "Ring(2,1,1)"],
            )
        )
    if args.only:
        cases = [case for case in cases if args.only in case[0]]
    lines = [
        "# Bad inputs and what they get",
        "",
        "Generated by `python scripts/bad_inputs.py`; every row ran for real (MPI rows under mpiexec). "
        f"`seconds` is wall time, measured on a {os.cpu_count()}-core machine "
        f"({time.strftime('%Y-%m-%d', time.gmtime())}); it is not compared.",
        "",
        "| input | command | exit | seconds | traceback | message (first line of stderr) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for what, cmd, *env in cases:
        start = time.monotonic()
        extra = {**os.environ, **env[0]} if env else None
        proc = run_probe(cmd, extra)
        seconds = time.monotonic() - start
        err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        shown = " ".join(c if c not in py else "" for c in cmd)
        shown = shown.replace(tmp + "/", "").replace(mpiexec_path(), "mpiexec").replace(ROOT + "/", "")
        message = (
            err[0].replace(tmp + "/", "").replace(ROOT + "/", "")
            if err
            else f"(nothing; {len(proc.stdout.splitlines())} lines of output)"
        )
        if REF:
            shown, message = shown.replace(REF + "/", ""), message.replace(REF + "/", "")
        if len(shown) > 160:
            shown = shown[:150] + " ..."
        lines.append(
            f"| {what} | `{' '.join(shown.split())}` | {proc.returncode} | {seconds:.1f} | "
            f"{'yes' if 'Traceback' in proc.stderr else 'no'} | {message[:300].replace('|', '/')} |"
        )
        print(f"{proc.returncode:>3} {seconds:5.1f}s {what}: {message[:160]}")
    if args.only:
        lines = splice(args.out, lines)
    lines += [
        "",
        "Runtime failures (from `tests/test_hardening.py`, `tests/test_hardening_setup.py` and "
        "`tests/test_collectives.py`):",
        "",
        "| failure | what happens |",
        "| --- | --- |",
    ]
    lines += [f"| {what} | {happens} |" for what, happens in RUNTIME]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with atomic_path(args.out) as out, open(out, "w") as f:
        f.write(
            ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        )
    print(f"wrote {args.out}")


def run_probe(cmd: list[str], env: dict | None) -> subprocess.CompletedProcess:
    """Run one probe in a session of its own; past `PROBE_TIMEOUT_S` end it all (exit "timeout")."""
    pipe = subprocess.PIPE
    proc = subprocess.Popen(
        cmd, stdout=pipe, stderr=pipe, text=True, cwd=ROOT, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # mpiexec and its ranks too
        out, err = proc.communicate()
        return subprocess.CompletedProcess(cmd, "timeout", out, f"(still running after {PROBE_TIMEOUT_S} s)")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def splice(page: str, fresh: list[str]) -> list[str]:
    """The probe table of the page at `page` with the rows of `fresh` (a header, then rows) in it.

    A fresh row replaces the page's row of the same label, or is added at the table's end; the
    page's header (its date) and other rows stay.
    """
    with open(page, encoding="utf-8") as f:
        old = f.read().split("\n\nRuntime failures", 1)[0].splitlines()

    def label(row: str) -> str:
        return row.split(" | ", 1)[0]

    new = {label(row): row for row in fresh[fresh.index("| --- | --- | --- | --- | --- | --- |") + 1 :]}
    out = [new.pop(label(row), row) for row in old]
    return out + list(new.values())


if __name__ == "__main__":
    main()
