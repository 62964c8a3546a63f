"""themis-mpi: emulate accelerator networks on MPI and schedule collectives with Themis.

Themis: Rashidi et al., ISCA 2022 (arXiv 2110.04478).
"""

__version__ = "0.1.0"
