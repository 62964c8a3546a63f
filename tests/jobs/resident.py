"""An MPI job whose ranks stay up between the suite's batches of runs (`harness.resident`).

Usage: ``mpiexec -n K python -m mpi4py tests/jobs/resident.py FOLDER PARENT_PID``. Rank 0 waits
for ``FOLDER/request1.json``, then ``request2.json`` and so on: ``{"kind": "commands" | "specs",
"items": [...], "out": PATH}``. Every rank runs the batch as tests/jobs/commands.py or
tests/jobs/agreements.py would (their `run`), and rank 0 writes the rows to PATH. So the
modules of a test session pay the ranks' start-up (about 1.6 s for 8 ranks on 2 cores) once,
not once each. ``{"kind": "stop"}``, a parent (the test session) that is gone, or an hour without
a request ends the job. The ranks sleep while they wait: a blocking MPI call would spin on a core.
"""

import json
import os
import sys
import time
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
import agreements  # noqa: E402
import commands  # noqa: E402

from themis_mpi.output import write_json  # noqa: E402

IDLE_S = 3600  # the longest wait for a request
NAP_S = (0.001, 0.1)  # the shortest and the longest sleep between two looks


def alive(pid: int) -> bool:
    """Whether process `pid` still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def sleep_until(ready) -> None:
    """Sleep until ``ready()``, a little longer each time (up to `NAP_S`)."""
    nap = NAP_S[0]
    while not ready():
        time.sleep(nap)
        nap = min(2 * nap, NAP_S[1])


def next_request(folder: Path, number: int, parent: int) -> dict:
    """Rank 0: request `number` once it is written (a stop when the parent is gone or it never comes)."""
    path, since = folder / f"request{number}.json", time.monotonic()
    sleep_until(lambda: path.exists() or not alive(parent) or time.monotonic() - since > IDLE_S)
    return json.loads(path.read_text()) if path.exists() else {"kind": "stop"}


def serve(folder: Path, parent: int) -> None:
    world = MPI.COMM_WORLD
    rank, number = world.Get_rank(), 0
    while True:
        number += 1
        request = next_request(folder, number, parent) if rank == 0 else None
        met = world.Ibarrier()  # every rank sleeps until rank 0 has the request
        sleep_until(met.Test)
        request = world.bcast(request, root=0)
        if request["kind"] == "stop":
            return
        run = commands.run if request["kind"] == "commands" else agreements.run
        rows = run(request["items"])
        if rank == 0:
            write_json(request["out"], rows)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]))
