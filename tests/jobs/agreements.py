"""Several scripts/agreement.py specs in one MPI job: one start-up for them all (`harness.run_specs`).

Usage: ``mpiexec -n K python -m mpi4py tests/jobs/agreements.py SPECS.json OUT.json``. SPECS is a
list of agreement specs (``{"topology": ..., "cases": [...]}``, each topology of K NPUs); rank 0
writes OUT, the list of each spec's comparison rows (`agreement.run_spec`), in the same order.
(`run` is also what the resident job, tests/jobs/resident.py, runs for a batch of specs.)
"""

import json
import sys
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from agreement import run_spec  # noqa: E402

from themis_mpi.output import write_json  # noqa: E402


def run(specs: list[dict]) -> list[list[dict]]:
    """Each spec's comparison rows, in order (every rank runs them; rank 0's rows are the table)."""
    return [run_spec(spec["topology"], spec["cases"]) for spec in specs]


if __name__ == "__main__":
    specs_path, out_path = sys.argv[1:3]
    rows = run(json.loads(Path(specs_path).read_text()))
    if MPI.COMM_WORLD.Get_rank() == 0:
        write_json(out_path, rows)
