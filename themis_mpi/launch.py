"""Starting and recognising MPI jobs, without importing MPI.

The CLI asks whether a launcher started it, and which rank it is, before MPI is initialised;
tests and benchmark scripts start ``mpiexec`` jobs from one ordinary Python process. Both need
these few facts, and neither may pull in mpi4py (pytest must never initialise MPI).
"""

from __future__ import annotations

import os
import sys

LAUNCHER_RANK_KEYS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")
LAUNCHER_SIZE_KEYS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
LAUNCHER_LOCAL_SIZE_KEYS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE")


def env_rank() -> int:
    """This process's MPI rank from the launcher's environment, before MPI is initialised."""
    for key in LAUNCHER_RANK_KEYS:
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def env_size() -> int | None:
    """The job's rank count from the launcher's environment, before MPI is initialised (None: unknown)."""
    for key in LAUNCHER_SIZE_KEYS:
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return None


def env_local_size() -> int:
    """Ranks of this job on this machine (the launcher's word, else every rank of the job, else 1)."""
    for key in LAUNCHER_LOCAL_SIZE_KEYS:
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return env_size() or 1


def under_mpiexec() -> bool:
    """True when a launcher started this process (even with one rank)."""
    return any(k in os.environ for k in LAUNCHER_RANK_KEYS)


def mpiexec_path() -> str:
    """The mpiexec beside this Python (the mpich wheel's), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    import shutil  # only here: every rank imports this module, few call this

    found = here if os.path.exists(here) else shutil.which("mpiexec")
    if not found:
        raise RuntimeError("no mpiexec found: `pip install .` brings one with the mpich wheel")
    return found


def job_env(**extra: str) -> dict:
    """This environment, plus what running as root and oversubscribing need (MPICH or Open MPI)."""
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
        PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe",
        **extra,
    )
    return env
