"""`themis-mpi info`: versions, for bug reports and trace metadata."""

from __future__ import annotations

import argparse

from ..trace import versions


def cmd_info(args: argparse.Namespace) -> int:
    """`themis-mpi info`: the package's, Python's, numpy's, mpi4py's, h5py's and MPI's versions."""
    for key, value in versions().items():
        print(f"{key:>10}: {value}")
    return 0
