"""Run metadata and (later) the HDF5 trace of a run."""

from __future__ import annotations

import platform


def versions() -> dict:
    """Versions of the package, Python, numpy, mpi4py, h5py and the MPI library."""
    import numpy

    from . import __version__

    out = {"themis-mpi": __version__, "python": platform.python_version(), "numpy": numpy.__version__}
    try:
        import mpi4py

        out["mpi4py"] = mpi4py.__version__
        from mpi4py import MPI

        out["MPI"] = MPI.Get_library_version().splitlines()[0].strip()
        out["MPI std"] = "{}.{}".format(*MPI.Get_version())
    except ImportError as exc:  # pragma: no cover - mpi4py is a dependency
        out["mpi4py"] = f"unavailable ({exc})"
    try:
        import h5py

        out["h5py"] = h5py.__version__
        out["HDF5"] = h5py.version.hdf5_version
    except ImportError as exc:  # pragma: no cover - h5py is a dependency
        out["h5py"] = f"unavailable ({exc})"
    return out
