"""themis-mpi: emulate accelerator networks on MPI and schedule collectives with Themis.

Themis: Rashidi et al., ISCA 2022 (arXiv 2110.04478). The Python API (`sweep`, `train`,
`gpt`, `price_gpt`, `to_dataframe`; `api.calibrate`, whose name here is the subpackage's) runs the
model in this process; `themis-mpi run` under mpiexec runs the emulator.
The API is imported on first use, so an MPI rank that imports the package pays only for what it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .version import __version__

__all__ = ["__version__", "gpt", "price_gpt", "sweep", "to_dataframe", "train"]

if TYPE_CHECKING:
    from .api import gpt, price_gpt, sweep, to_dataframe, train


def __getattr__(name: str) -> Any:
    """The API's functions (`__all__`) from `api`, imported on first use (PEP 562)."""
    if name in __all__[1:]:
        from . import api  # the model API: no MPI rank needs it

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names, the lazily imported API included."""
    return sorted({*globals(), *__all__})
