"""Run every bad input we know of and write what each one gets: docs/bad-inputs.md.

Usage::

    python scripts/bad_inputs.py [--out docs/bad-inputs.md]

Each case runs for real (under mpiexec where the input reaches the ranks), and the table records
its exit status, whether a Python traceback appeared, and the first line of what it printed.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from themis_mpi.launch import mpiexec_path
from themis_mpi.output import atomic_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ASTRA-sim 1.0's text workloads: the copies in tests/data, else the shared reference ones, if present
REF_DIRS = (
    os.path.join(ROOT, "tests", "data", "astra-sim-1.0-text"),
    os.path.join(os.path.dirname(ROOT), "shared", "reference-workloads", "astra-sim-1.0-text"),
)
REF = next((d for d in REF_DIRS if os.path.isdir(d)), None)


RUNTIME = [
    (
        "a rank killed (SIGKILL) mid-collective",
        "MPICH's launcher ends the job at once (exit 9). With `mpiexec -disable-auto-cleanup`, each rank "
        "that waited on it prints `themis-mpi: error: rank R: a message failed (...) waiting for rank(s) K "
        "in collective C (...), chunk k, RS on dim d; a peer died; aborting the job` and the job aborts",
    ),
    (
        "a rank frozen (SIGSTOP) or hung",
        "after `--timeout-s` (default 60 s) without progress: `themis-mpi: error: rank R: no progress "
        "for T s waiting for rank(s) K in collective C (...), chunk k, RS on dim d; a peer died or stopped "
        "responding; aborting the job`, then MPI_Abort ends every rank",
    ),
    ("a Python exception on one rank (a bug)", "the traceback is printed and MPI_Abort ends every rank"),
    (
        "int32 sums that would overflow (over 46340 NPUs)",
        "`int32 cannot hold the sums of N NPUs' inputs (...); use int64 or a float type`",
    ),
    (
        "a run that dies before writing its trace",
        "no file at the trace path; rank 0 writes `.NAME.partial-PID.h5` beside it (attribute `complete=0`) "
        "and renames it only when complete",
    ),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bad-inputs.md"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
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
    mpi = [mpiexec_path(), "-n"]
    cases = [
        ("rank count does not match the topology", [*mpi, "4", *py, "run", "-t", "2x2x2"]),
        ("unknown preset", [*mpi, "2", *py, "run", "-t", "no-such-preset"]),
        ("malformed inline topology", [*mpi, "2", *py, "run", "-t", "SW(2,100"]),
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
        ("training: wall clock without mpiexec", [*py, "train", files["micro.txt"], "--clock", "wall"]),
        ("trace: missing file", [*py, "analyze", os.path.join(tmp, "nope.h5")]),
        ("trace: truncated", [*py, "analyze", os.path.join(tmp, "truncated.h5")]),
        ("trace: HDF5 but not ours", [*py, "analyze", os.path.join(tmp, "foreign.h5")]),
        ("trace: not HDF5 at all", [*py, "analyze", files["text.h5"]]),
        ("trace: marked incomplete", [*py, "analyze", incomplete]),
        ("replay on other dim sizes", [*py, "replay", good, "-t", "4x2"]),
        ("replay without a trace", [*py, "replay"]),
    ]
    if REF:
        transformer = os.path.join(REF, "Transformer_HybridParallel.txt")
        cases.append(
            (
                "ASTRA-sim's Transformer workload (model-parallel group 4) on 2 NPUs",
                [*py, "train", transformer, "-t", "Ring(2,1,1)"],
            )
        )
    lines = [
        "# Bad inputs and what they get",
        "",
        "Generated by `python scripts/bad_inputs.py`; every row ran for real (MPI rows under mpiexec).",
        "",
        "| input | command | exit | traceback | message (first line of stderr) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for what, cmd in cases:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
        err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        shown = " ".join(c if c not in py else "" for c in cmd)
        shown = shown.replace(tmp + "/", "").replace(mpiexec_path(), "mpiexec")
        message = err[0].replace(tmp + "/", "") if err else "(nothing)"
        if REF:
            shown, message = shown.replace(REF + "/", ""), message.replace(REF + "/", "")
        lines.append(
            f"| {what} | `{' '.join(shown.split())}` | {proc.returncode} | "
            f"{'yes' if 'Traceback' in proc.stderr else 'no'} | {message.replace('|', '/')} |"
        )
        print(f"{proc.returncode:>3} {what}: {message}")
    lines += [
        "",
        "Runtime failures (from `tests/test_hardening.py` and `tests/test_collectives.py`):",
        "",
        "| failure | what happens |",
        "| --- | --- |",
    ]
    lines += [f"| {what} | {happens} |" for what, happens in RUNTIME]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with atomic_path(args.out) as out, open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
