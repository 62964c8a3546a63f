"""themis-mpi: emulate accelerator networks on MPI and schedule collectives with Themis.

Themis: Rashidi et al., ISCA 2022 (arXiv 2110.04478). The Python API (`sweep`, `train`,
`to_dataframe`) runs the model in this process; `themis-mpi run` under mpiexec runs the emulator.
"""

__version__ = "0.2.0"

from .api import sweep, to_dataframe, train  # noqa: E402

__all__ = ["__version__", "sweep", "to_dataframe", "train"]
