"""Calibration against real hardware: nccl-tests logs read, fitted and reported.

`logs` reads a log as posted; `hardware` holds the GPU table, `machine` what a log says of its
machine; `ncclfit` fits the NCCL-like model (`themis_mpi.nccl`) to it, `alphabeta` one dim's
latency and bandwidth; `perdim` gives a fit's per-dim view; `optimise` holds the optimiser the
fits use and `report` formats what ``themis-mpi calibrate`` prints.
"""

from .alphabeta import Fit, fit
from .logs import NCCL_TYPES, NcclLog, NcclRow, infer_npus, read_nccl_log
from .machine import Machine, machine_of, parse_algos
from .ncclfit import NcclFit, busbw_of, fit_nccl, nccl_rows, predict, read_base, summary
from .perdim import per_dim
from .report import fit_header, format_fit, format_nccl_fit, nccl_fit_header

__all__ = [
    "NCCL_TYPES",
    "Fit",
    "Machine",
    "NcclFit",
    "NcclLog",
    "NcclRow",
    "busbw_of",
    "fit",
    "fit_nccl",
    "fit_header",
    "format_fit",
    "format_nccl_fit",
    "nccl_fit_header",
    "infer_npus",
    "machine_of",
    "nccl_rows",
    "parse_algos",
    "per_dim",
    "predict",
    "read_base",
    "read_nccl_log",
    "summary",
]
