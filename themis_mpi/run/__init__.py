"""Running things: the run driver, the coordinator's broadcast, backends and sweeps.

- `coordinator`: rank 0 chooses every collective's schedule and broadcasts it.
- `collective`: one collective on any transport (`run_collective`, `model_collective`), and the
  start and end of every run (`execute`).
- `training`: training iterations of a text workload, or a Chakra graph (`run_training`,
  `run_graph`, `model_training`).
- `backend`: the model or MPI (COMM_WORLD), and MPI's start-up guard.
- `sweep`: what a sweep runs (topologies x sizes x chunks x policies x intra-dim policies),
  resolved once for the CLI and the Python API.

This file imports nothing: a rank of `themis-mpi run` loads `collective` without the workloads.
"""
