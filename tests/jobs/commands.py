"""Several `themis-mpi` commands in one MPI job: one start-up of the ranks for them all (`harness.cli_jobs`).

Usage: ``mpiexec -n K python tests/jobs/commands.py COMMANDS.json OUT.json``. COMMANDS is a list of
argument lists; each runs on every rank as ``themis-mpi ARGS`` does (`themis_mpi.cli.main`), one
after the other, with each rank's standard output and error caught. Rank 0 writes OUT: per
command, its exit code (the highest of the ranks') and the ranks' output, rank 0's first. For
commands that end normally: one that aborts the job ends them all. (`run` is also what the
resident job, tests/jobs/resident.py, runs for a batch of commands.)
"""

import contextlib
import io
import json
import sys

from mpi4py import MPI

from themis_mpi.cli import main
from themis_mpi.output import write_json


def run(commands: list[list[str]]) -> list[dict] | None:
    """Each command on every rank, in turn: on rank 0 each one's exit code and output, elsewhere None."""
    world = MPI.COMM_WORLD
    done = []
    for argv in commands:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as exc:  # argparse
                code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        ranks = world.gather((code, out.getvalue(), err.getvalue()), root=0)
        if ranks is not None:
            done.append(
                {
                    "returncode": max(c for c, _, _ in ranks),
                    "stdout": "".join(o for _, o, _ in ranks),
                    "stderr": "".join(e for _, _, e in ranks),
                }
            )
    return done if world.Get_rank() == 0 else None


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        rows = run(json.load(f))
    if rows is not None:
        write_json(sys.argv[2], rows)
