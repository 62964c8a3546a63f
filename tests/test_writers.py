"""Rules for every file the package writes: a failing file system is one line and exit 2.

The previous file stays intact and no temporary file is left; no output may be an input or
another output of the same command.

Write errors are injected in a child Python that replaces `os.fsync` or `os.replace` (the last two
steps of every write, `output.atomic_path`) with one that fails with ENOSPC, EROFS or EIO.
"""

import errno
import os
import subprocess
import sys

import pytest
from harness import DATA, ROOT, mpi_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

TRACE = str(ROOT / "docs" / "trace" / "run.h5")
LOG = str(DATA / "nccl-tests" / "h100x8_nvls_dgxc.txt")
WORKLOAD = str(ROOT / "traces" / "gnmt.txt")

# (name, arguments with OUT for the output file)
WRITERS = [
    ("model --json", ["model", "-b", "64K", "-c", "4", "-q", "--json", "OUT.json"]),
    ("model --csv", ["model", "-b", "64K", "-c", "4", "-q", "--csv", "OUT.csv"]),
    ("model --trace", ["model", "-b", "64K", "-c", "4", "-q", "--trace", "OUT.h5"]),
    ("train --json", ["train", WORKLOAD, "-c", "2", "--json", "OUT.json"]),
    ("analyze --json", ["analyze", TRACE, "--json", "OUT.json"]),
    ("export --perfetto", ["export", TRACE, "--perfetto", "OUT.json"]),
    ("convert to ET", ["convert", WORKLOAD, "OUT.et"]),
    ("calibrate --json", ["calibrate", LOG, "--json", "OUT.json"]),
    ("replay --json", ["replay", TRACE, "--json", "OUT.json"]),
]

INJECT = """
import errno, os, sys
code, where = int(sys.argv[1]), sys.argv[2]
real = getattr(os, where)

def failing(*args, **kwargs):
    raise OSError(code, os.strerror(code))

setattr(os, where, failing)
from themis_mpi.cli import main
sys.exit(main(sys.argv[3:]))
"""


def run(args, inject=None, cwd=None):
    """`themis-mpi ARGS` in a child Python, optionally with (errno, 'fsync' or 'replace') failing."""
    code, where = inject or (0, "getpid")
    cmd = (
        [sys.executable, "-c", INJECT, str(code), where, *args]
        if inject
        else [sys.executable, "-m", "themis_mpi", *args]
    )
    # (no progress lines: a loaded machine would add one to the one line a failure must print)
    env = {**mpi_env(), "THEMIS_MPI_PROGRESS_S": "inf"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd or ROOT, timeout=120)


def place(args, out_dir, stem="out"):
    """The writer's arguments with its output in out_dir; and that output's path."""
    out = ""
    placed = []
    for a in args:
        if a.startswith("OUT"):
            out = str(out_dir / (stem + a[3:]))
            a = out
        placed.append(a)
    return placed, out


@settings(
    max_examples=18,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    writer=st.sampled_from(WRITERS),
    code=st.sampled_from([errno.ENOSPC, errno.EROFS, errno.EIO]),
    where=st.sampled_from(["fsync", "replace"]),
)
def test_a_failing_file_system_is_one_line_and_keeps_the_previous_file(tmp_path_factory, writer, code, where):
    """ENOSPC, EROFS or EIO while a file is written: exit 2, one line, the old file as it was, nothing else."""
    out_dir = tmp_path_factory.mktemp("out")
    args, out = place(writer[1], out_dir)
    with open(out, "w") as f:
        f.write("the previous complete file")
    proc = run(args, (code, where))
    assert proc.returncode == 2, (writer[0], proc.stderr[-2000:])
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot write" in proc.stderr and os.strerror(code) in proc.stderr, proc.stderr
    with open(out) as f:
        assert f.read() == "the previous complete file"
    assert sorted(os.listdir(out_dir)) == [os.path.basename(out)]


@pytest.mark.parametrize("how", ["same", "symlink-to-input", "symlink-from-input", "directory"])
def test_an_output_that_is_an_input_or_a_directory_is_refused_before_any_work(tmp_path, how):
    """`train W --json W`, through symlinks either way, or onto a directory: one line, the input intact."""
    workload = tmp_path / "w.txt"
    workload.write_text(open(WORKLOAD).read())
    before = workload.read_bytes()
    out = tmp_path / "out.json"
    if how == "same":
        out = workload
    elif how == "symlink-to-input":
        out.symlink_to(workload)
    elif how == "symlink-from-input":
        link = tmp_path / "link.txt"
        link.symlink_to(workload)
        workload, out = link, tmp_path / "w.txt"
    else:
        out.mkdir()
    proc = run(["train", str(workload), "-c", "2", "--json", str(out)])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "cannot write" in proc.stderr
    assert (tmp_path / "w.txt").read_bytes() == before


@pytest.mark.parametrize(
    "args",
    [
        ["model", "-b", "64K", "-q", "--json", "P", "--csv", "P"],
        ["model", "-b", "64K", "-q", "--json", "P", "--trace", "P"],
        ["replay", TRACE, "--json", "P", "--trace", "P"],
    ],
    ids=["json-csv", "json-trace", "replay-json-trace"],
)
def test_two_outputs_of_one_command_with_one_path_are_refused(tmp_path, args):
    """Two outputs named alike would overwrite each other: one line, and nothing is written."""
    target = tmp_path / "same.out"
    proc = run([str(target) if a == "P" else a for a in args])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "same file" in proc.stderr, proc.stderr
    assert not target.exists()


def test_model_refuses_to_write_over_its_yaml_topology(tmp_path):
    """`model -t T.yml --json T.yml`: the topology file is an input."""
    net = tmp_path / "net.yml"
    net.write_text("topology: [Ring]\nnpus_count: [4]\nbandwidth: [50]\nlatency: [500]\n")
    before = net.read_bytes()
    proc = run(["model", "-t", str(net), "-b", "64K", "-q", "--json", str(net)])
    assert proc.returncode == 2 and "input of this command" in proc.stderr
    assert net.read_bytes() == before
